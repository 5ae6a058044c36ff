// Small helpers shared by the unit tests.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "kiln/executable.h"
#include "kiln/graph.h"
#include "kiln/reference.h"
#include "runtime/pipeline.h"

namespace kiln::testing {

// An empty path for a test's own kernel cache, unique to this process.
inline std::filesystem::path fresh_cache(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("kiln-test-{}-{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

// Sanitizer builds NVRTC-compile one graph in this many of a test's list
// and plan and generate the rest: the generation is theirs to check,
// NVRTC's compile time the same in every build (and most of theirs).
#ifdef KILN_SANITIZED_BUILD
inline constexpr size_t kNvrtcEvery = 4;
#else
inline constexpr size_t kNvrtcEvery = 1;
#endif

// "" when `g` compiles for `arch` (with `nvrtc`), else the error, prefixed by
// `what`. Without `nvrtc`: planned and generated only (a symbolic graph
// that is compiled per size passes: the compile would specialize it).
inline std::string compiles(const Graph& g, const char* arch, bool nvrtc, const std::string& what) {
  if (!nvrtc) {
    Expected<runtime::Target> target = runtime::compile_target(g, {.arch = arch, .use_cache = false});
    if (!target) return fmt::format("{} {}: {}", what, arch, target.error().message);
    Expected<runtime::Planned> planned = runtime::run_pipeline(g, *target);
    if (planned || planned.error().code == ErrorCode::InvalidInput) return "";
    return fmt::format("{} {}: {}", what, arch, planned.error().message);
  }
  Expected<Executable> exe = Executable::compile(g, {.arch = arch, .use_cache = false});
  return exe ? std::string() : fmt::format("{} {}: {}", what, arch, exe.error().message);
}

// Parses a graph that must be valid.
inline Graph must_parse(const std::string& text) {
  Expected<Graph> g = Graph::from_json(text, "test");
  if (!g) ADD_FAILURE() << "unexpected error: " << g.error().message;
  return std::move(g).value();
}

// The error message of a graph that must be invalid.
inline std::string parse_error(const std::string& text) {
  Expected<Graph> g = Graph::from_json(text, "test");
  if (g) {
    ADD_FAILURE() << "expected an error for:\n" << text;
    return {};
  }
  EXPECT_EQ(g.error().code, ErrorCode::InvalidInput) << g.error().message;
  return g.error().message;
}

// A one-op graph over f32 inputs named a, b, c... with the given shapes.
inline std::string one_op(const std::string& op_fields, const std::vector<std::string>& input_shapes,
                          const std::string& dtype = "f32") {
  std::string inputs;
  for (size_t i = 0; i < input_shapes.size(); ++i)
    inputs += std::string(i ? "," : "") + "\"" + static_cast<char>('a' + i) + "\": {\"shape\": " +
              input_shapes[i] + ", \"dtype\": \"" + dtype + "\"}";
  return "{\"kiln\": 1, \"inputs\": {" + inputs + "}, \"ops\": [{" + op_fields +
         ", \"out\": \"y\"}], \"outputs\": [\"y\"]}";
}

inline std::vector<HostTensor> must_run(const Graph& g, const std::vector<HostTensor>& inputs) {
  Expected<std::vector<HostTensor>> out = run_reference(g, inputs);
  if (!out) {
    ADD_FAILURE() << "reference failed: " << out.error().message;
    return {};
  }
  return std::move(out).value();
}

inline HostTensor f32(Shape shape, std::vector<float> values) {
  return HostTensor{std::move(shape), DType::f32, std::move(values)};
}

}  // namespace kiln::testing

// Small helpers shared by the unit tests.
#pragma once

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "kiln/graph.h"
#include "kiln/reference.h"

namespace kiln::testing {

// An empty path for a test's own kernel cache, unique to this process.
inline std::filesystem::path fresh_cache(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("kiln-test-{}-{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  return dir;
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

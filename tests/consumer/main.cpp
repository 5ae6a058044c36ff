// An embedder of kiln: builds a graph in code, checks it on the CPU
// reference, compiles it (NVRTC; no GPU needed) with its own settings and
// its own log, and prints what a launch would need.
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer CACHE_DIR\n");
    return 2;
  }
  kiln::Options options = kiln::Options::from_environment();
  options.cache_dir = argv[1];
  int warnings = 0;
  options.log = [&](kiln::LogLevel level, std::string_view message) {
    warnings += level == kiln::LogLevel::warning;
    std::printf("log: %.*s\n", static_cast<int>(message.size()), message.data());
  };
  kiln::set_options(options);

  kiln::GraphBuilder b("consumer_mlp");
  kiln::Tensor x = b.input("x", {4, 8}, kiln::DType::f32);
  kiln::Tensor w = b.input("w", {8, 3}, kiln::DType::f32);
  b.output(b.relu(b.add(b.matmul(x, w), 1.0)));
  kiln::Expected<kiln::Graph> graph = b.build();
  if (!graph) return std::fprintf(stderr, "build: %s\n", graph.error().message.c_str()), 1;

  std::vector<kiln::HostTensor> inputs = {{{4, 8}, kiln::DType::f32, std::vector<float>(32, 0.5f)},
                                          {{8, 3}, kiln::DType::f32, std::vector<float>(24, -0.25f)}};
  kiln::Expected<std::vector<kiln::HostTensor>> out = kiln::run_reference(*graph, inputs);
  if (!out) return std::fprintf(stderr, "reference: %s\n", out.error().message.c_str()), 1;
  // relu(8 * 0.5 * -0.25 + 1) = relu(0) = 0 everywhere
  for (float v : out->front().values)
    if (v != 0.0f) return std::fprintf(stderr, "reference: got %g, expected 0\n", v), 1;

  kiln::Expected<kiln::Executable> exe = kiln::Executable::compile(*graph, {.arch = "sm_90"});
  if (!exe) return std::fprintf(stderr, "compile: %s\n", exe.error().message.c_str()), 1;
  kiln::Expected<int> y = exe->output_index(graph->outputs().front().name);
  if (!y) return std::fprintf(stderr, "output_index: %s\n", y.error().message.c_str()), 1;
  std::printf("ok: hash %s, %zu kernels, workspace %zu bytes, output index %d, %d warnings\n", graph->hash().c_str(),
              exe->kernel_count(), exe->workspace_bytes(), *y, warnings);
  return 0;
}

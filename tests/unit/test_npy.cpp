// .npy reading and writing, and the random inputs of `kiln run --random`.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runtime/npy.h"
#include "runtime/random_inputs.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("kiln_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

// A hand-made .npy file (format 1.0) with the given header dict and raw data.
std::string make_npy(const std::string& name, const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << file << header << data;
  return path;
}

TEST(Npy, WritesAndReadsBack) {
  const std::string path = temp_path("roundtrip.npy");
  HostTensor t{{2, 3}, DType::f32, {1, -2, 3.5f, 0, 1e-3f, -7}};
  ASSERT_TRUE(write_npy(path, t).ok());
  Expected<HostTensor> back = read_npy(path, DType::f32);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->shape, t.shape);
  EXPECT_EQ(back->values, t.values);
  HostTensor b{{3}, DType::boolean, {1, 0, 1}};
  ASSERT_TRUE(write_npy(path, b).ok());
  EXPECT_EQ(read_npy(path, DType::boolean)->values, b.values);
  HostTensor scalar{{}, DType::f32, {42}};
  ASSERT_TRUE(write_npy(path, scalar).ok());
  EXPECT_EQ(read_npy(path, DType::f32)->values, scalar.values);
  std::remove(path.c_str());
}

TEST(Npy, ReadsBigEndianIntegersInFortranOrder) {
  // int16 big-endian, shape (2, 3), Fortran order: stored column by column.
  const int16_t logical[2][3] = {{1, 2, 3}, {-4, 5, 300}};
  std::string data;
  for (int c = 0; c < 3; ++c)
    for (int r = 0; r < 2; ++r) {
      const auto v = static_cast<uint16_t>(logical[r][c]);
      data += static_cast<char>(v >> 8);
      data += static_cast<char>(v & 0xff);
    }
  const std::string path = make_npy("be.npy", "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3), }", data);
  Expected<HostTensor> t = read_npy(path, DType::bf16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->values, (std::vector<float>{1, 2, 3, -4, 5, 300}));
  std::remove(path.c_str());
}

TEST(Npy, ConvertsToTheDeclaredDtype) {
  const double values[2] = {1.0 / 3.0, 70000.0};
  const std::string path = make_npy("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                                    std::string(reinterpret_cast<const char*>(values), sizeof values));
  Expected<HostTensor> t = read_npy(path, DType::f16);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->values[0], 0.333251953125f);                         // nearest f16
  EXPECT_EQ(t->values[1], std::numeric_limits<float>::infinity());  // overflows f16
  std::remove(path.c_str());
}

TEST(Npy, RejectsBadFiles) {
  const std::string short_data = make_npy("short.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", "abc");
  EXPECT_THAT(read_npy(short_data, DType::f32).error().message, ::testing::HasSubstr("holds 3 bytes of data"));
  const std::string complex = make_npy("c.npy", "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", "12345678");
  EXPECT_THAT(read_npy(complex, DType::f32).error().message, ::testing::HasSubstr("unsupported .npy dtype"));
  const std::string not_npy = temp_path("x.npy");
  std::ofstream(not_npy) << "hello world";
  EXPECT_THAT(read_npy(not_npy, DType::f32).error().message, ::testing::HasSubstr("not a .npy file"));
  // Empty, but its other dimensions' product overflows the strides (a fuzzer's find).
  const std::string huge_empty =
      make_npy("e.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 6, 8888888888, 88, 88888888, 2), }", "");
  EXPECT_THAT(read_npy(huge_empty, DType::f32).error().message, ::testing::HasSubstr("the array is too large"));
  const std::string empty = make_npy("z.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", "");
  ASSERT_TRUE(read_npy(empty, DType::f32).ok());
  EXPECT_EQ(read_npy(empty, DType::f32).value().values.size(), 0u);
  for (const auto& p : {short_data, complex, not_npy, huge_empty, empty}) std::remove(p.c_str());
}

TEST(RandomInputs, AreDeterministicAndFollowTheSpec) {
  Graph g = testing::must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [1000], "dtype": "bf16"},
    "mean": {"shape": [1000], "dtype": "f32"}, "var": {"shape": [1000], "dtype": "f32"},
    "m": {"shape": [1000], "dtype": "bool"}},
    "ops": [{"op": "batch_norm", "in": ["x", "mean", "var"], "out": "y", "axis": 0}], "outputs": ["y", "m"]})");
  auto a = random_inputs(g, 7), b = random_inputs(g, 7), c = random_inputs(g, 8);
  EXPECT_EQ(a[0].values, b[0].values);
  EXPECT_NE(a[0].values, c[0].values);
  // The values themselves, as every version has drawn them (the inputs are
  // drawn on several threads, each from its own stream): a reordering or a
  // changed stream shows here.
  EXPECT_EQ(a[0].values[0], 1.671875f);
  EXPECT_EQ(a[0].values[999], 1.1484375f);
  EXPECT_EQ(a[1].values[1], -0.9958745837211609f);
  EXPECT_EQ(a[2].values[2], 1.3502165079116821f);
  EXPECT_EQ(a[3].values[0], 1.0f);
  EXPECT_EQ(a[3].values[1], 0.0f);
  double sum = 0, sum_sq = 0;
  for (float v : a[0].values) {
    sum += v, sum_sq += v * v;
    EXPECT_EQ(v, round_from_f64(DType::bf16, v));  // held in bf16
  }
  EXPECT_NEAR(sum / 1000, 0.0, 0.15);
  EXPECT_NEAR(sum_sq / 1000, 1.0, 0.2);
  for (float v : a[2].values) EXPECT_GE(v, 0.5f);
  double ones = 0;
  for (float v : a[3].values) {
    EXPECT_TRUE(v == 0 || v == 1);
    ones += v;
  }
  EXPECT_NEAR(ones / 1000, 0.5, 0.08);
}

}  // namespace
}  // namespace kiln

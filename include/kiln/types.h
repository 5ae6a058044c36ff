// Element types and shapes, as graph-format.md defines them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// Storage types. Arithmetic is always f32 (graph-format.md, numerics rule 1).
enum class DType : uint8_t { f32, f16, bf16, boolean };

std::string_view to_string(DType dtype);             // "f32", "f16", "bf16", "bool"
std::optional<DType> parse_dtype(std::string_view);  // nullopt for unknown/reserved
int byte_size(DType dtype);
bool is_floating(DType dtype);

// A logical shape (row-major). Rank 0..8, every dimension >= 1.
using Shape = std::vector<int64_t>;
// Strides in elements, one per dimension, each >= 0.
using Strides = std::vector<int64_t>;

inline constexpr int kMaxRank = 8;
inline constexpr int64_t kMaxElements = int64_t{1} << 62;

int64_t element_count(const Shape& shape);  // shape must be valid
Strides contiguous_strides(const Shape& shape);
std::string to_string(const Shape& shape);  // "[32,56,56,128]"

}  // namespace kiln

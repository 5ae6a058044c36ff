#include "runtime/tensor_map.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::runtime {

Expected<CUtensorMap> encode_tensor_map(const Driver& cu, const codegen::TensorMapSpec& spec, CUdeviceptr pointer) {
  CUtensorMap map{};
  if (pointer % 16 != 0 || spec.offset_bytes % 16 != 0) return map;
  pointer += spec.offset_bytes;
  const auto rank = static_cast<cuuint32_t>(spec.rank);
  constexpr int kMax = codegen::TensorMapSpec::kMaxRank;
  cuuint64_t dims[kMax] = {}, strides[kMax - 1] = {};
  cuuint32_t box[kMax] = {}, element_strides[kMax] = {1, 1, 1, 1, 1};
  for (cuuint32_t d = 0; d < rank; ++d) dims[d] = spec.dims[d], box[d] = spec.box[d];
  for (cuuint32_t d = 0; d + 1 < rank; ++d) strides[d] = spec.strides[d];
  const CUtensorMapDataType type = spec.dtype == DType::bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : spec.dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                              : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const CUresult r = cu.cuTensorMapEncodeTiled(&map, type, rank, reinterpret_cast<void*>(pointer), dims, strides, box,
                                               element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (Status s = check(r, fmt::format("cuTensorMapEncodeTiled (rank {}, dims {}, box {})", rank,
                                      fmt::join(dims, dims + rank, " x "), fmt::join(box, box + rank, " x ")));
      !s)
    return s.error();
  return map;
}

}  // namespace kiln::runtime

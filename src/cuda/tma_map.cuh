/*
 * cuda/tma_map.cuh — tensor maps for the copy engine (TMA) of the sm90 kernels: the driver's
 * encoder reached through the runtime (the library links no libcuda), and the 4-D map of a
 * BSHD operand with 128-byte swizzled boxes. Definitions: tma_map.cu.
 */
#ifndef FA_CUDA_TMA_MAP_CUH
#define FA_CUDA_TMA_MAP_CUH

#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels.h"

namespace fa {
namespace sm90 {

/* cuTensorMapEncodeTiled, or NULL when this driver has none */
PFN_cuTensorMapEncodeTiled_v12000 encode_fn();

/* The 4-D map (d, head, token, batch) of a 16-bit (or FP8) BSHD operand, boxes of 128 bytes
   (64 columns, FP8 128) x `rows`
   with the 128-byte swizzle; boxes past the tensor's end are zero-filled. */
CUresult make_map(CUtensorMap *m, const fa_operand *op, fa_dtype dt, int64_t d, int64_t heads,
                  int64_t tokens, int64_t batch, int rows);

} // namespace sm90
} // namespace fa

#endif

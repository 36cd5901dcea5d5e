/* cuda/fwd_sm80_d64.cu — the sm80 forward kernels for head dim 64 (see fwd_sm80.cuh). */
#include "fwd_sm80.cuh"

namespace fa {
FA_FWD_SM80_DEFINE(__half, 64)
FA_FWD_SM80_DEFINE(__nv_bfloat16, 64)
} // namespace fa

/* cuda/fwd_sm80_d96.cu — the sm80 forward kernels for head dim 96 (see fwd_sm80.cuh). */
#include "fwd_sm80.cuh"

namespace fa {
FA_FWD_SM80_DEFINE(__half, 96)
FA_FWD_SM80_DEFINE(__nv_bfloat16, 96)
} // namespace fa

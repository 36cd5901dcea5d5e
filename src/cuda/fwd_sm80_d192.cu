/* cuda/fwd_sm80_d192.cu — the sm80 forward kernels for head dim 192 (see fwd_sm80.cuh). */
#include "fwd_sm80.cuh"

namespace fa {
FA_FWD_SM80_DEFINE(__half, 192)
FA_FWD_SM80_DEFINE(__nv_bfloat16, 192)
} // namespace fa

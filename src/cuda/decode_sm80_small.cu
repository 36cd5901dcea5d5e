/* cuda/decode_sm80_small.cu — decode kernels for head dims 32, 64, 96 (see decode_sm80.cuh). */
#include "decode_sm80.cuh"

namespace fa {
FA_DECODE_SM80_DEFINE(__half, 32)
FA_DECODE_SM80_DEFINE(__nv_bfloat16, 32)
FA_DECODE_SM80_DEFINE(__half, 64)
FA_DECODE_SM80_DEFINE(__nv_bfloat16, 64)
FA_DECODE_SM80_DEFINE(__half, 96)
FA_DECODE_SM80_DEFINE(__nv_bfloat16, 96)
} // namespace fa

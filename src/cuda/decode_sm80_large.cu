/* cuda/decode_sm80_large.cu — decode kernels for head dims 128, 192, 256 (see decode_sm80.cuh). */
#include "decode_sm80.cuh"

namespace fa {
FA_DECODE_SM80_DEFINE(__half, 128)
FA_DECODE_SM80_DEFINE(__nv_bfloat16, 128)
FA_DECODE_SM80_DEFINE(__half, 192)
FA_DECODE_SM80_DEFINE(__nv_bfloat16, 192)
FA_DECODE_SM80_DEFINE(__half, 256)
FA_DECODE_SM80_DEFINE(__nv_bfloat16, 256)
} // namespace fa

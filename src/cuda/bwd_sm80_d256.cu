/* cuda/bwd_sm80_d256.cu — the sm80 backward kernels for head dim 256 (see bwd_sm80.cu). */
#include "bwd_sm80_run.cuh"

FA_BWD_RUN_DEFINE(256)

/* cuda/bwd_sm80_d96.cu — the sm80 backward kernels for head dim 96 (see bwd_sm80.cu). */
#include "bwd_sm80_run.cuh"

FA_BWD_RUN_DEFINE(96)

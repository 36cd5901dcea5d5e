/*
 * cuda/tma_map.cu — see tma_map.cuh.
 */
#include "tma_map.cuh"

namespace fa {
namespace sm90 {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

CUresult make_map(CUtensorMap *m, const fa_operand *op, fa_dtype dt, int64_t d, int64_t heads,
                  int64_t tokens, int64_t batch, int rows) {
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)heads, (cuuint64_t)tokens,
                                (cuuint64_t)batch};
    /* a dimension of length 1 is never stepped, and its stride may come as anything (0
       included, which the encoder refuses): give it the packed one */
    const int64_t sh = heads > 1 ? op->sh : d, sb = batch > 1 ? op->sb : op->st * tokens;
    /* FP8: one byte an element, so a 128-byte box row holds 128 columns */
    const bool f8 = dt == FA_DTYPE_F8_E4M3 || dt == FA_DTYPE_F8_E5M2;
    const int64_t es = f8 ? 1 : 2;
    const cuuint64_t strides[3] = {(cuuint64_t)(sh * es), (cuuint64_t)(op->st * es),
                                   (cuuint64_t)(sb * es)};
    const cuuint32_t box[4] = {(cuuint32_t)(128 / es), 1, (cuuint32_t)rows, 1},
                     estr[4] = {1, 1, 1, 1};
    const CUtensorMapDataType type = f8                    ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                     : dt == FA_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return encode_fn()(m, type, 4, op->data, dims, strides, box, estr,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

} // namespace sm90
} // namespace fa

// Matrix products through cuBLASLt. Our tensors are row-major and cuBLASLt's layouts
// column-major: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so the
// call swaps the operands and passes each one's row-major layout as its transposed column-major
// one. float32 computes in float32 (CUBLAS_COMPUTE_32F, no TF32): results match the CPU kernels
// to float rounding; float16 and bfloat16 accumulate in float32.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backends/cuda/kernels.h"
#include "backends/cuda/runtime.h"

namespace onnxtrain::cuda {
namespace {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) OT_THROW(kRuntime, "cuBLASLt ", what, ": ", cublasLtGetStatusString(st));
}

cudaDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
    default: OT_THROW(kNotImplemented, "CUDA matrix product: no cuBLASLt kernel for dtype ", dtype_name(dt));
  }
}

// Owns the descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A column-major rows x cols layout with leading dimension ld, `batch` of them `stride` apart.
cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count), "batch count");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
             "batch stride");
  }
  return l;
}

// The largest power of two up to 256 that divides the address of every matrix of a batch: the
// first one's and, with more than one, their distance apart (stride elements of elem_bytes each).
uint32_t alignment_of(const void* p, int64_t batch = 1, int64_t stride = 0, size_t elem_bytes = 0) {
  uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (batch > 1) at |= uintptr_t(stride) * elem_bytes;  // a stride of 0 (broadcast) adds nothing
  uint32_t a = 256;
  while (a > 1 && at % a != 0) a /= 2;
  return a;
}

}  // namespace

void gemm(const GemmDesc& d, const void* a, const void* b, void* c, void* stream) {
  if (d.m == 0 || d.n == 0 || d.batch == 0) return;
  const cudaDataType_t type = data_type(d.dtype);
  cublasLtHandle_t handle = static_cast<cublasLtHandle_t>(cublaslt_handle());
  Descriptors desc;
  check_lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // Swapped: the first operand is our B, the second our A.
  const cublasOperation_t op_first = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second), "transb");
  if (d.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), "epilogue");
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &d.bias, sizeof d.bias), "bias");
    const cudaDataType_t bias_type = type;
    check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
             "bias type");
  }
  // Our B (row-major k x n, or n x k transposed) is column-major n x k (k x n) with ld n (k).
  desc.a = d.trans_b ? layout(type, d.k, d.n, d.k, d.batch, d.stride_b) : layout(type, d.n, d.k, d.n, d.batch, d.stride_b);
  desc.b = d.trans_a ? layout(type, d.m, d.k, d.m, d.batch, d.stride_a) : layout(type, d.k, d.m, d.k, d.batch, d.stride_a);
  desc.c = layout(type, d.n, d.m, d.n, d.batch, d.stride_c);

  size_t workspace_bytes = 0;
  void* workspace = cublaslt_workspace(&workspace_bytes);
  check_lt(cublasLtMatmulPreferenceCreate(&desc.pref), "cublasLtMatmulPreferenceCreate");
  check_lt(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes), "workspace preference");
  // cuBLASLt assumes 256-byte aligned operands unless told otherwise: arena views are 64-byte
  // aligned and the per-product pointers of a broadcast batch may be less.
  // A strided batch's later matrices lie stride elements on: the stride bounds their alignment too.
  const size_t elem = dtype_size(d.dtype);
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> operands[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(b, d.batch, d.stride_b, elem)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(a, d.batch, d.stride_a, elem)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(c, d.batch, d.stride_c, elem)},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(c, d.batch, d.stride_c, elem)}};
  for (const auto& [attribute, alignment] : operands) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(desc.pref, attribute, &alignment, sizeof alignment), "alignment");
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.c, desc.c, desc.pref, 1, &heuristic,
                                          &found), "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    OT_THROW(kNotImplemented, "cuBLASLt has no algorithm for a ", dtype_name(d.dtype), " product [", d.m, ", ", d.k,
             "] x [", d.k, ", ", d.n, "] (batch ", d.batch, ")");
  check_lt(cublasLtMatmul(handle, desc.op, &d.alpha, b, desc.a, a, desc.b, &d.beta, c, desc.c, c, desc.c,
                          &heuristic.algo, workspace, workspace_bytes, static_cast<cudaStream_t>(stream)),
           "cublasLtMatmul");
}

}  // namespace onnxtrain::cuda

// Batched matrix multiplication for every CPU op that needs one (MatMul, Gemm, Einsum, and the
// autodiff MatMul-with-transposes ops):
//
//   C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b]   (+ bias row)
//
// with numpy broadcasting over the batch dims. fp32, and bf16 / fp16 where the CPU has native
// kernels for them (matmul_native), run through oneDNN's matmul primitive, built once per
// MatmulDims (JIT, ~4 ms) and reused; the half types accumulate in fp32 inside the primitive.
// Small fp32 products (portable.h) and every product of the minimal build (gemm_minimal.cc) run
// through the blocked kernels of sgemm_blocked.h; the minimal build has no native half kernels.
// Transposed operands are read through strides, never copied. Other dtypes use matmul_reference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/shape_cache.h"
#include "core/dispatch.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {

struct MatmulDims {
  Shape a_batch, b_batch;  // same length; each pair of dims equal or one of them 1
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;    // A[b] is stored [k, m] row-major (read as its transpose)
  bool trans_b = false;    // B[b] is stored [n, k] row-major
  float alpha = 1.0f;
  float beta = 0.0f;       // != 0: C's existing contents are scaled by beta and accumulated
  bool bias = false;       // add a length-n row vector to every output row (fp32: fused)
  bool b_constant = false; // B never changes at its address (an initializer): packed once into
                           // the backend's preferred layout and reused, as ONNX Runtime prepacks
  DType dtype = DType::kFloat32;  // of A, B, C and bias: kFloat32, or a half type matmul_native() takes
  // C's dtype when it is not `dtype`: kFloat32 for half A and B (oneDNN writes its fp32
  // accumulator out unrounded: a Cast to fp32 after the product, folded into it).
  DType out_dtype = DType::kUndefined;
  DType c_dtype() const { return out_dtype == DType::kUndefined ? dtype : out_dtype; }

  Shape out_batch() const;  // broadcast of a_batch and b_batch
  int64_t batch_count() const;
  std::vector<int64_t> key() const;
};

// The instruction set the matmul kernels dispatch to (oneDNN's, or the blocked kernels' vector width).
std::string matmul_isa();

// Whether the backend has a native matmul kernel for dtype on this CPU (fp32 always; bf16 with
// AVX512-BF16 or AMX; fp16 with AVX512-FP16 or AMX-FP16). Probed once per dtype.
bool matmul_native(DType dtype);

// One prepared matmul in dims.dtype. Thread-compatible: run() may be called repeatedly with new
// pointers (to elements of dims.dtype).
class Matmul {
 public:
  Matmul(const MatmulDims& dims, const std::string& context);
  void run(const void* a, const void* b, void* c, const void* bias = nullptr) const;
  const MatmulDims& dims() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Element offsets of A, B and C for each product of [a_batch..., m, k] x [b_batch..., k, n] (numpy
// broadcasting over the batch dims; C is dense [out_batch..., m, n]).
struct BatchOffsets {
  std::vector<int64_t> a, b, c;
};
BatchOffsets batch_offsets(const Shape& a_batch, const Shape& b_batch, int64_t m, int64_t n, int64_t k);

// Matmuls by shape, for a kernel that sees a few shapes over its life.
class MatmulCache {
 public:
  explicit MatmulCache(size_t capacity = 16) : cache_(capacity) {}
  const Matmul& get(const MatmulDims& dims, const std::string& context);

 private:
  ShapeCache<Matmul> cache_;
};

// fp32 matmul through a per-thread cache of primitives (for callers without kernel state).
void matmul(const MatmulDims& dims, const float* a, const float* b, float* c,
            const float* bias = nullptr, const std::string& context = "");

// Any numeric dtype; accumulates in compute_t<T>. Correct for every MatmulDims, not fast.
template <typename T>
void matmul_reference(const MatmulDims& d, const T* a, const T* b, T* c, const T* bias = nullptr) {
  using C = compute_t<T>;
  Shape ob = d.out_batch();
  size_t rank = ob.size();
  int64_t batches = d.batch_count();
  std::vector<int64_t> as(rank), bs(rank);
  int64_t sa = d.m * d.k, sb = d.k * d.n;
  for (size_t i = rank; i-- > 0;) {
    as[i] = d.a_batch[i] == 1 ? 0 : sa;
    bs[i] = d.b_batch[i] == 1 ? 0 : sb;
    sa *= d.a_batch[i];
    sb *= d.b_batch[i];
  }
  // A(i, kk) and B(kk, j) through the transposes.
  int64_t a_ri = d.trans_a ? 1 : d.k, a_rk = d.trans_a ? d.m : 1;
  int64_t b_rk = d.trans_b ? 1 : d.n, b_rj = d.trans_b ? d.k : 1;
  int64_t rows = batches * d.m;
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.n * d.k));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<C> acc(size_t(d.n));
    for (int64_t r = begin; r < end; ++r) {
      int64_t bi = r / d.m, i = r % d.m;
      int64_t ao = 0, bo = 0, rem = bi;
      for (size_t x = rank; x-- > 0;) {
        int64_t idx = rem % ob[x];
        rem /= ob[x];
        ao += idx * as[x];
        bo += idx * bs[x];
      }
      std::fill(acc.begin(), acc.end(), C(0));
      const T* arow = a + ao + i * a_ri;
      const T* bmat = b + bo;
      for (int64_t kk = 0; kk < d.k; ++kk) {
        C av = C(arow[kk * a_rk]);
        const T* brow = bmat + kk * b_rk;
        for (int64_t j = 0; j < d.n; ++j) acc[size_t(j)] += av * C(brow[j * b_rj]);
      }
      T* crow = c + r * d.n;
      for (int64_t j = 0; j < d.n; ++j) {
        C v = acc[size_t(j)];
        if (d.alpha != 1.0f) v = C(v * C(d.alpha));
        if (d.beta != 0.0f) v = C(v + C(d.beta) * C(crow[j]));
        if (d.bias && bias) v = C(v + C(bias[j]));
        crow[j] = T(v);
      }
    }
  });
}

}  // namespace onnxtrain::cpu

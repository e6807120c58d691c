// The CUDA backend's kernels: plain functions over device pointers, queued on a stream (a
// cudaStream_t passed as void*). Op files (src/ops/*) wrap them as their ops' CUDA kernels inside
// `#if ONNXTRAIN_CUDA`; this header needs no CUDA header, so the host compiler reads it.
// Matrix products go through cuBLASLt (gemm.cc); the rest are the few kernel families no library
// provides, one file each: elementwise.cu, copy.cu, gather.cu, reduce.cu, softmax.cu,
// layer_norm.cu, cross_entropy.cu, adamw.cu. Floating-point kernels take float32, float16 and bfloat16 and
// compute in float.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device_update.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::cuda {

// ---- gemm.cc: C[b] = alpha op(A[b]) op(B[b]) + beta C[b] (+ bias row), row-major, `batch`
// products at the given element strides (0: the operand is shared by every product).
struct GemmDesc {
  DType dtype = DType::kFloat32;   // A, B and C alike; float32 computes in float32 (no TF32)
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1, beta = 0;
  const void* bias = nullptr;      // [n], added to every row by cuBLASLt's bias epilogue
};
void gemm(const GemmDesc& d, const void* a, const void* b, void* c, void* stream);

// ---- elementwise.cu: one broadcasting kernel family. Shapes follow numpy's broadcasting: each
// input's shape is right-aligned against the output's, and dims of 1 repeat.
// kReluGrad(dy, y) = y > 0 ? dy : 0; kGeluGrad(dy, x) = dy gelu'(x), kGeluTanhGrad its tanh form.
enum class Binary { kAdd, kSub, kMul, kDiv, kReluGrad, kGeluGrad, kGeluTanhGrad };
// kGelu: 0.5 x (1 + erf(x / sqrt 2)); kGeluTanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
enum class Unary { kCopy, kNeg, kAbs, kRelu, kExp, kLog, kSqrt, kReciprocal, kTanh, kSigmoid, kErf, kGelu, kGeluTanh };
// Whether the family computes `dtype` (floating types, int32 and int64; kDiv of integers by 0
// gives 0 as the CPU kernel does).
bool elementwise_supports(DType dtype);
void binary(Binary op, DType dtype, const void* a, const Shape& a_shape, const void* b, const Shape& b_shape,
            void* out, const Shape& out_shape, void* stream);
// bytes of zeros at p.
void memset_zero(void* p, size_t bytes, void* stream);
// out = op(x) with x broadcast to out_shape (kCopy: a broadcasting copy).
void unary(Unary op, DType dtype, const void* x, const Shape& x_shape, void* out, const Shape& out_shape, void* stream);

// ---- copy.cu: for every index c of `shape`, dst[dst_offset + sum_d c_d dst_strides_d] =
// src[src_offset + sum_d c_d src_strides_d], in elements of element_size bytes (any dtype). Strides
// may be 0 (a broadcast read) or negative (a reversed Slice); every offset reached must lie in its
// tensor. Rank at most kCopyMaxRank.
constexpr int kCopyMaxRank = 8;
struct StridedCopy {
  Shape shape;
  std::vector<int64_t> src_strides, dst_strides;
  int64_t src_offset = 0, dst_offset = 0;
};
void strided_copy(size_t element_size, const void* src, void* dst, const StridedCopy& c, void* stream);

// ---- gather.cu, data viewed as [outer, dim, inner]; `indices` are n host values in [0, dim).
// out [outer, n, inner] = data[:, indices, :] (any dtype: element_size bytes).
void gather(size_t element_size, const void* data, const int64_t* indices, void* out, int64_t n, int64_t outer,
            int64_t dim, int64_t inner, void* stream);
// dx [outer, dim, inner] = zeros, then dx[:, indices[j], :] += dy[:, j, :] (dy [outer, n, inner]),
// repeated indices summed in ascending j, in float, without atomics: deterministic.
void gather_grad(DType dtype, const void* dy, const int64_t* indices, void* dx, int64_t n, int64_t outer, int64_t dim,
                 int64_t inner, void* stream);

// ---- reduce.cu: out[o, i] = scale * sum_r x[o, r, i], x viewed as [outer, reduced, inner].
void reduce_sum(DType dtype, const void* x, void* out, int64_t outer, int64_t reduced, int64_t inner, float scale,
                void* stream);

// ---- softmax.cu, x viewed as [outer, n, inner] with the softmax along n.
void softmax(bool log, DType dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, void* stream);
// dx = y (dy - sum(dy y)) for softmax; dx = dy - exp(y) sum(dy) for log-softmax.
void softmax_grad(bool log, DType dtype, const void* dy, const void* y, void* dx, int64_t outer, int64_t n,
                  int64_t inner, void* stream);

// ---- layer_norm.cu over rows of d elements; scale and bias (bias may be null) have d elements;
// mean and inv_std (float, may be null) one per row.
void layer_norm(DType dtype, const void* x, const void* scale, const void* bias, void* y, float* mean, float* inv_std,
                int64_t rows, int64_t d, float eps, void* stream);
// dx, and (when not null) dscale and dbias summed over rows. mean and inv_std: the forward's, or
// null to recompute them.
void layer_norm_grad(DType dtype, const void* dy, const void* x, const void* scale, const float* mean,
                     const float* inv_std, void* dx, void* dscale, void* dbias, int64_t rows, int64_t d, float eps,
                     void* stream);

// ---- cross_entropy.cu: softmax cross-entropy over log_prob [n, c, d] (log_softmax along c, from
// softmax()) and int64 labels [n, d], without class weights. `ignore` is the ignore_index, or
// INT64_MIN for none. reduction: 0 none (loss [n, d]), 1 sum, 2 mean over the targets kept.
// *bad_label (device int) is set to 1 when a label is outside [0, c) and not ignored.
void nll_loss(DType dtype, const void* log_prob, const int64_t* labels, void* loss, int64_t n, int64_t c, int64_t d,
              int64_t ignore, int reduction, int* bad_label, void* stream);
// dx = (exp(log_prob) - onehot(label)) * dloss' (0 for ignored targets), dloss' = dloss[t] for
// reduction none, dloss for sum, dloss / (targets kept) for mean. dloss is on the device.
void nll_loss_grad(DType dtype, const void* dloss, const void* log_prob, const int64_t* labels, void* dx, int64_t n,
                   int64_t c, int64_t d, int64_t ignore, int reduction, int* bad_label, void* stream);

// The fused output layer (LinearSoftmaxCrossEntropy), float32: A [rows, k], B [k, c] ([c, k] with
// trans_b), bias [c] or null; `kept` the rows that count (host, ascending), `labels` theirs (host,
// in [0, c)). loss = scale * sum over kept r of (logsumexp(z_r) - z_r[label_r]), z_r = A_r op(B) +
// bias, and, each where not null, the unit gradients for dz_r = scale (softmax(z_r) - onehot):
// da [rows, k] = dz op(B)^T (0 for rows not kept), db (B's shape), dbias [c] = sum_r dz_r.
struct LinearCrossEntropyDesc {
  int64_t rows = 0, k = 0, c = 0;
  bool trans_b = false;
  float scale = 1;
};
void linear_cross_entropy(const LinearCrossEntropyDesc& d, const float* a, const float* b, const float* bias,
                          const std::vector<int64_t>& kept, const std::vector<int64_t>& labels, float* loss, float* da,
                          float* db, float* dbias, void* stream);

// ---- adamw.cu: one multi-tensor AdamW update of float32 tensors in place (torch.optim.AdamW,
// or transformers' AdamW when hf), with gradient clipping to max_grad_norm over all gradients
// together (0: none); the norm and the clip coefficient stay on the device.
using AdamWConfig = DeviceAdamW;  // core/device_update.h: what a device Module's Optimizer asks for
void adamw(const AdamWConfig& cfg, const std::vector<float*>& params, const std::vector<const float*>& grads,
           const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
           const std::vector<int64_t>& sizes, void* stream);

}  // namespace onnxtrain::cuda

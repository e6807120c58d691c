// Softmax cross-entropy's loss and gradient from log_prob [n, c, d] (softmax.cu's log-softmax
// along c) and labels [n, d], without class weights:
//   loss[t] = -log_prob[t, label[t]]  (0 where label == ignore_index), reduced by none/sum/mean
//   dx[t, k] = (exp(log_prob[t, k]) - [k == label[t]]) * dloss'  (0 for ignored targets)
// Sums over targets run in one block, so the order of additions is fixed from run to run. And the
// fused output layer (LinearSoftmaxCrossEntropy): chunks of rows gathered, their logits and
// products through cuBLASLt, each row's loss and dz from its float32 logits by a block, in place.
#include <algorithm>
#include <limits>
#include <optional>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 1024;

// The label of target t (n * d + j), or -1 when ignored; flags labels outside [0, c).
__device__ __forceinline__ int64_t label_of(const int64_t* labels, int64_t t, int64_t c, int64_t ignore, int* bad) {
  const int64_t l = labels[t];
  if (l == ignore) return -1;
  if (l < 0 || l >= c) {
    *bad = 1;
    return -1;
  }
  return l;
}

template <typename T>
__global__ void nll_none_kernel(const T* logp, const int64_t* labels, T* loss, int64_t targets, int64_t c, int64_t d,
                                int64_t ignore, int* bad) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < targets; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = label_of(labels, t, c, ignore, bad);
    const int64_t n = t / d, j = t % d;
    loss[t] = from_float<T>(l < 0 ? 0.0f : -to_float(logp[(n * c + l) * d + j]));
  }
}

// One block: the summed loss (mean: over the targets kept) into loss[0]; the count into *kept.
// The count is an integer (a float count stops at 2^24 targets).
template <typename T>
__global__ void nll_reduce_kernel(const T* logp, const int64_t* labels, T* loss, unsigned long long* kept_out,
                                  int64_t targets, int64_t c, int64_t d, int64_t ignore, int mean, int* bad) {
  __shared__ float shared[32];
  __shared__ unsigned long long kept_total;
  if (threadIdx.x == 0) kept_total = 0;
  float sum = 0;
  unsigned long long kept = 0;
  for (int64_t t = threadIdx.x; t < targets; t += blockDim.x) {
    const int64_t l = label_of(labels, t, c, ignore, bad);
    if (l < 0) continue;
    const int64_t n = t / d, j = t % d;
    sum -= to_float(logp[(n * c + l) * d + j]);
    kept += 1;
  }
  sum = block_reduce<false>(sum, shared);  // its __syncthreads orders kept_total's reset before the adds
  atomicAdd(&kept_total, kept);
  __syncthreads();
  if (threadIdx.x == 0) {
    if (loss) loss[0] = from_float<T>(mean ? sum / float(kept_total) : sum);
    if (kept_out) *kept_out = kept_total;
  }
}

template <typename T>
__global__ void nll_grad_kernel(const T* dloss, const T* logp, const int64_t* labels, T* dx,
                                const unsigned long long* kept, int64_t n, int64_t c, int64_t d, int64_t ignore,
                                int reduction, int* bad) {
  const int64_t total = n * c * d;
  const float scale = reduction == 0 ? 1.0f : to_float(dloss[0]) / (reduction == 2 ? float(*kept) : 1.0f);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % d, k = (i / d) % c, b = i / (c * d), t = b * d + j;
    const int64_t l = label_of(labels, t, c, ignore, bad);
    float g = 0;
    if (l >= 0) g = (expf(to_float(logp[i])) - (k == l ? 1.0f : 0.0f)) * (reduction == 0 ? to_float(dloss[t]) : scale);
    dx[i] = from_float<T>(g);
  }
}

// A block per row of z [m, c]: row_loss[i] = logsumexp(z_i) - z_i[l], l = labels[i]; with want_dz,
// z_i = f (softmax(z_i) - onehot(l)).
__global__ void softmax_cross_entropy_rows_kernel(float* z, const int64_t* labels, float* row_loss, int64_t c, float f,
                                                  int want_dz) {
  __shared__ float shared[32];
  float* zi = z + int64_t(blockIdx.x) * c;
  const int64_t l = labels[blockIdx.x];
  const float zl = zi[l];  // read before any thread overwrites z_i (the reductions below synchronise)
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) mx = fmaxf(mx, zi[j]);
  mx = block_reduce<true>(mx, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += expf(zi[j] - mx);
  sum = block_reduce<false>(sum, shared);
  if (threadIdx.x == 0) row_loss[blockIdx.x] = mx + logf(sum) - zl;
  if (!want_dz) return;
  const float scale = f / sum;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) zi[j] = expf(zi[j] - mx) * scale;
  __syncthreads();
  if (threadIdx.x == 0) zi[l] -= f;
}

}  // namespace

// The logits of a chunk take about this many bytes (the chunk is at least 32 rows).
constexpr int64_t kChunkBytes = int64_t(64) << 20;

void linear_cross_entropy(const LinearCrossEntropyDesc& d, const float* a, const float* b, const float* bias,
                          const std::vector<int64_t>& kept, const std::vector<int64_t>& labels, float* loss, float* da,
                          float* db, float* dbias, void* stream) {
  const cudaStream_t s = as_stream(stream);
  const int64_t n = int64_t(kept.size()), k = d.k, c = d.c;
  const bool want_dz = da || db || dbias;
  if (db) memset_zero(db, size_t(k * c) * sizeof(float), stream);  // summed into chunk by chunk
  if (dbias) memset_zero(dbias, size_t(c) * sizeof(float), stream);
  const int64_t chunk = std::min(n, std::max<int64_t>(32, kChunkBytes / std::max<int64_t>(1, c * int64_t(sizeof(float)))));
  OT_CHECK(chunk <= std::numeric_limits<int32_t>::max(), "CUDA LinearSoftmaxCrossEntropy: ", chunk, " rows in a chunk");
  StreamBuffer<int64_t> d_labels(size_t(std::max<int64_t>(n, 1)), s);
  if (n) check(cudaMemcpyAsync(d_labels.get(), labels.data(), size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice, s),
               "cudaMemcpyAsync (labels)");  // pageable: returns once staged, so `labels` may go
  StreamBuffer<float> row_loss(size_t(std::max<int64_t>(n, 1)), s), a_rows(size_t(std::max<int64_t>(chunk * k, 1)), s),
      z(size_t(std::max<int64_t>(chunk * c, 1)), s), da_rows(da ? size_t(std::max<int64_t>(n * k, 1)) : 1, s),
      dbias_chunk(dbias ? size_t(c) : 1, s);
  auto product = [&](int64_t m, int64_t cols, int64_t inner, bool ta, bool tb, float beta, const float* pa,
                     const float* pb, float* pc, const float* with_bias) {
    GemmDesc g;
    g.m = m, g.n = cols, g.k = inner, g.trans_a = ta, g.trans_b = tb, g.beta = beta, g.bias = with_bias;
    gemm(g, pa, pb, pc, stream);
  };
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t m = std::min(chunk, n - start);
    gather(sizeof(float), a, kept.data() + start, a_rows.get(), m, 1, d.rows, k, stream);
    // z = A_rows op(B) + bias: [m, C]; then each row's loss, and z overwritten with dz.
    product(m, c, k, false, d.trans_b, 0.0f, a_rows.get(), b, z.get(), bias);
    softmax_cross_entropy_rows_kernel<<<unsigned(m), kThreads, 0, s>>>(z.get(), d_labels.get() + start,
                                                                       row_loss.get() + start, c, d.scale, want_dz);
    check_launch("softmax_cross_entropy_rows");
    if (da)  // dA1 rows = dz op(B)^T: [m, K]
      product(m, k, c, false, !d.trans_b, 0.0f, z.get(), b, da_rows.get() + start * k, nullptr);
    if (db) {  // transB: dB1 [C, K] += dz^T A_rows; else dB1 [K, C] += A_rows^T dz
      if (d.trans_b) product(c, k, m, true, false, 1.0f, z.get(), a_rows.get(), db, nullptr);
      else product(k, c, m, true, false, 1.0f, a_rows.get(), z.get(), db, nullptr);
    }
    if (dbias) {  // dbias1 += the column sums of dz
      reduce_sum(DType::kFloat32, z.get(), dbias_chunk.get(), 1, m, c, 1.0f, stream);
      const Shape cs{c};
      binary(Binary::kAdd, DType::kFloat32, dbias, cs, dbias_chunk.get(), cs, dbias, cs, stream);
    }
  }
  // The kept rows are distinct: GatherGrad's scatter writes each one's dA1 row, zeros elsewhere.
  if (da) gather_grad(DType::kFloat32, da_rows.get(), kept.data(), da, n, 1, d.rows, k, stream);
  reduce_sum(DType::kFloat32, row_loss.get(), loss, 1, n, 1, d.scale, stream);  // one ordered sum
}

void nll_loss(DType dtype, const void* log_prob, const int64_t* labels, void* loss, int64_t n, int64_t c, int64_t d,
              int64_t ignore, int reduction, int* bad_label, void* stream) {
  const cudaStream_t s = as_stream(stream);
  dispatch_floating(dtype, "CUDA SoftmaxCrossEntropyLoss", [&]<typename T>() {
    auto lp = static_cast<const T*>(log_prob);
    auto out = static_cast<T*>(loss);
    if (reduction == 0) {
      if (n * d != 0) nll_none_kernel<T><<<blocks_for(n * d, 256), 256, 0, s>>>(lp, labels, out, n * d, c, d, ignore, bad_label);
    } else {
      nll_reduce_kernel<T><<<1, kThreads, 0, s>>>(lp, labels, out, nullptr, n * d, c, d, ignore, reduction == 2, bad_label);
    }
  });
  check_launch("nll_loss");
}

void nll_loss_grad(DType dtype, const void* dloss, const void* log_prob, const int64_t* labels, void* dx, int64_t n,
                   int64_t c, int64_t d, int64_t ignore, int reduction, int* bad_label, void* stream) {
  const cudaStream_t s = as_stream(stream);
  std::optional<StreamBuffer<unsigned long long>> kept_buffer;
  unsigned long long* kept = reduction == 2 ? kept_buffer.emplace(1, s).get() : nullptr;
  dispatch_floating(dtype, "CUDA SoftmaxCrossEntropyLossGrad", [&]<typename T>() {
    auto lp = static_cast<const T*>(log_prob);
    if (kept) nll_reduce_kernel<T><<<1, kThreads, 0, s>>>(lp, labels, nullptr, kept, n * d, c, d, ignore, 1, bad_label);
    if (n * c * d != 0)
      nll_grad_kernel<T><<<blocks_for(n * c * d, 256), 256, 0, s>>>(static_cast<const T*>(dloss), lp, labels,
                                                                   static_cast<T*>(dx), kept, n, c, d, ignore,
                                                                   reduction, bad_label);
  });
  check_launch("nll_loss_grad");
}

}  // namespace onnxtrain::cuda

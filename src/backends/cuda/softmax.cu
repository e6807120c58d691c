// Softmax and log-softmax along n of [outer, n, inner], forward and backward: a block per
// (outer, inner) line. The forward passes over the line twice: the running max and the sum of
// exponentials scaled to it (online softmax: sum' = sum * exp(max - max') + exp(x - max')), then
// the output. A line of a large vocabulary does not stay in L2, so each pass is a read from memory;
// a contiguous line (inner 1) is read in 16-byte packs.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;

// The running (max, sum of exp(x - max)) of one thread, and the merge of two.
struct MaxSum {
  float max = -INFINITY, sum = 0;
  __device__ void add(float x) {
    if (x > max) {  // exp(-inf) is 0: the first finite x starts the sum at 1
      sum = sum * expf(max - x) + 1.0f;
      max = x;
    } else if (!(x == -INFINITY && max == -INFINITY)) {  // a NaN x makes the sum NaN, as in two passes
      sum += expf(x - max);
    }
  }
  __device__ void merge(float other_max, float other_sum) {
    const float m = fmaxf(max, other_max);
    if (m == -INFINITY) return;  // both empty so far
    sum = (max == -INFINITY ? 0.0f : sum * expf(max - m)) + (other_max == -INFINITY ? 0.0f : other_sum * expf(other_max - m));
    max = m;
  }
};

// The line's MaxSum, to every thread of the block; `shared` holds 64 floats.
__device__ MaxSum block_max_sum(MaxSum v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v.merge(__shfl_xor_sync(0xffffffffu, v.max, o), __shfl_xor_sync(0xffffffffu, v.sum, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) {
    shared[warp] = v.max;
    shared[32 + warp] = v.sum;
  }
  __syncthreads();
  MaxSum w;
  if (lane < warps) w = MaxSum{shared[lane], shared[32 + lane]};
  for (int o = 16; o > 0; o >>= 1) w.merge(__shfl_xor_sync(0xffffffffu, w.max, o), __shfl_xor_sync(0xffffffffu, w.sum, o));
  return w;
}

// A contiguous line of n elements in 16-byte packs among the block's threads: fn(i, x[i]) for
// every element, the ones before the first aligned element and after the last whole pack singly.
template <typename T, typename Fn>
__device__ __forceinline__ void for_each_in_line(const T* x, int64_t n, Fn&& fn) {
  constexpr int kSize = Pack<T>::kSize;
  const int64_t head = min(n, int64_t((16 - reinterpret_cast<uintptr_t>(x) % 16) % 16 / sizeof(T)));
  const int64_t packs = (n - head) / kSize, tail = head + packs * kSize;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) fn(i, to_float(x[i]));
  const Pack<T>* px = reinterpret_cast<const Pack<T>*>(x + head);
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T> v = px[p];
#pragma unroll
    for (int k = 0; k < kSize; ++k) fn(head + p * kSize + k, to_float(v.v[k]));
  }
  for (int64_t i = tail + threadIdx.x; i < n; i += blockDim.x) fn(i, to_float(x[i]));
}

// y[i] = fn(x[i]) over a contiguous line; packs of y too where it is aligned as x is.
template <typename T, typename Fn>
__device__ __forceinline__ void map_line(const T* x, T* y, int64_t n, Fn&& fn) {
  if ((reinterpret_cast<uintptr_t>(y) - reinterpret_cast<uintptr_t>(x)) % 16 != 0)
    return for_each_in_line(x, n, [&](int64_t i, float v) { y[i] = from_float<T>(fn(v)); });
  constexpr int kSize = Pack<T>::kSize;
  const int64_t head = min(n, int64_t((16 - reinterpret_cast<uintptr_t>(x) % 16) % 16 / sizeof(T)));
  const int64_t packs = (n - head) / kSize, tail = head + packs * kSize;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) y[i] = from_float<T>(fn(to_float(x[i])));
  const Pack<T>* px = reinterpret_cast<const Pack<T>*>(x + head);
  Pack<T>* py = reinterpret_cast<Pack<T>*>(y + head);
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T> v = px[p];
    Pack<T> out;
#pragma unroll
    for (int k = 0; k < kSize; ++k) out.v[k] = from_float<T>(fn(to_float(v.v[k])));
    py[p] = out;
  }
  for (int64_t i = tail + threadIdx.x; i < n; i += blockDim.x) y[i] = from_float<T>(fn(to_float(x[i])));
}

// inner == 1: a block per contiguous line of n, in packs.
template <bool kLog, typename T>
__global__ void softmax_contiguous_kernel(const T* x, T* y, int64_t n) {
  __shared__ float shared[64];
  const T* xl = x + blockIdx.x * n;
  MaxSum part;
  for_each_in_line(xl, n, [&](int64_t, float v) { part.add(v); });
  const MaxSum line = block_max_sum(part, shared);
  const float mx = line.max, log_sum = logf(line.sum), inv = 1.0f / line.sum;
  map_line(xl, y + blockIdx.x * n, n, [&](float v) { return kLog ? (v - mx) - log_sum : expf(v - mx) * inv; });
}

template <bool kLog, typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t n, int64_t inner) {
  __shared__ float shared[64];
  const int64_t o = blockIdx.x / inner, j = blockIdx.x % inner;
  const T* xl = x + o * n * inner + j;
  T* yl = y + o * n * inner + j;
  MaxSum part;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) part.add(to_float(xl[i * inner]));
  const MaxSum line = block_max_sum(part, shared);
  const float mx = line.max, log_sum = logf(line.sum), inv = 1.0f / line.sum;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(xl[i * inner]) - mx;
    yl[i * inner] = from_float<T>(kLog ? v - log_sum : expf(v) * inv);
  }
}

template <bool kLog, typename T>
__global__ void softmax_grad_kernel(const T* dy, const T* y, T* dx, int64_t n, int64_t inner) {
  __shared__ float shared[32];
  const int64_t base = (blockIdx.x / inner) * n * inner + blockIdx.x % inner;
  float dot = 0;  // sum(dy * y) for softmax, sum(dy) for log-softmax
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t at = base + i * inner;
    dot += kLog ? to_float(dy[at]) : to_float(dy[at]) * to_float(y[at]);
  }
  dot = block_reduce<false>(dot, shared);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t at = base + i * inner;
    const float g = to_float(dy[at]), v = to_float(y[at]);
    dx[at] = from_float<T>(kLog ? g - expf(v) * dot : v * (g - dot));
  }
}

unsigned lines(int64_t outer, int64_t inner, const char* what) {
  const int64_t count = outer * inner;
  OT_CHECK(count < (int64_t(1) << 31), what, ": ", count, " lines exceed one CUDA grid");
  return unsigned(count);
}

}  // namespace

void softmax(bool log, DType dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, void* stream) {
  if (outer * n * inner == 0) return;
  const unsigned grid = lines(outer, inner, "CUDA Softmax");
  dispatch_floating(dtype, "CUDA Softmax", [&]<typename T>() {
    auto px = static_cast<const T*>(x);
    auto py = static_cast<T*>(y);
    const cudaStream_t s = as_stream(stream);
    if (inner == 1 && log) softmax_contiguous_kernel<true, T><<<grid, kThreads, 0, s>>>(px, py, n);
    else if (inner == 1) softmax_contiguous_kernel<false, T><<<grid, kThreads, 0, s>>>(px, py, n);
    else if (log) softmax_kernel<true, T><<<grid, kThreads, 0, s>>>(px, py, n, inner);
    else softmax_kernel<false, T><<<grid, kThreads, 0, s>>>(px, py, n, inner);
  });
  check_launch("softmax_kernel");
}

void softmax_grad(bool log, DType dtype, const void* dy, const void* y, void* dx, int64_t outer, int64_t n,
                  int64_t inner, void* stream) {
  if (outer * n * inner == 0) return;
  const unsigned grid = lines(outer, inner, "CUDA SoftmaxGrad");
  dispatch_floating(dtype, "CUDA SoftmaxGrad", [&]<typename T>() {
    auto pdy = static_cast<const T*>(dy);
    auto py = static_cast<const T*>(y);
    auto pdx = static_cast<T*>(dx);
    if (log) softmax_grad_kernel<true, T><<<grid, kThreads, 0, as_stream(stream)>>>(pdy, py, pdx, n, inner);
    else softmax_grad_kernel<false, T><<<grid, kThreads, 0, as_stream(stream)>>>(pdy, py, pdx, n, inner);
  });
  check_launch("softmax_grad_kernel");
}

}  // namespace onnxtrain::cuda

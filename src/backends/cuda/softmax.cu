// Softmax and log-softmax along n of [outer, n, inner], forward and backward: a block per
// (outer, inner) line; three passes over the line (max, sum of exponentials, output) read it from
// L2 after the first.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kLog, typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t n, int64_t inner) {
  __shared__ float shared[32];
  const int64_t o = blockIdx.x / inner, j = blockIdx.x % inner;
  const T* xl = x + o * n * inner + j;
  T* yl = y + o * n * inner + j;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, to_float(xl[i * inner]));
  mx = block_reduce<true>(mx, shared);
  float sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(to_float(xl[i * inner]) - mx);
  sum = block_reduce<false>(sum, shared);
  const float log_sum = logf(sum), inv = 1.0f / sum;
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
    if (log) softmax_kernel<true, T><<<grid, kThreads, 0, as_stream(stream)>>>(px, py, n, inner);
    else softmax_kernel<false, T><<<grid, kThreads, 0, as_stream(stream)>>>(px, py, n, inner);
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

// Sums over the middle dim of [outer, reduced, inner]: a block per output row when inner is 1
// (a contiguous row: a block reduction), else a thread per output element walking down the
// reduced dim (neighbouring threads read neighbouring elements).
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

template <typename T>
__global__ void reduce_rows(const T* x, T* out, int64_t reduced, float scale) {
  __shared__ float shared[32];
  const T* row = x + blockIdx.x * reduced;
  float sum = 0;
  for (int64_t r = threadIdx.x; r < reduced; r += blockDim.x) sum += to_float(row[r]);
  sum = block_reduce<false>(sum, shared);
  if (threadIdx.x == 0) out[blockIdx.x] = from_float<T>(sum * scale);
}

template <typename T>
__global__ void reduce_columns(const T* x, T* out, int64_t outer, int64_t reduced, int64_t inner, float scale) {
  const int64_t total = outer * inner;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = i / inner, j = i % inner;
    const T* p = x + o * reduced * inner + j;
    float sum = 0;
    for (int64_t r = 0; r < reduced; ++r) sum += to_float(p[r * inner]);
    out[i] = from_float<T>(sum * scale);
  }
}

}  // namespace

void reduce_sum(DType dtype, const void* x, void* out, int64_t outer, int64_t reduced, int64_t inner, float scale,
                void* stream) {
  if (outer * inner == 0) return;
  dispatch_floating(dtype, "CUDA ReduceSum", [&]<typename T>() {
    auto px = static_cast<const T*>(x);
    auto po = static_cast<T*>(out);
    if (inner == 1 && outer < (int64_t(1) << 31))
      reduce_rows<T><<<unsigned(outer), 256, 0, as_stream(stream)>>>(px, po, reduced, scale);
    else
      reduce_columns<T><<<blocks_for(outer * inner, 256), 256, 0, as_stream(stream)>>>(px, po, outer, reduced, inner, scale);
  });
  check_launch("reduce_sum");
}

}  // namespace onnxtrain::cuda

// What the backend's .cu files share: element types, loads and stores in float, the dtype switch
// (one place, not one per kernel), the broadcast walk, block reductions and launch helpers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/runtime.h"

namespace onnxtrain::cuda {

template <typename T> __device__ __forceinline__ float to_float(T v) { return float(v); }
template <> __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v) { return T(v); }
template <> __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

// Calls fn.template operator()<T>() with T the device type of a floating dtype.
template <typename Fn>
void dispatch_floating(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn.template operator()<float>(); return;
    case DType::kFloat16: fn.template operator()<__half>(); return;
    case DType::kBFloat16: fn.template operator()<__nv_bfloat16>(); return;
    default: OT_THROW(kNotImplemented, what, ": no CUDA kernel for dtype ", dtype_name(dtype));
  }
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// A kernel's temporary: `count` T from cudaMallocAsync on `stream`, freed on it when the owner
// goes, also when a launch check between throws (nothing then reports a failed free).
template <typename T>
class StreamBuffer {
 public:
  StreamBuffer(size_t count, cudaStream_t stream) : stream_(stream) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&p_), count * sizeof(T), stream), "cudaMallocAsync");
  }
  ~StreamBuffer() { (void)cudaFreeAsync(p_, stream_); }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t stream_;
};
// Pack<T>::kSize elements of T in one 16-byte load or store.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};
inline bool pack_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);  // grid-stride loops cover the rest
}

// A walk over the dims of an index space (the output's) and two operands' element strides over
// them, in index type I: the elementwise family's inputs (0 where one broadcasts), the strided
// copy's source and destination.
constexpr int kMaxRank = 8;
template <typename I>
struct Broadcast {
  int rank = 0;
  I dims[kMaxRank] = {};
  I stride_a[kMaxRank] = {};
  I stride_b[kMaxRank] = {};
};
// The two operands' offsets of index i. Unrolled over kMaxRank so that every index into bc is a
// constant: a loop to bc.rank indexed the kernel's parameters dynamically, which copied them to
// local memory in every thread.
template <typename I>
__device__ __forceinline__ void offsets(const Broadcast<I>& bc, I i, I& oa, I& ob) {
  oa = 0;
  ob = 0;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (d >= bc.rank) continue;
    const I coord = i % bc.dims[d];
    i /= bc.dims[d];
    oa += coord * bc.stride_a[d];
    ob += coord * bc.stride_b[d];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum (or max) over the block, returned to every thread; `shared` holds 32 floats. Blocks are
// multiples of 32 threads.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}

}  // namespace onnxtrain::cuda

// LayerNormalization over rows of d elements, forward and backward (llm.c's layernorm kernels in
// spirit: a block per row for the statistics and dx; the parameter gradients as column sums over
// chunks of rows, then over the chunks).
//   y = (x - mean) * inv_std * scale + bias,  inv_std = 1 / sqrt(var + eps)
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * scale
//   dscale = sum_rows(dy * xhat),  dbias = sum_rows(dy)
#include <algorithm>
#include <optional>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;

// The row's mean and inverse standard deviation (variance about the mean: two passes, as the CPU
// kernel does), to every thread of the block.
template <typename T>
__device__ void row_stats(const T* xr, int64_t d, float eps, float* shared, float& mean, float& inv) {
  float sum = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += to_float(xr[i]);
  mean = block_reduce<false>(sum, shared) / float(d);
  float sq = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = to_float(xr[i]) - mean;
    sq += c * c;
  }
  inv = rsqrtf(block_reduce<false>(sq, shared) / float(d) + eps);
}

template <typename T>
__global__ void layer_norm_kernel(const T* x, const T* scale, const T* bias, T* y, float* mean_out, float* inv_out,
                                  int64_t d, float eps) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  float mean, inv;
  row_stats(xr, d, eps, shared, mean, inv);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = (to_float(xr[i]) - mean) * inv * to_float(scale[i]) + (bias ? to_float(bias[i]) : 0.0f);
    y[r * d + i] = from_float<T>(v);
  }
  if (threadIdx.x == 0) {
    if (mean_out) mean_out[r] = mean;
    if (inv_out) inv_out[r] = inv;
  }
}

template <typename T>
__global__ void layer_norm_stats_kernel(const T* x, float* mean, float* inv, int64_t d, float eps) {
  __shared__ float shared[32];
  float m, r;
  row_stats(x + blockIdx.x * d, d, eps, shared, m, r);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    inv[blockIdx.x] = r;
  }
}

// dx may be dy's buffer (the op's in-place pair): each thread reads its elements before writing them.
template <typename T>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* scale, const float* mean_in,
                                     const float* inv_in, T* dx, int64_t d) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  const T* dr = dy + r * d;
  const float mean = mean_in[r], inv = inv_in[r];
  float sg = 0, sgx = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float g = to_float(dr[i]) * to_float(scale[i]);
    sg += g;
    sgx += g * (to_float(xr[i]) - mean) * inv;
  }
  const float mg = block_reduce<false>(sg, shared) / float(d);
  const float mgx = block_reduce<false>(sgx, shared) / float(d);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float xh = (to_float(xr[i]) - mean) * inv;
    dx[r * d + i] = from_float<T>(inv * (to_float(dr[i]) * to_float(scale[i]) - mg - xh * mgx));
  }
}

// dscale[j] and dbias[j] in two steps, in a fixed order (the sums are the same from run to run).
// First, blocks of kColumns x kRowLanes threads sum a chunk of rows each: a warp reads 32
// neighbouring columns of one row (coalesced), its lanes down the chunk; the block's row lanes
// are added in shared memory into partial[chunk][0 or 1][j]. Then a thread per column adds the
// chunks. One thread per column down all the rows left the card idle: 768 columns are 3 blocks.
constexpr int kColumns = 32, kRowLanes = 8;

template <typename T>
__global__ void layer_norm_params_partial_kernel(const T* dy, const T* x, const float* mean, const float* inv,
                                                 float* partial, int64_t rows, int64_t d, int64_t rows_per_chunk) {
  __shared__ float sums[2][kRowLanes][kColumns + 1];  // +1: no bank conflicts down a column
  const int64_t j = blockIdx.x * int64_t(kColumns) + threadIdx.x;
  const int64_t begin = blockIdx.y * rows_per_chunk, end = min(rows, begin + rows_per_chunk);
  float ds = 0, db = 0;
  if (j < d)
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const float g = to_float(dy[r * d + j]);
      ds += g * (to_float(x[r * d + j]) - mean[r]) * inv[r];
      db += g;
    }
  sums[0][threadIdx.y][threadIdx.x] = ds;
  sums[1][threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y < 2 && j < d) {
    float total = 0;
    for (int lane = 0; lane < kRowLanes; ++lane) total += sums[threadIdx.y][lane][threadIdx.x];
    partial[(blockIdx.y * 2 + threadIdx.y) * d + j] = total;
  }
}

template <typename T>
__global__ void layer_norm_params_finish_kernel(const float* partial, int64_t chunks, T* dscale, T* dbias, int64_t d) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < d; j += int64_t(gridDim.x) * blockDim.x) {
    float ds = 0, db = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      ds += partial[(c * 2) * d + j];
      db += partial[(c * 2 + 1) * d + j];
    }
    if (dscale) dscale[j] = from_float<T>(ds);
    if (dbias) dbias[j] = from_float<T>(db);
  }
}

}  // namespace

void layer_norm(DType dtype, const void* x, const void* scale, const void* bias, void* y, float* mean, float* inv_std,
                int64_t rows, int64_t d, float eps, void* stream) {
  if (rows == 0) return;
  OT_CHECK(rows < (int64_t(1) << 31) && d > 0, "CUDA LayerNormalization: ", rows, " rows of ", d, " elements");
  dispatch_floating(dtype, "CUDA LayerNormalization", [&]<typename T>() {
    layer_norm_kernel<T><<<unsigned(rows), kThreads, 0, as_stream(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(y), mean,
        inv_std, d, eps);
  });
  check_launch("layer_norm_kernel");
}

void layer_norm_grad(DType dtype, const void* dy, const void* x, const void* scale, const float* mean,
                     const float* inv_std, void* dx, void* dscale, void* dbias, int64_t rows, int64_t d, float eps,
                     void* stream) {
  if (rows == 0) return;
  OT_CHECK(rows < (int64_t(1) << 31) && d > 0, "CUDA LayerNormalizationGrad: ", rows, " rows of ", d, " elements");
  const cudaStream_t s = as_stream(stream);
  std::optional<StreamBuffer<float>> stats_buffer;
  float* stats = nullptr;  // the statistics, when the forward's were not given
  if (!mean || !inv_std) {
    stats = stats_buffer.emplace(size_t(2 * rows), s).get();
    mean = stats;
    inv_std = stats + rows;
  }
  dispatch_floating(dtype, "CUDA LayerNormalizationGrad", [&]<typename T>() {
    auto px = static_cast<const T*>(x);
    auto pdy = static_cast<const T*>(dy);
    if (stats)
      layer_norm_stats_kernel<T><<<unsigned(rows), kThreads, 0, s>>>(px, stats, stats + rows, d, eps);
    // The parameter gradients first: dx may overwrite dy.
    if (dscale || dbias) {
      // About 1024 blocks in all (several waves on 132 multiprocessors), a chunk at least kRowLanes rows.
      const int64_t column_blocks = (d + kColumns - 1) / kColumns;
      const int64_t wanted = std::clamp<int64_t>(1024 / column_blocks, 1, (rows + kRowLanes - 1) / kRowLanes);
      const int64_t rows_per_chunk = (rows + wanted - 1) / wanted, chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
      OT_CHECK(column_blocks < (int64_t(1) << 31), "CUDA LayerNormalizationGrad: ", d, " elements a row");
      StreamBuffer<float> partial(size_t(chunks * 2 * d), s);
      layer_norm_params_partial_kernel<T><<<dim3(unsigned(column_blocks), unsigned(chunks)), dim3(kColumns, kRowLanes),
                                            0, s>>>(pdy, px, mean, inv_std, partial.get(), rows, d, rows_per_chunk);
      layer_norm_params_finish_kernel<T><<<blocks_for(d, kThreads), kThreads, 0, s>>>(
          partial.get(), chunks, static_cast<T*>(dscale), static_cast<T*>(dbias), d);
    }
    layer_norm_dx_kernel<T><<<unsigned(rows), kThreads, 0, s>>>(pdy, px, static_cast<const T*>(scale), mean, inv_std,
                                                                static_cast<T*>(dx), d);
  });
  check_launch("layer_norm_grad");
}

}  // namespace onnxtrain::cuda

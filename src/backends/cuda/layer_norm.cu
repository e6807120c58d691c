// LayerNormalization over rows of d elements, forward and backward (llm.c's layernorm kernels in
// spirit: a warp per row, or a block for long rows, for the statistics and dx, in 16-byte packs
// where the row allows; the parameter gradients as column sums over chunks of rows, then over the
// chunks).
//   y = (x - mean) * inv_std * scale + bias,  inv_std = 1 / sqrt(var + eps)
//   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * scale
//   dscale = sum_rows(dy * xhat),  dbias = sum_rows(dy)
#include <algorithm>
#include <initializer_list>
#include <optional>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;
// Rows up to this long get a warp each (kThreads / 32 rows a block): their reductions are warp
// shuffles, with no block barrier, and a 768-element row keeps all 32 lanes busy. Longer rows get a
// block each.
constexpr int64_t kWarpRowMax = 4096;

// The threads that work on one row: a warp or the whole block.
template <bool kWarp>
struct RowTeam {
  int64_t row;
  int first, stride;
  __device__ RowTeam()
      : row(kWarp ? blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32 : int64_t(blockIdx.x)),
        first(kWarp ? int(threadIdx.x % 32) : int(threadIdx.x)),
        stride(kWarp ? 32 : int(blockDim.x)) {}
  // The team's sum, to each of its threads; `shared` (32 floats) is used by a block team only.
  __device__ float sum(float v, float* shared) const { return kWarp ? warp_sum(v) : block_reduce<false>(v, shared); }
};

// fn(i, pack of T at i) over a row of d elements in 16-byte packs (kPacked: the row, and every
// other array indexed the same way, 16-byte aligned and d a whole number of packs), else fn(i, one
// T) element by element.
template <bool kWarp, bool kPacked, typename T, typename Fn>
__device__ __forceinline__ void for_each_in_row(const RowTeam<kWarp>& team, int64_t d, Fn&& fn) {
  if constexpr (kPacked) {
    for (int64_t q = team.first; q < d / Pack<T>::kSize; q += team.stride) fn(q * Pack<T>::kSize);
  } else {
    for (int64_t i = team.first; i < d; i += team.stride) fn(i);
  }
}
// The elements of a pack (or the one element) at i, in float.
template <bool kPacked, typename T>
struct Elements {
  static constexpr int kCount = kPacked ? Pack<T>::kSize : 1;
  float v[kCount];
  __device__ explicit Elements(const T* p) {
    if constexpr (kPacked) {
      const Pack<T> pack = *reinterpret_cast<const Pack<T>*>(p);
#pragma unroll
      for (int k = 0; k < kCount; ++k) v[k] = to_float(pack.v[k]);
    } else {
      v[0] = to_float(*p);
    }
  }
  __device__ Elements() = default;
  __device__ void store(T* p) const {
    if constexpr (kPacked) {
      Pack<T> pack;
#pragma unroll
      for (int k = 0; k < kCount; ++k) pack.v[k] = from_float<T>(v[k]);
      *reinterpret_cast<Pack<T>*>(p) = pack;
    } else {
      *p = from_float<T>(v[0]);
    }
  }
};

// The row's mean and inverse standard deviation (variance about the mean: two passes, as the CPU
// kernel does), to every thread of the team.
template <bool kWarp, bool kPacked, typename T>
__device__ void row_stats(const RowTeam<kWarp>& team, const T* xr, int64_t d, float eps, float* shared, float& mean,
                          float& inv) {
  using E = Elements<kPacked, T>;
  float sum = 0;
  for_each_in_row<kWarp, kPacked, T>(team, d, [&](int64_t i) {
    const E e(xr + i);
#pragma unroll
    for (int k = 0; k < E::kCount; ++k) sum += e.v[k];
  });
  mean = team.sum(sum, shared) / float(d);
  float sq = 0;
  for_each_in_row<kWarp, kPacked, T>(team, d, [&](int64_t i) {
    const E e(xr + i);
#pragma unroll
    for (int k = 0; k < E::kCount; ++k) sq += (e.v[k] - mean) * (e.v[k] - mean);
  });
  inv = rsqrtf(team.sum(sq, shared) / float(d) + eps);
}

template <bool kWarp, bool kPacked, typename T>
__global__ void layer_norm_kernel(const T* x, const T* scale, const T* bias, T* y, float* mean_out, float* inv_out,
                                  int64_t rows, int64_t d, float eps) {
  __shared__ float shared[32];
  using E = Elements<kPacked, T>;
  const RowTeam<kWarp> team;
  if (team.row >= rows) return;  // a whole warp (block teams: rows == blocks)
  const T* xr = x + team.row * d;
  T* yr = y + team.row * d;
  float mean, inv;
  row_stats<kWarp, kPacked>(team, xr, d, eps, shared, mean, inv);
  for_each_in_row<kWarp, kPacked, T>(team, d, [&](int64_t i) {
    const E xe(xr + i), se(scale + i);
    E be, out;
    if (bias) be = E(bias + i);
#pragma unroll
    for (int k = 0; k < E::kCount; ++k) out.v[k] = (xe.v[k] - mean) * inv * se.v[k] + (bias ? be.v[k] : 0.0f);
    out.store(yr + i);
  });
  if (team.first == 0) {
    if (mean_out) mean_out[team.row] = mean;
    if (inv_out) inv_out[team.row] = inv;
  }
}

template <bool kWarp, bool kPacked, typename T>
__global__ void layer_norm_stats_kernel(const T* x, float* mean, float* inv, int64_t rows, int64_t d, float eps) {
  __shared__ float shared[32];
  const RowTeam<kWarp> team;
  if (team.row >= rows) return;
  float m, r;
  row_stats<kWarp, kPacked>(team, x + team.row * d, d, eps, shared, m, r);
  if (team.first == 0) {
    mean[team.row] = m;
    inv[team.row] = r;
  }
}

// dx may be dy's buffer (the op's in-place pair): each thread reads its elements before writing them.
template <bool kWarp, bool kPacked, typename T>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* scale, const float* mean_in,
                                     const float* inv_in, T* dx, int64_t rows, int64_t d) {
  __shared__ float shared[32];
  using E = Elements<kPacked, T>;
  const RowTeam<kWarp> team;
  if (team.row >= rows) return;
  const T* xr = x + team.row * d;
  const T* dr = dy + team.row * d;
  const float mean = mean_in[team.row], inv = inv_in[team.row];
  float sg = 0, sgx = 0;
  for_each_in_row<kWarp, kPacked, T>(team, d, [&](int64_t i) {
    const E ge(dr + i), xe(xr + i), se(scale + i);
#pragma unroll
    for (int k = 0; k < E::kCount; ++k) {
      const float g = ge.v[k] * se.v[k];
      sg += g;
      sgx += g * (xe.v[k] - mean) * inv;
    }
  });
  const float mg = team.sum(sg, shared) / float(d);
  const float mgx = team.sum(sgx, shared) / float(d);
  for_each_in_row<kWarp, kPacked, T>(team, d, [&](int64_t i) {
    const E ge(dr + i), xe(xr + i), se(scale + i);
    E out;
#pragma unroll
    for (int k = 0; k < E::kCount; ++k) out.v[k] = inv * (ge.v[k] * se.v[k] - mg - (xe.v[k] - mean) * inv * mgx);
    out.store(dx + team.row * d + i);
  });
}

// Launches kernel<kWarp, kPacked, T> over `rows`: a warp a row or a block a row by d; in packs when
// d is a whole number of them and every pointer given is 16-byte aligned (null ones aside).
template <typename T, typename Launch>
void launch_rows(int64_t rows, int64_t d, std::initializer_list<const void*> pointers, Launch&& launch) {
  bool packed = d % Pack<T>::kSize == 0;
  for (const void* p : pointers) packed = packed && (p == nullptr || pack_aligned(p));
  const bool warp = d <= kWarpRowMax;
  const int64_t rows_a_block = kThreads / 32;
  const unsigned blocks = unsigned(warp ? (rows + rows_a_block - 1) / rows_a_block : rows);
  if (warp && packed) launch.template operator()<true, true>(blocks);
  else if (warp) launch.template operator()<true, false>(blocks);
  else if (packed) launch.template operator()<false, true>(blocks);
  else launch.template operator()<false, false>(blocks);
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
    launch_rows<T>(rows, d, {x, scale, bias, y}, [&]<bool kWarp, bool kPacked>(unsigned blocks) {
      layer_norm_kernel<kWarp, kPacked, T><<<blocks, kThreads, 0, as_stream(stream)>>>(
          static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(y),
          mean, inv_std, rows, d, eps);
    });
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
      launch_rows<T>(rows, d, {x}, [&]<bool kWarp, bool kPacked>(unsigned blocks) {
        layer_norm_stats_kernel<kWarp, kPacked, T><<<blocks, kThreads, 0, s>>>(px, stats, stats + rows, rows, d, eps);
      });
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
    launch_rows<T>(rows, d, {dy, x, scale, dx}, [&]<bool kWarp, bool kPacked>(unsigned blocks) {
      layer_norm_dx_kernel<kWarp, kPacked, T><<<blocks, kThreads, 0, s>>>(
          pdy, px, static_cast<const T*>(scale), mean, inv_std, static_cast<T*>(dx), rows, d);
    });
  });
  check_launch("layer_norm_grad");
}

}  // namespace onnxtrain::cuda

// Gather and its gradient over data viewed as [outer, dim, inner] and indices [n], the indices
// given on the host, already checked and in [0, dim) (the op files check them as the CPU does).
//
// Gather copies rows: it dispatches on the row's byte size, in 16-, 8-, 4-, 2- or 1-byte units as
// the rows and pointers allow. GatherGrad sums dY's rows into dX's without atomics: the host sorts
// the positions j by index (stable), and each dX element that some index hits is written once,
// by one thread that adds its dY elements in ascending j, in float. The result is the same bits
// on every run (atomics would add in whatever order the threads arrive); the price is a pass over
// the indices on the host, which the range check makes anyway, and one thread looping over a
// heavily repeated index (a padding token) while its neighbours are done.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;

// out[(o n + j) inner + c] = data[(o dim + idx[j]) inner + c], in units E.
template <typename E, typename I>
__global__ void gather_kernel(const E* data, const int64_t* idx, E* out, I total, I n, I dim, I inner) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I c = i % inner, row = i / inner, j = row % n, o = row / n;
    out[i] = data[(o * dim + I(idx[j])) * inner + c];
  }
}

// dx[(o dim + rows[u]) inner + c] = sum over p in [starts[u], starts[u+1]) of
// dy[(o n + order[p]) inner + c], for every o, u < unique and c.
template <typename T, typename I>
__global__ void gather_grad_kernel(const T* dy, const int64_t* order, const int64_t* rows, const int64_t* starts,
                                   T* dx, I total, I unique, I n, I dim, I inner) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I c = i % inner, r = i / inner, u = r % unique, o = r / unique;
    float acc = 0.0f;
    for (int64_t p = starts[u]; p < starts[u + 1]; ++p) acc += to_float(dy[(o * n + I(order[p])) * inner + c]);
    dx[(o * dim + I(rows[u])) * inner + c] = from_float<T>(acc);
  }
}

// `count` int64 from the host to `device` on the stream. The host array may go once this returns:
// an asynchronous copy from pageable memory returns after staging it.
void upload(const int64_t* host, size_t count, int64_t* device, cudaStream_t stream) {
  if (count) check(cudaMemcpyAsync(device, host, count * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
                   "cudaMemcpyAsync (indices)");
}

bool fits_32_bits(int64_t n) { return n <= std::numeric_limits<int32_t>::max(); }

}  // namespace

void gather(size_t element_size, const void* data, const int64_t* indices, void* out, int64_t n, int64_t outer,
            int64_t dim, int64_t inner, void* stream) {
  if (outer == 0 || n == 0 || inner == 0) return;
  const cudaStream_t s = as_stream(stream);
  const int64_t row_bytes = inner * int64_t(element_size);
  size_t unit = 1;
  for (size_t u : {size_t(16), size_t(8), size_t(4), size_t(2)})
    if (row_bytes % int64_t(u) == 0 && reinterpret_cast<uintptr_t>(data) % u == 0 &&
        reinterpret_cast<uintptr_t>(out) % u == 0) {
      unit = u;
      break;
    }
  const int64_t units = row_bytes / int64_t(unit), total = outer * n * units;
  StreamBuffer<int64_t> idx(size_t(n), s);
  upload(indices, size_t(n), idx.get(), s);
  auto run = [&]<typename E>() {
    auto d = static_cast<const E*>(data);
    auto o = static_cast<E*>(out);
    if (fits_32_bits(total) && fits_32_bits(outer * dim * units))
      gather_kernel<E, uint32_t><<<blocks_for(total, kThreads), kThreads, 0, s>>>(
          d, idx.get(), o, uint32_t(total), uint32_t(n), uint32_t(dim), uint32_t(units));
    else
      gather_kernel<E, uint64_t><<<blocks_for(total, kThreads), kThreads, 0, s>>>(
          d, idx.get(), o, uint64_t(total), uint64_t(n), uint64_t(dim), uint64_t(units));
  };
  switch (unit) {
    case 16: run.template operator()<uint4>(); break;
    case 8: run.template operator()<unsigned long long>(); break;
    case 4: run.template operator()<uint32_t>(); break;
    case 2: run.template operator()<uint16_t>(); break;
    default: run.template operator()<uint8_t>(); break;
  }
  check_launch("gather_kernel");
}

void gather_grad(DType dtype, const void* dy, const int64_t* indices, void* dx, int64_t n, int64_t outer, int64_t dim,
                 int64_t inner, void* stream) {
  const cudaStream_t s = as_stream(stream);
  const int64_t dx_elements = outer * dim * inner;
  memset_zero(dx, size_t(dx_elements) * dtype_size(dtype), stream);  // rows no index hits
  if (outer == 0 || n == 0 || inner == 0) return;
  // The positions sorted by index (stable: ascending j within an index), the distinct indices, and
  // where each one's positions start: [order (n) | rows (unique) | starts (unique + 1)].
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return indices[a] < indices[b]; });
  std::vector<int64_t> rows, starts;
  for (int64_t p = 0; p < n; ++p)
    if (p == 0 || indices[order[size_t(p)]] != indices[order[size_t(p - 1)]]) {
      rows.push_back(indices[order[size_t(p)]]);
      starts.push_back(p);
    }
  starts.push_back(n);
  const int64_t unique = int64_t(rows.size());
  std::vector<int64_t> table = std::move(order);
  table.insert(table.end(), rows.begin(), rows.end());
  table.insert(table.end(), starts.begin(), starts.end());
  StreamBuffer<int64_t> t(table.size(), s);
  upload(table.data(), table.size(), t.get(), s);
  const int64_t* d_order = t.get();
  const int64_t* d_rows = d_order + n;
  const int64_t* d_starts = d_rows + unique;
  const int64_t total = outer * unique * inner;
  dispatch_floating(dtype, "CUDA GatherGrad", [&]<typename T>() {
    auto g = static_cast<const T*>(dy);
    auto x = static_cast<T*>(dx);
    if (fits_32_bits(dx_elements) && fits_32_bits(outer * n * inner))
      gather_grad_kernel<T, uint32_t><<<blocks_for(total, kThreads), kThreads, 0, s>>>(
          g, d_order, d_rows, d_starts, x, uint32_t(total), uint32_t(unique), uint32_t(n), uint32_t(dim), uint32_t(inner));
    else
      gather_grad_kernel<T, uint64_t><<<blocks_for(total, kThreads), kThreads, 0, s>>>(
          g, d_order, d_rows, d_starts, x, uint64_t(total), uint64_t(unique), uint64_t(n), uint64_t(dim), uint64_t(inner));
  });
  check_launch("gather_grad_kernel");
}

}  // namespace onnxtrain::cuda

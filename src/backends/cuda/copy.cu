// Strided copies: the layout ops' one kernel (Transpose, Slice, SliceGrad's scatter, Expand,
// Concat). A copy does no arithmetic, so it dispatches on the element's size, not its dtype. The
// walk is simplified first (size-1 dims dropped, neighbours merged where both sides walk them
// contiguously); where the innermost dim is contiguous on both sides and everything lines up,
// elements are widened to 16-, 8- or 4-byte units (one vector load and store each); a contiguous
// whole is one cudaMemcpyAsync. Offsets are 32-bit where both tensors allow, computed in unsigned
// arithmetic so negative strides (a reversed Slice) wrap to the right offset.
#include <algorithm>
#include <limits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;
// Rows at least this long go a block per row (the outer offsets by division once a row).
constexpr int64_t kMinRowElements = 128;

static_assert(kCopyMaxRank == kMaxRank, "the copy walks common.cuh's Broadcast");

// The walk in index type I is a Broadcast: stride_a the source's, stride_b the destination's (two's
// complement for negative ones; the offsets come out right modulo 2^bits, and the true ones are
// in range).
template <typename E, typename I>
__global__ void strided_copy_kernel(const E* src, E* dst, I n, I src_offset, I dst_offset, Broadcast<I> w) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I so, dof;
    offsets(w, i, so, dof);
    dst[dst_offset + dof] = src[src_offset + so];
  }
}

// A block per row of the innermost dim (inner elements at strides inner_src and inner_dst); `outer`
// is the walk without it.
template <typename E, typename I>
__global__ void strided_copy_rows_kernel(const E* src, E* dst, I rows, I inner, I inner_src, I inner_dst, I src_offset,
                                         I dst_offset, Broadcast<I> outer) {
  for (I row = blockIdx.x; row < rows; row += gridDim.x) {
    I so, dof;
    offsets(outer, row, so, dof);
    so += src_offset;
    dof += dst_offset;
    for (I k = threadIdx.x; k < inner; k += blockDim.x) dst[dof + k * inner_dst] = src[so + k * inner_src];
  }
}

// The walk in 64-bit integers, simplified.
struct Walk {
  int rank = 0;
  int64_t dims[kCopyMaxRank] = {}, src[kCopyMaxRank] = {}, dst[kCopyMaxRank] = {};
  int64_t src_offset = 0, dst_offset = 0;
  size_t element_size = 0;
};

Walk simplify(const StridedCopy& c, size_t element_size) {
  OT_CHECK(c.shape.size() <= size_t(kCopyMaxRank) && c.src_strides.size() == c.shape.size() &&
               c.dst_strides.size() == c.shape.size(),
           "CUDA strided copy: rank ", c.shape.size(), " with ", c.src_strides.size(), " and ", c.dst_strides.size(),
           " strides (at most rank ", kCopyMaxRank, ")");
  Walk w;
  w.src_offset = c.src_offset;
  w.dst_offset = c.dst_offset;
  w.element_size = element_size;
  for (size_t d = 0; d < c.shape.size(); ++d) {
    const int64_t n = c.shape[d], s = c.src_strides[d], t = c.dst_strides[d];
    if (n == 1) continue;
    const int last = w.rank - 1;
    if (last >= 0 && w.src[last] == s * n && w.dst[last] == t * n) {
      w.dims[last] *= n;
      w.src[last] = s;
      w.dst[last] = t;
      continue;
    }
    w.dims[w.rank] = n;
    w.src[w.rank] = s;
    w.dst[w.rank] = t;
    ++w.rank;
  }
  return w;
}

// Wider units where the innermost dim is contiguous on both sides and every stride, offset and
// pointer is a multiple of the unit: [.., 64] float32 rows become [.., 16] 16-byte units.
void widen(Walk& w, const void* src, void* dst) {
  if (w.rank == 0 || w.src[w.rank - 1] != 1 || w.dst[w.rank - 1] != 1) return;
  for (size_t unit : {size_t(16), size_t(8), size_t(4), size_t(2)}) {
    if (unit <= w.element_size) return;
    const int64_t k = int64_t(unit / w.element_size);
    bool ok = w.dims[w.rank - 1] % k == 0 && w.src_offset % k == 0 && w.dst_offset % k == 0 &&
              reinterpret_cast<uintptr_t>(src) % unit == 0 && reinterpret_cast<uintptr_t>(dst) % unit == 0;
    for (int d = 0; d + 1 < w.rank && ok; ++d) ok = w.src[d] % k == 0 && w.dst[d] % k == 0;
    if (!ok) continue;
    w.dims[w.rank - 1] /= k;
    for (int d = 0; d + 1 < w.rank; ++d) {
      w.src[d] /= k;
      w.dst[d] /= k;
    }
    w.src_offset /= k;
    w.dst_offset /= k;
    w.element_size = unit;
    return;
  }
}

// The lowest and highest element offset one side reaches; both must lie in its tensor.
std::pair<int64_t, int64_t> reach(const Walk& w, bool source) {
  int64_t lo = source ? w.src_offset : w.dst_offset, hi = lo;
  for (int d = 0; d < w.rank; ++d) {
    const int64_t span = (source ? w.src[d] : w.dst[d]) * (w.dims[d] - 1);
    (span < 0 ? lo : hi) += span;
  }
  return {lo, hi};
}

template <typename I>
Broadcast<I> walk_in(const Walk& w, int rank) {
  Broadcast<I> c;
  c.rank = rank;
  for (int d = 0; d < rank; ++d) {
    c.dims[d] = I(w.dims[d]);
    c.stride_a[d] = I(w.src[d]);  // two's complement for negative strides
    c.stride_b[d] = I(w.dst[d]);
  }
  return c;
}

template <typename E, typename I>
void launch(const Walk& w, const void* src, void* dst, int64_t n, cudaStream_t stream) {
  auto s = static_cast<const E*>(src);
  auto t = static_cast<E*>(dst);
  const int64_t inner = w.rank > 0 ? w.dims[w.rank - 1] : 1;
  if (w.rank > 0 && inner >= kMinRowElements) {
    const int64_t rows = n / inner;
    strided_copy_rows_kernel<E, I><<<unsigned(std::min<int64_t>(rows, std::numeric_limits<int32_t>::max())), kThreads, 0,
                                     stream>>>(s, t, I(rows), I(inner), I(w.src[w.rank - 1]), I(w.dst[w.rank - 1]),
                                               I(w.src_offset), I(w.dst_offset), walk_in<I>(w, w.rank - 1));
  } else {
    strided_copy_kernel<E, I><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(s, t, I(n), I(w.src_offset),
                                                                                I(w.dst_offset), walk_in<I>(w, w.rank));
  }
}

// The element type of each unit size.
template <typename Fn>
void dispatch_size(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1: fn.template operator()<uint8_t>(); return;
    case 2: fn.template operator()<uint16_t>(); return;
    case 4: fn.template operator()<uint32_t>(); return;
    case 8: fn.template operator()<unsigned long long>(); return;
    case 16: fn.template operator()<uint4>(); return;
    default: OT_THROW(kNotImplemented, "CUDA strided copy: no kernel for ", bytes, "-byte elements");
  }
}

}  // namespace

void strided_copy(size_t element_size, const void* src, void* dst, const StridedCopy& c, void* stream) {
  const int64_t n = numel(c.shape);
  if (n == 0) return;
  Walk w = simplify(c, element_size);
  const cudaStream_t s = as_stream(stream);
  if (w.rank == 0 || (w.rank == 1 && w.src[0] == 1 && w.dst[0] == 1)) {  // one contiguous run
    const size_t bytes = size_t(n) * element_size;
    check(cudaMemcpyAsync(static_cast<char*>(dst) + w.dst_offset * int64_t(element_size),
                          static_cast<const char*>(src) + w.src_offset * int64_t(element_size), bytes,
                          cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync (strided copy)");
    return;
  }
  const auto [src_lo, src_hi] = reach(w, true);
  const auto [dst_lo, dst_hi] = reach(w, false);
  OT_CHECK(src_lo >= 0 && dst_lo >= 0, "CUDA strided copy: a negative offset (", src_lo, ", ", dst_lo, ")");
  widen(w, src, dst);
  const int64_t units = n * int64_t(element_size) / int64_t(w.element_size);
  constexpr int64_t k32 = std::numeric_limits<int32_t>::max();
  const bool small = units <= k32 && src_hi <= k32 && dst_hi <= k32;  // element offsets only shrink when widened
  dispatch_size(w.element_size, [&]<typename E>() {
    if (small) launch<E, uint32_t>(w, src, dst, units, s);
    else launch<E, uint64_t>(w, src, dst, units, s);
  });
  check_launch("strided_copy_kernel");
}

}  // namespace onnxtrain::cuda

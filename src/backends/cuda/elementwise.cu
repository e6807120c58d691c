// One broadcasting elementwise family: every binary and unary op is a functor over float (or the
// integer type itself), and two kernels serve them all. Same shapes: a flat loop over 16-byte
// packs (one vector load per input, where the pointers allow). Broadcast: the output's dims after
// merging the ones every input walks contiguously (or not at all); a block per row of the
// innermost dim when it is long (the outer offsets by division once a row), else index
// arithmetic per element; in 32-bit integers where the output allows (64-bit division is many
// times slower on the GPU).
#include <algorithm>
#include <limits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kThreads = 256;

void fill_strides(const Shape& in, const Shape& out, int64_t* strides, const char* what) {
  const int rank = int(out.size()), offset = rank - int(in.size());
  OT_CHECK(offset >= 0, what, ": input of shape ", shape_str(in), " cannot broadcast to ", shape_str(out));
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t dim = d >= offset ? in[size_t(d - offset)] : 1;
    OT_CHECK(dim == out[size_t(d)] || dim == 1, what, ": input of shape ", shape_str(in), " cannot broadcast to ",
             shape_str(out));
    strides[d] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
}

// Per-element math: compute type C is float for floating types, the type itself for integers.
template <typename T> struct Compute { using type = float; };
template <> struct Compute<int32_t> { using type = int32_t; };
template <> struct Compute<int64_t> { using type = int64_t; };
template <typename T> __device__ __forceinline__ typename Compute<T>::type load(T v) {
  if constexpr (std::is_integral_v<T>) return v; else return to_float(v);
}
template <typename T, typename C> __device__ __forceinline__ T store(C v) {
  if constexpr (std::is_integral_v<T>) return T(v); else return from_float<T>(float(v));
}

// Integer +, - and * wrap (two's complement) as the CPU's binary.cc wrap_t does: computed in the
// unsigned type, where overflow is defined, not in the signed one, where it is undefined.
template <typename C> __device__ __forceinline__ C add(C x, C y) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(x) + std::make_unsigned_t<C>(y));
  else return x + y;
}
template <typename C> __device__ __forceinline__ C sub(C x, C y) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(x) - std::make_unsigned_t<C>(y));
  else return x - y;
}
template <typename C> __device__ __forceinline__ C mul(C x, C y) {
  if constexpr (std::is_integral_v<C>) return C(std::make_unsigned_t<C>(x) * std::make_unsigned_t<C>(y));
  else return x * y;
}

// Gelu's constants (ops/fused/gelu.cc defines the forms).
constexpr float kInvSqrt2 = 0.70710678118654752440f, kInvSqrt2Pi = 0.39894228040143267794f,
                kSqrt2OverPi = 0.79788456080286535588f, kGeluCoef = 0.044715f;

template <Binary kOp, typename C>
__device__ __forceinline__ C apply_binary(C x, C y) {
  if constexpr (kOp == Binary::kAdd) return add(x, y);
  if constexpr (kOp == Binary::kSub) return sub(x, y);
  if constexpr (kOp == Binary::kMul) return mul(x, y);
  if constexpr (kOp == Binary::kDiv) {  // x / -1 as 0 - x: INT_MIN / -1 wraps to INT_MIN
    if constexpr (std::is_integral_v<C>) return y == 0 ? C(0) : (y == C(-1) ? sub(C(0), x) : x / y);
    else return x / y;
  }
  if constexpr (kOp == Binary::kReluGrad) return y > C(0) ? x : C(0);
  if constexpr (!std::is_integral_v<C>) {
    // d gelu / dx = Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    if constexpr (kOp == Binary::kGeluGrad)
      return x * (0.5f * (1.0f + erff(y * kInvSqrt2)) + y * kInvSqrt2Pi * expf(-0.5f * y * y));
    // d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh u
    if constexpr (kOp == Binary::kGeluTanhGrad) {
      const float t = tanhf(kSqrt2OverPi * (y + kGeluCoef * y * y * y));
      return x * (0.5f * (1.0f + t) + 0.5f * y * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * y * y));
    }
  }
  return x;
}

template <Unary kOp, typename C>
__device__ __forceinline__ C apply_unary(C x) {
  if constexpr (kOp == Unary::kCopy) return x;
  if constexpr (kOp == Unary::kNeg) return sub(C(0), x);
  if constexpr (kOp == Unary::kAbs) return x < C(0) ? sub(C(0), x) : x;
  if constexpr (kOp == Unary::kRelu) return x > C(0) ? x : C(0);
  if constexpr (!std::is_integral_v<C>) {
    if constexpr (kOp == Unary::kExp) return expf(x);
    if constexpr (kOp == Unary::kLog) return logf(x);
    if constexpr (kOp == Unary::kSqrt) return sqrtf(x);
    if constexpr (kOp == Unary::kReciprocal) return 1.0f / x;
    if constexpr (kOp == Unary::kTanh) return tanhf(x);
    if constexpr (kOp == Unary::kSigmoid) return 1.0f / (1.0f + expf(-x));
    if constexpr (kOp == Unary::kErf) return erff(x);
    if constexpr (kOp == Unary::kGelu) return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    // 0.5 x (1 + tanh u) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
    if constexpr (kOp == Unary::kGeluTanh) return x / (1.0f + expf(-2.0f * kSqrt2OverPi * (x + kGeluCoef * x * x * x)));
  }
  return x;
}


// Broadcast by rows: the walk's innermost dim (inner elements, strides inner_a and inner_b) along
// a block's threads, its outer dims (outer) by division once a row.
template <Binary kOp, typename T, typename I>
__global__ void binary_rows_kernel(const T* a, const T* b, T* out, I rows, I inner, Broadcast<I> outer, I inner_a,
                                   I inner_b) {
  for (I row = blockIdx.x; row < rows; row += gridDim.x) {
    I oa, ob;
    offsets(outer, row, oa, ob);
    T* out_row = out + int64_t(row) * inner;
    for (I k = threadIdx.x; k < inner; k += blockDim.x)
      out_row[k] = store<T>(apply_binary<kOp>(load(a[oa + k * inner_a]), load(b[ob + k * inner_b])));
  }
}

template <Unary kOp, typename T, typename I>
__global__ void unary_rows_kernel(const T* x, T* out, I rows, I inner, Broadcast<I> outer, I inner_x) {
  for (I row = blockIdx.x; row < rows; row += gridDim.x) {
    I ox, unused;
    offsets(outer, row, ox, unused);
    T* out_row = out + int64_t(row) * inner;
    for (I k = threadIdx.x; k < inner; k += blockDim.x) out_row[k] = store<T>(apply_unary<kOp>(load(x[ox + k * inner_x])));
  }
}


// Same shapes, every pointer 16-byte aligned: whole packs, then the last n % kSize elements.
template <Binary kOp, typename T>
__global__ void binary_packed_kernel(const T* a, const T* b, T* out, int64_t n) {
  constexpr int kSize = Pack<T>::kSize;
  const int64_t packs = n / kSize, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
                step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += step) {
    const Pack<T> pa = reinterpret_cast<const Pack<T>*>(a)[p], pb = reinterpret_cast<const Pack<T>*>(b)[p];
    Pack<T> po;
#pragma unroll
    for (int k = 0; k < kSize; ++k) po.v[k] = store<T>(apply_binary<kOp>(load(pa.v[k]), load(pb.v[k])));
    reinterpret_cast<Pack<T>*>(out)[p] = po;
  }
  for (int64_t i = packs * kSize + first; i < n; i += step) out[i] = store<T>(apply_binary<kOp>(load(a[i]), load(b[i])));
}

template <Unary kOp, typename T>
__global__ void unary_packed_kernel(const T* x, T* out, int64_t n) {
  constexpr int kSize = Pack<T>::kSize;
  const int64_t packs = n / kSize, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
                step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = first; p < packs; p += step) {
    const Pack<T> px = reinterpret_cast<const Pack<T>*>(x)[p];
    Pack<T> po;
#pragma unroll
    for (int k = 0; k < kSize; ++k) po.v[k] = store<T>(apply_unary<kOp>(load(px.v[k])));
    reinterpret_cast<Pack<T>*>(out)[p] = po;
  }
  for (int64_t i = packs * kSize + first; i < n; i += step) out[i] = store<T>(apply_unary<kOp>(load(x[i])));
}

// kSame: same shapes, a flat loop (pointers not 16-byte aligned); else broadcast offsets.
template <Binary kOp, typename T, typename I, bool kSame>
__global__ void binary_kernel(const T* a, const T* b, T* out, I n, Broadcast<I> bc) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I oa = i, ob = i;
    if constexpr (!kSame) offsets(bc, i, oa, ob);
    out[i] = store<T>(apply_binary<kOp>(load(a[oa]), load(b[ob])));
  }
}

template <Unary kOp, typename T, typename I, bool kSame>
__global__ void unary_kernel(const T* x, T* out, I n, Broadcast<I> bc) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I ox = i, unused;
    if constexpr (!kSame) offsets(bc, i, ox, unused);
    out[i] = store<T>(apply_unary<kOp>(load(x[ox])));
  }
}

// The dtype switch of this family: floating types and int32/int64.
template <typename Fn>
void dispatch_elementwise(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::kInt32: fn.template operator()<int32_t>(); return;
    case DType::kInt64: fn.template operator()<int64_t>(); return;
    default: dispatch_floating(dtype, what, fn);
  }
}

// The output's dims and the inputs' strides (b: none for a unary op), size-1 dims dropped and
// neighbours merged where each input's stride carries across them (both walk them contiguously,
// or neither does): [262144, 1024] + [1024] stays rank 2, [8, 128, 768] + itself becomes rank 1.
struct Walk {
  int rank = 0;
  int64_t dims[kMaxRank], stride_a[kMaxRank], stride_b[kMaxRank];
};
Walk make_walk(const Shape& a, const Shape* b, const Shape& out, const char* what) {
  OT_CHECK(out.size() <= size_t(kMaxRank), what, ": rank ", out.size(), " is above the CUDA kernel's ", kMaxRank);
  int64_t sa[kMaxRank], sb[kMaxRank] = {};
  fill_strides(a, out, sa, what);
  if (b) fill_strides(*b, out, sb, what);
  Walk w;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == 1) continue;
    const int last = w.rank - 1;
    if (last >= 0 && w.stride_a[last] == sa[d] * out[d] && w.stride_b[last] == sb[d] * out[d]) {
      w.dims[last] *= out[d];
      w.stride_a[last] = sa[d];
      w.stride_b[last] = sb[d];
      continue;
    }
    w.dims[w.rank] = out[d];
    w.stride_a[w.rank] = sa[d];
    w.stride_b[w.rank] = sb[d];
    ++w.rank;
  }
  return w;
}
template <typename I>
Broadcast<I> broadcast_in(const Walk& w) {
  Broadcast<I> bc;
  bc.rank = w.rank;
  for (int d = 0; d < w.rank; ++d) {
    bc.dims[d] = I(w.dims[d]);
    bc.stride_a[d] = I(w.stride_a[d]);
    bc.stride_b[d] = I(w.stride_b[d]);
  }
  return bc;
}
// The walk without its innermost dim, which a rows kernel walks along its threads.
template <typename I>
Broadcast<I> outer_of(const Walk& w) {
  Walk outer = w;
  outer.rank = w.rank - 1;
  return broadcast_in<I>(outer);
}
// Rows of at least this many elements go to the rows kernels (fewer would idle most of a block).
constexpr int64_t kMinRowElements = 128;
unsigned row_blocks(int64_t rows) { return unsigned(std::min<int64_t>(rows, std::numeric_limits<int32_t>::max())); }

// 32-bit offsets when every index fits (an input is never larger than the output it broadcasts to).
bool fits_32_bits(int64_t n) { return n <= std::numeric_limits<int32_t>::max(); }

template <Binary kOp>
void launch_binary(DType dtype, const void* a, const Shape& as, const void* b, const Shape& bs, void* out,
                   const Shape& os, cudaStream_t stream) {
  const int64_t n = numel(os);
  if (n == 0) return;
  const bool same = as == os && bs == os;
  const Walk walk = same ? Walk{} : make_walk(as, &bs, os, "CUDA binary elementwise");
  dispatch_elementwise(dtype, "CUDA binary elementwise", [&]<typename T>() {
    auto pa = static_cast<const T*>(a);
    auto pb = static_cast<const T*>(b);
    auto po = static_cast<T*>(out);
    if (same && pack_aligned(a) && pack_aligned(b) && pack_aligned(out))
      binary_packed_kernel<kOp, T><<<blocks_for(n / Pack<T>::kSize + 1, kThreads), kThreads, 0, stream>>>(pa, pb, po, n);
    else if (same)
      binary_kernel<kOp, T, int64_t, true><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(pa, pb, po, n, {});
    else if (walk.rank > 0 && walk.dims[walk.rank - 1] >= kMinRowElements && fits_32_bits(n)) {
      const int64_t inner = walk.dims[walk.rank - 1];
      binary_rows_kernel<kOp, T, uint32_t><<<row_blocks(n / inner), kThreads, 0, stream>>>(
          pa, pb, po, uint32_t(n / inner), uint32_t(inner), outer_of<uint32_t>(walk),
          uint32_t(walk.stride_a[walk.rank - 1]), uint32_t(walk.stride_b[walk.rank - 1]));
    } else if (fits_32_bits(n))
      binary_kernel<kOp, T, uint32_t, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          pa, pb, po, uint32_t(n), broadcast_in<uint32_t>(walk));
    else
      binary_kernel<kOp, T, int64_t, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          pa, pb, po, n, broadcast_in<int64_t>(walk));
  });
  check_launch("binary_kernel");
}

template <Unary kOp>
void launch_unary(DType dtype, const void* x, const Shape& xs, void* out, const Shape& os, cudaStream_t stream) {
  const int64_t n = numel(os);
  if (n == 0) return;
  const bool same = xs == os;
  const Walk walk = same ? Walk{} : make_walk(xs, nullptr, os, "CUDA unary elementwise");
  dispatch_elementwise(dtype, "CUDA unary elementwise", [&]<typename T>() {
    auto px = static_cast<const T*>(x);
    auto po = static_cast<T*>(out);
    if (same && pack_aligned(x) && pack_aligned(out))
      unary_packed_kernel<kOp, T><<<blocks_for(n / Pack<T>::kSize + 1, kThreads), kThreads, 0, stream>>>(px, po, n);
    else if (same)
      unary_kernel<kOp, T, int64_t, true><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(px, po, n, {});
    else if (walk.rank > 0 && walk.dims[walk.rank - 1] >= kMinRowElements && fits_32_bits(n)) {
      const int64_t inner = walk.dims[walk.rank - 1];
      unary_rows_kernel<kOp, T, uint32_t><<<row_blocks(n / inner), kThreads, 0, stream>>>(
          px, po, uint32_t(n / inner), uint32_t(inner), outer_of<uint32_t>(walk), uint32_t(walk.stride_a[walk.rank - 1]));
    } else if (fits_32_bits(n))
      unary_kernel<kOp, T, uint32_t, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          px, po, uint32_t(n), broadcast_in<uint32_t>(walk));
    else
      unary_kernel<kOp, T, int64_t, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
          px, po, n, broadcast_in<int64_t>(walk));
  });
  check_launch("unary_kernel");
}

}  // namespace

bool elementwise_supports(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kInt32 || dtype == DType::kInt64;
}

void memset_zero(void* p, size_t bytes, void* stream) {
  if (bytes) check(cudaMemsetAsync(p, 0, bytes, as_stream(stream)), "cudaMemsetAsync");
}

void binary(Binary op, DType dtype, const void* a, const Shape& a_shape, const void* b, const Shape& b_shape,
            void* out, const Shape& out_shape, void* stream) {
  const cudaStream_t s = as_stream(stream);
  switch (op) {
    case Binary::kAdd: return launch_binary<Binary::kAdd>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
    case Binary::kSub: return launch_binary<Binary::kSub>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
    case Binary::kMul: return launch_binary<Binary::kMul>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
    case Binary::kDiv: return launch_binary<Binary::kDiv>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
    case Binary::kReluGrad: return launch_binary<Binary::kReluGrad>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
    case Binary::kGeluGrad: return launch_binary<Binary::kGeluGrad>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
    case Binary::kGeluTanhGrad:
      return launch_binary<Binary::kGeluTanhGrad>(dtype, a, a_shape, b, b_shape, out, out_shape, s);
  }
}

void unary(Unary op, DType dtype, const void* x, const Shape& x_shape, void* out, const Shape& out_shape, void* stream) {
  const cudaStream_t s = as_stream(stream);
  switch (op) {
#define OT_UNARY_CASE(OP) case Unary::OP: return launch_unary<Unary::OP>(dtype, x, x_shape, out, out_shape, s);
    OT_UNARY_CASE(kCopy) OT_UNARY_CASE(kNeg) OT_UNARY_CASE(kAbs) OT_UNARY_CASE(kRelu) OT_UNARY_CASE(kExp)
    OT_UNARY_CASE(kLog) OT_UNARY_CASE(kSqrt) OT_UNARY_CASE(kReciprocal) OT_UNARY_CASE(kTanh) OT_UNARY_CASE(kSigmoid)
    OT_UNARY_CASE(kErf) OT_UNARY_CASE(kGelu) OT_UNARY_CASE(kGeluTanh)
#undef OT_UNARY_CASE
  }
}

}  // namespace onnxtrain::cuda

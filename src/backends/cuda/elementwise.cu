// One broadcasting elementwise family: every binary and unary op is a functor over float (or the
// integer type itself), and two kernels (same shapes: a flat loop; broadcast: index arithmetic
// over at most kMaxRank dims) serve them all.
#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kMaxRank = 8;
constexpr int kThreads = 256;

// The output's dims and each input's element strides over them (0 where the input broadcasts).
struct Broadcast {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t stride_a[kMaxRank] = {};
  int64_t stride_b[kMaxRank] = {};
};

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
  }
  return x;
}

__device__ __forceinline__ void offsets(const Broadcast& bc, int64_t i, int64_t& oa, int64_t& ob) {
  oa = 0;
  ob = 0;
  for (int d = bc.rank - 1; d >= 0; --d) {
    const int64_t coord = i % bc.dims[d];
    i /= bc.dims[d];
    oa += coord * bc.stride_a[d];
    ob += coord * bc.stride_b[d];
  }
}

template <Binary kOp, typename T, bool kSame>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, Broadcast bc) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t oa = i, ob = i;
    if constexpr (!kSame) offsets(bc, i, oa, ob);
    out[i] = store<T>(apply_binary<kOp>(load(a[oa]), load(b[ob])));
  }
}

template <Unary kOp, typename T, bool kSame>
__global__ void unary_kernel(const T* x, T* out, int64_t n, Broadcast bc) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t ox = i, unused;
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

Broadcast make_broadcast(const Shape& a, const Shape& b, const Shape& out, const char* what) {
  Broadcast bc;
  OT_CHECK(out.size() <= size_t(kMaxRank), what, ": rank ", out.size(), " is above the CUDA kernel's ", kMaxRank);
  bc.rank = int(out.size());
  for (int d = 0; d < bc.rank; ++d) bc.dims[d] = out[size_t(d)];
  fill_strides(a, out, bc.stride_a, what);
  fill_strides(b, out, bc.stride_b, what);
  return bc;
}

template <Binary kOp>
void launch_binary(DType dtype, const void* a, const Shape& as, const void* b, const Shape& bs, void* out,
                   const Shape& os, cudaStream_t stream) {
  const int64_t n = numel(os);
  if (n == 0) return;
  const bool same = as == os && bs == os;
  const Broadcast bc = same ? Broadcast{} : make_broadcast(as, bs, os, "CUDA binary elementwise");
  dispatch_elementwise(dtype, "CUDA binary elementwise", [&]<typename T>() {
    auto pa = static_cast<const T*>(a);
    auto pb = static_cast<const T*>(b);
    auto po = static_cast<T*>(out);
    if (same) binary_kernel<kOp, T, true><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(pa, pb, po, n, bc);
    else binary_kernel<kOp, T, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(pa, pb, po, n, bc);
  });
  check_launch("binary_kernel");
}

template <Unary kOp>
void launch_unary(DType dtype, const void* x, const Shape& xs, void* out, const Shape& os, cudaStream_t stream) {
  const int64_t n = numel(os);
  if (n == 0) return;
  const bool same = xs == os;
  const Broadcast bc = same ? Broadcast{} : make_broadcast(xs, Shape{}, os, "CUDA unary elementwise");
  dispatch_elementwise(dtype, "CUDA unary elementwise", [&]<typename T>() {
    auto px = static_cast<const T*>(x);
    auto po = static_cast<T*>(out);
    if (same) unary_kernel<kOp, T, true><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(px, po, n, bc);
    else unary_kernel<kOp, T, false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(px, po, n, bc);
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
  }
}

void unary(Unary op, DType dtype, const void* x, const Shape& x_shape, void* out, const Shape& out_shape, void* stream) {
  const cudaStream_t s = as_stream(stream);
  switch (op) {
#define OT_UNARY_CASE(OP) case Unary::OP: return launch_unary<Unary::OP>(dtype, x, x_shape, out, out_shape, s);
    OT_UNARY_CASE(kCopy) OT_UNARY_CASE(kNeg) OT_UNARY_CASE(kAbs) OT_UNARY_CASE(kRelu) OT_UNARY_CASE(kExp)
    OT_UNARY_CASE(kLog) OT_UNARY_CASE(kSqrt) OT_UNARY_CASE(kReciprocal) OT_UNARY_CASE(kTanh) OT_UNARY_CASE(kSigmoid)
#undef OT_UNARY_CASE
  }
}

}  // namespace onnxtrain::cuda

// One dtype dispatch for every kernel: call a templated lambda with the C++ type of a DType.
//
//   dispatch_float(x.dtype(), [&]<typename T>() { relu<T>(x.data<T>(), ...); });
//
// The families name what an op accepts; an unsupported dtype throws kNotImplemented, which the
// executor prefixes with the op and node name.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

template <typename T>
inline constexpr bool is_float_like_v =
    std::is_floating_point_v<T> || std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// float for half types, T otherwise: the type arithmetic is done in.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>,
                                     float, T>;

namespace detail {
[[noreturn]] void unsupported_dtype(DType dt, const char* family);
}

#define OT_DISPATCH_CASE(DT, TYPE) \
  case DType::DT: return f.template operator()<TYPE>();

template <typename F>
decltype(auto) dispatch_float(DType dt, F&& f) {
  switch (dt) {
    OT_DISPATCH_CASE(kFloat32, float)
    OT_DISPATCH_CASE(kFloat64, double)
    OT_DISPATCH_CASE(kFloat16, float16)
    OT_DISPATCH_CASE(kBFloat16, bfloat16)
    default: detail::unsupported_dtype(dt, "floating-point");
  }
}

template <typename F>
decltype(auto) dispatch_signed(DType dt, F&& f) {  // floats and signed integers
  switch (dt) {
    OT_DISPATCH_CASE(kFloat32, float)
    OT_DISPATCH_CASE(kFloat64, double)
    OT_DISPATCH_CASE(kFloat16, float16)
    OT_DISPATCH_CASE(kBFloat16, bfloat16)
    OT_DISPATCH_CASE(kInt8, int8_t)
    OT_DISPATCH_CASE(kInt16, int16_t)
    OT_DISPATCH_CASE(kInt32, int32_t)
    OT_DISPATCH_CASE(kInt64, int64_t)
    default: detail::unsupported_dtype(dt, "signed numeric");
  }
}

template <typename F>
decltype(auto) dispatch_integer(DType dt, F&& f) {
  switch (dt) {
    OT_DISPATCH_CASE(kInt8, int8_t)
    OT_DISPATCH_CASE(kUint8, uint8_t)
    OT_DISPATCH_CASE(kInt16, int16_t)
    OT_DISPATCH_CASE(kUint16, uint16_t)
    OT_DISPATCH_CASE(kInt32, int32_t)
    OT_DISPATCH_CASE(kUint32, uint32_t)
    OT_DISPATCH_CASE(kInt64, int64_t)
    OT_DISPATCH_CASE(kUint64, uint64_t)
    default: detail::unsupported_dtype(dt, "integer");
  }
}

template <typename F>
decltype(auto) dispatch_numeric(DType dt, F&& f) {  // every number type, no bool
  switch (dt) {
    OT_DISPATCH_CASE(kFloat32, float)
    OT_DISPATCH_CASE(kFloat64, double)
    OT_DISPATCH_CASE(kFloat16, float16)
    OT_DISPATCH_CASE(kBFloat16, bfloat16)
    OT_DISPATCH_CASE(kInt8, int8_t)
    OT_DISPATCH_CASE(kUint8, uint8_t)
    OT_DISPATCH_CASE(kInt16, int16_t)
    OT_DISPATCH_CASE(kUint16, uint16_t)
    OT_DISPATCH_CASE(kInt32, int32_t)
    OT_DISPATCH_CASE(kUint32, uint32_t)
    OT_DISPATCH_CASE(kInt64, int64_t)
    OT_DISPATCH_CASE(kUint64, uint64_t)
    default: detail::unsupported_dtype(dt, "numeric");
  }
}

template <typename F>
decltype(auto) dispatch_all(DType dt, F&& f) {  // numeric and bool
  if (dt == DType::kBool) return f.template operator()<bool>();
  return dispatch_numeric(dt, std::forward<F>(f));
}

// Byte-level dispatch for ops that only move data (Gather, Concat, Transpose, ...): one
// instantiation per element size instead of per dtype.
template <typename F>
decltype(auto) dispatch_by_size(DType dt, F&& f) {
  switch (dtype_size(dt)) {
    case 1: return f.template operator()<uint8_t>();
    case 2: return f.template operator()<uint16_t>();
    case 4: return f.template operator()<uint32_t>();
    case 8: return f.template operator()<uint64_t>();
    default: detail::unsupported_dtype(dt, "fixed-size");
  }
}

#undef OT_DISPATCH_CASE

// Float to integer with defined behaviour (a plain static_cast is undefined out of range): NaN
// gives 0, values beyond the type's range saturate to its limits.
template <typename To, typename From>
inline To saturate_to_int(From v) {
  static_assert(std::is_integral_v<To> && std::is_floating_point_v<From>);
  if (std::isnan(v)) return To(0);
  // lowest is 0 or -2^digits and max + 1 is 2^digits: both exact in From (max itself may round up).
  constexpr From lo = From(std::numeric_limits<To>::lowest());
  constexpr From hi = From(std::numeric_limits<To>::max()) + From(1);
  if (v <= lo) return std::numeric_limits<To>::lowest();
  if (v >= hi) return std::numeric_limits<To>::max();
  return static_cast<To>(v);
}

// The one element conversion (Cast, Pad values, scalar reads, kernels writing statistics):
// integers wrap (two's complement, as ONNX Runtime and numpy do), floats saturate into integers
// (NaN -> 0), nonzero -> true, half types go through float.
template <typename To, typename From>
inline To cast_value(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, float16> || std::is_same_v<From, bfloat16>) {
    return cast_value<To>(float(v));
  } else if constexpr (std::is_same_v<To, float16> || std::is_same_v<To, bfloat16>) {
    if constexpr (std::is_same_v<From, bool>) return To(v ? 1.0f : 0.0f);
    else return To(float(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return saturate_to_int<To>(v);
  } else {
    return static_cast<To>(v);  // int -> int wraps (C++20), int -> float rounds
  }
}

}  // namespace onnxtrain

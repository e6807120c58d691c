// Rounding a compute value back to a kernel's element type, inline. bfloat16's converting
// constructor lives in tensor.cc, so a loop that calls it cannot vectorise (bf16 Gelu ran 2x, its
// gradient 10x slower than fp32); the same round-to-nearest-even written here keeps the loop
// branch-free and vectorisable. Other types convert as before.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dispatch.h"

namespace onnxtrain {

inline uint16_t bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;  // NaN stays a quiet NaN
  return uint16_t(nan ? (b >> 16) | 0x40u : (b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

template <typename T>
inline T round_to(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bfloat16>) return bfloat16::from_bits(bf16_bits(v));
  else return T(v);
}

}  // namespace onnxtrain

// Branch-free float math that loops vectorise (glibc's expf is a call the compiler cannot
// vectorise without -ffast-math): Softmax, Gelu and their gradients.
#pragma once

#include <bit>
#include <cstdint>

namespace onnxtrain {

// e^x for x <= 0 (or NaN), to about 1 ulp; 0 below -87 (where e^x is denormal). Positive x below
// 88 come out right too (nothing guards overflow above). Branch-free, so loops over it vectorise:
// e^x = 2^k e^r with k = round(x / ln2), |r| <= ln2 / 2.
inline float exp_nonpositive(float x) {
  const float cx = x < -87.0f ? -87.0f : x;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = cx * 1.44269504088896341f + kMagic;
  const float k = t - kMagic;
  float r = cx - k * 0.693145751953125f;   // ln2, high part (exact product)
  r = r - k * 1.428606765330187e-06f;      // ln2, low part
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t ki = int32_t(std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kMagic));
  const float scale = std::bit_cast<float>(uint32_t(ki + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}

}  // namespace onnxtrain

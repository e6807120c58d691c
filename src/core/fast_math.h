// The SIMD math layer: branch-free float transcendentals that the compiler vectorises for the
// build's ISA (AVX-512, AVX2, NEON; a scalar tail is the same function). glibc's expf/tanhf/erff
// are scalar calls unless -ffast-math, which would also drop NaN/Inf semantics, so every
// elementwise hot path in float (and in bf16/fp16, computed in float) calls these instead:
// Exp, Log, Tanh, Erf, Sigmoid, Softplus, Gelu (both forms), FastGelu, their fused gradients,
// and softmax.
//
// Each function is one straight line of multiplies, adds, bit operations and selects: no table,
// no branch, no call, so a loop over an array becomes vector code (checked with -fopt-info-vec
// on the kernel files and objdump of a loop per function for AVX-512, AVX2 and NEON; see
// docs/DESIGN.md "Vectorised transcendentals"). Special values are exact: ±0 keep
// their sign where the function is odd, ±inf go to their limits, NaN propagates, denormal inputs
// and outputs are handled. Error bounds, measured against double precision over a strided sweep
// of all 2^32 float bit patterns plus every special value (tests/cpp/fast_math_test.cc):
//   exp_fast     <= 1 ulp (0.88 measured)      log_fast       <= 1 ulp (0.78)
//   tanh_fast    <= 1.5 ulp (1.33)             erf_fast       <= 2.5 ulp (2.39)
//   sigmoid_fast <= 3 ulp (2.52)               softplus_fast  <= 3 ulp (2.75)
//   gelu_tanh_fast <= 4 ulp (3.9) where the result is normal (x >= -9), <= 12 ulp of 2^-149 in
//     the denormal tail; gelu_tanh_grad_fast <= 3 ulp (2.60), or 2^-23 absolute where its two
//     terms cancel around its zero near x = -0.75
//   erf_abs_fast (for the erf form of Gelu) < 4e-7 absolute (3.8e-7)
// (ulp of the double reference rounded to float; a denormal result counts ulps of 2^-149.) The
// test asserts these bounds; changing a function means re-measuring them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace onnxtrain {

// Always inlined: a call in the middle of a vector loop keeps the loop scalar, and GCC
// declined to inline exp_fast into softmax's rows (its loop ran 25x slower than Exp's).
#define ONNXTRAIN_FAST_MATH_INLINE [[gnu::always_inline]] inline

namespace fast_math_detail {
ONNXTRAIN_FAST_MATH_INLINE float pow2i(int32_t k) {  // 2^k for k in [-126, 127]
  return std::bit_cast<float>(uint32_t(k + 127) << 23);
}
}  // namespace fast_math_detail

// c ? a : b as a bit blend. A plain ?: whose condition becomes known on one path (after a
// clamp to a constant, or a test for 0 or inf) lets GCC's jump threading split the function into
// branches, and the loop around it then stays scalar ("control flow in loop"); the blend gives it
// nothing to thread and becomes a vector mask operation.
ONNXTRAIN_FAST_MATH_INLINE float blend(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// e^x over the whole float range: 2^k e^r with k = round(x / ln2), |r| <= ln2 / 2 and a degree-7
// polynomial for e^r; 2^k applied as two factors, so results overflow to +inf from 88.73 and go
// through the denormals to 0 below -103.97 as the true values do. NaN propagates.
ONNXTRAIN_FAST_MATH_INLINE float exp_fast(float x) {
  const float cx = blend(x < -104.0f, -104.0f, blend(x > 89.0f, 89.0f, x));  // NaN stays NaN
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
  // k in [-150, 128]: two factors 2^(k/2) each a normal float; only the last product rounds.
  const int32_t ki = int32_t(std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kMagic));
  const int32_t k1 = ki >> 1;
  return p * fast_math_detail::pow2i(k1) * fast_math_detail::pow2i(ki - k1);
}

// log x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log x = e ln2 + log m, log(1 + f) = f - f^2/2 +
// f^3 P(f) (Cephes' logf coefficients). Denormals are scaled by 2^23 first. log 0 = -inf,
// log x<0 = NaN, log inf = inf.
ONNXTRAIN_FAST_MATH_INLINE float log_fast(float x) {
  const bool denormal = x < std::numeric_limits<float>::min();
  const float xs = blend(denormal, x * 8388608.0f, x);  // 2^23
  const uint32_t u = std::bit_cast<uint32_t>(xs);
  float e = float(int32_t((u >> 23) & 0xffu) - 126) - blend(denormal, 23.0f, 0.0f);
  float m = std::bit_cast<float>((u & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  const bool lo = m < 0.70710678118654752f;
  e = blend(lo, e - 1.0f, e);
  const float f = blend(lo, m + m, m) - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float y = p * f * z;
  y = y + e * -2.12194440e-4f;  // ln2 = 0.693359375 - 2.12194440e-4, the high part exact in e * it
  y = y - 0.5f * z;
  float r = f + y;
  r = r + e * 0.693359375f;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  r = blend(x == kInf, kInf, r);
  r = blend(x == 0.0f, -kInf, r);
  return blend(x >= 0.0f, r, std::numeric_limits<float>::quiet_NaN());  // x < 0 or NaN
}

// log(1 + u) for u >= 0 (Softplus): log w * u / (w - 1) with w = 1 + u rounded, which cancels
// the rounding of w (Goldberg's trick); u itself where w rounds to 1.
ONNXTRAIN_FAST_MATH_INLINE float log1p_nonneg_fast(float u) {
  const float w = 1.0f + u;
  const float d = w - 1.0f;
  return blend(d == 0.0f, u, log_fast(w) * (u / d));
}

// tanh x, odd: on |x| < 0.625 |x| + |x|^3 P(x^2) (Cephes' tanhf coefficients), above it
// 1 - 2 / (e^2|x| + 1), which reaches 1 where e^2|x| overflows; the sign is copied from x
// (so tanh(-0) = -0).
ONNXTRAIN_FAST_MATH_INLINE float tanh_fast(float x) {
  const float a = std::fabs(x);
  const float z = a * a;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = a + a * z * p;
  const float large = 1.0f - 2.0f / (exp_fast(a + a) + 1.0f);
  return std::copysign(blend(a < 0.625f, small, large), x);
}

// erf x, odd: on |x| < 1 |x| P(x^2) (Cephes' erff coefficients, relative error), above it
// 1 - erfc|x| with erfc z = t exp(-z^2 + Q(t)), t = 1 / (1 + z / 2) (Numerical Recipes'
// Chebyshev fit, fractional error < 1.2e-7), which reaches 1 from 3.92.
ONNXTRAIN_FAST_MATH_INLINE float erf_fast(float x) {
  const float z = std::fabs(x);
  const float s = z * z;
  float p = 7.853861353153693e-5f;
  p = p * s - 8.010193625184903e-4f;
  p = p * s + 5.188327685732524e-3f;
  p = p * s - 2.685381193529856e-2f;
  p = p * s + 1.128358514861418e-1f;
  p = p * s - 3.761262582423300e-1f;
  p = p * s + 1.128379165726710e+0f;
  const float small = z * p;
  const float t = 1.0f / (1.0f + 0.5f * z);
  const float q = -s - 1.26551223f +
      t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f +
      t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  const float large = 1.0f - t * exp_fast(q);
  return std::copysign(blend(z < 1.0f, small, large), x);
}

// erf with an absolute error < 4e-7 (3.8e-7 measured, near 0; the comment before 2026-11-27 said
// 2e-7): the 1 - erfc branch of erf_fast alone, over the whole range
// (near 0 the subtraction loses relative accuracy). For 0.5 x (1 + erf(x / sqrt 2)), the erf form
// of GELU and its gradient, where only the absolute error counts: one polynomial cheaper than
// erf_fast (the erf Gelu ran 7% slower through erf_fast).
ONNXTRAIN_FAST_MATH_INLINE float erf_abs_fast(float x) {
  const float z = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.5f * z);
  const float q = -z * z - 1.26551223f +
      t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f +
      t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  return std::copysign(1.0f - t * exp_fast(q), x);
}

// 1 / (1 + e^-x) with relative accuracy on both sides: e = e^-|x| never overflows, and for x < 0
// the result is e / (1 + e), down through the denormals.
ONNXTRAIN_FAST_MATH_INLINE float sigmoid_fast(float x) {
  const float e = exp_fast(-std::fabs(x));
  const float q = 1.0f / (1.0f + e);
  return blend(x >= 0.0f, q, e * q);
}

// log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow, relative accuracy for x << 0.
ONNXTRAIN_FAST_MATH_INLINE float softplus_fast(float x) {
  return blend(x > 0.0f, x, 0.0f) + log1p_nonneg_fast(exp_fast(-std::fabs(x)));
}

// The tanh form of GELU: 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3), computed as
// x sigmoid(v), v = 2u (the same function: 0.5 (1 + tanh u) = sigmoid(2u)), so that negative x
// keep relative accuracy instead of cancelling in 1 + tanh u. e^-|v| is ill-conditioned (a
// relative error of v becomes |v| times as large in e^-|v|: 170 ulps at x = -9.8 with v rounded
// once in float), so v is carried as a float plus its error dv, from products split exactly by
// FMA and a two-sum (the constants too, as high and low floats), and e^-|v| is taken as
// e^-|v_f| (1 -+ dv). All in float: a double-precision v ran 0.67 ns an element against 0.49.
// std::fma is one instruction under -march=native (x86 with FMA, aarch64). gelu(-inf) = -0 (the
// formula's limit; 0.5 x (1 + tanh u) is NaN there).
namespace fast_math_detail {
// 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715, each as a high float and the float nearest the rest.
inline constexpr float kGeluC1 = 0x1.988454p+0f, kGeluC1Lo = -0x1.857936p-25f;
inline constexpr float kGeluC3 = 0x1.2444f2p-4f, kGeluC3Lo = 0x1.49b16ap-29f;
// v = c1 x + c3 x^3 rounded, and dv, its rounding error to about 2^-44 relative. (dv through a
// reference, not a returned struct: GCC kept the struct in memory and the loop scalar.)
ONNXTRAIN_FAST_MATH_INLINE float gelu_tanh_v(float x, float& dv) {
  const float x2 = x * x, x2l = std::fma(x, x, -x2);
  const float x3 = x2 * x, x3l = std::fma(x2, x, -x3) + x2l * x;
  const float a = kGeluC1 * x, al = std::fma(kGeluC1, x, -a) + kGeluC1Lo * x;
  const float b = kGeluC3 * x3, bl = std::fma(kGeluC3, x3, -b) + (kGeluC3 * x3l + kGeluC3Lo * x3);
  const float v = a + b, bv = v - a;  // two-sum: a + b = v + ((a - (v - bv)) + (b - bv))
  dv = ((a - (v - bv)) + (b - bv)) + al + bl;
  return v;
}
// e^-|v| for v + dv: e^-|v| (1 -+ dv); 0 where e^-|v| is (dv may be NaN there: x^3 overflowed).
ONNXTRAIN_FAST_MATH_INLINE float exp_neg_abs(float v, float dv) {
  const float ev = exp_fast(-std::fabs(v));
  return blend(ev == 0.0f, 0.0f, ev * (1.0f - blend(v >= 0.0f, dv, -dv)));
}
}  // namespace fast_math_detail

ONNXTRAIN_FAST_MATH_INLINE float gelu_tanh_fast(float x) {
  float dv;
  const float v = fast_math_detail::gelu_tanh_v(x, dv);
  const float e = fast_math_detail::exp_neg_abs(v, dv);
  const float q = 1.0f / (1.0f + e);
  const float s = blend(v >= 0.0f, q, e * q);
  return blend(s == 0.0f, -0.0f, x * s);
}

// d/dx [x sigmoid(v)] = s + x s (1 - s) v', v' = c1 + 3 c3 x^2, with s (1 - s) = e / (1 + e)^2,
// e = e^-|v|, so neither side cancels; the second term is 0 where e is (large |x|, where x v'
// would overflow).
ONNXTRAIN_FAST_MATH_INLINE float gelu_tanh_grad_fast(float x) {
  float dv;
  const float v = fast_math_detail::gelu_tanh_v(x, dv);
  const float e = fast_math_detail::exp_neg_abs(v, dv);
  const float q = 1.0f / (1.0f + e);
  const float s = blend(v >= 0.0f, q, e * q);
  const float dvdx = fast_math_detail::kGeluC1 + 3.0f * fast_math_detail::kGeluC3 * (x * x);
  const float slope = (x * dvdx) * (e * q * q);
  return s + blend(e == 0.0f, 0.0f, slope);
}

}  // namespace onnxtrain

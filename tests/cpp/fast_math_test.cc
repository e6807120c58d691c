// The SIMD math layer (core/fast_math.h) against double precision: a strided sweep of all 2^32
// float bit patterns (every 509th, so each binade of both signs is visited ~16k times) plus the
// special values (±0, the smallest and largest denormals and normals, ±inf, NaN, the overflow
// and underflow edges), evaluated as the kernels do: an array loop the compiler vectorises.
// The bound asserted per function is the one fast_math.h states, for optimised builds: GCC fuses
// a * b + c into one FMA only when optimising, and the stated bounds count on it. A Debug build
// (make sanitize) rounds every step and lands a little further out (exp 1.14 ulp, Gelu's erf
// 4.5e-7), which the looser Debug bounds below allow; the sanitizers' point there is memory, not ulps.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/fast_math.h"

#ifdef __OPTIMIZE__
constexpr double kExpUlps = 1.0;       // fast_math.h's bounds
constexpr double kErfForGeluAbs = 4e-7;
#else
constexpr double kExpUlps = 1.25;      // unfused multiply-adds (see above)
constexpr double kErfForGeluAbs = 5e-7;
#endif

namespace onnxtrain {
namespace {

std::vector<float> sweep_inputs() {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 509) xs.push_back(std::bit_cast<float>(uint32_t(b)));
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                            std::nextafter(std::numeric_limits<float>::min(), 0.0f), std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            1.0f, 0.5f, 0.625f, 1e-20f, 88.0f, 88.72283f, 88.7229f, 89.0f, -87.0f, -87.5f, -103.9f,
                            -103.97208f, -104.0f, -150.0f, 9.0f, 44.0f, 3.92f, 3.93f, 0.70710677f, 0.70710683f};
  for (float s : specials) {
    xs.push_back(s);
    xs.push_back(-s);
    for (int k = 1; k <= 4; ++k) xs.push_back(std::nextafter(s, k % 2 ? 1e30f : -1e30f));
  }
  return xs;
}

// |y - r| in units of the ulp of r as a float (2^-149 for denormal results); +inf counts as 2^128.
double ulp_error(float y, double r) {
  if (std::isnan(r)) return std::isnan(y) ? 0.0 : 1e30;
  if (std::isnan(y)) return 1e30;
  // Where r rounds to ±inf as a float, it counts as ±2^128 (one ulp above the largest float).
  double yd = std::isinf(y) ? std::copysign(std::ldexp(1.0, 128), double(y)) : double(y);
  double rd = std::isinf(float(r)) ? std::copysign(std::ldexp(1.0, 128), r) : r;
  if (yd == rd) return 0.0;
  int e = 0;
  std::frexp(rd, &e);  // |r| in [2^(e-1), 2^e)
  double ulp = std::ldexp(1.0, std::max(e - 1 - 23, -149));
  return std::fabs(yd - rd) / ulp;
}

struct Worst {
  double ulps = 0;
  float x = 0;
};

template <typename Fast, typename Ref>
Worst measure(const std::vector<float>& xs, Fast fast, Ref ref, double abs_floor = 0.0,
              float lo = -std::numeric_limits<float>::infinity(), float hi = std::numeric_limits<float>::infinity()) {
  std::vector<float> ys(xs.size());
  const float* px = xs.data();
  float* py = ys.data();
  for (size_t i = 0; i < xs.size(); ++i) py[i] = fast(px[i]);  // the kernels' loop shape
  Worst w;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] < lo || xs[i] > hi) continue;
    double r = ref(double(xs[i]));
    // Functions with interior zeros (Gelu's gradient) are held to an absolute floor there.
    if (abs_floor > 0 && std::isfinite(r) && std::fabs(double(ys[i]) - r) <= abs_floor) continue;
    double u = ulp_error(ys[i], r);
    if (u > w.ulps) w = {u, xs[i]};
  }
  return w;
}

double ref_sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }
double ref_softplus(double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); }
// 0.5 x (1 + tanh u) = x sigmoid(2u): the sigmoid form keeps double's accuracy for negative x.
double ref_gelu_tanh(double x) {
  if (std::isinf(x)) return x > 0 ? x : 0.0;
  return x * ref_sigmoid(2 * 0.7978845608028654 * (x + 0.044715 * x * x * x));
}
double ref_gelu_tanh_grad(double x) {
  if (std::isinf(x)) return x > 0 ? 1.0 : 0.0;
  double v = 2 * 0.7978845608028654 * (x + 0.044715 * x * x * x);
  double dv = 2 * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
  double e = std::exp(-std::fabs(v));
  double s = ref_sigmoid(v);
  return s + (e == 0 ? 0.0 : x * dv * e / ((1 + e) * (1 + e)));
}

void expect_within(const char* name, Worst w, double bound) {
  std::printf("%-15s worst %.3f ulp at x = %a (%.9g)\n", name, w.ulps, double(w.x), double(w.x));
  EXPECT_LE(w.ulps, bound) << name << " at x = " << w.x;
}

TEST(FastMath, ExpWithinOneUlpOverTheFloatRange) {
  auto xs = sweep_inputs();
  expect_within("exp", measure(xs, [](float x) { return exp_fast(x); }, [](double x) { return std::exp(x); }), kExpUlps);
  EXPECT_EQ(exp_fast(88.8f), std::numeric_limits<float>::infinity());
  EXPECT_GT(exp_fast(88.7f), 1e38f);                       // finite below the overflow edge
  EXPECT_GT(exp_fast(-100.0f), 0.0f);                      // a denormal, not 0
  EXPECT_EQ(exp_fast(-std::numeric_limits<float>::infinity()), 0.0f);
}

TEST(FastMath, LogWithinOneUlpOverTheFloatRange) {
  auto xs = sweep_inputs();
  expect_within("log", measure(xs, [](float x) { return log_fast(x); }, [](double x) { return std::log(x); }), 1.0);
  EXPECT_EQ(log_fast(0.0f), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(log_fast(-0.0f), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(log_fast(-1.0f)));
  EXPECT_NEAR(log_fast(std::numeric_limits<float>::denorm_min()), -103.27893f, 1e-4f);
}

TEST(FastMath, TanhWithinOneAndAHalfUlpOverTheFloatRange) {
  auto xs = sweep_inputs();
  expect_within("tanh", measure(xs, [](float x) { return tanh_fast(x); }, [](double x) { return std::tanh(x); }), 1.5);
  EXPECT_TRUE(std::signbit(tanh_fast(-0.0f)));
  EXPECT_EQ(tanh_fast(-std::numeric_limits<float>::infinity()), -1.0f);
}

TEST(FastMath, ErfWithinTwoAndAHalfUlpOverTheFloatRange) {
  auto xs = sweep_inputs();
  expect_within("erf", measure(xs, [](float x) { return erf_fast(x); }, [](double x) { return std::erf(x); }), 2.5);
  EXPECT_TRUE(std::signbit(erf_fast(-0.0f)));
}

TEST(FastMath, SigmoidAndSoftplusWithinThreeUlpOverTheFloatRange) {
  auto xs = sweep_inputs();
  expect_within("sigmoid", measure(xs, [](float x) { return sigmoid_fast(x); }, ref_sigmoid), 3.0);
  expect_within("softplus", measure(xs, [](float x) { return softplus_fast(x); }, ref_softplus), 3.0);
}

TEST(FastMath, TanhGeluAndItsGradientOverTheFloatRange) {
  auto xs = sweep_inputs();
  // 4 ulp where the result is a normal float (x >= -9); below, sigmoid(v) is a denormal whose
  // rounding (half of 2^-149) x then multiplies: about |x| / 2 ulp of 2^-149, 12 at most.
  expect_within("gelu_tanh", measure(xs, [](float x) { return gelu_tanh_fast(x); }, ref_gelu_tanh, 0.0, -9.0f), 4.0);
  expect_within("gelu_tanh tail", measure(xs, [](float x) { return gelu_tanh_fast(x); }, ref_gelu_tanh), 12.0);
  // The gradient is s + x s (1 - s) v', two terms of opposite signs for x < 0 that cancel around
  // its zero near x = -0.75: there, an absolute 2^-23 (its values are O(1)).
  expect_within("gelu_tanh_grad",
                measure(xs, [](float x) { return gelu_tanh_grad_fast(x); }, ref_gelu_tanh_grad, std::ldexp(1.0, -23)), 3.0);
  EXPECT_EQ(gelu_tanh_fast(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(gelu_tanh_fast(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {
TEST(FastMath, ErfForGeluWithinFourTimesTenToTheMinusSevenAbsolute) {
  auto xs = sweep_inputs();
  double worst = 0;
  float at = 0;
  for (float x : xs) {
    float y = erf_abs_fast(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(y));
      continue;
    }
    double err = std::fabs(double(y) - std::erf(double(x)));
    if (err > worst) worst = err, at = x;
  }
  std::printf("erf_abs        worst %.3g absolute at x = %.9g\n", worst, double(at));
  EXPECT_LT(worst, kErfForGeluAbs);
}
}  // namespace
}  // namespace onnxtrain

// The portable blocked sgemm (backends/cpu/sgemm_blocked.cc) against a float64 reference, over the
// shapes that pick each of its paths: short products (fewer rows than a register tile, read in
// place), narrow ones (dot products), packed tiles; both layouts of A and B; alpha, beta and bias;
// widths that leave partial vectors; serial and split over the pool.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/sgemm_blocked.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

struct Case {
  int64_t m, n, k;
  bool trans_a, trans_b;
  float alpha, beta;
  bool bias;
};

std::string name(const Case& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + (c.trans_a ? " A^T" : "") +
         (c.trans_b ? " B^T" : "") + " alpha " + std::to_string(c.alpha) + " beta " + std::to_string(c.beta) +
         (c.bias ? " bias" : "");
}

// C = alpha op(A) op(B) + beta C + bias, in float64; returns the largest error relative to the
// size of the terms summed (|alpha| sum |a b| + |beta c| + |bias|).
double max_relative_error(const Case& c, bool parallel, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> a(size_t(c.m * c.k)), b(size_t(c.k * c.n)), y(size_t(c.m * c.n)), bias(size_t(c.n));
  for (auto* v : {&a, &b, &y, &bias})
    for (float& x : *v) x = dist(rng);
  const std::vector<float> y0 = y;
  SgemmArgs g;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.a = a.data();
  g.a_row = c.trans_a ? 1 : c.k;  // A stored [m, k], or [k, m] when transposed
  g.a_col = c.trans_a ? c.m : 1;
  g.b = b.data();
  g.b_row = c.trans_b ? 1 : c.n;  // B stored [k, n], or [n, k] when transposed
  g.b_col = c.trans_b ? c.k : 1;
  g.c = y.data();
  g.ldc = c.n;
  g.alpha = c.alpha;
  g.beta = c.beta;
  g.bias = c.bias ? bias.data() : nullptr;
  sgemm_blocked(g, parallel);

  double worst = 0.0;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0.0, scale = 0.0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double t = double(a[size_t(i * g.a_row + p * g.a_col)]) * double(b[size_t(p * g.b_row + j * g.b_col)]);
        sum += t;
        scale += std::fabs(t);
      }
      double want = double(c.alpha) * sum;
      scale *= std::fabs(double(c.alpha));
      if (c.beta != 0.0f) {
        want += double(c.beta) * y0[size_t(i * c.n + j)];
        scale += std::fabs(double(c.beta) * y0[size_t(i * c.n + j)]);
      }
      if (c.bias) {
        want += bias[size_t(j)];
        scale += std::fabs(double(bias[size_t(j)]));
      }
      worst = std::max(worst, std::fabs(double(y[size_t(i * c.n + j)]) - want) / std::max(scale, 1e-30));
    }
  return worst;
}

TEST(SgemmBlocked, MatchesFloat64AcrossPathsLayoutsAndEpilogues) {
  std::mt19937 rng(7);
  std::vector<Case> cases;
  // m from 1 to past a register tile (short and tiled paths); n with partial vectors, and wide
  // enough to split over threads; k below and above a vector, and past one packed depth slice.
  for (int64_t m : {1, 2, 3, 4, 5, 7, 9, 33})
    for (int64_t n : {1, 5, 17, 64, 130, 300})
      for (int64_t k : {3, 16, 37, 400})
        for (bool ta : {false, true})
          for (bool tb : {false, true}) cases.push_back({m, n, k, ta, tb, 1.0f, 0.0f, (m + n) % 2 == 0});
  // The epilogues on each path.
  for (int64_t m : {1, 3, 4, 12})
    for (bool tb : {false, true}) {
      cases.push_back({m, 96, 200, false, tb, 0.5f, 0.0f, true});
      cases.push_back({m, 96, 200, false, tb, 1.0f, 1.0f, false});
      cases.push_back({m, 96, 200, true, tb, -2.0f, 0.25f, true});
    }
  // A request's product through a wide layer (the openWakeWord head's 1 x 1536 x 128, both ways).
  cases.push_back({1, 128, 1536, false, true, 1.0f, 0.0f, true});
  cases.push_back({1, 128, 1536, false, false, 1.0f, 0.0f, true});
  cases.push_back({2, 2048, 512, false, false, 1.0f, 0.0f, false});  // enough work to split the columns
  cases.push_back({300, 40, 300, false, true, 1.0f, 0.0f, true});   // taller than wide: split the rows
  cases.push_back({100, 260, 200, true, false, 1.0f, 0.5f, false}); // wider: split the columns, packed

  set_num_threads(2);
  for (const Case& c : cases)
    for (bool parallel : {false, true}) {
      const double err = max_relative_error(c, parallel, rng);
      // float32 sums of up to 1536 terms: well inside 1e-5 of the terms' magnitude.
      EXPECT_LT(err, 1e-5) << name(c) << (parallel ? " parallel" : " serial");
    }
}

TEST(SgemmBlocked, EmptyDepthWritesBetaCPlusBias) {
  std::vector<float> y{1, 2, 3, 4, 5, 6}, bias{10, 20, 30};
  SgemmArgs g;
  g.m = 2;
  g.n = 3;
  g.k = 0;
  g.c = y.data();
  g.ldc = 3;
  g.beta = 2.0f;
  g.bias = bias.data();
  sgemm_blocked(g);
  EXPECT_EQ(y, (std::vector<float>{12, 24, 36, 18, 30, 42}));
}

}  // namespace
}  // namespace onnxtrain::cpu

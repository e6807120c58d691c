// Writes the C example's problem as an .npz for train_digits: points in [-1.5, 1.5]^2 labelled by
// the ring they fall in (radius < 0.6: 0, < 1.1: 1, else 2), as x_train/y_train/x_test/y_test.
//
//   make_rings OUT.npz
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "onnxtrain/npz.h"

using namespace onnxtrain;

namespace {

void make_points(std::mt19937_64& rng, int64_t n, Tensor& x, Tensor& y) {
  std::uniform_real_distribution<float> coordinate(-1.5f, 1.5f);
  std::vector<float> xs(static_cast<size_t>(n) * 2);
  std::vector<int64_t> ys(static_cast<size_t>(n));
  for (size_t i = 0; i < ys.size(); ++i) {
    const float a = coordinate(rng), b = coordinate(rng), r = std::hypot(a, b);
    xs[2 * i] = a;
    xs[2 * i + 1] = b;
    ys[i] = r < 0.6f ? 0 : r < 1.1f ? 1 : 2;
  }
  x = Tensor::from_vector(xs, {n, 2});
  y = Tensor::from_vector(ys, {n});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_rings OUT.npz\n");
    return 2;
  }
  std::mt19937_64 rng(7);
  Tensor x_train, y_train, x_test, y_test;
  make_points(rng, 1024, x_train, y_train);
  make_points(rng, 512, x_test, y_test);
  try {
    save_npz(argv[1], {{"x_train", x_train}, {"y_train", y_train}, {"x_test", x_test}, {"y_test", y_test}});
  } catch (const Error& e) {
    std::fprintf(stderr, "make_rings: %s\n", e.what());
    return 1;
  }
  return 0;
}

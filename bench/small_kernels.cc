// The full build's kernel choice for small shapes (src/backends/cpu/portable.h): oneDNN's
// primitives against the portable kernels both builds share (conv_im2col.h, gemm_blocked.h,
// pool_loops.h), per call, on the digits CNN's shapes (batch 32: conv 1->32 and 32->64 3x3 on 8x8,
// their backward passes, 2x2 max pool, the 1024->10 head) and on larger ones around the
// thresholds. Interleaved rounds, medians; prints microseconds and portable / oneDNN per shape.
//
//   OMP_NUM_THREADS=1 build/bench/small_kernels [--rounds 15]   (make bench runs it)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/conv.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/pool.h"
#include "backends/cpu/portable.h"

namespace {

using onnxtrain::cpu::KernelChoice;

std::vector<float> random_floats(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(size_t(std::max<int64_t>(n, 1)));
  for (auto& x : v) x = u(rng);
  return v;
}

double seconds_of(const std::function<void()>& f, int inner) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < inner; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / inner;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// make(choice) builds the primitive under that choice and returns its call.
void compare(const std::string& what, const std::function<std::function<void()>(KernelChoice)>& make, int rounds) {
  std::function<void()> lib, port;
  onnxtrain::cpu::set_kernel_choice(KernelChoice::kLibrary);
  lib = make(KernelChoice::kLibrary);
  onnxtrain::cpu::set_kernel_choice(KernelChoice::kPortable);
  port = make(KernelChoice::kPortable);
  onnxtrain::cpu::set_kernel_choice(KernelChoice::kBySize);
  lib(), port();  // first calls: JIT, scratch growth
  const int inner = 5;
  std::vector<double> tl, tp, ratio;
  for (int r = 0; r < rounds; ++r) {
    const double a = seconds_of(lib, inner), b = seconds_of(port, inner);
    tl.push_back(a), tp.push_back(b), ratio.push_back(b / a);
  }
  std::printf("%-46s oneDNN %9.1f us  portable %9.1f us  portable/oneDNN %.2f\n", what.c_str(), median(tl) * 1e6,
              median(tp) * 1e6, median(ratio));
}

onnxtrain::cpu::ConvSpec conv_spec(int64_t n, int64_t c, int64_t m, int64_t hw, int64_t k, int64_t stride = 1,
                                   int64_t group = 1) {
  onnxtrain::cpu::ConvSpec s;
  s.x = {n, c, hw, hw};
  s.out_channels = m;
  s.group = group;
  s.kernel = {k, k};
  s.stride = {stride, stride};
  s.dilation = {1, 1};
  s.pad_l = s.pad_r = {k / 2, k / 2};
  const int64_t out = (hw + 2 * (k / 2) - k) / stride + 1;
  s.out = {out, out};
  return s;
}

void conv_case(const std::string& name, const onnxtrain::cpu::ConvSpec& s, bool need_dx, int rounds) {
  const int64_t n = s.x[0], c = s.x[1], m = s.out_channels, xs = s.x[2] * s.x[3], ys = s.out[0] * s.out[1];
  const int64_t taps = s.kernel[0] * s.kernel[1];
  const int64_t w_size = m * (c / s.group) * taps;
  auto x = random_floats(n * c * xs, 1), w = random_floats(w_size, 2), dy = random_floats(n * m * ys, 3);
  std::vector<float> y(size_t(n * m * ys)), dx(size_t(n * c * xs)), dw(static_cast<size_t>(w_size));
  compare(name + " forward", [&](KernelChoice) {
    auto p = std::make_shared<onnxtrain::cpu::ConvPrimitive>(s, "bench");
    return [p, &x, &w, &y] { p->run(x.data(), w.data(), nullptr, y.data()); };
  }, rounds);
  compare(name + (need_dx ? " backward dX+dW" : " backward dW"), [&](KernelChoice) {
    auto p = std::make_shared<onnxtrain::cpu::ConvBackwardPrimitive>(s, need_dx, true, "bench");
    return [p, &dy, &x, &w, &dx, &dw, need_dx] {
      p->run(dy.data(), x.data(), w.data(), need_dx ? dx.data() : nullptr, dw.data(), nullptr);
    };
  }, rounds);
}

void matmul_case(const std::string& name, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool bias, int rounds) {
  onnxtrain::cpu::MatmulDims d;
  d.m = m, d.n = n, d.k = k, d.trans_a = ta, d.trans_b = tb, d.bias = bias;
  auto a = random_floats(m * k, 4), b = random_floats(k * n, 5), bv = random_floats(n, 6);
  std::vector<float> c(size_t(m * n));
  compare(name, [&](KernelChoice) {
    auto p = std::make_shared<onnxtrain::cpu::Matmul>(d, "bench");
    return [p, &a, &b, &c, &bv] { p->run(a.data(), b.data(), c.data(), bv.data()); };
  }, rounds);
}

void pool_case(const std::string& name, int64_t n, int64_t c, int64_t hw, int rounds) {
  onnxtrain::cpu::PoolSpec s;
  s.x = {n, c, hw, hw};
  s.kernel = s.stride = {2, 2};
  s.dilation = {1, 1};
  s.pad_l = s.pad_r = {0, 0};
  s.out = {hw / 2, hw / 2};
  auto x = random_floats(n * c * hw * hw, 7), dy = random_floats(n * c * hw * hw / 4, 8);
  std::vector<float> y(dy.size()), dx(x.size());
  compare(name + " forward", [&](KernelChoice) {
    auto p = std::make_shared<onnxtrain::cpu::PoolPrimitive>(*onnxtrain::cpu::PoolPrimitive::make(s, false, "bench"));
    return [p, &x, &y] { p->forward(x.data(), y.data()); };
  }, rounds);
  compare(name + " backward", [&](KernelChoice) {
    auto p = std::make_shared<onnxtrain::cpu::PoolPrimitive>(*onnxtrain::cpu::PoolPrimitive::make(s, true, "bench"));
    return [p, &dy, &x, &dx] { p->backward(dy.data(), x.data(), dx.data()); };
  }, rounds);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  std::printf("# digits CNN shapes (batch 32)\n");
  conv_case("conv 1->32 3x3 on 8x8", conv_spec(32, 1, 32, 8, 3), false, rounds);
  conv_case("conv 32->64 3x3 on 8x8", conv_spec(32, 32, 64, 8, 3), true, rounds);
  pool_case("maxpool 2x2 [32,64,8,8]", 32, 64, 8, rounds);
  matmul_case("head Y = X W^T + b [32,1024]x[10,1024]^T", 32, 10, 1024, false, true, true, rounds);
  matmul_case("head dX = dY W [32,10]x[10,1024]", 32, 1024, 10, false, false, false, rounds);
  matmul_case("head dW = dY^T X [32,10]^Tx[32,1024]", 10, 1024, 32, true, false, false, rounds);
  std::printf("# around the thresholds\n");
  conv_case("conv 64->64 3x3 on 8x8", conv_spec(32, 64, 64, 8, 3), true, rounds);
  conv_case("conv 32->64 3x3 on 16x16", conv_spec(32, 32, 64, 16, 3), true, rounds);
  conv_case("conv 128->128 3x3 on 7x7 (batch 8)", conv_spec(8, 128, 128, 7, 3), true, rounds);
  // MobileNet's last stage at batch 1 (issue 13's CNNs): a 1x1 expansion and a depthwise 3x3.
  conv_case("conv 160->960 1x1 on 7x7 (batch 1)", conv_spec(1, 160, 960, 7, 1), true, rounds);
  conv_case("depthwise 960 3x3 on 7x7 (batch 1)", conv_spec(1, 960, 960, 7, 3, 1, 960), true, rounds);
  pool_case("maxpool 2x2 [32,64,16,16]", 32, 64, 16, rounds);
  matmul_case("matmul 128x128x128", 128, 128, 128, false, false, false, rounds);
  matmul_case("matmul 256x256x256", 256, 256, 256, false, false, false, rounds);
  return 0;
}

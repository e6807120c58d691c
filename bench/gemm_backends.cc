// fp32 GEMM backends for the minimal runtime, measured on one machine in one run: the full build's
// oneDNN matmul, the minimal build's blocked kernel (src/backends/cpu/sgemm_blocked.h) and XNNPACK's
// fully-connected operator (libxnnpack-dev), on shapes training runs: the digits CNN (its conv as
// im2col GEMMs and its head) and a BERT-style layer (hidden 256, batch x seq 1024). Training
// changes the weights every step, so XNNPACK, which packs them when the operator is created, is
// timed both as inference runs it (create once, run) and as a training step needs it (create + run).
//
// One thread for all three (XNNPACK runs on its caller's thread without a pthreadpool, whose
// development headers Debian does not ship): the kernels, not the thread pools, are compared.
//
//   build/bench/gemm_backends     (make bench runs it)
#include <xnnpack.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/sgemm_blocked.h"
#include "core/parallel.h"

namespace {

struct Shape3 { const char* what; int64_t m, n, k; };

template <typename F>
double median_seconds(F&& f) {
  f();  // warm up (oneDNN JIT, packing buffers)
  std::vector<double> t;
  for (int rep = 0; rep < 9; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    const int inner = 5;
    for (int i = 0; i < inner; ++i) f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / inner);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  const int threads = 1;
  onnxtrain::set_num_threads(threads);
  if (xnn_initialize(nullptr) != xnn_status_success) {
    std::fprintf(stderr, "XNNPACK failed to initialize\n");
    return 1;
  }
  void* const pool = nullptr;  // pthreadpool_t: none, the caller's thread
  const Shape3 shapes[] = {
      {"digits conv2 fwd (im2col)", 64, 2048, 288}, {"digits conv2 dW", 64, 288, 2048},
      {"digits head", 32, 10, 1024},                 {"BERT QKV/out proj", 1024, 256, 256},
      {"BERT FFN up", 1024, 1024, 256},              {"BERT FFN down", 1024, 256, 1024},
  };
  std::printf("fp32 GEMM C[m,n] = A[m,k] B[k,n], %d threads, median of 9 x 5 runs; GFLOP/s\n", threads);
  std::printf("%-28s %6s %6s %6s | %8s %8s %10s %12s | blocked/oneDNN\n", "shape", "m", "n", "k", "oneDNN",
              "blocked", "XNN(run)", "XNN(pack+run)");
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape3& s : shapes) {
    std::vector<float> a(size_t(s.m * s.k)), b(size_t(s.k * s.n)), bt(size_t(s.n * s.k)), c(size_t(s.m * s.n));
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    for (int64_t i = 0; i < s.k; ++i)
      for (int64_t j = 0; j < s.n; ++j) bt[size_t(j * s.k + i)] = b[size_t(i * s.n + j)];
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);

    onnxtrain::cpu::MatmulDims d;
    d.m = s.m, d.n = s.n, d.k = s.k;
    onnxtrain::cpu::Matmul dnnl(d, "bench");
    const double t_dnnl = median_seconds([&] { dnnl.run(a.data(), b.data(), c.data()); });

    onnxtrain::cpu::SgemmArgs g;
    g.m = s.m, g.n = s.n, g.k = s.k, g.a = a.data(), g.a_row = s.k, g.b = b.data(), g.b_row = s.n;
    g.c = c.data(), g.ldc = s.n;
    const double t_blocked = median_seconds([&] { onnxtrain::cpu::sgemm_blocked(g); });

    // XNNPACK's fully connected: weights [n, k] (output channels x input channels), packed at creation.
    auto create = [&] {
      xnn_operator_t op = nullptr;
      if (xnn_create_fully_connected_nc_f32(size_t(s.k), size_t(s.n), size_t(s.k), size_t(s.n), bt.data(), nullptr,
                                            -INFINITY, INFINITY, 0, &op) != xnn_status_success) {
        std::fprintf(stderr, "xnn_create_fully_connected_nc_f32 failed\n");
        std::exit(1);
      }
      return op;
    };
    auto run = [&](xnn_operator_t op) {
      xnn_setup_fully_connected_nc_f32(op, size_t(s.m), a.data(), c.data(), static_cast<pthreadpool_t>(pool));
      xnn_run_operator(op, static_cast<pthreadpool_t>(pool));
    };
    xnn_operator_t op = create();
    const double t_xnn = median_seconds([&] { run(op); });
    xnn_delete_operator(op);
    const double t_xnn_pack = median_seconds([&] {
      xnn_operator_t fresh = create();
      run(fresh);
      xnn_delete_operator(fresh);
    });
    std::printf("%-28s %6lld %6lld %6lld | %8.1f %8.1f %10.1f %12.1f | %.2fx\n", s.what, (long long)s.m,
                (long long)s.n, (long long)s.k, flops / t_dnnl * 1e-9, flops / t_blocked * 1e-9, flops / t_xnn * 1e-9,
                flops / t_xnn_pack * 1e-9, t_blocked / t_dnnl);
  }
  return 0;
}

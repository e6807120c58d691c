// oneDNN matmul throughput in fp32, bf16 (bf16 inputs, fp32 accumulation, bf16 or fp32 output)
// and f16 on this CPU: the ceiling a mixed-precision train step can reach.
//
//   g++ -O2 -std=c++20 bench/gemm_bf16_peak.cc -ldnnl -o /tmp/gemm_bf16_peak && /tmp/gemm_bf16_peak [n=2048] [runs=10]
//
// (standalone: oneDNN alone, no onnxtrain; bench/bench_mixed_precision.py measures the same
// through onnxtrain's MatMul in the run it reports)
//
// Prints one JSON object {"isa": ..., "n": ..., "f32": GFLOP/s, "bf16": ..., "bf16_f32out": ...,
// "f16": ... or an error string}, each the median over `runs` after one warm-up (JIT) run.
// Threads follow OMP_NUM_THREADS.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Median GFLOP/s of an n x n x n matmul with the given source/weights and destination types;
// weights in the primitive's preferred (packed) layout, as the engine keeps constant weights.
std::string measure(dnnl::engine& eng, dnnl::stream& strm, int64_t n, int runs, dt in, dt out) {
  try {
    dnnl::memory::desc a_md({n, n}, in, tag::ab), b_any({n, n}, in, tag::any), c_md({n, n}, out, tag::ab);
    dnnl::matmul::desc desc(a_md, b_any, c_md);
    dnnl::matmul::primitive_desc pd(desc, eng);
    dnnl::matmul prim(pd);
    dnnl::memory a(a_md, eng), b(pd.weights_desc(), eng), c(c_md, eng);
    // Fill A and B with small values (the bytes of 0.5 in each type are fine for timing).
    std::fill_n(static_cast<char*>(a.get_data_handle()), a_md.get_size(), 0);
    std::fill_n(static_cast<char*>(b.get_data_handle()), pd.weights_desc().get_size(), 0);
    std::vector<double> t;
    for (int r = 0; r <= runs; ++r) {
      auto s = std::chrono::steady_clock::now();
      prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
      strm.wait();
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
      if (r > 0) t.push_back(sec);
    }
    std::sort(t.begin(), t.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", 2.0 * double(n) * n * n / t[t.size() / 2] / 1e9);
    return buf;
  } catch (const dnnl::error& e) {
    return std::string("\"unsupported: ") + e.what() + "\"";
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = argc > 1 ? std::atoll(argv[1]) : 2048;
  int runs = argc > 2 ? std::atoi(argv[2]) : 10;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::string f32 = measure(eng, strm, n, runs, dt::f32, dt::f32);
  std::string bf16 = measure(eng, strm, n, runs, dt::bf16, dt::bf16);
  std::string bf16_f32 = measure(eng, strm, n, runs, dt::bf16, dt::f32);
  std::string f16 = measure(eng, strm, n, runs, dt::f16, dt::f16);
  std::printf("{\"isa\": \"%d\", \"n\": %lld, \"f32\": %s, \"bf16\": %s, \"bf16_f32out\": %s, \"f16\": %s}\n",
              int(dnnl::get_effective_cpu_isa()), static_cast<long long>(n), f32.c_str(), bf16.c_str(),
              bf16_f32.c_str(), f16.c_str());
  return 0;
}

// cpu_features(): CPUID for what the hardware has, XGETBV for what the OS lets programs use, and
// the matmul backend for which kernels the engine then runs.
#include "onnxtrain/cpu_features.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "backends/cpu/gemm.h"
#include "onnxtrain/status.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain {
namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Regs { uint32_t a = 0, b = 0, c = 0, d = 0; };

Regs cpuid(uint32_t leaf, uint32_t sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// CPUID leaves 0x80000002-4: the 48-byte brand string, padded with spaces and NULs.
std::string brand_string() {
  if (cpuid(0x80000000u, 0).a < 0x80000004u) return "";
  char brand[49] = {};
  for (uint32_t i = 0; i < 3; ++i) {
    Regs r = cpuid(0x80000002u + i, 0);
    std::memcpy(brand + 16 * i, &r.a, 4);
    std::memcpy(brand + 16 * i + 4, &r.b, 4);
    std::memcpy(brand + 16 * i + 8, &r.c, 4);
    std::memcpy(brand + 16 * i + 12, &r.d, 4);
  }
  std::string s(brand);
  const size_t begin = s.find_first_not_of(' '), end = s.find_last_not_of(' ');
  return begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
}

void probe_x86(CpuFeatures& f) {
  Regs v = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  f.model = brand_string();
  Regs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l71 = v.a >= 7 ? cpuid(7, 1) : Regs{};
  auto bit = [](uint32_t r, int i) { return ((r >> i) & 1u) != 0; };
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool avx_os = (xcr0 & 0x6) == 0x6;             // XMM and YMM state
  const bool avx512_os = avx_os && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool amx_os = (xcr0 & 0x60000) == 0x60000;     // XTILECFG and XTILEDATA
  f.flags["avx2"] = avx_os && bit(l7.b, 5);
  f.flags["fma"] = avx_os && bit(l1.c, 12);
  f.flags["f16c"] = avx_os && bit(l1.c, 29);
  f.flags["avx512f"] = avx512_os && bit(l7.b, 16);
  f.flags["avx512bw"] = avx512_os && bit(l7.b, 30);
  f.flags["avx512_vnni"] = avx512_os && bit(l7.c, 11);
  f.flags["avx512_bf16"] = avx512_os && bit(l71.a, 5);
  f.flags["avx512_fp16"] = avx512_os && bit(l7.d, 23);
  f.flags["amx_bf16"] = amx_os && bit(l7.d, 22);
  f.flags["amx_tile"] = amx_os && bit(l7.d, 24);
  f.flags["amx_int8"] = amx_os && bit(l7.d, 25);
  f.flags["amx_fp16"] = amx_os && bit(l71.a, 21);
}
#endif

// A 256 x 512 x 512 product in `dtype`, ready to time.
struct TimedProduct {
  explicit TimedProduct(DType dtype) : product(dims(dtype), "gemm_rates") {
    a = Tensor::zeros(dtype, {256, 512});
    b = Tensor::zeros(dtype, {512, 512});
    c = Tensor::zeros(dtype, {256, 512});
    product.run(a.data(), b.data(), c.data());  // the first run JIT-compiles
  }
  static cpu::MatmulDims dims(DType dtype) {
    cpu::MatmulDims d;
    d.m = 256;
    d.n = 512;
    d.k = 512;
    d.dtype = dtype;
    return d;
  }
  double seconds() const {
    const auto start = std::chrono::steady_clock::now();
    product.run(a.data(), b.data(), c.data());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  cpu::Matmul product;
  Tensor a, b;
  mutable Tensor c;  // written by every timed run
};

// fp32 and bf16 GFLOP/s on one thread (a core's property, and what the ratio between them is
// about; a two-thread figure swung 16-460 GFLOP/s on the shared 2-core VM while other processes ran),
// the two interleaved, the best of seven runs each, so a preempted run counts for neither.
std::pair<double, double> measure_gflops(bool bf16) {
  struct OneThread {  // the caller's thread count comes back however this returns
    int threads = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(threads); }
  } one_thread;
  TimedProduct fp32_product(DType::kFloat32);
  std::optional<TimedProduct> bf16_product;
  if (bf16) bf16_product.emplace(DType::kBFloat16);
  double fp32_best = 1e30, bf16_best = 1e30;
  for (int i = 0; i < 7; ++i) {
    fp32_best = std::min(fp32_best, fp32_product.seconds());
    if (bf16_product) bf16_best = std::min(bf16_best, bf16_product->seconds());
  }
  const double flops = 2.0 * 256 * 512 * 512;
  return {flops / std::max(fp32_best, 1e-9) / 1e9, bf16_product ? flops / std::max(bf16_best, 1e-9) / 1e9 : 0.0};
}

// ONNXTRAIN_GEMM_RATES="fp32=RATE,bf16=RATE": both, positive (bf16 may be 0: no native kernel).
GemmRates rates_from(const std::string& text) {
  GemmRates r;
  r.source = "ONNXTRAIN_GEMM_RATES";
  bool fp32 = false, bf16 = false;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    char* end = nullptr;
    const double value = eq == std::string::npos ? -1.0 : std::strtod(item.c_str() + eq + 1, &end);
    const bool number = eq != std::string::npos && end && *end == '\0' && end != item.c_str() + eq + 1 && value >= 0.0;
    const std::string key = eq == std::string::npos ? item : item.substr(0, eq);
    OT_CHECK(number && (key == "fp32" || key == "bf16"), "ONNXTRAIN_GEMM_RATES: expected fp32=GFLOPS,bf16=GFLOPS, got '",
             text, "' (at '", item, "')");
    (key == "fp32" ? r.fp32_gflops : r.bf16_gflops) = value;
    (key == "fp32" ? fp32 : bf16) = true;
    pos = comma + 1;
  }
  OT_CHECK(fp32 && bf16 && r.fp32_gflops > 0.0, "ONNXTRAIN_GEMM_RATES: expected fp32=GFLOPS,bf16=GFLOPS with fp32 > 0, got '",
           text, "'");
  return r;
}

}  // namespace

const GemmRates& gemm_rates() {
  static const GemmRates rates = [] {
    if (const char* env = std::getenv("ONNXTRAIN_GEMM_RATES"); env && *env) return rates_from(env);
    GemmRates r;
    r.source = "measured";
    std::tie(r.fp32_gflops, r.bf16_gflops) = measure_gflops(cpu::matmul_native(DType::kBFloat16));
    return r;
  }();
  return rates;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    probe_x86(f);
#endif
    f.onednn_isa = cpu::matmul_isa();
    f.bf16_matmul_native = cpu::matmul_native(DType::kBFloat16);
    f.fp16_matmul_native = cpu::matmul_native(DType::kFloat16);
    return f;
  }();
  return features;
}

}  // namespace onnxtrain

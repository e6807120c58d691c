// cpu_features(): CPUID for what the hardware has, XGETBV for what the OS lets programs use, and
// the matmul backend for which kernels the engine then runs.
#include "onnxtrain/cpu_features.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "backends/cpu/gemm.h"

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

void probe_x86(CpuFeatures& f) {
  Regs v = cpuid(0, 0);
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
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

}  // namespace

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

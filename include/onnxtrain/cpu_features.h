// What this CPU offers for low-precision training, and what onnxtrain does with it.
//
//   onnxtrain::CpuFeatures f = onnxtrain::cpu_features();
//   if (!f.bf16_matmul_native) { /* bf16 GEMMs compute through fp32 here */ }
#pragma once

#include <map>
#include <string>

namespace onnxtrain {

struct CpuFeatures {
  std::string vendor;                  // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  std::string model;                   // the CPU's brand string ("AMD EPYC 9R14 ..."; "" when unknown)
  // Instruction sets the CPU reports and the OS has enabled (CPUID and XGETBV).
  std::map<std::string, bool> flags;   // avx2, fma, f16c, avx512f, avx512bw, avx512_vnni,
                                       // avx512_bf16, avx512_fp16, amx_tile, amx_bf16, amx_fp16
  std::string onednn_isa;              // the instruction set the GEMM kernels dispatch to (oneDNN's;
                                       // the minimal build's blocked kernels: "blocked-<width>")
  bool bf16_matmul_native = false;     // bf16 MatMul/Gemm run in bf16 (fp32 accumulation)
  bool fp16_matmul_native = false;     // fp16 likewise; otherwise they compute through fp32
};

// Probed once per process.
const CpuFeatures& cpu_features();

// What bf16 mixed precision buys on this CPU: the GEMM rates (GFLOP/s) of one 256 x 512 x 512
// product through the kernels training runs, on one thread, fp32 and bf16 interleaved, the best of
// seven runs each after a warm-up. Measured once per process, on the first call (tens of milliseconds), or taken from
// ONNXTRAIN_GEMM_RATES="fp32=RATE,bf16=RATE" (to state them, or to test what follows from them).
// Without AMX, bf16 GEMMs can be slower than fp32 ones (an Intel Xeon with AVX512-BF16: 143 against
// 235 GFLOP/s): there bf16 mixed precision still halves activation memory but slows the step.
struct GemmRates {
  double fp32_gflops = 0.0;
  double bf16_gflops = 0.0;            // 0: no native bf16 kernel (bf16 computes through fp32)
  std::string source;                  // "measured" or "ONNXTRAIN_GEMM_RATES"
  bool bf16_pays() const { return bf16_gflops > fp32_gflops; }
};
const GemmRates& gemm_rates();

}  // namespace onnxtrain

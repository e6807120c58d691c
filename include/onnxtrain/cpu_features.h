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

}  // namespace onnxtrain

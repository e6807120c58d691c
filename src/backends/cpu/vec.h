// The widest fp32 vector the target compiles for, in the compiler's vector extension: the portable
// kernels' one SIMD type (sgemm_blocked.cc, conv_direct.cc). AVX-512 (16 lanes), AVX2 (8), NEON,
// WebAssembly SIMD128 or no SIMD (4: the compiler splits or scalarises it); which one follows the
// build's -march, and both builds of one machine compile these files with the same flags, so they
// compute alike.
#pragma once

#include <cstring>

namespace onnxtrain::cpu::vec {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__)
constexpr int kLanes = 8;
constexpr const char* kIsa = "avx2";
#elif defined(__ARM_NEON)
constexpr int kLanes = 4;
constexpr const char* kIsa = "neon";
#elif defined(__wasm_simd128__)
constexpr int kLanes = 4;  // WebAssembly's SIMD128 (-msimd128): the engine maps it to SSE or NEON
constexpr const char* kIsa = "wasm-simd128";
#else
constexpr int kLanes = 4;
constexpr const char* kIsa = "generic";
#endif
// Vector registers the target has: 32 (ZMM, NEON q) or 16 (YMM, SSE; WebAssembly, whose engines
// keep SIMD128 values in the host's XMM registers on x86-64).
#if defined(__AVX512F__) || defined(__ARM_NEON)
constexpr int kRegisters = 32;
#else
constexpr int kRegisters = 16;
#endif

using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));

// Every lane = x: a broadcast. x - (+0) is exactly x for every x, so the compiler drops the
// subtraction (x + 0 is not: -0 + 0 = +0, and a lane-by-lane fill goes through memory).
inline Vec splat(float x) { return x - Vec{}; }

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

}  // namespace onnxtrain::cpu::vec

// fp32 GEMM with no library: the portable matmul of both builds (gemm_blocked.h: every product of
// the minimal build, the small ones of the full build; bench/ measures it against oneDNN).
//
//   C = alpha * A B + beta * C (+ bias row),   A: m x k, B: k x n, C: m x n (row stride ldc)
//
// A and B are read through element strides (A(i, p) = a[i * a_row + p * a_col]), so transposed
// operands cost nothing. Blocked as BLIS does: a KC-deep slice of B packed into NR-wide column
// panels, of A into MR-tall row panels, and an MR x NR register tile computed by a micro-kernel
// in the compiler's vector extension (AVX-512, AVX2 or NEON width, whichever the target has).
#pragma once

#include <cstdint>
#include <string>

namespace onnxtrain::cpu {

struct SgemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t a_row = 0, a_col = 1;  // element strides of A's rows and columns
  const float* b = nullptr;
  int64_t b_row = 0, b_col = 1;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* bias = nullptr;   // length n, added to every row after alpha and beta
};

// `parallel`: split the tiles over the OpenMP pool (callers already running in parallel pass false).
void sgemm_blocked(const SgemmArgs& args, bool parallel = true);

// The vector width the micro-kernel was compiled for: "blocked-avx512", "blocked-avx2", "blocked-neon"
// or "blocked-generic".
std::string sgemm_blocked_isa();

}  // namespace onnxtrain::cpu

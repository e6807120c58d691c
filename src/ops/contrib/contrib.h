// Shared by the com.microsoft contrib ops (ONNX Runtime's docs/ContribOperators.md is the contract):
// the domain name and the dtype dispatch these kernels accept (float32 for models, float64 for the
// finite-difference gradient checks; float16/bfloat16 inputs are named as not implemented).
#pragma once

#include <string>
#include <type_traits>

#include "backends/cpu/gemm.h"
#include "ops/common.h"

namespace onnxtrain {

template <typename F>
decltype(auto) dispatch_f32_f64(const Node& node, DType dt, F&& f) {
  if (dt == DType::kFloat32) return f.template operator()<float>();
  if (dt == DType::kFloat64) return f.template operator()<double>();
  OT_THROW(kNotImplemented, node.context(), "expected float32 or float64 inputs, got ", dtype_name(dt));
}

// c[m, n] = beta c + op(a)[m, k] op(b)[k, n], op transposing when asked: oneDNN for float32, the
// reference loop for float64 (the gradient checks).
template <typename T>
void contrib_gemm(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float beta, const T* a, const T* b,
                  T* c) {
  cpu::MatmulDims d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_a = trans_a;
  d.trans_b = trans_b;
  d.beta = beta;
  if constexpr (std::is_same_v<T, float>) cpu::matmul(d, a, b, c);
  else cpu::matmul_reference<T>(d, a, b, c);
}

}  // namespace onnxtrain

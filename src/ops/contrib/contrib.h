// Shared by the com.microsoft contrib ops (ONNX Runtime's docs/ContribOperators.md is the contract):
// the domain name and the dtype dispatch these kernels accept (float32 for models, float64 for the
// finite-difference gradient checks; float16/bfloat16 inputs are named as not implemented).
#pragma once

#include <string>

#include "ops/common.h"

namespace onnxtrain {

inline const std::string kMsDomain = "com.microsoft";

template <typename F>
decltype(auto) dispatch_f32_f64(const Node& node, DType dt, F&& f) {
  if (dt == DType::kFloat32) return f.template operator()<float>();
  if (dt == DType::kFloat64) return f.template operator()<double>();
  OT_THROW(kNotImplemented, node.context(), "expected float32 or float64 inputs, got ", dtype_name(dt));
}

}  // namespace onnxtrain

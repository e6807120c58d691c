// The quantization graph transformation behind onnxtrain::quantize (include/onnxtrain/quantize.h):
// MatMul/Gemm with fp32 weight initializers -> com.microsoft.MatMulNBits (layout: ops/contrib/nbits_layout.h).
#pragma once

#include "ir/graph.h"
#include "onnxtrain/quantize.h"

namespace onnxtrain {

// Rewrites `model` in place and returns the per-layer report.
QuantizeReport quantize_model(Model& model, const QuantizeOptions& options);

// Block quantization of one weight W [N, K] (row n = output feature) into the MatMulNBits inputs.
struct QuantizedWeight {
  Tensor blob;         // uint8 [N, k_blocks, blob_bytes]
  Tensor scales;       // float32 [N, k_blocks]
  Tensor zero_points;  // uint8 [N, ceil(k_blocks * bits / 8)], undefined when symmetric
  double relative_error = 0;
};
QuantizedWeight quantize_weight(const float* w_nk, int64_t n, int64_t k, const QuantizeOptions& options);

}  // namespace onnxtrain

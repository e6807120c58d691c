// Weight-only block quantization of an fp32 model for fine-tuning and inference on small devices:
// every MatMul whose weight is a 2-D float32 initializer (directly, or through a Transpose as
// exporters write a Linear without bias), and every Gemm (transA=0, alpha=1,
// beta=1) with such a weight, becomes a com.microsoft.MatMulNBits node (ONNX Runtime's layout, so
// the result also runs in ONNX Runtime). Node names are kept, so LoRA target patterns still match.
//
//   onnxtrain::QuantizeOptions o;  o.bits = 4;  o.block_size = 32;
//   onnxtrain::QuantizeReport r = onnxtrain::quantize("model.onnx", "model_int4.onnx", o);
//   std::cout << r.table();     // per layer: K, N, relative error ||W - Wq|| / ||W||
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnxtrain {

struct QuantizeOptions {
  int bits = 4;                       // 2, 4 or 8
  int block_size = 32;                // a power of 2, >= 16
  bool symmetric = false;             // true: zero point 2^(bits-1) implied, no zero_points input
  std::vector<std::string> exclude;   // node or weight name patterns left in fp32 (substring or glob)
};

struct QuantizedLayer {
  std::string node, weight;
  int64_t k = 0, n = 0;
  double relative_error = 0;          // ||W - dequant(quant(W))||_F / ||W||_F
};

struct QuantizeReport {
  std::vector<QuantizedLayer> layers;
  std::vector<std::string> skipped;   // "node: why" for MatMul/Gemm nodes left in fp32
  int64_t weight_bytes_before = 0, weight_bytes_after = 0;
  std::string table() const;          // a human-readable report, one line per layer
};

// Quantizes the model at `input` (external data next to it) and writes the result to `output`.
// Throws onnxtrain::Error for bad options (bits, block size) before anything is written.
QuantizeReport quantize(const std::string& input, const std::string& output, const QuantizeOptions& options);

}  // namespace onnxtrain

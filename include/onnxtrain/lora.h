// LoRA adapters for on-device fine-tuning (ArtifactOptions::lora): for each targeted MatMul, Gemm
// or com.microsoft.MatMulNBits with weight W (K inputs, N outputs) the artifacts compute
//   y = x W + (alpha / rank) (x A^T) B^T,   A [rank, K] Kaiming-uniform as PEFT, B [N, rank] zero,
// train only A and B (the base stays frozen, and quantized if it was), and checkpoint only the
// adapters plus a hash of the base. Adapter parameters are named "<module>.lora_A.weight" and
// "<module>.lora_B.weight", <module> being the layer's PyTorch path (the weight name without
// ".weight", or the node name with '/' as '.' and the op suffix dropped), so exported adapters
// carry PEFT's key names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onnxtrain {

struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16;
  // Layers to adapt, by PEFT's target_modules rule on the module path: "fc" adapts a module named
  // "fc" or ending in ".fc" (not "fc2"); a pattern with * ? [ is a glob over the whole path.
  std::vector<std::string> target;
  double dropout = 0.0;             // on the adapter's input during training (needs ai.onnx opset >= 12)
  uint64_t seed = 0;                // for A's initialisation
};

class CheckpointState;

// Writes the adapters recorded in `model_path` (the training or eval model of LoRA artifacts) with
// their values from `state` to `path`: a safetensors file with PEFT's key names
// ("base_model.model.<module>.lora_A.weight", ...) and the base's hash in its metadata, so it loads
// into Hugging Face PEFT. Throws when the model has no adapters or the state lacks one.
void export_lora_adapters(const std::string& model_path, const CheckpointState& state, const std::string& path);

// The reverse: sets the adapters of `state` (the checkpoint of LoRA artifacts whose training or
// eval model is `model_path`) from a PEFT adapter_model.safetensors at `path` (float32, float16,
// bfloat16 or float64 tensors). Every adapter must be in the file with the artifacts' shapes (so the
// same rank), and the file must hold nothing else; on any error the state is unchanged.
void import_lora_adapters(const std::string& model_path, CheckpointState& state, const std::string& path);

}  // namespace onnxtrain

// LoRA insertion, merging and adapter export: graph transformations beside the artifact builder
// (the config is public: include/onnxtrain/lora.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/lora.h"

namespace onnxtrain {

struct LoraAdapter {
  std::string node, module, weight, a, b;  // target node, PEFT module path, base weight, adapter params
  int64_t in = 0, out = 0;
};

// Metadata key of the training/eval/exported models (JSON: rank, alpha, base_hash, adapters) and
// the checkpoint property holding the base hash.
inline constexpr const char* kMetaLora = "onnxtrain.lora";
inline constexpr const char* kLoraBaseHashProperty = "onnxtrain.lora.base_hash";

// Hash of every initializer of the model (names, dtypes, shapes, bytes): the base's identity.
std::string model_base_hash(const Model& model);

// Inserts the adapters into `model` (new initializers A and B, FusedMatMul + Add nodes after each
// target) and records kMetaLora. Throws, naming the problem, when a pattern matches no layer (the
// message lists the candidates), the rank exceeds a layer's min(K, N), or the config is invalid.
std::vector<LoraAdapter> apply_lora(Model& model, const LoraConfig& config);

// The adapters recorded in a model's kMetaLora metadata (empty when none), with rank/alpha/hash.
struct LoraInfo {
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;
  std::string base_hash;
  std::vector<LoraAdapter> adapters;
};
LoraInfo lora_info(const Model& model);

// Folds each adapter into its fp32 base weight (W += scale (B A)^T for MatMul, Gemm likewise) and
// removes its branch; adapters on a MatMulNBits base stay as base + adapter branch (re-quantizing
// would add the quantization error to the trained update). Returns how many were merged.
int merge_lora(Model& model);

}  // namespace onnxtrain

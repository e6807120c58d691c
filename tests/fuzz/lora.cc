// LoRA adapter records (src/training/lora.cc, lora_apply.cc): the bytes as the "onnxtrain.lora"
// metadata of a LoRA model (rank, alpha, base hash, one record per adapter naming its node, module,
// base weight and A/B parameters), read by lora_info (Module's base-hash check, `onnxtrain
// inspect`, adapter export) and by merge_lora, which folds the recorded adapters into their base
// weights. The model is tests/models/mlp_classifier.onnx with rank-2 adapters on its three Gemms,
// so a record may name real nodes and weights or lie about them.
#include <string>

#include "fuzz_util.h"
#include "onnx/model_io.h"
#include "training/lora.h"

namespace {
onnxtrain::Model adapted;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace onnxtrain;
  fuzz::init();
  adapted = load_model(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx");
  LoraConfig config;
  config.rank = 2;
  config.target = {"fc1", "fc2", "fc3"};  // PEFT's rule: a name matches whole (or as a dotted suffix)
  apply_lora(adapted, config);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  Model model = adapted;
  for (auto& [name, t] : model.graph.initializers) t = t.clone();  // merge_lora writes the weights
  model.metadata[kMetaLora] = std::string(reinterpret_cast<const char*>(data), size);
  try {
    lora_info(model);
    merge_lora(model);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}

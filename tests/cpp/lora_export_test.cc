// LoRA adapters leave the library as a safetensors file with PEFT's key names and the trained
// values (include/onnxtrain/lora.h: export_lora_adapters), written through the one safetensors writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "onnxtrain/onnxtrain.h"
#include "training/safetensors.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

TEST(LoraExport, WritesTheTrainedAdaptersUnderPeftNames) {
  const fs::path dir = fs::temp_directory_path() / ("onnxtrain_lora_export_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ArtifactOptions o;
  o.graphs.loss = LossType::kCrossEntropy;
  o.optimizer = OptimizerConfig::defaults(OptimizerType::kAdamW);
  o.optimizer.lr = 1e-2;
  o.directory = dir.string();
  LoraConfig lora;
  lora.rank = 2;
  lora.target = {"fc1", "fc2"};
  o.lora = lora;
  ArtifactPaths paths = generate_artifacts(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", o);

  CheckpointState state = CheckpointState::load(paths.checkpoint);
  Module module(paths.training_model, state, paths.eval_model);
  Optimizer optimizer(paths.optimizer_model, module);
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int i = 0; i < 8; ++i) {
    x.push_back(std::sin(0.7f * float(i)));
    x.push_back(std::cos(1.3f * float(i)));
    y.push_back(i % 3);
  }
  for (int step = 0; step < 3; ++step) {  // B starts at zero: training makes it nonzero
    module.train_step({Tensor::from_vector(x, {8, 2}), Tensor::from_vector(y, {8})});
    optimizer.step();
    module.lazy_reset_grad();
  }

  const std::string file = (dir / "adapter_model.safetensors").string();
  export_lora_adapters(paths.training_model, state, file);
  safetensors::Contents got = safetensors::read(file);
  ASSERT_EQ(got.tensors.size(), 4u);  // A and B of fc1 and fc2
  ASSERT_NE(got.metadata_value("onnxtrain.lora.base_hash"), nullptr);
  bool some_b_trained = false;
  for (const auto& [key, tensor] : got.tensors) {
    ASSERT_EQ(key.rfind("base_model.model.", 0), 0u) << key;
    const std::string name = key.substr(std::strlen("base_model.model."));
    ASSERT_TRUE(state.has_parameter(name)) << name;
    const Tensor& want = state.parameter(name).data();
    ASSERT_EQ(tensor.shape(), want.shape()) << name;
    EXPECT_EQ(std::memcmp(tensor.data(), want.data(), want.nbytes()), 0) << name;
    if (name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < tensor.numel(); ++i) some_b_trained |= tensor.data<float>()[i] != 0.0f;
  }
  EXPECT_TRUE(some_b_trained) << "the exported B matrices are still their zero initialisation";

  // A model without adapters is an error, and nothing is written.
  const std::string none = (dir / "none.safetensors").string();
  EXPECT_THROW(export_lora_adapters(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", state, none),
               Error);
  EXPECT_FALSE(fs::exists(none));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace onnxtrain

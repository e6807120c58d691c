// Whole models trained on the GPU against the same training on the CPU: a Module on each device
// from one checkpoint, the same batches (four, cycled), 50 AdamW steps; the loss curves and the parameters must
// agree (fp32: within 1e-4 relative). The artifacts (small BERT-style, GPT-style and ResNet-style
// models, tests/cuda/make_training_artifacts.py) come from the full build; `scripts/gpu_check.sh
// --prepare` writes them and the check points ONNXTRAIN_GPU_TRAINING at them. Without a GPU the
// tests skip; on a GPU without the artifacts they skip too, which the check counts as a failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "onnxtrain/module.h"
#include "onnxtrain/npz.h"
#include "onnxtrain/training.h"

using namespace onnxtrain;

namespace {

// ‖a - b‖ / ‖b‖ over float32 tensors on the host.
double relative_difference(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class GpuTraining : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuTraining, FollowsTheCpuLossCurve) {
  std::string why;
  if (!device_available(Device::kCuda, &why)) GTEST_SKIP() << why;
  const char* root = std::getenv("ONNXTRAIN_GPU_TRAINING");
  if (!root) GTEST_SKIP() << "ONNXTRAIN_GPU_TRAINING is not set (scripts/gpu_check.sh --prepare writes the artifacts)";
  const std::string dir = std::string(root) + "/" + GetParam() + "/";

  CheckpointState cpu_state = CheckpointState::load(dir + "checkpoint");
  CheckpointState gpu_state = CheckpointState::load(dir + "checkpoint");
  Module cpu(dir + "training_model.onnx", cpu_state, dir + "eval_model.onnx", Device::kCpu);
  Module gpu(dir + "training_model.onnx", gpu_state, dir + "eval_model.onnx", Device::kCuda);
  Optimizer cpu_opt(dir + "optimizer_model.onnx", cpu);
  Optimizer gpu_opt(dir + "optimizer_model.onnx", gpu);

  const std::vector<NamedArray> arrays = load_npz(dir + "batches.npz");
  ASSERT_TRUE(!arrays.empty() && arrays.size() % 2 == 0) << dir << "batches.npz: (input, target) pairs expected";
  const size_t batches = arrays.size() / 2, steps = 50;
  std::vector<double> cpu_losses, gpu_losses;
  for (size_t s = 0; s < steps; ++s) {
    const std::vector<Tensor> batch = {arrays[2 * (s % batches)].value, arrays[2 * (s % batches) + 1].value};
    for (auto [module, opt, losses] : {std::tuple{&cpu, &cpu_opt, &cpu_losses}, std::tuple{&gpu, &gpu_opt, &gpu_losses}}) {
      const std::vector<Tensor> out = module->train_step(batch);
      ASSERT_EQ(out[0].device(), Device::kCpu);
      losses->push_back(out[0].data<float>()[0]);
      opt->step();
      module->lazy_reset_grad();
    }
    EXPECT_NEAR(gpu_losses[s], cpu_losses[s], 1e-4 * std::abs(cpu_losses[s])) << GetParam() << " step " << s;
  }
  // Training happened: the last pass over the batches has a lower mean loss than the first (the
  // curve is not flat, so agreeing on it says something).
  double first = 0, last = 0;
  for (size_t s = 0; s < batches; ++s) {
    first += cpu_losses[s] / double(batches);
    last += cpu_losses[steps - batches + s] / double(batches);
  }
  EXPECT_LT(last, 0.9 * first) << GetParam() << ": the CPU's loss did not fall";

  for (const std::string& name : cpu_state.parameter_names()) {
    const Tensor& want = cpu_state.parameter(name).data();
    if (want.dtype() != DType::kFloat32) continue;
    EXPECT_LE(relative_difference(gpu_state.parameter(name).data(), want), 1e-4) << GetParam() << " parameter " << name;
  }
  // The eval graph on both devices, from the trained parameters.
  cpu.eval();
  gpu.eval();
  std::vector<Tensor> batch = {arrays[0].value, arrays[1].value};
  batch.resize(cpu.input_names(false).size());  // the eval graph may take the target (its loss) or not
  const std::vector<Tensor> want = cpu.eval_step(batch), got = gpu.eval_step(batch);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].dtype() == DType::kFloat32) {
      EXPECT_LE(relative_difference(got[i], want[i]), 1e-4) << "eval output " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuTraining, ::testing::Values("bert", "gpt", "resnet"));

}  // namespace

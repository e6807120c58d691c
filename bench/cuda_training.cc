// Training steps of the GPU benchmark's models (bench/cuda_training_models.py: GPT-2 124M in bf16
// mixed precision, BERT-base, ResNet-50) with a Module on the GPU, for the speed targets against
// PyTorch on the same card (bench/cuda_training_torch.py prints the same lines). Each model's
// nominal checkpoint is filled with random values (weights N(0, 0.02), norm scales and running
// variances 1, the rest 0) and its batch drawn from batch.txt; a step is train_step, the
// optimizer's step and lazy_reset_grad. Prints one line per model: the median step of `steps`
// after 2 warm-ups, and examples or tokens per second.
//   build-gpu/bench/cuda_training_bench DIR [steps]    (DIR: the models' folders, ONNX files unzipped)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "onnxtrain/module.h"
#include "onnxtrain/training.h"

using namespace onnxtrain;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void fill_parameters(CheckpointState& state, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const std::string& name : state.parameter_names()) {
    Parameter& p = state.parameter(name);
    Tensor t = Tensor::empty(p.dtype(), p.shape());
    const bool ones = (p.shape().size() == 1 && ends_with(name, "weight")) || ends_with(name, "running_var");
    const bool random = p.shape().size() >= 2;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = random ? normal(rng) : ones ? 1.0f : 0.0f;
      if (p.dtype() == DType::kFloat32) t.data<float>()[i] = v;
      else if (p.dtype() == DType::kInt64) t.data<int64_t>()[i] = 0;
      else OT_THROW(kNotImplemented, "cuda_training_bench: parameter '", name, "' of dtype ", dtype_name(p.dtype()));
    }
    p.set_data(t);
  }
}

// One batch from batch.txt: per line, an input's name, dtype (float32 or int64), dims and the
// exclusive upper bound of its values (integers; floats are N(0, 1)). Returns the inputs in file
// order and the examples (or tokens, for a language model's token rows) a step trains on.
std::vector<Tensor> draw_batch(const std::string& path, std::mt19937& rng, int64_t& examples) {
  std::ifstream in(path);
  OT_CHECK(in, "cuda_training_bench: cannot open ", path);
  std::vector<Tensor> batch;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, dtype;
    fields >> name >> dtype;
    std::vector<int64_t> numbers;
    for (int64_t v; fields >> v;) numbers.push_back(v);
    OT_CHECK(numbers.size() >= 2, path, ": '", line, "' should be: name dtype dims... high");
    const int64_t high = numbers.back();
    numbers.pop_back();
    Tensor t = Tensor::empty(dtype == "int64" ? DType::kInt64 : DType::kFloat32, Shape(numbers.begin(), numbers.end()));
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int64_t> uniform(0, std::max<int64_t>(high, 1) - 1);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype() == DType::kInt64) t.data<int64_t>()[i] = uniform(rng);
      else t.data<float>()[i] = normal(rng);
    }
    if (name == "target") examples = t.numel();  // a class per example, or per token
    batch.push_back(std::move(t));
  }
  return batch;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [steps]\n", argv[0]);
    return 2;
  }
  std::string why;
  if (!device_available(Device::kCuda, &why)) {
    std::printf("skipped: %s\n", why.c_str());
    return 0;
  }
  const std::string root = argv[1];
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  std::printf("device: %s\n", device_backend(Device::kCuda).description().c_str());
  int failures = 0;
  for (const char* name : {"gpt2", "bert", "resnet50"}) {
    const std::string dir = root + "/" + name + "/";
    try {
      std::mt19937 rng(0);
      CheckpointState state = CheckpointState::load(dir + "checkpoint");
      fill_parameters(state, rng);
      Module module(dir + "training_model.onnx", state, "", Device::kCuda);
      Optimizer optimizer(dir + "optimizer_model.onnx", module);
      int64_t examples = 0;
      const std::vector<Tensor> batch = draw_batch(dir + "batch.txt", rng, examples);
      std::vector<double> ms;
      float loss = 0;
      for (int s = 0; s < steps + 2; ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        loss = module.train_step(batch)[0].data<float>()[0];  // the loss comes to the host: the step is done
        optimizer.step();
        module.lazy_reset_grad();
        const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (s >= 2) ms.push_back(elapsed);
      }
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      std::printf("%-9s onnxtrain   step %9.2f ms  %10.1f examples/s  (loss %.4f, median of %d)\n", name, median,
                  double(examples) / (median / 1e3), loss, steps);
    } catch (const std::exception& e) {
      std::printf("%-9s onnxtrain   failed: %s\n", name, e.what());
      ++failures;
    }
    std::fflush(stdout);
  }
  return failures ? 1 : 0;
}

// Pre-compiled artifacts on the minimal runtime: the digits demo's artifacts (examples/demo.py,
// `make demo`), compiled here, train bit-identically to their ONNX files, and a damaged compiled
// file falls back to them with a note. Skipped until the demo has written the artifacts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "onnxtrain/module.h"
#include "runtime/compiled_model.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatch = 16;

class CompiledDigitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(ONNXTRAIN_DIGITS_ARTIFACTS) / "training_model.onnx"))
      GTEST_SKIP() << "no digits artifacts at " << ONNXTRAIN_DIGITS_ARTIFACTS << " (make demo writes them)";
    dir_ = fs::temp_directory_path() / ("onnxtrain_compiled_digits_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* name : {"onnx", "compiled"}) fs::copy(ONNXTRAIN_DIGITS_ARTIFACTS, dir_ / name);
    compile_artifacts((dir_ / "compiled").string(), {{"input", {kBatch, 1, 8, 8}}, {"target", {kBatch}}});
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // Losses, eval logits and parameters after a few AdamW steps on synthetic images.
  std::vector<Tensor> train(const fs::path& dir) {
    CheckpointState state = CheckpointState::load((dir / "checkpoint").string());
    state.add_property(CheckpointState::kRandomSeedProperty, int64_t(11));
    Module module((dir / "training_model.onnx").string(), state, (dir / "eval_model.onnx").string());
    Optimizer optimizer((dir / "optimizer_model.onnx").string(), module);
    std::vector<Tensor> results;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> x(static_cast<size_t>(kBatch * 64));
      std::vector<int64_t> y(static_cast<size_t>(kBatch));
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i + size_t(step))));
      for (size_t i = 0; i < y.size(); ++i) y[i] = int64_t((i + size_t(step)) % 10);
      std::vector<Tensor> in = {Tensor::from_vector(x, {kBatch, 1, 8, 8}), Tensor::from_vector(y, {kBatch})};
      for (const Tensor& t : module.train_step(in)) results.push_back(t);
      optimizer.step();
      module.lazy_reset_grad();
      if (step == 2)
        for (const Tensor& t : module.eval_step(in)) results.push_back(t);
    }
    for (const auto& name : state.parameter_names()) results.push_back(state.get_parameter(name));
    return results;
  }
  void expect_like_onnx(const std::string& note) {
    testing::internal::CaptureStderr();
    const std::vector<Tensor> got = train(dir_ / "compiled");
    const std::string err = testing::internal::GetCapturedStderr();
    if (note.empty()) EXPECT_EQ(err, "");
    else EXPECT_NE(err.find(note), std::string::npos) << err;
    const std::vector<Tensor> want = train(dir_ / "onnx");
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].nbytes(), want[i].nbytes());
      EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), got[i].nbytes()), 0) << "result " << i << " differs";
    }
  }
  fs::path dir_;
};

TEST_F(CompiledDigitsTest, TrainsBitIdenticallyToTheOnnxFiles) {
  const fs::path otc = dir_ / "compiled" / "training_model.otc";
  ASSERT_TRUE(fs::exists(otc));
  EXPECT_EQ(load_model_for_runtime((dir_ / "compiled" / "training_model.onnx").string()).plans.size(), 1u);
  expect_like_onnx("");
}

TEST_F(CompiledDigitsTest, ADamagedFileFallsBackWithANote) {
  const fs::path otc = dir_ / "compiled" / "training_model.otc";
  std::string bytes;
  {
    std::ifstream f(otc, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  bytes[bytes.size() - 10] ^= 1;
  std::ofstream(otc, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  expect_like_onnx("payload checksum mismatch");
}

}  // namespace
}  // namespace onnxtrain

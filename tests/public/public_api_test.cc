// The public C++ API, compiled against include/ only (no src/ on the include path), as a user's
// program is: artifacts from a model path, Module, Optimizer from a model or a config, and the LR
// schedulers' ONNX Runtime semantics (driven by the optimizer's step count, so a resumed run
// continues its schedule).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <numbers>

#include "onnxtrain/onnxtrain.h"

namespace {

namespace fs = std::filesystem;
using namespace onnxtrain;

constexpr int64_t kBatch = 16;

class PublicApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxtrain_public_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    ArtifactOptions o;
    o.graphs.requires_grad = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
    o.graphs.loss = LossType::kCrossEntropy;
    o.optimizer = OptimizerConfig::defaults(OptimizerType::kAdamW);
    o.optimizer.lr = 1e-2;
    o.directory = dir_.string();
    paths_ = generate_artifacts(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", o);
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int i = 0; i < kBatch; ++i) {
      x.push_back(std::sin(0.7f * i));
      x.push_back(std::cos(1.3f * i));
      y.push_back(i % 3);
    }
    batch_ = {Tensor::from_vector(x, {kBatch, 2}), Tensor::from_vector(y, {kBatch})};
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  ArtifactPaths paths_;
  std::vector<Tensor> batch_;
};

TEST_F(PublicApiTest, TrainsWithALinearScheduleAndResumesIt) {
  CheckpointState state = CheckpointState::load(paths_.checkpoint);
  Module module(paths_.training_model, state, paths_.eval_model);
  Optimizer optimizer(paths_.optimizer_model, module);
  LinearLRScheduler scheduler(optimizer, 2, 20, 1e-2);
  EXPECT_EQ(optimizer.get_learning_rate(), 0.0);  // step 0 of the warmup
  float first = 0, last = 0;
  for (int step = 1; step <= 10; ++step) {
    float loss = module.train_step(batch_).at(0).data<float>()[0];
    (step == 1 ? first : last) = loss;
    optimizer.step();
    module.lazy_reset_grad();
    EXPECT_DOUBLE_EQ(scheduler.step(), scheduler.lr_at(step));
    EXPECT_DOUBLE_EQ(optimizer.get_learning_rate(), step < 2 ? 1e-2 * step / 2 : 1e-2 * (20 - step) / 18);
  }
  EXPECT_LT(last, 0.9f * first);  // 1.094 -> 0.965 over these 10 warmup-and-decay steps
  state.save((dir_ / "resume").string());

  CheckpointState resumed_state = CheckpointState::load((dir_ / "resume").string());
  Module resumed(paths_.training_model, resumed_state);
  Optimizer resumed_optimizer(paths_.optimizer_model, resumed);
  EXPECT_EQ(resumed_optimizer.step_count(), 10);
  LinearLRScheduler resumed_scheduler(resumed_optimizer, 2, 20, 1e-2);
  EXPECT_DOUBLE_EQ(resumed_optimizer.get_learning_rate(), 1e-2 * (20 - 10) / 18);
}

TEST_F(PublicApiTest, OptimizerFromAConfig) {
  CheckpointState state = CheckpointState::load(paths_.checkpoint);
  Module module(paths_.training_model, state);
  OptimizerConfig sgd = OptimizerConfig::defaults(OptimizerType::kSGD);
  sgd.lr = 0.5;
  Optimizer optimizer(sgd, module);
  module.train_step(batch_);
  Tensor before = state.get_parameter("fc3.bias").clone();
  Tensor grad = state.parameter("fc3.bias").grad().clone();
  optimizer.step();
  for (int i = 0; i < 3; ++i)
    EXPECT_FLOAT_EQ(state.get_parameter("fc3.bias").data<float>()[i],
                    before.data<float>()[i] - 0.5f * grad.data<float>()[i]);
  EXPECT_EQ(optimizer.step_count(), 1);
}

TEST_F(PublicApiTest, SchedulesAndTheirChecks) {
  CheckpointState state = CheckpointState::load(paths_.checkpoint);
  Module module(paths_.training_model, state);
  Optimizer optimizer(paths_.optimizer_model, module);
  CosineLRScheduler cosine(optimizer, 2, 10, 1.0);
  EXPECT_DOUBLE_EQ(cosine.lr_at(1), 0.5);
  EXPECT_NEAR(cosine.lr_at(6), 0.5 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-12);
  EXPECT_NEAR(cosine.lr_at(10), 0.0, 1e-12);
  StepLRScheduler stepped(optimizer, 3, 0.5, 1.0);
  EXPECT_DOUBLE_EQ(stepped.lr_at(2), 1.0);
  EXPECT_DOUBLE_EQ(stepped.lr_at(7), 0.25);
  ConstantLRScheduler constant(optimizer, 4, 2.0);
  EXPECT_DOUBLE_EQ(constant.lr_at(1), 0.5);
  EXPECT_DOUBLE_EQ(constant.lr_at(100), 2.0);
  EXPECT_DOUBLE_EQ(optimizer.get_learning_rate(), 0.0);  // the last one built set it: warmup step 0
  try {
    LinearLRScheduler bad(optimizer, 5, 2, 1.0);
    FAIL() << "total < warmup accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("total_step_count (2) must be >= warmup_step_count (5)"), std::string::npos);
  }
}

}  // namespace

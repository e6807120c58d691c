// The C API (include/onnxtrain/c_api.h) through its C surface only: training, checkpoints,
// properties, schedulers and inference on the MLP of tests/models, and every kind of bad input
// (NULL handles, wrong dtypes and shapes, missing and corrupt files): a status, a message that
// names the problem, no crash, and the objects left as they were.
#include "core/device.h"
#include "onnxtrain/c_api.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

#define ASSERT_OK(call) ASSERT_EQ((call), OT_OK) << ot_last_error()
#define EXPECT_OK(call) EXPECT_EQ((call), OT_OK) << ot_last_error()

// A failed call: the status, and a message containing `what`.
void expect_error(OtStatus status, OtStatus expected, const std::string& what) {
  EXPECT_EQ(status, expected) << ot_status_name(status) << ": " << ot_last_error();
  EXPECT_NE(std::string(ot_last_error()).find(what), std::string::npos)
      << "message '" << ot_last_error() << "' does not mention '" << what << "'";
}

// Handles released at scope exit, as a C++ caller of the C API would hold them.
template <typename T, void (*Release)(T*)>
struct Handle {
  T* p = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  ~Handle() { Release(p); }
  T** out() { return &p; }
  operator T*() const { return p; }
};
using Checkpoint = Handle<OtCheckpoint, ot_checkpoint_release>;
using Module = Handle<OtModule, ot_module_release>;
using Optimizer = Handle<OtOptimizer, ot_optimizer_release>;
using Scheduler = Handle<OtLRScheduler, ot_lr_scheduler_release>;
using Session = Handle<OtInferenceSession, ot_session_release>;
using Options = Handle<OtArtifactOptions, ot_artifact_options_release>;

struct Outputs {
  std::vector<OtTensor*> t;
  explicit Outputs(size_t n) : t(n, nullptr) {}
  ~Outputs() { for (OtTensor* x : t) ot_tensor_release(x); }
  float scalar(size_t i) const {
    const void* d = nullptr;
    EXPECT_EQ(ot_tensor_data(t[i], &d), OT_OK);
    return *static_cast<const float*>(d);
  }
  std::vector<float> floats(size_t i) const {
    const void* d = nullptr;
    const int64_t* shape = nullptr;
    size_t rank = 0;
    EXPECT_EQ(ot_tensor_data(t[i], &d), OT_OK);
    EXPECT_EQ(ot_tensor_info(t[i], nullptr, &shape, &rank), OT_OK);
    int64_t n = 1;
    for (size_t k = 0; k < rank; ++k) n *= shape[k];
    const float* f = static_cast<const float*>(d);
    return std::vector<float>(f, f + n);
  }
};

const char* const kParams[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
const char* const kLogits[] = {"logits"};
constexpr int64_t kBatch = 16;
constexpr int64_t kNumParameters = 2 * 32 + 32 + 32 * 32 + 32 + 32 * 3 + 3;

std::string model_path() { return std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx"; }

// Artifacts for the MLP (cross-entropy, AdamW, logits as an additional output) in a fresh directory.
class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxtrain_capi_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    Options o;
    ASSERT_NO_FATAL_FAILURE(mlp_options(o));
    ASSERT_OK(ot_generate_artifacts(model_path().c_str(), o, dir_.c_str()));
    for (int i = 0; i < kBatch; ++i) {
      x_.push_back(std::sin(0.7f * i));
      x_.push_back(std::cos(1.3f * i));
      y_.push_back(i % 3);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The fixture's artifact options: every MLP parameter, cross-entropy, AdamW at 1e-2, logits out.
  static void mlp_options(Options& o) {
    ASSERT_OK(ot_artifact_options_create(o.out()));
    ASSERT_OK(ot_artifact_options_set_requires_grad(o, kParams, 6));
    ASSERT_OK(ot_artifact_options_set_loss(o, OT_LOSS_CROSS_ENTROPY));
    ASSERT_OK(ot_artifact_options_set_optimizer(o, OT_OPTIMIZER_ADAMW, 1e-2));
    ASSERT_OK(ot_artifact_options_set_additional_output_names(o, kLogits, 1));
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  void open(Checkpoint& ckpt, Module& module, bool with_eval = true) {
    ASSERT_OK(ot_checkpoint_load(path("checkpoint").c_str(), ckpt.out()));
    ASSERT_OK(ot_module_create(path("training_model.onnx").c_str(), ckpt,
                               with_eval ? path("eval_model.onnx").c_str() : nullptr, module.out()));
  }
  std::vector<OtTensorView> inputs() const {
    return {{x_.data(), OT_DTYPE_FLOAT32, x_shape_, 2}, {y_.data(), OT_DTYPE_INT64, y_shape_, 1}};
  }
  std::vector<float> parameter(OtCheckpoint* ckpt, const char* name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(size_t(n), -1.0f);
    EXPECT_OK(ot_checkpoint_get_parameter(ckpt, name, v.data(), OT_DTYPE_FLOAT32, shape.data(), shape.size()));
    return v;
  }

  fs::path dir_;
  std::vector<float> x_;
  std::vector<int64_t> y_;
  int64_t x_shape_[2] = {kBatch, 2};
  int64_t y_shape_[1] = {kBatch};
};

// ---------------------------------------------------------------- happy paths

TEST_F(CApiTest, TrainsEvaluatesAndExports) {
  Checkpoint ckpt;
  Module module;
  open(ckpt, module);
  Optimizer opt;
  ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), module, opt.out()));

  size_t n = 0;
  const char* name = nullptr;
  ASSERT_OK(ot_module_input_count(module, &n));
  ASSERT_EQ(n, 2u);
  ASSERT_OK(ot_module_input_name(module, 0, &name));
  EXPECT_STREQ(name, "x");
  ASSERT_OK(ot_module_output_count(module, &n));
  ASSERT_EQ(n, 2u);
  ASSERT_OK(ot_module_output_name(module, 1, &name));
  EXPECT_STREQ(name, "logits");
  EXPECT_EQ(ot_last_error()[0], '\0');  // success clears the message

  auto in = inputs();
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    Outputs out(2);
    ASSERT_OK(ot_module_train_step(module, in.data(), in.size(), out.t.data(), 2));
    OtDType dtype = OT_DTYPE_INT8;
    size_t rank = 9;
    ASSERT_OK(ot_tensor_info(out.t[0], &dtype, nullptr, &rank));
    EXPECT_EQ(dtype, OT_DTYPE_FLOAT32);
    EXPECT_EQ(rank, 0u);  // the loss is a scalar
    (step == 0 ? first : last) = out.scalar(0);
    ASSERT_OK(ot_optimizer_step(opt));
    ASSERT_OK(ot_module_lazy_reset_grad(module));
  }
  EXPECT_LT(last, 0.5f * first) << "the loss did not fall: " << first << " -> " << last;
  int64_t steps = 0;
  ASSERT_OK(ot_optimizer_step_count(opt, &steps));
  EXPECT_EQ(steps, 30);

  // Eval mode switches the names to the eval graph; eval_step gives the loss and logits.
  int training = -1;
  ASSERT_OK(ot_module_eval(module));
  ASSERT_OK(ot_module_is_training(module, &training));
  EXPECT_EQ(training, 0);
  ASSERT_OK(ot_module_output_name(module, 0, &name));
  EXPECT_STREQ(name, "loss");
  Outputs eval(2);
  ASSERT_OK(ot_module_eval_step(module, in.data(), in.size(), eval.t.data(), 2));
  EXPECT_LT(eval.scalar(0), first);

  // The exported model gives the eval graph's logits.
  ASSERT_OK(ot_module_export_model_for_inferencing(module, path("infer.onnx").c_str(), kLogits, 1));
  Session session;
  ASSERT_OK(ot_session_create(path("infer.onnx").c_str(), session.out()));
  ASSERT_OK(ot_session_input_count(session, &n));
  EXPECT_EQ(n, 1u);  // the target input is gone
  ASSERT_OK(ot_session_output_name(session, 0, &name));
  EXPECT_STREQ(name, "logits");
  const char* feed_names[] = {"x"};
  Outputs logits(1);
  ASSERT_OK(ot_session_run(session, feed_names, in.data(), 1, logits.t.data(), 1));
  const int64_t* shape = nullptr;
  size_t rank = 0;
  ASSERT_OK(ot_tensor_info(logits.t[0], nullptr, &shape, &rank));
  ASSERT_EQ(rank, 2u);
  EXPECT_EQ(shape[0], kBatch);
  EXPECT_EQ(shape[1], 3);
  std::vector<float> a = logits.floats(0), b = eval.floats(1);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f) << i;
}

TEST_F(CApiTest, ParametersByNameWithChecks) {
  Checkpoint ckpt;
  ASSERT_OK(ot_checkpoint_load(path("checkpoint").c_str(), ckpt.out()));
  size_t count = 0;
  ASSERT_OK(ot_checkpoint_parameter_count(ckpt, &count));
  ASSERT_EQ(count, 6u);
  std::set<std::string> names;
  for (size_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    ASSERT_OK(ot_checkpoint_parameter_name(ckpt, i, &name));
    names.insert(name);
  }
  EXPECT_EQ(names, std::set<std::string>(std::begin(kParams), std::end(kParams)));
  OtDType dtype = OT_DTYPE_INT8;
  const int64_t* shape = nullptr;
  size_t rank = 0;
  int requires_grad = 0;
  ASSERT_OK(ot_checkpoint_parameter_info(ckpt, "fc3.weight", &dtype, &shape, &rank, &requires_grad));
  EXPECT_EQ(dtype, OT_DTYPE_FLOAT32);
  ASSERT_EQ(rank, 2u);
  EXPECT_EQ(shape[0], 3);
  EXPECT_EQ(shape[1], 32);
  EXPECT_EQ(requires_grad, 1);

  std::vector<float> bias = parameter(ckpt, "fc3.bias", {3});
  EXPECT_NE(bias[0], -1.0f);
  std::vector<float> next = {1.5f, -2.5f, 3.5f};
  int64_t three[] = {3};
  ASSERT_OK(ot_checkpoint_set_parameter(ckpt, "fc3.bias", next.data(), OT_DTYPE_FLOAT32, three, 1));
  EXPECT_EQ(parameter(ckpt, "fc3.bias", {3}), next);

  // Wrong dtype, wrong shape, unknown name, bad descriptions: errors, and the parameter is kept.
  double wide[3] = {0, 0, 0};
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", wide, OT_DTYPE_FLOAT64, three, 1), OT_INVALID_ARGUMENT,
               "parameter 'fc3.bias' is float32 [3], the buffer is float64 [3]");
  float four[4] = {0, 0, 0, 0};
  int64_t shape4[] = {4};
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", four, OT_DTYPE_FLOAT32, shape4, 1), OT_INVALID_ARGUMENT,
               "the buffer is float32 [4]");
  expect_error(ot_checkpoint_get_parameter(ckpt, "fc3.bias", four, OT_DTYPE_FLOAT32, shape4, 1), OT_INVALID_ARGUMENT,
               "parameter 'fc3.bias' is float32 [3]");
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc9.bias", four, OT_DTYPE_FLOAT32, three, 1), OT_INVALID_ARGUMENT,
               "fc9.bias");
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", nullptr, OT_DTYPE_FLOAT32, three, 1),
               OT_INVALID_ARGUMENT, "data is NULL");
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", four, OT_DTYPE_FLOAT32, nullptr, 1),
               OT_INVALID_ARGUMENT, "shape is NULL");
  int64_t negative[] = {-3};
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", four, OT_DTYPE_FLOAT32, negative, 1),
               OT_INVALID_ARGUMENT, "invalid shape");
  int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 40};
  expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", four, OT_DTYPE_FLOAT32, huge, 2), OT_INVALID_ARGUMENT,
               "invalid shape");
  for (int bad : {0, -1, 8, 14, 99})
    expect_error(ot_checkpoint_set_parameter(ckpt, "fc3.bias", four, static_cast<OtDType>(bad), three, 1),
                 OT_INVALID_ARGUMENT, "is not a supported ONNX tensor data type");
  EXPECT_EQ(parameter(ckpt, "fc3.bias", {3}), next);
  const char* name = nullptr;
  expect_error(ot_checkpoint_parameter_name(ckpt, 6, &name), OT_INVALID_ARGUMENT, "out of range");
  EXPECT_EQ(name, nullptr);
}

TEST_F(CApiTest, PropertiesRoundTripThroughSave) {
  Checkpoint ckpt;
  ASSERT_OK(ot_checkpoint_load(path("checkpoint").c_str(), ckpt.out()));
  ASSERT_OK(ot_checkpoint_set_int_property(ckpt, "epoch", 7));
  ASSERT_OK(ot_checkpoint_set_float_property(ckpt, "best_loss", 0.125));
  ASSERT_OK(ot_checkpoint_set_string_property(ckpt, "note", "from C"));
  ASSERT_OK(ot_checkpoint_save(ckpt, path("saved").c_str(), 1));

  Checkpoint back;
  ASSERT_OK(ot_checkpoint_load(path("saved").c_str(), back.out()));
  int64_t epoch = 0;
  double best = 0;
  const char* note = nullptr;
  ASSERT_OK(ot_checkpoint_get_int_property(back, "epoch", &epoch));
  ASSERT_OK(ot_checkpoint_get_float_property(back, "best_loss", &best));
  ASSERT_OK(ot_checkpoint_get_string_property(back, "note", &note));
  EXPECT_EQ(epoch, 7);
  EXPECT_EQ(best, 0.125);
  EXPECT_STREQ(note, "from C");
  size_t count = 0;
  const char* name = nullptr;
  ASSERT_OK(ot_checkpoint_property_count(back, &count));
  EXPECT_EQ(count, 4u);  // and generate_artifacts' onnxtrain.random_seed
  ASSERT_OK(ot_checkpoint_property_name(back, 0, &name));
  EXPECT_STREQ(name, "best_loss");  // name order
  OtPropertyType type = OT_PROPERTY_NONE;
  ASSERT_OK(ot_checkpoint_get_property_type(back, "note", &type));
  EXPECT_EQ(type, OT_PROPERTY_STRING);
  ASSERT_OK(ot_checkpoint_get_property_type(back, "missing", &type));
  EXPECT_EQ(type, OT_PROPERTY_NONE);

  expect_error(ot_checkpoint_get_string_property(back, "epoch", &note), OT_INVALID_ARGUMENT,
               "property 'epoch' is int, not string");
  expect_error(ot_checkpoint_get_int_property(back, "missing", &epoch), OT_INVALID_ARGUMENT,
               "no property named 'missing'");
  EXPECT_EQ(epoch, 7);
  ASSERT_OK(ot_checkpoint_remove_property(back, "note"));
  expect_error(ot_checkpoint_remove_property(back, "note"), OT_INVALID_ARGUMENT, "no property named 'note'");
  ASSERT_OK(ot_checkpoint_property_count(back, &count));
  EXPECT_EQ(count, 3u);
}

TEST_F(CApiTest, OptimizerStateIsSavedOnRequestAndResumes) {
  Checkpoint ckpt;
  Module module;
  open(ckpt, module);
  {
    Optimizer opt;
    ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), module, opt.out()));
    auto in = inputs();
    for (int i = 0; i < 3; ++i) {
      Outputs out(2);
      ASSERT_OK(ot_module_train_step(module, in.data(), in.size(), out.t.data(), 2));
      ASSERT_OK(ot_optimizer_step(opt));
    }
    ASSERT_OK(ot_optimizer_set_learning_rate(opt, 0.5));
  }
  ASSERT_OK(ot_checkpoint_save(ckpt, path("with_state").c_str(), 1));
  ASSERT_OK(ot_checkpoint_save(ckpt, path("without_state").c_str(), 0));

  for (const char* file : {"with_state", "without_state"}) {
    bool kept = std::string(file) == "with_state";
    Checkpoint back;
    Module resumed;
    Optimizer opt;
    ASSERT_OK(ot_checkpoint_load(path(file).c_str(), back.out()));
    ASSERT_OK(ot_module_create(path("training_model.onnx").c_str(), back, nullptr, resumed.out()));
    ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), resumed, opt.out()));
    int64_t steps = -1;
    double lr = 0;
    ASSERT_OK(ot_optimizer_step_count(opt, &steps));
    ASSERT_OK(ot_optimizer_get_learning_rate(opt, &lr));
    EXPECT_EQ(steps, kept ? 3 : 0) << file;
    EXPECT_NEAR(lr, kept ? 0.5 : 1e-2, 1e-7) << file;
  }
}

// ONNX Runtime's checkpoint format from C: the optimizer state survives a round trip through it
// and training resumes from it; the format is told by the bytes; bad arguments are refused.
TEST_F(CApiTest, OrtFormatCheckpointsResume) {
  Checkpoint ckpt;
  Module module;
  open(ckpt, module);
  {
    Optimizer opt;
    ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), module, opt.out()));
    auto in = inputs();
    for (int i = 0; i < 3; ++i) {
      Outputs out(2);
      ASSERT_OK(ot_module_train_step(module, in.data(), in.size(), out.t.data(), 2));
      ASSERT_OK(ot_optimizer_step(opt));
    }
    ASSERT_OK(ot_optimizer_set_learning_rate(opt, 0.5));
  }
  ASSERT_OK(ot_checkpoint_set_int_property(ckpt, "epoch", 7));
  ASSERT_OK(ot_checkpoint_save_as(ckpt, path("ort").c_str(), 1, OT_CHECKPOINT_ORT));
  ASSERT_OK(ot_checkpoint_save_as(ckpt, path("ours").c_str(), 1, OT_CHECKPOINT_ONNXTRAIN));
  OtCheckpointFormat format = OT_CHECKPOINT_ONNXTRAIN;
  ASSERT_OK(ot_checkpoint_file_format(path("ort").c_str(), &format));
  EXPECT_EQ(format, OT_CHECKPOINT_ORT);
  ASSERT_OK(ot_checkpoint_file_format(path("ours").c_str(), &format));
  EXPECT_EQ(format, OT_CHECKPOINT_ONNXTRAIN);

  Checkpoint back;
  Module resumed;
  Optimizer opt;
  ASSERT_OK(ot_checkpoint_load(path("ort").c_str(), back.out()));
  ASSERT_OK(ot_module_create(path("training_model.onnx").c_str(), back, nullptr, resumed.out()));
  ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), resumed, opt.out()));
  int64_t steps = -1, epoch = 0;
  double lr = 0;
  ASSERT_OK(ot_optimizer_step_count(opt, &steps));
  ASSERT_OK(ot_optimizer_get_learning_rate(opt, &lr));
  ASSERT_OK(ot_checkpoint_get_int_property(back, "epoch", &epoch));
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(lr, 0.5);  // float32 in ORT's file; 0.5 is exact
  EXPECT_EQ(epoch, 7);
  // The same next step from either file: the moments came through.
  Checkpoint back2;
  Module resumed2;
  Optimizer opt2;
  ASSERT_OK(ot_checkpoint_load(path("ours").c_str(), back2.out()));
  ASSERT_OK(ot_module_create(path("training_model.onnx").c_str(), back2, nullptr, resumed2.out()));
  ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), resumed2, opt2.out()));
  auto in = inputs();
  Outputs o1(2), o2(2);
  ASSERT_OK(ot_module_train_step(resumed, in.data(), in.size(), o1.t.data(), 2));
  ASSERT_OK(ot_optimizer_step(opt));
  ASSERT_OK(ot_module_train_step(resumed2, in.data(), in.size(), o2.t.data(), 2));
  ASSERT_OK(ot_optimizer_step(opt2));
  ASSERT_OK(ot_checkpoint_save_as(back, path("after1").c_str(), 1, OT_CHECKPOINT_ORT));
  ASSERT_OK(ot_checkpoint_save_as(back2, path("after2").c_str(), 1, OT_CHECKPOINT_ORT));
  std::ifstream f1(path("after1"), std::ios::binary), f2(path("after2"), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f1), {}), std::string(std::istreambuf_iterator<char>(f2), {}));

  expect_error(ot_checkpoint_save_as(ckpt, path("x").c_str(), 1, OtCheckpointFormat(5)), OT_INVALID_ARGUMENT,
               "format: expected OT_CHECKPOINT_ONNXTRAIN (0) or OT_CHECKPOINT_ORT (1), got 5");
  expect_error(ot_checkpoint_file_format(path("training_model.onnx").c_str(), &format), OT_INVALID_MODEL, "got neither");
  expect_error(ot_checkpoint_file_format(path("ort").c_str(), nullptr), OT_INVALID_ARGUMENT, "format");
}

TEST_F(CApiTest, ContiguousParameters) {
  Checkpoint ckpt;
  Module module;
  open(ckpt, module);
  int64_t size = 0;
  ASSERT_OK(ot_module_get_parameters_size(module, 1, &size));
  ASSERT_EQ(size, kNumParameters);
  std::vector<float> flat(static_cast<size_t>(size));
  ASSERT_OK(ot_module_get_contiguous_parameters(module, 1, flat.data(), OT_DTYPE_FLOAT32, size));
  // The buffer is the parameters concatenated in checkpoint order.
  std::vector<float> expected;
  for (size_t i = 0; i < 6; ++i) {
    const char* name = nullptr;
    const int64_t* shape = nullptr;
    size_t rank = 0;
    ASSERT_OK(ot_checkpoint_parameter_name(ckpt, i, &name));
    ASSERT_OK(ot_checkpoint_parameter_info(ckpt, name, nullptr, &shape, &rank, nullptr));
    std::vector<float> p = parameter(ckpt, name, std::vector<int64_t>(shape, shape + rank));
    expected.insert(expected.end(), p.begin(), p.end());
  }
  EXPECT_EQ(flat, expected);
  std::vector<float> bias3 = parameter(ckpt, "fc3.bias", {3});
  for (float& v : flat) v *= 2.0f;
  ASSERT_OK(ot_module_copy_buffer_to_parameters(module, 1, flat.data(), OT_DTYPE_FLOAT32, size));
  std::vector<float> doubled = parameter(ckpt, "fc3.bias", {3});
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(doubled[i], 2.0f * bias3[i]);

  expect_error(ot_module_get_contiguous_parameters(module, 1, flat.data(), OT_DTYPE_FLOAT32, size - 1),
               OT_INVALID_ARGUMENT, "the buffer holds 1250 float32");
  expect_error(ot_module_copy_buffer_to_parameters(module, 1, flat.data(), OT_DTYPE_FLOAT32, size + 1),
               OT_INVALID_ARGUMENT, "expected a 1-D float32 buffer of 1251");
  EXPECT_EQ(parameter(ckpt, "fc3.bias", {3}), doubled);
}

TEST_F(CApiTest, SchedulersSetTheOptimizersLearningRate) {
  Checkpoint ckpt;
  Module module;
  open(ckpt, module, false);
  Optimizer opt;
  ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), module, opt.out()));
  Scheduler linear;
  ASSERT_OK(ot_lr_scheduler_create_linear(opt, 2, 6, 1.0, linear.out()));
  double lr = -1;
  ASSERT_OK(ot_optimizer_get_learning_rate(opt, &lr));
  EXPECT_EQ(lr, 0.0);  // warmup starts at 0, as ONNX Runtime's
  auto in = inputs();
  const double expected[] = {0.5, 1.0, 0.75, 0.5, 0.25, 0.0};
  for (double want : expected) {
    Outputs out(2);
    ASSERT_OK(ot_module_train_step(module, in.data(), in.size(), out.t.data(), 2));
    ASSERT_OK(ot_optimizer_step(opt));
    ASSERT_OK(ot_lr_scheduler_step(linear, &lr));
    EXPECT_DOUBLE_EQ(lr, want);
    double got = -1;
    ASSERT_OK(ot_optimizer_get_learning_rate(opt, &got));
    EXPECT_DOUBLE_EQ(got, want);
  }
  // A scheduler made later starts from the optimizer's step count (6 here).
  Scheduler step, cosine, constant;
  ASSERT_OK(ot_lr_scheduler_create_step(opt, 4, 0.5, 2.0, step.out()));
  ASSERT_OK(ot_optimizer_get_learning_rate(opt, &lr));
  EXPECT_DOUBLE_EQ(lr, 1.0);  // 2 * 0.5^(6 / 4)
  ASSERT_OK(ot_lr_scheduler_create_cosine(opt, 2, 10, 1.0, 0.5, cosine.out()));
  ASSERT_OK(ot_optimizer_get_learning_rate(opt, &lr));
  EXPECT_NEAR(lr, 0.5 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-12);  // progress (6 - 2) / 8
  ASSERT_OK(ot_lr_scheduler_create_constant(opt, 8, 3.0, constant.out()));
  ASSERT_OK(ot_optimizer_get_learning_rate(opt, &lr));
  EXPECT_DOUBLE_EQ(lr, 3.0 * 6 / 8);

  Scheduler bad;
  expect_error(ot_lr_scheduler_create_linear(opt, 5, 2, 1.0, bad.out()), OT_INVALID_ARGUMENT,
               "total_step_count (2) must be >= warmup_step_count (5)");
  expect_error(ot_lr_scheduler_create_step(opt, 0, 0.5, 1.0, bad.out()), OT_INVALID_ARGUMENT, "step_size");
  EXPECT_EQ(bad.p, nullptr);
}

TEST_F(CApiTest, HandlesKeepWhatTheyUseAlive) {
  // Release the checkpoint, module and optimizer first: the scheduler still works.
  OtCheckpoint* ckpt = nullptr;
  OtModule* module = nullptr;
  OtOptimizer* opt = nullptr;
  Scheduler sched;
  ASSERT_OK(ot_checkpoint_load(path("checkpoint").c_str(), &ckpt));
  ASSERT_OK(ot_module_create(path("training_model.onnx").c_str(), ckpt, nullptr, &module));
  ot_checkpoint_release(ckpt);
  ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), module, &opt));
  auto in = inputs();
  Outputs out(2);
  ASSERT_OK(ot_module_train_step(module, in.data(), in.size(), out.t.data(), 2));
  ASSERT_OK(ot_lr_scheduler_create_constant(opt, 0, 0.1, sched.out()));
  ot_module_release(module);
  ot_optimizer_release(opt);
  double lr = 0;
  ASSERT_OK(ot_lr_scheduler_step(sched, &lr));
  EXPECT_DOUBLE_EQ(lr, 0.1);
  EXPECT_EQ(out.floats(1).size(), size_t(kBatch * 3));  // outputs outlive the module too
}

// ---------------------------------------------------------------- error paths

TEST_F(CApiTest, BadStepInputsLeaveParametersUntouched) {
  Checkpoint ckpt;
  Module module;
  open(ckpt, module, false);
  Optimizer opt;
  ASSERT_OK(ot_optimizer_create(path("optimizer_model.onnx").c_str(), module, opt.out()));
  expect_error(ot_optimizer_step(opt), OT_INVALID_ARGUMENT, "has no gradient");
  std::vector<float> before = parameter(ckpt, "fc1.weight", {32, 2});

  auto in = inputs();
  Outputs out(2);
  expect_error(ot_module_train_step(module, in.data(), 1, out.t.data(), 2), OT_INVALID_ARGUMENT,
               "expected 2 inputs (x, target), got 1");
  expect_error(ot_module_train_step(module, in.data(), 2, out.t.data(), 1), OT_INVALID_ARGUMENT,
               "expected room for 2 outputs, got 1");
  expect_error(ot_module_train_step(module, in.data(), 2, nullptr, 2), OT_INVALID_ARGUMENT, "outputs is NULL");
  expect_error(ot_module_train_step(module, nullptr, 2, out.t.data(), 2), OT_INVALID_ARGUMENT, "inputs is NULL");
  std::vector<double> wide(x_.begin(), x_.end());
  std::vector<OtTensorView> bad = in;
  bad[0].data = wide.data();
  bad[0].dtype = OT_DTYPE_FLOAT64;
  expect_error(ot_module_train_step(module, bad.data(), 2, out.t.data(), 2), OT_INVALID_ARGUMENT,
               "input 'x' should be float32, got float64");
  int64_t wrong_shape[] = {kBatch / 2, 4};
  bad = in;
  bad[0].shape = wrong_shape;
  expect_error(ot_module_train_step(module, bad.data(), 2, out.t.data(), 2), OT_INVALID_ARGUMENT,
               "input 'x' should have shape [-1, 2] (-1: any), got [8, 4]");
  for (OtTensor* t : out.t) EXPECT_EQ(t, nullptr);
  EXPECT_EQ(parameter(ckpt, "fc1.weight", {32, 2}), before);

  // Without an eval model: eval_step and eval-mode names fail by name.
  Outputs eval(2);
  expect_error(ot_module_eval_step(module, in.data(), 2, eval.t.data(), 2), OT_INVALID_ARGUMENT, "no eval model");
  ASSERT_OK(ot_module_eval(module));
  size_t n = 0;
  expect_error(ot_module_input_count(module, &n), OT_INVALID_ARGUMENT, "no eval model");
  expect_error(ot_module_export_model_for_inferencing(module, path("x.onnx").c_str(), kLogits, 1),
               OT_INVALID_ARGUMENT, "needs the eval model");
  EXPECT_FALSE(fs::exists(path("x.onnx")));
}

TEST_F(CApiTest, MissingAndCorruptFiles) {
  Checkpoint ckpt;
  expect_error(ot_checkpoint_load(path("nope").c_str(), ckpt.out()), OT_RUNTIME_ERROR, path("nope"));
  EXPECT_EQ(ckpt.p, nullptr);

  // A flipped byte and a truncated file are detected; the loaded checkpoint stays as it was.
  std::ifstream f(path("checkpoint"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  ASSERT_GT(bytes.size(), 100u);
  std::string flipped = bytes;
  flipped[flipped.size() - 5] ^= 0x40;
  std::ofstream(path("flipped"), std::ios::binary) << flipped;
  std::ofstream(path("truncated"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  for (const char* name : {"flipped", "truncated"}) {
    OtCheckpoint* out = reinterpret_cast<OtCheckpoint*>(0x1);
    OtStatus s = ot_checkpoint_load(path(name).c_str(), &out);
    EXPECT_EQ(s, OT_INVALID_MODEL) << name << ": " << ot_last_error();
    EXPECT_NE(std::string(ot_last_error()).find(path(name)), std::string::npos) << ot_last_error();
    EXPECT_EQ(out, nullptr);
  }

  Module module;
  ASSERT_OK(ot_checkpoint_load(path("checkpoint").c_str(), ckpt.out()));
  expect_error(ot_module_create(path("missing.onnx").c_str(), ckpt, nullptr, module.out()), OT_INVALID_ARGUMENT,
               "missing.onnx");
  EXPECT_EQ(module.p, nullptr);
  std::ofstream(path("garbage.onnx"), std::ios::binary) << "not a model";
  EXPECT_NE(ot_module_create(path("garbage.onnx").c_str(), ckpt, nullptr, module.out()), OT_OK);
  EXPECT_EQ(module.p, nullptr);
  // A device other than cpu or cuda is refused by name; cuda without a GPU (or without a CUDA
  // build) says why (tests/cuda runs it on a GPU).
  expect_error(ot_module_create_on_device(path("training_model.onnx").c_str(), ckpt, nullptr, "tpu", module.out()),
               OT_INVALID_ARGUMENT, "\"tpu\"");
  EXPECT_EQ(module.p, nullptr);
  if (!onnxtrain::device_available(onnxtrain::Device::kCuda)) {
    EXPECT_NE(ot_module_create_on_device(path("training_model.onnx").c_str(), ckpt, nullptr, "cuda", module.out()), OT_OK);
    EXPECT_NE(std::string(ot_last_error()).find("CUDA"), std::string::npos) << ot_last_error();
    EXPECT_EQ(module.p, nullptr);
  }
  ASSERT_OK(ot_module_create_on_device(path("training_model.onnx").c_str(), ckpt, nullptr, "cpu", module.out()));
  EXPECT_NE(module.p, nullptr);
  Session session;
  EXPECT_NE(ot_session_create(path("garbage.onnx").c_str(), session.out()), OT_OK);
  EXPECT_EQ(session.p, nullptr);

  // A failed save keeps the old file.
  expect_error(ot_checkpoint_save(ckpt, (dir_ / "no_dir" / "ckpt").c_str(), 1), OT_RUNTIME_ERROR, "no_dir");
}

TEST_F(CApiTest, ArtifactOptionsAreChecked) {
  Options o;
  ASSERT_OK(ot_artifact_options_create(o.out()));
  ASSERT_OK(ot_artifact_options_set_requires_grad(o, kParams, 6));
  std::string out = path("again");
  expect_error(ot_generate_artifacts(model_path().c_str(), o, out.c_str()), OT_INVALID_ARGUMENT, "no loss given");
  expect_error(ot_artifact_options_set_loss(o, static_cast<OtLossType>(42)), OT_INVALID_ARGUMENT,
               "unknown loss type 42");
  expect_error(ot_artifact_options_set_optimizer(o, static_cast<OtOptimizerType>(-1), 0.1), OT_INVALID_ARGUMENT,
               "unknown optimizer type -1");
  expect_error(ot_artifact_options_set_optimizer(o, OT_OPTIMIZER_SGD, -0.1), OT_INVALID_ARGUMENT,
               "invalid learning rate");
  const char* unknown[] = {"fc1.weight", "fc7.weight"};
  ASSERT_OK(ot_artifact_options_set_loss(o, OT_LOSS_CROSS_ENTROPY));
  ASSERT_OK(ot_artifact_options_set_requires_grad(o, unknown, 2));
  expect_error(ot_generate_artifacts(model_path().c_str(), o, out.c_str()), OT_INVALID_ARGUMENT, "fc7.weight");
  const char* with_null[] = {"fc1.weight", nullptr};
  expect_error(ot_artifact_options_set_frozen_params(o, with_null, 2), OT_INVALID_ARGUMENT, "names[1] is NULL");
  expect_error(ot_generate_artifacts(path("missing.onnx").c_str(), o, out.c_str()), OT_INVALID_ARGUMENT,
               "missing.onnx");

  // A nominal checkpoint has no values: a module refuses it until the parameters are filled.
  ASSERT_OK(ot_artifact_options_set_requires_grad(o, kParams, 6));
  ASSERT_OK(ot_artifact_options_set_nominal_checkpoint(o, 1));
  ASSERT_OK(ot_generate_artifacts(model_path().c_str(), o, out.c_str()));
  Checkpoint nominal;
  Module module;
  ASSERT_OK(ot_checkpoint_load((fs::path(out) / "checkpoint").c_str(), nominal.out()));
  expect_error(ot_module_create((fs::path(out) / "training_model.onnx").c_str(), nominal, nullptr, module.out()),
               OT_INVALID_ARGUMENT, "nominal");
}

// The memory optimizer through the C surface: bad levels fail at once, a config naming no cluster
// fails at generation listing the model's clusters, and recomputing the MLP's Gemm+Relu outputs
// (the plan the config asks for, recorded in the training model) trains bit-identically.
TEST_F(CApiTest, MemoryOptimizerRecomputesAndTrainsTheSame) {
  Options o;
  ASSERT_NO_FATAL_FAILURE(mlp_options(o));
  expect_error(ot_artifact_options_set_memory_optimizer(o, 3, nullptr), OT_INVALID_ARGUMENT,
               "must be 0, 1 or 2, got 3");
  expect_error(ot_artifact_options_set_memory_optimizer(o, -1, ""), OT_INVALID_ARGUMENT, "got -1");
  ASSERT_OK(ot_artifact_options_set_memory_optimizer(o, 0, "Softmax+:1:-1"));
  const std::string out = path("recompute");
  expect_error(ot_generate_artifacts(model_path().c_str(), o, out.c_str()), OT_INVALID_ARGUMENT, "Gemm+Relu+");
  ASSERT_OK(ot_artifact_options_set_memory_optimizer(o, 0, "Gemm+Relu+:1:-1"));
  ASSERT_OK(ot_generate_artifacts(model_path().c_str(), o, out.c_str()));

  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  const std::string plan_key = "onnxtrain.memory_plan";  // metadata of an applied plan
  EXPECT_NE(read(fs::path(out) / "training_model.onnx").find(plan_key), std::string::npos);
  EXPECT_EQ(read(path("training_model.onnx")).find(plan_key), std::string::npos);

  auto train = [&](const std::string& dir) {
    Checkpoint ckpt;
    Module module;
    Optimizer opt;
    std::vector<float> losses;
    EXPECT_OK(ot_checkpoint_load((fs::path(dir) / "checkpoint").c_str(), ckpt.out()));
    EXPECT_OK(ot_module_create((fs::path(dir) / "training_model.onnx").c_str(), ckpt, nullptr, module.out()));
    EXPECT_OK(ot_optimizer_create((fs::path(dir) / "optimizer_model.onnx").c_str(), module, opt.out()));
    auto in = inputs();
    for (int step = 0; step < 8; ++step) {
      Outputs loss(2);
      EXPECT_OK(ot_module_train_step(module, in.data(), in.size(), loss.t.data(), 2));
      losses.push_back(loss.scalar(0));
      EXPECT_OK(ot_optimizer_step(opt));
      EXPECT_OK(ot_module_lazy_reset_grad(module));
    }
    return losses;
  };
  const std::vector<float> plain = train(dir_.string()), recomputed = train(out);
  EXPECT_EQ(plain, recomputed);
  EXPECT_LT(plain.back(), plain.front());
}

// fp16 artifacts: a scale of 2^40 overflows, so the first updates are skipped, each halving the
// scale (torch.amp.GradScaler's backoff), until the gradients are finite and updates run again.
TEST_F(CApiTest, Fp16LossScalerSkipsOverflowingUpdates) {
  Options o;
  ASSERT_OK(ot_artifact_options_create(o.out()));
  ASSERT_OK(ot_artifact_options_set_requires_grad(o, kParams, 6));
  ASSERT_OK(ot_artifact_options_set_loss(o, OT_LOSS_CROSS_ENTROPY));
  expect_error(ot_artifact_options_set_mixed_precision(o, "fp8"), OT_INVALID_ARGUMENT, "'fp8'");
  ASSERT_OK(ot_artifact_options_set_mixed_precision(o, "fp16"));
  const std::string out = path("fp16");
  ASSERT_OK(ot_generate_artifacts(model_path().c_str(), o, out.c_str()));
  Checkpoint ckpt;
  Module module;
  ASSERT_OK(ot_checkpoint_load((fs::path(out) / "checkpoint").c_str(), ckpt.out()));
  double scale = 0;
  ASSERT_OK(ot_checkpoint_get_float_property(ckpt, "onnxtrain.loss_scale", &scale));
  EXPECT_EQ(scale, 65536.0);
  ASSERT_OK(ot_checkpoint_set_float_property(ckpt, "onnxtrain.loss_scale", std::ldexp(1.0, 40)));
  ASSERT_OK(ot_module_create((fs::path(out) / "training_model.onnx").c_str(), ckpt, nullptr, module.out()));
  size_t n = 0;
  ASSERT_OK(ot_module_input_count(module, &n));
  EXPECT_EQ(n, 2u);  // x and the target: the module feeds the loss scale itself
  Optimizer opt;
  ASSERT_OK(ot_optimizer_create((fs::path(out) / "optimizer_model.onnx").c_str(), module, opt.out()));
  auto in = inputs();
  double expected = std::ldexp(1.0, 40);
  int64_t skipped_count = 0, applied = 0;
  for (int step = 0; step < 30; ++step) {
    Outputs loss(1);
    ASSERT_OK(ot_module_train_step(module, in.data(), in.size(), loss.t.data(), 1));
    int skipped = -1;
    ASSERT_OK(ot_optimizer_step_report(opt, &skipped, &scale));
    if (skipped) {
      expected *= 0.5;
      ++skipped_count;
      EXPECT_EQ(applied, 0) << "step " << step << ": a skip after finite steps at this scale";
    } else {
      ++applied;
    }
    EXPECT_EQ(scale, expected) << "step " << step;
    ASSERT_OK(ot_module_lazy_reset_grad(module));
  }
  EXPECT_GE(skipped_count, 10);  // fp16 overflows above 65504
  EXPECT_GT(applied, 0);
  int64_t count = 0;
  ASSERT_OK(ot_optimizer_step_count(opt, &count));
  EXPECT_EQ(count, applied);  // a skipped update does not count
  ASSERT_OK(ot_checkpoint_get_int_property(ckpt, "onnxtrain.skipped_steps", &count));
  EXPECT_EQ(count, skipped_count);
}

TEST_F(CApiTest, SessionRunChecksItsFeeds) {
  Session session;
  ASSERT_OK(ot_session_create(model_path().c_str(), session.out()));
  auto in = inputs();
  Outputs out(1);
  const char* twice[] = {"x", "x"};
  expect_error(ot_session_run(session, twice, in.data(), 2, out.t.data(), 1), OT_INVALID_ARGUMENT,
               "input 'x' is given twice");
  const char* wrong[] = {"y"};
  expect_error(ot_session_run(session, wrong, in.data(), 1, out.t.data(), 1), OT_INVALID_ARGUMENT,
               "feed 'y' is not an input of the model");
  expect_error(ot_session_run(session, nullptr, in.data(), 1, out.t.data(), 1), OT_INVALID_ARGUMENT,
               "input_names is NULL");
  EXPECT_EQ(out.t[0], nullptr);
}

TEST(CApi, StatusNamesAndThreadLocalErrors) {
  EXPECT_STREQ(ot_status_name(OT_INVALID_MODEL), "INVALID_MODEL");
  EXPECT_STREQ(ot_status_name(static_cast<OtStatus>(77)), "UNKNOWN_STATUS");
  EXPECT_EQ(ot_module_train(nullptr), OT_INVALID_ARGUMENT);
  std::string here = ot_last_error();
  EXPECT_EQ(here, "[C API] ot_module_train: module is NULL");
  std::string there = "unset";
  std::thread([&] { there = ot_last_error(); }).join();
  EXPECT_EQ(there, "");  // each thread has its own message
  EXPECT_EQ(std::string(ot_last_error()), here);
}

}  // namespace

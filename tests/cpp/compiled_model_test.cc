// Pre-compiled artifacts (compile_artifacts, runtime/compiled_model): training from them is
// bit-identical to training from the ONNX files, and every kind of bad file (another format or
// library version, another model, damaged, truncated) falls back to the ONNX file with a note, or
// is a clear error when there is no ONNX file to fall back to.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/crc32c.h"
#include "onnxtrain/artifacts.h"
#include "onnxtrain/c_api.h"
#include "runtime/compiled_model.h"
#include "test_util.h"
#include "training/module.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatch = 8;

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

// Rewrites a compiled file's header (version, size, checksums) around an edited payload, as the
// format (docs/DESIGN.md) lays it out: a file that differs only where the test means it to.
void rewrite_compiled(const fs::path& p, uint32_t version, const std::string& payload) {
  std::string header = read_bytes(p).substr(0, 32);
  const uint64_t size = payload.size();
  const uint32_t crc = crc32c(0, payload.data(), payload.size());
  std::memcpy(header.data() + 8, &version, 4);
  std::memcpy(header.data() + 16, &size, 8);
  std::memcpy(header.data() + 24, &crc, 4);
  const uint32_t header_crc = crc32c(0, header.data(), 28);
  std::memcpy(header.data() + 28, &header_crc, 4);
  write_bytes(p, header + payload);
}

class CompiledModelTest : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    ArtifactOptions o;
    o.graphs.loss = LossType::kCrossEntropy;
    o.graphs.requires_grad = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
    o.graphs.additional_output_names = {"logits"};
    o.optimizer.lr = 1e-2;
    o.directory = (dir_ / "onnx").string();
    generate_artifacts(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", o);
    fs::copy(dir_ / "onnx", dir_ / "compiled");
    written_ = compile_artifacts((dir_ / "compiled").string(), {{"x", {kBatch, 2}}, {"target", {kBatch}}});
  }
  fs::path compiled(const std::string& name) const { return dir_ / "compiled" / name; }

  // The inputs and targets of train step `step`.
  static std::vector<Tensor> batch(int step) {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int i = 0; i < kBatch; ++i) {
      x.push_back(std::sin(0.7f * float(i + step)));
      x.push_back(std::cos(1.3f * float(i)));
      y.push_back((i + step) % 3);
    }
    return {Tensor::from_vector(x, {kBatch, 2}), Tensor::from_vector(y, {kBatch})};
  }
  // Parameters and losses after `steps` train steps and the eval outputs after them, from `dir`.
  std::vector<Tensor> train(const fs::path& dir, int steps = 4) {
    CheckpointState state = CheckpointState::load((dir / "checkpoint").string());
    state.add_property(CheckpointState::kRandomSeedProperty, int64_t(7));
    Module module((dir / "training_model.onnx").string(), state, (dir / "eval_model.onnx").string());
    Optimizer optimizer((dir / "optimizer_model.onnx").string(), module);
    std::vector<Tensor> results;
    for (int step = 0; step < steps; ++step) {
      std::vector<Tensor> in = batch(step);
      for (const Tensor& t : module.train_step(in)) results.push_back(t);
      optimizer.step();
      module.lazy_reset_grad();
      if (step + 1 == steps)
        for (const Tensor& t : module.eval_step(in)) results.push_back(t);
    }
    for (const auto& name : state.parameter_names()) results.push_back(state.get_parameter(name));
    return results;
  }
  static void expect_bit_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].shape(), b[i].shape()) << "result " << i;
      EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()), 0) << "result " << i << " differs";
    }
  }
  // Trains from the compiled directory, expecting `note` on stderr ("" for none), and compares
  // with the ONNX directory.
  void expect_trains_like_onnx(const std::string& note) {
    testing::internal::CaptureStderr();
    std::vector<Tensor> got = train(dir_ / "compiled");
    const std::string err = testing::internal::GetCapturedStderr();
    if (note.empty()) EXPECT_EQ(err, "");
    else EXPECT_NE(err.find(note), std::string::npos) << err;
    expect_bit_identical(train(dir_ / "onnx"), got);
  }

  std::vector<std::string> written_;
};

TEST_F(CompiledModelTest, WritesTheThreeModelsWithPlans) {
  ASSERT_EQ(written_.size(), 3u);
  EXPECT_EQ(written_[0], compiled("training_model.otc").string());
  const CompiledModel training = read_compiled_model(written_[0], compiled("training_model.onnx").string());
  ASSERT_EQ(training.plans.size(), 1u);
  EXPECT_EQ(training.kernel_versions.size(), training.model.graph.nodes.size());
  EXPECT_GT(training.plans[0].arena_bytes, 0u);
  const CompiledModel eval = read_compiled_model(written_[1], compiled("eval_model.onnx").string());
  EXPECT_EQ(eval.plans.size(), 1u);
  const CompiledModel optimizer = read_compiled_model(written_[2], compiled("optimizer_model.onnx").string());
  EXPECT_TRUE(optimizer.plans.empty());
  // What load_model_for_runtime picks: the compiled file while it is valid.
  EXPECT_EQ(load_model_for_runtime(compiled("training_model.onnx").string()).compiled_from, written_[0]);
  EXPECT_EQ(load_model_for_runtime((dir_ / "onnx" / "training_model.onnx").string()).compiled_from, "");
}

TEST_F(CompiledModelTest, TrainingIsBitIdenticalToTheOnnxFiles) { expect_trains_like_onnx(""); }

// After lazy_reset_grad a step writes each gradient into the storage the previous step's took,
// unless the caller still holds that gradient: it keeps its values, and the training is the same.
TEST_F(CompiledModelTest, GradientStorageIsReusedUnlessTheCallerHoldsIt) {
  for (const char* form : {"onnx", "compiled"}) {
    SCOPED_TRACE(form);
    auto run = [&](bool hold) {
      CheckpointState state = CheckpointState::load((dir_ / form / "checkpoint").string());
      state.add_property(CheckpointState::kRandomSeedProperty, int64_t(7));
      Module module((dir_ / form / "training_model.onnx").string(), state);
      Optimizer optimizer((dir_ / form / "optimizer_model.onnx").string(), module);
      std::vector<const void*> storage;
      Tensor held, held_values;
      for (int step = 0; step < 4; ++step) {
        module.train_step(batch(step));
        const Tensor& grad = state.parameter("fc2.weight").grad();
        storage.push_back(grad.data());
        if (held.defined()) {  // the step did not write into the gradient held since the last one
          EXPECT_EQ(std::memcmp(held.data(), held_values.data(), held.nbytes()), 0) << "step " << step;
        }
        if (hold) {
          held = grad;
          held_values = grad.clone();
        }
        optimizer.step();
        module.lazy_reset_grad();
      }
      for (int step = 2; step < 4; ++step) {  // the ONNX form's first step records: fresh storage
        if (hold) EXPECT_NE(storage[size_t(step)], storage[size_t(step - 1)]) << "step " << step;
        else EXPECT_EQ(storage[size_t(step)], storage[size_t(step - 1)]) << "step " << step;
      }
      std::vector<Tensor> params;
      for (const auto& name : state.parameter_names()) params.push_back(state.get_parameter(name));
      return params;
    };
    expect_bit_identical(run(false), run(true));
  }
}

TEST_F(CompiledModelTest, ThePlanIsTheOneTheOnnxPathRecords) {
  // The executor adopts the plan: its first run is planned, and the plan it holds is the file's.
  const CompiledModel c = read_compiled_model(written_[0], compiled("training_model.onnx").string());
  CheckpointState state = CheckpointState::load(compiled("checkpoint").string());
  Module module(compiled("training_model.onnx").string(), state);
  const std::vector<PlanRecord> held = CompileAccess::executor(module, true).recorded_plans();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].signature, c.plans[0].signature);
  EXPECT_EQ(held[0].offsets, c.plans[0].offsets);
  EXPECT_EQ(held[0].arena_bytes, c.plans[0].arena_bytes);
}

TEST_F(CompiledModelTest, OtherShapesPlanOnTheFirstStep) {
  // A batch the file has no plan for records one as from ONNX; the compiled plan stays.
  CheckpointState state = CheckpointState::load(compiled("checkpoint").string());
  Module module(compiled("training_model.onnx").string(), state);
  module.train_step({Tensor::zeros(DType::kFloat32, {3, 2}), Tensor::zeros(DType::kInt64, {3})});
  EXPECT_EQ(CompileAccess::executor(module, true).recorded_plans().size(), 2u);
}

TEST_F(CompiledModelTest, AnotherFormatVersionFallsBackWithANote) {
  const std::string bytes = read_bytes(compiled("training_model.otc"));
  rewrite_compiled(compiled("training_model.otc"), 99, bytes.substr(32));
  EXPECT_NE(test::error_of([&] { read_compiled_model(compiled("training_model.otc").string(), ""); })
                .find("format version 99; this library reads version 1"),
            std::string::npos);
  expect_trains_like_onnx("ignoring pre-compiled model");
}

TEST_F(CompiledModelTest, AnotherLibraryVersionFallsBackWithANote) {
  const std::string bytes = read_bytes(compiled("training_model.otc"));
  uint64_t n;
  std::memcpy(&n, bytes.data() + 32, 8);  // the payload starts with the library version string
  const std::string other = "0.0.0-other";
  const uint64_t m = other.size();
  std::string payload(reinterpret_cast<const char*>(&m), 8);
  payload += other + bytes.substr(32 + 8 + n);
  rewrite_compiled(compiled("training_model.otc"), kCompiledFormatVersion, payload);
  expect_trains_like_onnx("was written by onnxtrain 0.0.0-other");
}

TEST_F(CompiledModelTest, AnotherModelIsStale) {
  // eval_model.otc replaced by the training model's: compiled from another ONNX file.
  fs::copy_file(compiled("training_model.otc"), compiled("eval_model.otc"), fs::copy_options::overwrite_existing);
  expect_trains_like_onnx("is stale: '" + compiled("eval_model.onnx").string() + "' changed since it was compiled");
}

TEST_F(CompiledModelTest, AChangedOnnxFileIsStale) {
  fs::copy_file(dir_ / "onnx" / "eval_model.onnx", compiled("training_model.onnx"), fs::copy_options::overwrite_existing);
  testing::internal::CaptureStderr();
  CheckpointState state = CheckpointState::load(compiled("checkpoint").string());
  EXPECT_NE(test::error_of([&] { Module module(compiled("training_model.onnx").string(), state); }), "<no error>");
  EXPECT_NE(testing::internal::GetCapturedStderr().find("is stale"), std::string::npos);
}

TEST_F(CompiledModelTest, DamagedFilesFallBackWithANote) {
  const std::string good = read_bytes(compiled("training_model.otc"));
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {flipped, "payload checksum mismatch"},
      {good.substr(0, good.size() - 100), "is truncated"},
      {good.substr(0, 20), "is not a pre-compiled model"},
      {"not a model at all, just text", "is not a pre-compiled model"},
      {std::string(good).replace(9, 1, "\x7f"), "header checksum mismatch"},
  };
  for (const auto& [bytes, note] : cases) {
    SCOPED_TRACE(note);
    write_bytes(compiled("training_model.otc"), bytes);
    expect_trains_like_onnx(note);
  }
}

TEST_F(CompiledModelTest, APlanThatDoesNotFitIsDroppedWithANote) {
  // A checksummed file whose plan puts a value outside its arena: the model loads, the plan does not.
  CompiledModel c = read_compiled_model(written_[0], compiled("training_model.onnx").string());
  for (auto& offset : c.plans[0].offsets)
    if (offset >= 0) offset = int64_t(c.plans[0].arena_bytes);
  write_compiled_model(written_[0], c, compiled("training_model.onnx").string());
  expect_trains_like_onnx("ignoring the plans of pre-compiled model");
  // Views in a cycle would never reach their storage.
  c = read_compiled_model(written_[0], compiled("training_model.onnx").string());
  c.plans[0].alias_of[0] = 1;
  c.plans[0].alias_of[1] = 0;
  write_compiled_model(written_[0], c, compiled("training_model.onnx").string());
  expect_trains_like_onnx("aliases a cycle of views");
}

TEST_F(CompiledModelTest, WithoutOnnxFilesTheCompiledOnesStandAlone) {
  const std::vector<Tensor> expected = train(dir_ / "onnx");
  for (const char* name : {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"}) fs::remove(compiled(name));
  testing::internal::CaptureStderr();
  expect_bit_identical(expected, train(dir_ / "compiled"));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  {  // and may be named directly
    CheckpointState state = CheckpointState::load(compiled("checkpoint").string());
    Module module(compiled("training_model.otc").string(), state);
    EXPECT_EQ(module.input_names(), (std::vector<std::string>{"x", "target"}));
  }
  // A damaged one then has nothing to fall back to: a clear error.
  write_bytes(compiled("training_model.otc"), read_bytes(compiled("training_model.otc")).substr(0, 64));
  CheckpointState state = CheckpointState::load(compiled("checkpoint").string());
  EXPECT_NE(test::error_of([&] { Module module(compiled("training_model.onnx").string(), state); }).find("is truncated"),
            std::string::npos);
}

TEST_F(CompiledModelTest, ShapesAreChecked) {
  const std::string dir = (dir_ / "compiled").string();
  EXPECT_NE(test::error_of([&] { compile_artifacts(dir); }).find("give its dims (--shape x=d0,d1,...)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { compile_artifacts(dir, {{"x", {8, 2}}, {"target", {8}}, {"y", {1}}}); })
                .find("--shape y: not an input of the models (inputs: x, target)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { compile_artifacts(dir, {{"x", {8, 5}}, {"target", {8}}}); })
                .find("input 'x' is declared"),
            std::string::npos);
}

TEST_F(CompiledModelTest, CApiCompiles) {
  fs::remove(compiled("training_model.otc"));
  const char* names[] = {"x", "target"};
  const int64_t x_dims[] = {kBatch, 2}, target_dims[] = {kBatch};
  const int64_t* dims[] = {x_dims, target_dims};
  const size_t ranks[] = {2, 1};
  ASSERT_EQ(ot_compile_artifacts((dir_ / "compiled").c_str(), names, dims, ranks, 2), OT_OK) << ot_last_error();
  EXPECT_TRUE(fs::exists(compiled("training_model.otc")));
  EXPECT_EQ(ot_compile_artifacts((dir_ / "compiled").c_str(), names, dims, ranks, 1), OT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ot_last_error()).find("give its dims"), std::string::npos);
  expect_trains_like_onnx("");
}

}  // namespace
}  // namespace onnxtrain

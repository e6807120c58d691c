// The C++ front end of the kill test (tests/crash/kill_test.py): a training loop through the public
// C++ API that saves a checkpoint and exports an inference model after every update, resuming
// from the checkpoint when it exists.
//
//   crash_train ARTIFACTS DATA.npz CHECKPOINT FORMAT STEPS BATCH EXPORT.onnx OUTPUT [KEEP_DIR]
//
// FORMAT: onnxtrain, ort (ONNX Runtime's format) or ort-external (every tensor of 64 bytes or more
// in "<CHECKPOINT>.data"). Update s (from 0) trains on rows [s*BATCH, (s+1)*BATCH) of DATA's x, y
// (wrapping); the checkpoint's "crash.step" property counts the updates done. OUTPUT names the
// exported model's output. KEEP_DIR (the uninterrupted reference run): also writes every update's
// checkpoint and model there, as ckpt-<s> and model-<s>.onnx.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "onnxtrain/dataset.h"
#include "onnxtrain/module.h"
#include "training/ort_checkpoint.h"

using namespace onnxtrain;
namespace fs = std::filesystem;

namespace {

void save(const CheckpointState& state, const std::string& path, const std::string& format) {
  if (format == "onnxtrain") state.save(path, true, CheckpointFormat::kOnnxtrain);
  else if (format == "ort") state.save(path, true, CheckpointFormat::kOrt);
  else ort_checkpoint::write(state, path, true, {ort_checkpoint::kNewestVersion, 0});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9) {
    std::fprintf(stderr, "usage: crash_train ARTIFACTS DATA.npz CHECKPOINT FORMAT STEPS BATCH EXPORT.onnx OUTPUT [KEEP_DIR]\n");
    return 2;
  }
  const fs::path dir = argv[1];
  const std::string checkpoint = argv[3], format = argv[4], exported = argv[7], output = argv[8];
  const int64_t steps = std::atoll(argv[5]), batch = std::atoll(argv[6]);
  const std::string keep = argc > 9 ? argv[9] : "";
  if (format != "onnxtrain" && format != "ort" && format != "ort-external") {
    std::fprintf(stderr, "crash_train: FORMAT must be onnxtrain, ort or ort-external, got %s\n", format.c_str());
    return 2;
  }
  try {
    CheckpointState state = CheckpointState::load(fs::exists(checkpoint) ? checkpoint : (dir / "checkpoint").string());
    const int64_t first = state.has_property("crash.step") ? std::get<int64_t>(state.get_property("crash.step")) : 0;
    Module module((dir / "training_model.onnx").string(), state, (dir / "eval_model.onnx").string());
    Optimizer optimizer((dir / "optimizer_model.onnx").string(), module);
    Dataset data(load_npz(argv[2], {"x", "y"}), argv[2]);
    std::vector<int64_t> rows(size_t(data.size()), 0);  // Dataset::batch reads a full-length order
    for (int64_t s = first; s < steps; ++s) {
      for (int64_t i = 0; i < batch; ++i) rows[size_t(i)] = (s * batch + i) % data.size();
      module.train_step(data.batch(rows, 0, batch));
      optimizer.step();
      module.lazy_reset_grad();
      state.add_property("crash.step", s + 1);
      save(state, checkpoint, format);
      module.export_model_for_inferencing(exported, {output});
      if (!keep.empty()) {
        save(state, (fs::path(keep) / ("ckpt-" + std::to_string(s + 1))).string(), format);
        module.export_model_for_inferencing((fs::path(keep) / ("model-" + std::to_string(s + 1) + ".onnx")).string(),
                                            {output});
      }
    }
    if (first >= steps) module.export_model_for_inferencing(exported, {output});  // killed between save and export
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crash_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

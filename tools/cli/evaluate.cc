// `onnxtrain eval` and `onnxtrain export`: use a trained checkpoint.
#include <cstdio>

#include "commands.h"
#include "training/trainer.h"

namespace onnxtrain::cli {

const Command kEvalCommand{
    "eval",
    "evaluate a checkpoint on .npz data: mean loss, and accuracy (argmax) when the labels are class indices",
    {"DIR"},
    {
        {"--data", "FILE.npz", "evaluation data (required)"},
        kInputsOption,
        kLabelsOption,
        {"--checkpoint", "PATH", "the parameters to evaluate (default DIR/checkpoint)"},
        {"--batch-size", "B", "examples per batch (default 256)"},
        {"--predictions", "FILE.npz", "also write the model's predictions (the loss's inputs) there"},
    },
    "example:\n  onnxtrain eval out --data val.npz --inputs x --labels y --checkpoint out/trained_checkpoint\n"};

const Command kExportCommand{
    "export",
    "write an inference model (the eval graph without the loss) with a checkpoint's parameters",
    {"DIR"},
    {
        {"--checkpoint", "PATH", "the trained parameters (required)"},
        {"--out", "FILE.onnx", "the model to write (required)"},
        {"--outputs", "NAMES", "graph outputs (default: the original model's outputs)"},
    },
    "example:\n  onnxtrain export out --checkpoint out/trained_checkpoint --out model.onnx\n"};

int run_eval(const Args& a) {
  const std::string dir = a.positional(0);
  const std::string data = a.require("--data");
  const int64_t batch_size = a.get_int("--batch-size", 256, 1);
  const std::vector<std::string> inputs = a.get_list("--inputs"), labels = a.get_list("--labels");
  const std::string predictions = a.has("--predictions") ? a.require("--predictions") : "";
  const ArtifactPaths artifacts = artifact_paths(dir);
  Trainer trainer(artifacts, a.has("--checkpoint") ? a.require("--checkpoint") : artifacts.checkpoint);
  std::vector<std::string> notes;
  Dataset dataset = trainer.load_dataset(data, inputs, labels, &notes);
  for (const auto& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  EvalResult r = trainer.evaluate(dataset, batch_size);
  std::printf("examples %lld\nloss %.6g\n", (long long)r.examples, r.loss);
  if (r.correct)
    std::printf("accuracy %.4f (%lld/%lld)\n", r.accuracy(), (long long)*r.correct, (long long)*r.counted);
  if (!predictions.empty()) {
    save_npz(predictions, trainer.predict(dataset, batch_size));
    std::printf("wrote %s\n", predictions.c_str());
  }
  return 0;
}

int run_export(const Args& a) {
  const std::string dir = a.positional(0);
  const std::string checkpoint = a.require("--checkpoint");
  const std::string out = a.require("--out");
  std::vector<std::string> outputs = a.get_list("--outputs");
  Trainer trainer(artifact_paths(dir), checkpoint);
  if (outputs.empty()) outputs = trainer.model_outputs();
  if (outputs.empty())
    OT_THROW(kInvalidArgument, "the eval model does not record the original model's outputs (artifacts from "
             "another generator?): name them with --outputs");
  trainer.module().export_model_for_inferencing(out, outputs);
  std::string names;
  for (const auto& n : outputs) names += (names.empty() ? "" : ", ") + n;
  std::printf("wrote %s (outputs: %s)\n", out.c_str(), names.c_str());
  return 0;
}

}  // namespace onnxtrain::cli

// generate_artifacts: the offline step of on-device training, with no Python needed. From an
// inference ONNX model it writes <prefix>training_model.onnx (forward + loss + backward),
// <prefix>eval_model.onnx, <prefix>optimizer_model.onnx and <prefix>checkpoint into a directory.
//
//   onnxtrain::ArtifactOptions o;
//   o.graphs.requires_grad = {"fc1.weight", "fc1.bias"};
//   o.graphs.loss = onnxtrain::LossType::kCrossEntropy;
//   o.optimizer = onnxtrain::OptimizerConfig::defaults(onnxtrain::OptimizerType::kAdamW);
//   o.directory = "out";
//   onnxtrain::ArtifactPaths paths = onnxtrain::generate_artifacts("model.onnx", o);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/lora.h"
#include "onnxtrain/memory_options.h"
#include "onnxtrain/optimizer_config.h"

namespace onnxtrain {

struct Model;  // internal (src/ir/graph.h)

// Built-in losses; semantics follow torch.nn's losses of the same name.
enum class LossType { kMSE, kL1, kSmoothL1, kHuber, kCrossEntropy, kNLL, kBCE, kBCEWithLogits, kKLDiv };

LossType loss_type_from_name(const std::string& name);  // "MSELoss", "CrossEntropyLoss", ...
std::string loss_type_name(LossType type);

struct LossOptions {
  std::string reduction = "mean";   // "mean", "sum", "none" ("batchmean" for KLDiv)
  int64_t ignore_index = -100;      // CrossEntropy, NLL
  double label_smoothing = 0.0;     // CrossEntropy
  std::string class_weights;        // CrossEntropy, NLL: name of a [C] initializer or input, "" for none
  std::string pos_weight;           // BCEWithLogits: name of a value broadcastable to the target
  double beta = 1.0;                // SmoothL1 beta, Huber delta
  bool log_target = false;          // KLDiv
};

// How the training and eval graphs are built from the inference model.
struct TrainingGraphOptions {
  std::vector<std::string> requires_grad;      // initializers to train
  std::vector<std::string> frozen_params;      // initializers kept fixed
  std::optional<LossType> loss;                // a built-in loss, or
  // a loss model (inputs = model outputs + targets, one scalar output). Built in memory by the
  // Python API and internal callers; C++ programs on the public headers use `loss`.
  std::shared_ptr<const Model> custom_loss;
  LossOptions loss_options;
  std::vector<std::string> loss_input_names;   // model outputs fed to the loss (default: the first output)
  std::vector<std::string> additional_output_names;
  // "bf16": GEMMs and their gradients in bfloat16 (fp32 accumulation), losses, normalisations and
  // the optimizer in fp32, fp32 master parameters in the checkpoint. "fp16": the same in float16,
  // with a dynamic loss scaler (the training graph takes the scale, Optimizer::step skips updates
  // whose gradients overflowed; the scale lives in the checkpoint). "" for fp32 only.
  std::string mixed_precision;
  // The compute optimizer (src/passes/compute_optimizer.h): a Gather or Slice that keeps a few
  // positions (a head on token 0, the last token) moves upstream past elementwise ops, LayerNorm,
  // Softmax and MatMul, so the training and eval graphs compute only those rows. Exact; on by
  // default, as TrainModule's ONNXTRAIN_ENABLE_COMPUTE_OPTIMIZER.
  bool compute_optimizer = true;
  // Label sparsity (src/passes/sparsity.h), training graph only: a CrossEntropy/NLL loss with
  // ignore_index gathers the rows whose label is kept above the LM head (final LayerNorm, the
  // vocabulary MatMul, their gradients), so a step costs what its kept labels need. The loss and
  // the gradients are the dense graph's (mean over kept labels); batch and sequence may be
  // symbolic. Off by default: the generator cannot see the data's label density, and where every
  // label is kept it saves nothing and only adds ops (docs/DESIGN.md, "Label and padding sparsity").
  bool label_sparsity = false;
  // Artifacts that ONNX Runtime training's API (1.16-1.19, onnxruntime.training.api) loads and
  // trains as well as onnxtrain: ORT's graph conventions (gradient accumulation buffers,
  // lazy_reset_grad, com.microsoft gradient ops), its optimizer graph (AdamW or plain SGD only)
  // and its checkpoint format. Options ORT cannot run (other optimizers, clipping, mixed precision,
  // LoRA, the memory optimizer, label sparsity) are refused (docs/MIGRATING_FROM_ORT.md).
  bool ort_compatible = false;
};

struct ArtifactOptions {
  TrainingGraphOptions graphs;
  OptimizerConfig optimizer = OptimizerConfig::defaults(OptimizerType::kAdamW);
  std::string directory = ".";
  std::string prefix;
  bool nominal_checkpoint = false;  // shapes and dtypes only; fill parameters later from a buffer
  std::optional<LoraConfig> lora;   // train LoRA adapters only (onnxtrain/lora.h); the base stays in the graphs
  MemoryOptimizerOptions memory;    // recompute plans applied to the training graph
};

struct ArtifactPaths {
  std::string training_model, eval_model, optimizer_model, checkpoint;
};

// Loads the model at model_path (external data next to it) and writes the four artifacts. Throws
// onnxtrain::Error naming the problem: a parameter in both lists or not an initializer, a
// non-floating trainable parameter, an op with no gradient rule on the path to the loss, ...
ArtifactPaths generate_artifacts(const std::string& model_path, const ArtifactOptions& options);

}  // namespace onnxtrain

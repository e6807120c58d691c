// Training artifacts: from an inference model, the training graph (forward + loss + backward),
// the eval graph (forward + loss, inference-mode Dropout and BatchNorm) and the lists of
// trainable and frozen parameters. The optimizer graph and the checkpoint are written from these
// by generate_artifacts (src/training/generate_artifacts.cc).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/registry.h"
#include "training/losses.h"

namespace onnxtrain {

// TrainingGraphOptions is public: include/onnxtrain/artifacts.h.

struct TrainingGraphs {
  Model training;  // inputs: user inputs, targets, then parameters; outputs: loss, additional outputs,
                   // "<param>_grad" per trainable parameter, then "<buffer>_updated" per buffer
  Model eval;      // inputs: user inputs, targets, parameters; outputs: loss, additional outputs
  std::vector<std::string> trainable;          // in graph-input order
  std::vector<std::string> frozen;             // every other initializer that became an input
  std::vector<std::string> buffers;            // frozen values the training step updates (BN running stats)
  std::vector<std::string> user_inputs;        // model inputs and loss targets, in order
  std::string loss_output = "loss";
  std::vector<std::string> gradient_outputs;   // "<param>_grad", parallel to trainable
  std::vector<std::string> buffer_outputs;     // parallel to buffers
};

// Metadata keys build_training_graphs writes into the training and eval models (JSON arrays of
// value names), so tools find the model's own outputs, the loss's predictions and targets again.
inline constexpr const char* kMetaModelOutputs = "onnxtrain.model_outputs";
inline constexpr const char* kMetaLossInputs = "onnxtrain.loss_inputs";
inline constexpr const char* kMetaTargets = "onnxtrain.targets";
// "bf16" or "fp16" where the graphs run in mixed precision (absent for fp32); the checkpoint records the
// same under the property of that name, and Module refuses a checkpoint of another mode.
inline constexpr const char* kMetaMixedPrecision = "onnxtrain.mixed_precision";
// fp16: the name of the training graph's loss-scale input (an fp32 scalar Module feeds from the
// checkpoint's loss scaler, src/optim/loss_scaler.h); absent without loss scaling.
inline constexpr const char* kMetaLossScaleInput = "onnxtrain.loss_scale_input";
// The names recorded under key, or nullopt when the model has no such metadata (artifacts from
// another generator); malformed metadata throws.
std::optional<std::vector<std::string>> recorded_names(const Model& model, const std::string& key);

// Throws naming the parameter when a name is in both lists, in a list but not an initializer, or
// a trainable one is not floating point. Initializers in neither list are frozen.
TrainingGraphs build_training_graphs(const Model& inference, const TrainingGraphOptions& options);

// A buffer (an initializer the loss does not train, such as BatchNorm's running mean) and the value
// holding its new value after a training step, from the ops' declared state updates (OpSchema).
struct BufferUpdate {
  std::string buffer;
  std::string value;
  std::string node;               // the node that computes it
  StateUpdate update;             // which of its inputs and outputs (ops/registry.h)
};
// State inputs that are initializers, or graph inputs named in `bound_inputs` (values a host binds
// at every run, already inputs of the model it gave: TrainModule's stripped exports).
std::vector<BufferUpdate> buffer_updates(const Model& model, const std::set<std::string>& bound_inputs = {});

// The model with the Constant nodes whose outputs are named in `names` turned into initializers of
// the same name (paddle2onnx stores weights that way; spox inside If branches, whose constants move
// to the top level and are read from there). Throws naming the node when such a constant is not
// floating point. Names that are initializers already, or nothing's, are left alone.
Model promote_constant_parameters(const Model& model, const std::vector<std::string>& names);

// What "train everything" means: floating-point initializers of rank >= 1 and floating-point
// Constant node outputs of >= 2 elements (in subgraphs too), except the ops' declared state inputs (BatchNorm's running
// statistics, OpSchema::state_inputs) and values read only
// as shapes/scales (Resize, Upsample) or only by non-differentiable ops.
std::vector<std::string> all_parameters(const Model& model);

// The same graph with every op in its declared inference form (Dropout without training_mode,
// BatchNorm with running statistics) and the training-only values nothing else reads removed.
Model to_inference_mode(const Model& model);

}  // namespace onnxtrain

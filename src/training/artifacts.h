// Training artifacts: from an inference model, the training graph (forward + loss + backward),
// the eval graph (forward + loss, inference-mode Dropout and BatchNorm) and the lists of
// trainable and frozen parameters. The optimizer graph and the checkpoint are written from these
// by generate_artifacts (src/training/generate_artifacts.cc).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "training/losses.h"

namespace onnxtrain {

struct TrainingGraphOptions {
  std::vector<std::string> requires_grad;      // initializers to train
  std::vector<std::string> frozen_params;      // initializers kept fixed
  std::optional<LossType> loss;                // a built-in loss, or
  std::optional<Model> custom_loss;            // a loss model: inputs = model outputs + targets, one scalar output
  LossOptions loss_options;
  std::vector<std::string> loss_input_names;   // model outputs fed to the loss (default: the first output)
  std::vector<std::string> additional_output_names;
};

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

// Throws naming the parameter when a name is in both lists, in a list but not an initializer, or
// a trainable one is not floating point. Initializers in neither list are frozen.
TrainingGraphs build_training_graphs(const Model& inference, const TrainingGraphOptions& options);

// BatchNormalization nodes in training mode output new running statistics: (initializer, value
// holding its update) for each running mean and variance that is an initializer.
std::vector<std::pair<std::string, std::string>> batchnorm_buffer_updates(const Graph& graph);

// The same graph with Dropout and BatchNormalization switched to inference mode and training-only
// outputs (BatchNorm running statistics, Dropout masks) removed.
Model to_inference_mode(const Model& model);

}  // namespace onnxtrain

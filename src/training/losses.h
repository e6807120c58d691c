// Losses as graph blocks: each appends nodes computing a loss from a prediction and a target to
// a graph and returns the loss value's name. Artifact generation attaches them; anyone building a
// training graph by hand can too. Semantics follow torch.nn's losses of the same name.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

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

// Appends the loss of `prediction` against `target` (both existing values of `model`) and names
// its output `loss_name`. CrossEntropy takes logits [N, C, ...] and int64 class indices; NLL takes
// log-probabilities; BCE takes probabilities; KLDiv takes log-probabilities and probabilities (or
// log-probabilities with log_target).
std::string add_loss(Model& model, LossType type, const std::string& prediction, const std::string& target,
                     const std::string& loss_name, const LossOptions& options = {});

}  // namespace onnxtrain

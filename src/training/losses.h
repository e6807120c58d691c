// Losses as graph blocks: each appends nodes computing a loss from a prediction and a target to
// a graph and returns the loss value's name. Artifact generation attaches them; anyone building a
// training graph by hand can too. Semantics follow torch.nn's losses of the same name.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/artifacts.h"

namespace onnxtrain {

// LossType, LossOptions and their names are public: include/onnxtrain/artifacts.h.

// Appends the loss of `prediction` against `target` (both existing values of `model`) and names
// its output `loss_name`. CrossEntropy takes logits [N, C, ...] and int64 class indices; NLL takes
// log-probabilities; BCE takes probabilities; KLDiv takes log-probabilities and probabilities (or
// log-probabilities with log_target).
std::string add_loss(Model& model, LossType type, const std::string& prediction, const std::string& target,
                     const std::string& loss_name, const LossOptions& options = {});

}  // namespace onnxtrain

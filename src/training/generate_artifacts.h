// generate_artifacts: the offline step of on-device training, in C++ (no Python needed). Writes
// <prefix>training_model.onnx, <prefix>eval_model.onnx, <prefix>optimizer_model.onnx and
// <prefix>checkpoint into a directory.
#pragma once

#include <string>

#include "onnxtrain/artifacts.h"
#include "optim/optimizer.h"
#include "training/artifacts.h"

namespace onnxtrain {

// ArtifactOptions and ArtifactPaths are public (include/onnxtrain/artifacts.h), as is the overload
// that loads the model from a path.
ArtifactPaths generate_artifacts(const Model& model, const ArtifactOptions& options);

// Where generate_artifacts puts (and Module/Optimizer users find) the files of a directory.
ArtifactPaths artifact_paths(const std::string& directory, const std::string& prefix = "");

// The optimizer graph: one onnxtrain update node over every trainable parameter. Inputs:
// "step" (int64 scalar), parameters, "<p>_grad", then "<p>.<state>" per state tensor; the
// learning rate is the initializer "learning_rate".
Model build_optimizer_model(const TrainingGraphs& graphs, const optim::OptimizerConfig& config);

}  // namespace onnxtrain

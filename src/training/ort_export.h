// Artifacts for ONNX Runtime training (generate_artifacts with TrainingGraphOptions::ort_compatible):
// onnxtrain's graphs restated in the conventions of onnxruntime.training.api 1.16-1.19, so that ORT's
// Module and Optimizer load and train them (and onnxtrain's, through ort_artifacts.h). The reverse
// of ort_artifacts.h; DESIGN.md, "ONNX Runtime's training artifacts".
#pragma once

#include "onnxtrain/artifacts.h"
#include "training/artifacts.h"

namespace onnxtrain {

// Throws kInvalidArgument, naming the option, for what ORT's training API cannot run: an optimizer
// other than AdamW (torch's or transformers') or plain SGD, a learning rate other than ORT's
// starting 0.001, gradient clipping, mixed precision, LoRA, the memory optimizer, label sparsity.
void check_ort_compatible(const ArtifactOptions& options);

// In place: the training graph takes `<p>_grad.accumulation.buffer` per trainable parameter and
// `lazy_reset_grad`, accumulates each gradient there with com.microsoft.InPlaceAccumulatorV2 and
// outputs the loss (and additional outputs) and `<p>_grad.accumulation.out`; BatchNorm's running
// statistics are no outputs (ORT's Module would return them as the step's outputs). Every
// onnxtrain-domain op becomes ORT's op of the same meaning or a few ai.onnx ops; one without an
// ORT form is an error naming it.
void to_ort_training_graphs(TrainingGraphs& graphs);

// ORT's optimizer graph: com.microsoft.AdamWOptimizer or SGDOptimizerV2 over sequence inputs
// (learning_rate, step, params, gradients[, first_order_moments, second_order_moments]).
Model ort_optimizer_model(const OptimizerConfig& config);

}  // namespace onnxtrain

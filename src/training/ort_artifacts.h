// ONNX Runtime training's artifacts (onnxruntime.training.artifacts.generate_artifacts, 1.16-1.19)
// run by onnxtrain's Module and Optimizer unchanged on disk: these functions read ORT's graph
// conventions and restate them in onnxtrain's (DESIGN.md, "ONNX Runtime's training artifacts").
#pragma once

#include <optional>

#include "ir/graph.h"
#include "onnxtrain/optimizer_config.h"

namespace onnxtrain {

class CheckpointState;

// A training graph of ORT's generator: it has the `lazy_reset_grad` input and a
// `<parameter>_grad.accumulation.buffer` input per trainable parameter.
bool is_ort_training_model(const Model& model);

// In place, for Module: each InPlaceAccumulatorV2 that accumulates `<p>_grad` into its buffer
// input goes, and the gradient itself becomes the output `<p>_grad` (Module accumulates in the
// parameter, lazy_reset_grad overwrites: ORT's semantics); the buffer inputs and lazy_reset_grad
// go. BatchNormInternal's new running statistics become `<statistic>_updated` outputs, which
// Module writes back to the checkpoint (ORT computes and drops them: onnxruntime#19370). ORT's
// default checkpoint leaves the statistics initializers of each graph: they join `state` as frozen
// parameters (the graph's values, unless the state has them already) and become graph inputs, so
// training updates them and the eval graph reads the updated values.
// Every op must be one onnxtrain runs: an op it lacks is an error naming the op and ORT's generator.
void adapt_ort_training_model(Model& model, CheckpointState& state);

// In place, for Module: the eval graph of an ORT training graph. BatchNormalization in inference
// mode keeps the running-statistics outputs ORT's generator leaves on it (which ONNX, and ORT's
// own Module, refuse): unused, they go. Initializers that are checkpoint parameters (the running
// statistics adapt_ort_training_model moved there) become inputs bound to the checkpoint.
void adapt_ort_eval_model(Model& model, const CheckpointState& state);

// The update rule of an ORT optimizer graph (com.microsoft AdamWOptimizer or SGDOptimizerV2 over
// sequences of parameters, gradients and moments), or nullopt when the graph is not ORT's.
std::optional<OptimizerConfig> ort_optimizer_config(const Model& model);

}  // namespace onnxtrain

// Graph-to-graph rewrites (never called "optimizers": that word is for parameter updates).
#pragma once

#include "ir/graph.h"

namespace onnxtrain {

// Each returns how many nodes it removed or rewrote.
int fold_constants(Model& model);          // nodes over constants become initializers
int eliminate_dead_code(Graph& graph);     // nodes and initializers nothing reads
int eliminate_identities(Graph& graph);    // Identity, inference-mode Dropout
int eliminate_common_subexpressions(Graph& graph);

// Fusions (src/passes/fusions.cc).
int fuse_gelu(Graph& graph);               // both GELU forms (erf, tanh) -> onnxtrain.Gelu
int fuse_matmul(Graph& graph);             // Transpose -> MatMul -> Add(bias) -> onnxtrain.FusedMatMul
int fuse_conv_batchnorm(Graph& graph);     // Conv -> BatchNormalization (inference) -> Conv, folded weights
int fold_conv_scalar_affine(Graph& graph);  // Conv -> Mul/Div/Add/Sub by a scalar constant -> Conv, folded weights
int fuse_conv_hard_swish(Graph& graph);    // Conv -> y * Clip(y + 3, 0, 6) / 6 (or y * HardSigmoid(y)) -> FusedConv
int fuse_conv_residual_add(Graph& graph);  // Conv -> Add(., Z) [-> Relu] -> FusedConv(X, W, B, Z)
int fuse_conv_activation(Graph& graph);    // Conv -> Relu/LeakyRelu/Sigmoid/Tanh/Clip -> onnxtrain.FusedConv
int keep_channels_last(Graph& graph);     // values only fp32 convs and elementwise ops touch: channels last
// SoftmaxCrossEntropyLoss over the logits of a MatMul (through a row-keeping Reshape/Transpose) ->
// onnxtrain.LinearSoftmaxCrossEntropy: the logits are never materialised whole. Run on a forward
// graph before autodiff (its gradient reads the unit gradients the op computes in its forward),
// then drop_unread_unit_gradients on the gradient graph, so the op computes only what is read.
int fuse_linear_cross_entropy(Graph& graph);
// Clears the unit-gradient outputs of LinearSoftmaxCrossEntropy nodes that nothing reads (a gradient
// graph after the fusion above), so the op computes only the gradients its backward uses.
int drop_unread_unit_gradients(Graph& graph);

// Folding, identities, CSE, DCE to a fixed point: safe before autodiff when the values to
// differentiate are graph inputs (folding would turn ops over trainable initializers into constants).
void simplify_graph(Model& model);
// The standard pipeline for inference: simplify_graph, then every fusion, including those with no
// gradient rule (onnxtrain.FusedConv): run it on forward-only graphs or after autodiff, never before.
void optimize_for_inference(Model& model);
// The fusions that keep every initializer and graph value a caller can name (no folding, which would
// turn Transpose(W) of a trainable W into a new constant): run on a forward graph before autodiff so
// the backward gets the fused ops' gradients (GeluGrad, FusedMatMul) instead of the expanded ones.
// Returns how many nodes were fused.
int fuse_for_training(Model& model);

// The value of `value` when it is a constant: an initializer, or the output of a Constant node
// with a tensor `value` (training exports keep their constants as nodes: nothing folds them).
const Tensor* constant_tensor(const Graph& graph, const std::string& value);

// Replaces every read of `from` (node inputs, graph outputs excluded) with `to`.
void replace_uses(Graph& graph, const std::string& from, const std::string& to);

}  // namespace onnxtrain

// The compute optimizer: computes only the rows a model uses. A Gather that picks positions along
// an axis (a classification head's token 0, a decoder's last token) moves upstream past the ops
// that treat that axis row by row — elementwise ops (their other operands gathered alike, or left
// to broadcast), LayerNormalization over later axes, MatMul over a 2-D weight — so those ops,
// and their gradients, run on the gathered rows only.
//
//   BertClassifier: head(LN2(x1 + FFN(x1))[:, 0])  ->  head(LN2(x1[:, 0] + FFN(x1[:, 0])))
//
// Run on a forward graph before autodiff, with shapes inferred (it infers them itself). A value
// read by other nodes or returned by the graph is not moved past: it is computed in full anyway.
#pragma once

#include "ir/graph.h"

namespace onnxtrain {

// Returns how many ops now run on gathered rows.
int move_gathers_upstream(Model& model);

// Ops that map each element (or each row, along any axis) on its own, shared with the sparsity
// passes (src/passes/sparsity.h): one-input elementwise ops and GELU; two-input arithmetic.
bool is_row_wise_unary(const Node& node);
bool is_elementwise_binary(const Node& node);

}  // namespace onnxtrain

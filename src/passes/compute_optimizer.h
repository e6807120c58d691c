// The compute optimizer: computes only the rows a model uses. A selection of positions along some
// axes — a Gather (a classification head's token 0, a decoder's last token `x[:, -1]`) or a Slice
// with constant bounds (`x[:, :1]`, `x[:, -1:]`) — moves upstream past the ops that treat those
// axes row by row: elementwise ops (their other operands selected alike, or left to broadcast),
// LayerNormalization/Softmax over later axes, MatMul over a 2-D weight. Those ops, and their
// gradients, then run on the selected rows only.
//
//   BertClassifier: head(LN2(x1 + FFN(x1))[:, 0])  ->  head(LN2(x1[:, 0] + FFN(x1[:, 0])))
//
// Run on a forward graph before autodiff (TrainModule's graphs, on-device artifacts), with shapes
// inferred (it infers them itself). A value read by other nodes, returned by the graph or named in
// `keep` is not moved past: it is computed in full anyway.
#pragma once

#include <set>
#include <string>

#include "ir/graph.h"

namespace onnxtrain {

// Returns how many ops now run on selected rows.
int move_selections_upstream(Model& model, const std::set<std::string>& keep = {});

// Ops that map each element (or each row, along any axis) on its own, shared with the sparsity
// passes (src/passes/sparsity.h): one-input elementwise ops and GELU; two-input arithmetic.
bool is_row_wise_unary(const Node& node);
bool is_elementwise_binary(const Node& node);

}  // namespace onnxtrain

// Input-sparsity passes: rows that cannot change the loss are not computed, forward or backward.
//
// Label sparsity. A cross-entropy loss with ignore_index (SoftmaxCrossEntropyLoss, or
// NegativeLogLikelihoodLoss over a LogSoftmax) takes only the rows whose label is kept, gathered
// as high up as the ops treat rows one by one (the vocabulary projection, the final LayerNorm,
// biases, a LogSoftmax, reshapes that merge or split leading dims):
//
//   SCE(Reshape(MatMul(LN(x), W), [-1, V]), y)
//     -> SCE(MatMul(LN(Gather(Flatten(x), kept)), W), Gather(y, kept))   kept = NonZero(y != ignore_index)
//
// Where the rows come from a region of row-wise ops with branches (a decoder's last block: the
// residual Adds, the second LayerNorm, the MLP, the attention's output projection), the whole
// region runs on the kept rows, each value entering it gathered once (the residual stream before
// the block, the attention's context); attention itself needs every row and stays whole.
//
// The loss is the same number: 'mean' divides by the (weighted) count of kept labels either way,
// 'sum' adds the same terms; 'none' (one loss per row) is left alone. Exact for any data; it pays
// when few labels are kept, which is why its users switch it on by the measured label density
// (TrainModule) or by asking for it (generate_artifacts' label_sparsity). A loss over [N, C, d...]
// scores made by Transpose(x, [0, r-1, 1, ..., r-2]) (an LM's logits in the layout the artifacts'
// CrossEntropy takes) first reads SCE(Reshape(x, [-1, C]), Reshape(y, [-1])): the same terms, no
// Transpose. The labels' length may be symbolic (batch, sequence).
//
// Padding sparsity. After an embedding lookup Gather(W, ids) whose ids hold a padding index, the
// ops that treat tokens one by one (elementwise, LayerNorm over the hidden dims, MatMul with a
// weight, Softmax over the hidden dims) run on the K non-padded tokens only, as [K, hidden...];
// before any other op (attention's reshapes and batched MatMuls, a loss) the full [ids..., hidden...]
// shape is restored, with zeros at the positions not kept:
//
//   restore(c) = Reshape(GatherGrad(c, [N, hidden...], kept), [ids..., hidden...])   (a scatter into zeros)
//   strip(x)   = Gather(Reshape(x, [N, hidden...]), kept),   kept = the kept positions, [K]
//
// (GatherGrad and Gather are each other's gradient, so the backward of a restore is a K-row Gather.)
// That is the dense computation exactly at the kept positions; at padded positions the values
// differ (zeros, or rows computed from the padding embedding for the few padded positions the
// rounding below keeps, instead of what the dense graph computes there). So the result equals the dense one
// when the model's loss does not depend on padded positions: its attention masks padded keys (or is
// causal, with padding at the end) and its loss ignores the padded positions. That is a property of
// the model the pass cannot check, so it runs only where its user asks for it.
// The ids' shape and the hidden dims must be static (TrainModule exports are); one padding region
// per graph (the first embedding lookup named, and others on the same ids).
//
// Both passes round the number of kept rows up to a multiple of 1/16 of all rows (with rows that
// are ignored or padding, whose values nothing reads and whose gradients are zeros): the executor
// records a plan per distinct input shape, so a schema gets at most 16, not one per batch.
// With a symbolic length the step (ceil(n / 16), at least 1) is computed from the shape at run time.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

// A graph input that decides how sparse a pass's rows are: the labels of a loss with ignore_index
// (traced back through reshapes and casts), or the ids of an embedding lookup.
struct LabelInput {
  std::string input;     // graph input
  int64_t ignore_index;  // the loss's
};
struct EmbeddingInput {
  std::string input;   // graph input holding the ids
  std::string weight;  // the embedding table (an initializer or a graph input)
};
struct SparsityInputs {
  std::vector<LabelInput> labels;
  std::vector<EmbeddingInput> embeddings;
};

// What a host measures the density of before choosing the passes (TrainModule's first batch).
SparsityInputs find_sparsity_inputs(const Model& model);

// Label sparsity on a forward graph (before autodiff); returns how many losses now take only the
// kept rows.
int compute_kept_labels_only(Model& model);

// Padding sparsity on a forward graph (before autodiff) for the embedding tables named, each with
// its padding index; returns how many ops now run on the kept tokens only. Throws when a named
// table is not the data of any Gather.
int strip_padding(Model& model, const std::map<std::string, int64_t>& padding_index_by_table);

}  // namespace onnxtrain

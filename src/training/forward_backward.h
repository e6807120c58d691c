// Forward and backward as two graphs, for a host framework's autograd (onnxtrain.torch.TrainModule).
//
//   ForwardBackwardOptions o;
//   o.bind = {"fc.weight", "fc.bias"};        // host-owned parameters: graph inputs, read in place
//   o.wrt = {"fc.weight", "fc.bias"};
//   ForwardBackwardGraphs fb = build_forward_backward(exported, o);
//   forward:  feeds -> model outputs, buffer updates, then the saved values
//   backward: upstream gradients ("seeds"), saved values, feeds -> "<wrt>_grad"
//
// The host keeps the saved values between the two calls (torch: save_for_backward), so several
// forwards may be in flight before their backwards, as autograd allows. Nodes that depend on an
// upstream gradient form the backward; every other node runs in the forward, which also outputs
// each of its values the backward reads. With `memory` (the memory optimizer, src/passes/
// memory_optimizer.h), the backward recomputes the stashed values the plan names from fewer saved ones.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/memory_optimizer.h"

namespace onnxtrain {

struct ForwardBackwardOptions {
  std::vector<std::string> bind;  // initializers owned by the host (parameters, buffers): become inputs
  std::vector<std::string> wrt;   // model inputs or bound initializers to differentiate; empty: forward only
  MemoryOptimizerOptions memory;  // recompute plans (memory for time); level 0 and no config: none
  bool optimize = true;           // simplify before autodiff, every fusion on the built graph
  bool compute_optimizer = true;  // move Gathers/Slices of a few rows upstream (src/passes/compute_optimizer.h)
  // Input sparsity (src/passes/sparsity.h): losses with ignore_index take the kept rows only; the
  // embedding tables named (bound initializers) drop the tokens at their padding index.
  bool label_sparsity = false;
  std::map<std::string, int64_t> padding_index;
  // torch's BatchNorm updates running_var with the unbiased batch variance (ONNX: the population
  // variance): n / (n - 1) times the ONNX statistic's batch term.
  bool unbiased_running_var = true;
  // "bf16" / "fp16": convert_to_mixed_precision (src/passes/mixed_precision.h) before autodiff;
  // host values and graph outputs keep their dtypes. "" for none.
  std::string mixed_precision;
};

struct ForwardBackwardGraphs {
  Model forward;   // inputs: forward_feeds; outputs: `outputs`, `buffer_outputs`, then saved values
  Model backward;  // inputs: seeds, saved, then backward_feeds; outputs: gradients (empty: forward only)
  std::vector<std::string> inputs;          // model inputs, then bound initializers: the host's feed order
  std::vector<std::string> forward_feeds;   // the part of `inputs` the forward reads, in that order
  std::vector<std::string> backward_feeds;  // the part of `inputs` the backward reads, in that order
  std::vector<std::string> outputs;         // the model's outputs
  std::vector<std::string> seeded_outputs;  // outputs that take an upstream gradient
  std::vector<std::string> seeds;           // the backward inputs carrying them, parallel
  std::vector<std::string> buffers;         // bound initializers the forward updates (BatchNorm statistics)
  std::vector<std::string> buffer_outputs;  // forward outputs holding their new values, parallel
  std::vector<std::string> saved;           // forward outputs the backward reads (may repeat `outputs`)
  std::vector<std::string> gradients;       // backward outputs, parallel to wrt
  MemoryPlan memory_plan;                   // what the memory optimizer found and applied
  int kept_label_losses = 0;                // losses label sparsity rewrote to take the kept rows only
};

// Throws naming the value when a bound name is not an initializer, a wrt name is neither a model
// input nor bound, or an op on the path has no gradient rule.
ForwardBackwardGraphs build_forward_backward(const Model& model, const ForwardBackwardOptions& options);

// The bytes the host holds for the saved values between forward and backward (static shapes
// only), each buffer once: a saved value that is a view (Reshape, Squeeze, Unsqueeze, Flatten,
// Identity) of another forward value shares that value's buffer, as the executor returns it.
int64_t saved_bytes(const ForwardBackwardGraphs& graphs);

}  // namespace onnxtrain

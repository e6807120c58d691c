// The memory optimizer: trades compute for memory in a training graph (forward and backward in one
// graph) by recomputing stashed activations in the backward instead of keeping them alive.
//
// A stashed activation is a value the forward computes and the backward reads: the executor keeps
// it from its producer to its last backward reader. For each one the pass finds the subgraph that
// could recompute it from values that stay alive anyway (graph inputs, initializers, other stashed
// values): elementwise ops, reshape/transpose/cast/slice/gather, Dropout (re-applying its saved
// mask), Gelu; at the higher probe level also MatMul, LayerNormalization and Softmax. Subgraphs
// are clustered by their op pattern ("Reshape+Transpose+"), and the plan table reports, per
// cluster, how often it occurs, the bytes one occurrence saves (a formula of the symbolic dims and
// a number for the current shapes) and the extra FLOPs of recomputing it.
//
// Applying a plan copies the chosen forward nodes, rewires the backward to the copies, and places
// each copy just before its first reader in the backward, so the executor's liveness frees the
// forward value after its last forward reader and the copy lives only between its recomputation
// and its last use.
//
//   MemoryOptimizerOptions o;
//   o.level = 1;                                    // layer-wise recompute
//   MemoryPlan plan = optimize_memory(training_model, {"loss"}, o);
//   std::cout << plan_table(plan);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/memory_options.h"

namespace onnxtrain {

struct RecomputeCluster {
  std::string name;                    // the op pattern, "Gelu+" — the key the config names
  std::vector<std::string> stashed;    // the stashed values of its occurrences, in forward order
  std::string bytes_formula;           // bytes one occurrence saves, in the symbolic dims
  int64_t bytes_saved = -1;            // the same for the current shapes (-1: not static)
  int64_t compromised_bytes_saved = -1;  // strategy 2 (cheap ops only); -1: no such plan
  int64_t extra_flops = 0;             // recomputing one occurrence (current shapes)
  int applied_strategy = 0;            // what the options applied: 0 none, 1 recompute, 2 compromised
  int applied_count = 0;               // occurrences applied
};

// A torch.utils.checkpoint call in a module TrainModule exported: the values entering it and the
// values it returns. Everything the region computes between them is recomputed in the backward
// from its inputs, as torch's checkpoint does (and for Dropout from its saved mask, the same
// numbers torch's replayed RNG gives).
struct CheckpointRegion {
  std::vector<std::string> inputs, outputs;
};

// TrainModule's export marks each value entering or leaving a checkpointed call with this op
// (python/onnxtrain/torch/train_module.py: attributes `region`, the call's number, and `end`,
// 0 entering / 1 leaving). It never runs: take_checkpoint_regions removes it.
inline constexpr const char* kCheckpointBoundaryDomain = "onnxtrain.torch";
inline constexpr const char* kCheckpointBoundaryOp = "CheckpointBoundary";

// Removes the boundary marks from `graph` (a mark's readers read its input) and returns the
// regions, in order of their numbers.
std::vector<CheckpointRegion> take_checkpoint_regions(Graph& graph);

struct MemoryPlan {
  std::vector<RecomputeCluster> clusters;  // every cluster found, in forward order of first occurrence
  int level = 0;
  int layer_boundaries = 0;                // residual-stream values level 1 keeps (checkpoints)
  // Level 1's candidates: the stashed values inside the layers that a recompute subgraph can
  // replace, ranked by bytes saved per unit of cost (best first), and which of them it recomputes.
  struct LayerwiseCandidate {
    std::string value;
    int64_t bytes = 0;      // saved, less what its recomputation newly keeps (nominal shapes when not static)
    int64_t cost = 0;       // its subgraph's FLOPs with every other stashed value kept; data movement 1/element
    bool recomputed = false;
  };
  std::vector<LayerwiseCandidate> layerwise;
  int checkpoint_regions = 0;              // torch.utils.checkpoint regions recomputed
  int64_t stashed_bytes_before = 0;        // all stashed activations (current shapes) but those the
                                           // backward reads only the shape of
  int64_t stashed_bytes_after = 0;         // those the applied plan keeps, new boundaries included
  int64_t extra_flops = 0;                 // of every recomputed node
  std::vector<std::string> recompute_nodes;  // names of the copies added to the graph
  std::vector<std::string> notes;          // plans reported and not applied, with why
};

// Analyses without changing the model. `dims` binds symbolic dims for the byte numbers (dims the
// model states statically need no binding).
MemoryPlan analyze_memory(const Model& model, const std::vector<std::string>& forward_outputs,
                          const MemoryOptimizerOptions& options, const std::map<std::string, int64_t>& dims = {});

// Analyses and applies the plan the options ask for, and recomputes the checkpoint regions named
// (whatever the level). Throws (listing the model's clusters) on a level out of range, a malformed
// config entry or one naming no cluster; a plan that would not save memory is left out and said so
// in `notes`, as is a region whose boundary values an earlier pass rewrote.
MemoryPlan optimize_memory(Model& model, const std::vector<std::string>& forward_outputs,
                           const MemoryOptimizerOptions& options, const std::map<std::string, int64_t>& dims = {},
                           const std::vector<CheckpointRegion>& regions = {});

// The plan as a table: cluster, occurrences, bytes saved per occurrence (formula and number),
// extra FLOPs, what is applied, and a summary line.
std::string plan_table(const MemoryPlan& plan);

// Metadata key under which optimize_memory records the applied plan's table in the model.
inline constexpr const char* kMetaMemoryPlan = "onnxtrain.memory_plan";

}  // namespace onnxtrain

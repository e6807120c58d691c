// Settings of the memory optimizer (recompute of stashed activations), one struct shared by every
// front end: ArtifactOptions (C++), generate_artifacts(memory_opt_level=, memory_opt_config=)
// (Python), `onnxtrain artifacts --memory-opt-level/--memory-opt-config` (CLI) and TrainModule's
// ONNXTRAIN_MEMORY_OPT_LEVEL / ONNXTRAIN_MEMORY_OPT_CONFIG. The pass (src/passes/memory_optimizer.h)
// parses and validates them once.
#pragma once

#include <string>

namespace onnxtrain {

struct MemoryOptimizerOptions {
  // 0: only what `config` asks; 1: layer-wise recompute (gradient checkpointing at the residual
  // boundaries of transformer layers: the values inside them that save the most bytes per FLOP of
  // recomputation, until the stashed bytes are down by 45%); 2: level 1 plus the compromised plans
  // of the values outside the layers that save memory.
  int level = 0;
  // "cluster:strategy:count[,cluster:strategy:count...]": strategy 0 none, 1 recompute,
  // 2 compromised (recompute the cheap ops only); count -1 for every occurrence. Cluster names are
  // the op patterns the plan table prints (e.g. "Gelu+", "FusedMatMul+").
  std::string config;
};

}  // namespace onnxtrain

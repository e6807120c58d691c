// Module, Optimizer and the LR schedulers are public (include/onnxtrain/module.h). This header is
// for callers inside the library: it makes Model complete, so a Module can be built from graphs in
// memory, and brings in the update-rule types (src/optim) the implementation uses.
#pragma once

#include "ir/graph.h"
#include "onnxtrain/module.h"
#include "optim/optimizer.h"
#include "runtime/compiled_model.h"

namespace onnxtrain {

class Executor;

// The graphs of a Module as loaded from files: pre-compiled (with plans) or ONNX.
struct CompiledGraphs {
  CompiledModel training;
  std::optional<CompiledModel> eval;
};

// compile_artifacts (src/training/compile.cc) reads the executors a Module records its plans in.
struct CompileAccess {
  static const Executor& executor(const Module& module, bool training);
};

}  // namespace onnxtrain

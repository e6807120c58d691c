// Module, Optimizer and the LR schedulers are public (include/onnxtrain/module.h). This header is
// for callers inside the library: it makes Model complete, so a Module can be built from graphs in
// memory, and brings in the update-rule types (src/optim) the implementation uses.
#pragma once

#include "ir/graph.h"
#include "onnxtrain/module.h"
#include "optim/optimizer.h"

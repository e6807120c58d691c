// Reverse-mode automatic differentiation as a graph-to-graph transformation.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

struct GradientGraphInfo {
  std::vector<std::string> gradient_outputs;  // "<wrt>_grad", in the order of wrt
  std::vector<std::string> seed_inputs;       // "<output>_grad" inputs for non-scalar outputs
  std::vector<std::string> seeded_outputs;    // the outputs those seeds belong to, parallel
};

struct GradientGraphOptions {
  // A one-element output is seeded with 1 (a loss). False: it gets an "<output>_grad" input like
  // any other output, for hosts that pass their own upstream gradient (TrainModule).
  bool seed_scalars_with_one = true;
  // False: an output that does not depend on `wrt` is an error. True: it gets no seed (integer
  // outputs, outputs computed from constants), and seeded_outputs says which outputs got one.
  bool skip_independent_outputs = false;
};

// Returns one model holding forward and backward. Only nodes on a path from `wrt` to `outputs`
// get gradients; fan-out gradients are summed; broadcasting is reduced by sum_to. A scalar output
// (one element) is seeded with 1; any other output gets an upstream-gradient input
// "<output>_grad". The model's outputs are the forward outputs followed by "<wrt>_grad".
// The forward is differentiated as given: callers that want the fused ops' gradient kernels run
// fuse_for_training (src/passes) first. Initializers and graph inputs and outputs keep their names.
//
// Throws, naming op and node, when an op on the path has no gradient rule; throws when a `wrt`
// value is not floating point or not in the graph.
Model build_gradient_graph(const Model& forward, const std::vector<std::string>& wrt,
                           const std::vector<std::string>& outputs, GradientGraphInfo* info = nullptr,
                           const GradientGraphOptions& options = {});

}  // namespace onnxtrain

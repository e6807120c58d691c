// How control-flow kernels (If, Loop, Scan) run their subgraphs. The runtime implements
// SubgraphHost on the context it hands those kernels: it compiles each subgraph once into an
// executor of its own (planned per shape signature like any graph) and binds the values the
// subgraph reads from enclosing scopes, so ops never include runtime/.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ops/kernel.h"

namespace onnxtrain {

class SubgraphHost {
 public:
  virtual ~SubgraphHost() = default;
  // Runs the graph attribute `attribute` of the current node on its formal inputs, in the order
  // the subgraph declares them; returns its outputs in order, owned by the caller.
  virtual std::vector<Tensor> run_subgraph(const std::string& attribute, const std::vector<Tensor>& inputs) = 0;
};

// The host behind a kernel context; throws naming the node when there is none (a control-flow node
// run outside an executor, e.g. by constant folding).
SubgraphHost& subgraph_host(KernelContext& ctx);

// Differentiates a subgraph for the gradient rules of control-flow ops; autodiff installs it (ops
// never include autodiff/). From a subgraph with no formal inputs that reads outer values, the
// upstream gradient of each of its outputs (an outer value's name, "" for none) and the outer
// values to differentiate, it makes a graph with no formal inputs that reads the same outer values
// and the upstream gradients by name and outputs one gradient per `wrt` value, in order.
// `outer_info` gives the dtype and shape of an outer value.
using SubgraphDifferentiator = std::function<Graph(
    const Graph& subgraph, const std::vector<std::string>& output_grads, const std::vector<std::string>& wrt,
    const std::function<ValueInfo(const std::string&)>& outer_info, const std::map<std::string, int64_t>& opsets)>;
void set_subgraph_differentiator(SubgraphDifferentiator fn);

// Gradient rules of nodes with subgraphs address the values those subgraphs read from outside as
// inputs too: GradientBuilder index num_inputs() + k is outer_scope_reads(node)[k] (ir/subgraph.h).

}  // namespace onnxtrain

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
  // the subgraph declares them; returns its outputs in order, owned by the caller. Values may be
  // sequences or empty optionals where the subgraph's types say so.
  virtual std::vector<Value> run_subgraph(const std::string& attribute, const std::vector<Value>& inputs) = 0;
};

// The host behind a kernel context; throws naming the node when there is none (a control-flow node
// run outside an executor, e.g. by constant folding).
SubgraphHost& subgraph_host(KernelContext& ctx);

// Differentiates a subgraph for the gradient rules of control-flow ops; autodiff installs it (ops
// never include autodiff/). `seeded[i]` says which subgraph outputs receive an upstream gradient;
// `wrt` names formal inputs of the subgraph or outer values it reads; `outer_info` gives the dtype
// and shape of an outer value. The result's graph has no inputs: it reads the subgraph's formal
// inputs, the seeds and outer values by name (the caller defines the first two) and outputs the
// gradients.
struct SubgraphGradient {
  Graph graph;
  std::vector<std::string> seeds;  // per subgraph output: the value its upstream gradient is read from, or ""
  std::vector<std::string> grads;  // per wrt: its gradient (zeros when the seeded outputs do not depend on it)
};
using SubgraphDifferentiator = std::function<SubgraphGradient(
    const Graph& subgraph, const std::vector<bool>& seeded, const std::vector<std::string>& wrt,
    const std::function<ValueInfo(const std::string&)>& outer_info, const std::map<std::string, int64_t>& opsets)>;
void set_subgraph_differentiator(SubgraphDifferentiator fn);

// Gradient rules of nodes with subgraphs address the values those subgraphs read from outside as
// inputs too: GradientBuilder index num_inputs() + k is outer_scope_reads(node)[k] (ir/subgraph.h).

}  // namespace onnxtrain

// Subgraphs (If's branches, Loop's and Scan's bodies) may read values of the scopes around them by
// name. These helpers make those reads visible to code that walks one graph: ordering, liveness,
// renaming, the executor's bindings and autodiff's dependency tracking.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

bool has_subgraphs(const Node& node);
// The names a graph reads that it does not define itself (inputs, initializers, node outputs),
// nested subgraphs included, in first-read order.
std::vector<std::string> free_values(const Graph& graph);
// The values of the enclosing scope a node's subgraphs read, in first-read order.
std::vector<std::string> outer_scope_reads(const Node& node);
// Renames reads of `from` to `to` inside a node's subgraphs, except where a subgraph defines its
// own `from` (shadowing). Subgraphs are copied before the change: models share them.
void rename_outer_reads(Node& node, const std::string& from, const std::string& to);

}  // namespace onnxtrain

// Whether two graphs are the same program, whatever their shape annotations say: what tells that
// two traces of one PyTorch module at different input sizes baked none of those sizes in
// (TrainModule's symbolic batch and sequence dims).
#pragma once

#include <set>
#include <string>

#include "ir/graph.h"

namespace onnxtrain {

// Where two graphs differ as programs: their nodes (op, domain, inputs, outputs, attributes and
// subgraphs alike; node names aside, and the names of the values nodes make, which are matched by
// position), initializers (names and values), inputs (names, dtypes,
// ranks, and each dim that both fix or both name) and outputs (names, dtypes). Other shape annotations (value_info,
// the outputs' shapes) are left out: an exporter writes there what its own inference found. ""
// when the programs are the same, else the first difference, naming the node or value. Initializers
// named in `bound` are compared by dtype and shape alone: their values come from the host at each
// run (a module's parameters, which its optimizer changes between two exports).
std::string program_difference(const Graph& a, const Graph& b, const std::set<std::string>& bound = {});

}  // namespace onnxtrain

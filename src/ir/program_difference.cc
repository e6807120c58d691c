#include "ir/program_difference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>

namespace onnxtrain {

namespace {

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// a's names of the values nodes make (and of subgraph inputs) -> b's, matched by position.
using Renames = std::unordered_map<std::string, std::string>;

std::string difference(const Graph& a, const Graph& b, const std::set<std::string>& bound, Renames made,
                       bool subgraph);

// `made` and `bound`: the enclosing graphs', which a subgraph's nodes read by name.
bool same_attribute(const Attribute& a, const Attribute& b, const std::set<std::string>& bound, const Renames& made) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Attribute::Kind::kFloat: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    case Attribute::Kind::kInt: return a.i == b.i;
    case Attribute::Kind::kString: case Attribute::Kind::kTypeProto: return a.s == b.s;
    case Attribute::Kind::kTensor: return same_tensor(a.t, b.t);
    case Attribute::Kind::kGraph: return (!a.g && !b.g) || (a.g && b.g && difference(*a.g, *b.g, bound, made, true).empty());
    case Attribute::Kind::kFloats: return a.floats == b.floats;
    case Attribute::Kind::kInts: return a.ints == b.ints;
    case Attribute::Kind::kStrings: return a.strings == b.strings;
    case Attribute::Kind::kTensors:
      return a.tensors.size() == b.tensors.size() &&
             std::equal(a.tensors.begin(), a.tensors.end(), b.tensors.begin(), same_tensor);
  }
  return false;
}

std::string value_str(const NamedValue& v, bool with_shape) {
  std::string s = v.name + ": " + dtype_name(v.info.dtype);
  if (!with_shape) return s;
  if (!v.info.shape) return s + "[?]";
  s += "[";
  for (size_t d = 0; d < v.info.shape->size(); ++d) {
    const std::string& param = d < v.info.dim_params.size() ? v.info.dim_params[d] : std::string();
    s += (d ? "," : "") + (param.empty() ? std::to_string((*v.info.shape)[d]) : param);
  }
  return s + "]";
}

// Inputs agree in names, dtypes and ranks, and in each dim that both give a size or both name:
// a dim one export fixes and the other names (the same module exported with and without symbolic
// dims) is no difference of the program.
// A subgraph's inputs (a Loop body's iteration number, condition and carried values) are named by
// the exporter's counter: `by_name` false compares them by position.
bool same_inputs(const std::vector<NamedValue>& a, const std::vector<NamedValue>& b, bool by_name) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const ValueInfo &x = a[i].info, &y = b[i].info;
    if ((by_name && a[i].name != b[i].name) || x.dtype != y.dtype || x.shape.has_value() != y.shape.has_value())
      return false;
    if (!x.shape) continue;
    if (x.shape->size() != y.shape->size()) return false;
    for (size_t d = 0; d < x.shape->size(); ++d) {
      const std::string& p = d < x.dim_params.size() ? x.dim_params[d] : std::string();
      const std::string& q = d < y.dim_params.size() ? y.dim_params[d] : std::string();
      const int64_t m = (*x.shape)[d], n = (*y.shape)[d];
      if ((m >= 0 && n >= 0 && m != n) || (!p.empty() && !q.empty() && p != q)) return false;
    }
  }
  return true;
}

std::string node_line(const Node& n) {
  Graph one;
  one.nodes.push_back(n);
  std::string s = to_string(one);
  return s.substr(s.find('\n') + 1, s.rfind('\n') - s.find('\n') - 1);
}

std::string difference(const Graph& a, const Graph& b, const std::set<std::string>& bound, Renames made,
                       bool subgraph) {
  auto values = [](const std::vector<NamedValue>& list, bool with_shape) {
    std::vector<std::string> out;
    for (const auto& v : list) out.push_back(value_str(v, with_shape));
    return out;
  };
  auto joined = [](const std::vector<std::string>& list) {
    std::string s;
    for (const auto& x : list) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!same_inputs(a.inputs, b.inputs, !subgraph))
    return "inputs (" + joined(values(a.inputs, true)) + ") against (" + joined(values(b.inputs, true)) + ")";
  if (a.outputs.size() != b.outputs.size())
    return "outputs (" + joined(values(a.outputs, false)) + ") against (" + joined(values(b.outputs, false)) + ")";
  for (auto i = a.initializers.begin(), j = b.initializers.begin();; ++i, ++j) {
    if (i == a.initializers.end() || j == b.initializers.end()) {
      if (i != a.initializers.end() || j != b.initializers.end())
        return "initializer '" + (i != a.initializers.end() ? i->first : j->first) + "' is in one graph only";
      break;
    }
    if (i->first != j->first) return "initializer '" + std::min(i->first, j->first) + "' is in one graph only";
    const bool same = bound.count(i->first) ? i->second.dtype() == j->second.dtype() && i->second.shape() == j->second.shape()
                                            : same_tensor(i->second, j->second);
    if (!same)
      return "initializer '" + i->first + "': " + dtype_name(i->second.dtype()) + shape_str(i->second.shape()) +
             " against " + dtype_name(j->second.dtype()) + shape_str(j->second.shape()) + " or other values";
  }
  // Values the nodes make are matched by position (a's name -> b's): an exporter numbers them
  // from a counter that other traces in the process have moved on. A subgraph sees its enclosing
  // graphs' values (`made` on entry) and its own inputs.
  if (subgraph)
    for (size_t i = 0; i < a.inputs.size(); ++i) made[a.inputs[i].name] = b.inputs[i].name;
  auto same_value = [&](const std::string& x, const std::string& y) {
    auto it = made.find(x);
    return it != made.end() ? it->second == y : x == y;  // inputs and initializers by name
  };
  for (size_t k = 0; k < std::min(a.nodes.size(), b.nodes.size()); ++k) {
    const Node &x = a.nodes[k], &y = b.nodes[k];
    bool same = x.op_type == y.op_type && x.domain == y.domain && x.inputs.size() == y.inputs.size() &&
                x.outputs.size() == y.outputs.size() && x.attributes.size() == y.attributes.size();
    for (size_t i = 0; same && i < x.inputs.size(); ++i) same = same_value(x.inputs[i], y.inputs[i]);
    for (auto i = x.attributes.begin(), j = y.attributes.begin(); same && i != x.attributes.end(); ++i, ++j)
      same = i->first == j->first && same_attribute(i->second, j->second, bound, made);
    if (!same) {
      std::string where = x.context();
      where = where.substr(0, where.size() - 2);  // "[Op] node 'name'" without its ": "
      return where + " (node " + std::to_string(k) + "): " + node_line(x) + " against " + node_line(y) +
             (x.op_type == y.op_type && x.inputs.size() == y.inputs.size() ? " (attribute values or inputs differ)" : "");
    }
    for (size_t i = 0; i < x.outputs.size(); ++i) made[x.outputs[i]] = y.outputs[i];
  }
  if (a.nodes.size() != b.nodes.size())
    return std::to_string(a.nodes.size()) + " nodes against " + std::to_string(b.nodes.size());
  for (size_t i = 0; i < a.outputs.size(); ++i)
    if (!same_value(a.outputs[i].name, b.outputs[i].name) || a.outputs[i].info.dtype != b.outputs[i].info.dtype)
      return "output " + std::to_string(i) + ": " + value_str(a.outputs[i], false) + " against " +
             value_str(b.outputs[i], false);
  return "";
}

}  // namespace

std::string program_difference(const Graph& a, const Graph& b, const std::set<std::string>& bound) {
  return difference(a, b, bound, {}, false);
}

}  // namespace onnxtrain

#include "ir/program_difference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace onnxtrain {

namespace {

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

bool same_attribute(const Attribute& a, const Attribute& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Attribute::Kind::kFloat: return a.f == b.f || (std::isnan(a.f) && std::isnan(b.f));
    case Attribute::Kind::kInt: return a.i == b.i;
    case Attribute::Kind::kString: case Attribute::Kind::kTypeProto: return a.s == b.s;
    case Attribute::Kind::kTensor: return same_tensor(a.t, b.t);
    case Attribute::Kind::kGraph: return (!a.g && !b.g) || (a.g && b.g && program_difference(*a.g, *b.g).empty());
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

std::string node_line(const Node& n) {
  Graph one;
  one.nodes.push_back(n);
  std::string s = to_string(one);
  return s.substr(s.find('\n') + 1, s.rfind('\n') - s.find('\n') - 1);
}

}  // namespace

std::string program_difference(const Graph& a, const Graph& b, const std::set<std::string>& bound) {
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
  if (values(a.inputs, true) != values(b.inputs, true))
    return "inputs (" + joined(values(a.inputs, true)) + ") against (" + joined(values(b.inputs, true)) + ")";
  if (values(a.outputs, false) != values(b.outputs, false))
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
  for (size_t k = 0; k < std::min(a.nodes.size(), b.nodes.size()); ++k) {
    const Node &x = a.nodes[k], &y = b.nodes[k];
    bool same = x.op_type == y.op_type && x.domain == y.domain && x.inputs == y.inputs && x.outputs == y.outputs &&
                x.attributes.size() == y.attributes.size();
    for (auto i = x.attributes.begin(), j = y.attributes.begin(); same && i != x.attributes.end(); ++i, ++j)
      same = i->first == j->first && same_attribute(i->second, j->second);
    if (!same) {
      std::string where = x.context();
      where = where.substr(0, where.size() - 2);  // "[Op] node 'name'" without its ": "
      return where + " (node " + std::to_string(k) + "): " + node_line(x) + " against " + node_line(y) +
             (x.op_type == y.op_type && x.inputs == y.inputs ? " (attribute values differ)" : "");
    }
  }
  if (a.nodes.size() != b.nodes.size())
    return std::to_string(a.nodes.size()) + " nodes against " + std::to_string(b.nodes.size());
  return "";
}

}  // namespace onnxtrain

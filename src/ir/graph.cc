#include "ir/graph.h"

#include <fnmatch.h>

#include <algorithm>
#include <queue>
#include <sstream>
#include <unordered_set>

#include "ir/subgraph.h"

namespace onnxtrain {

const char* attribute_kind_name(Attribute::Kind kind) {
  switch (kind) {
    case Attribute::Kind::kFloat: return "float";
    case Attribute::Kind::kInt: return "int";
    case Attribute::Kind::kString: return "string";
    case Attribute::Kind::kTensor: return "tensor";
    case Attribute::Kind::kGraph: return "graph";
    case Attribute::Kind::kFloats: return "floats";
    case Attribute::Kind::kInts: return "ints";
    case Attribute::Kind::kStrings: return "strings";
    case Attribute::Kind::kTensors: return "tensors";
    case Attribute::Kind::kTypeProto: return "type";
  }
  return "?";
}

std::string Node::context() const { return "[" + op_type + "] node '" + name + "': "; }

const Attribute* Node::attr(const std::string& key) const {
  auto it = attributes.find(key);
  return it == attributes.end() ? nullptr : &it->second;
}

namespace {
const Attribute* typed(const Node& n, const std::string& key, Attribute::Kind kind) {
  const Attribute* a = n.attr(key);
  if (a && a->kind != kind)
    OT_THROW(kInvalidModel, n.context(), "attribute '", key, "' should be ", attribute_kind_name(kind),
             ", got ", attribute_kind_name(a->kind));
  return a;
}
}  // namespace

int64_t Node::attr_int(const std::string& key, int64_t dflt) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::kInt);
  return a ? a->i : dflt;
}
float Node::attr_float(const std::string& key, float dflt) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::kFloat);
  return a ? a->f : dflt;
}
std::string Node::attr_string(const std::string& key, const std::string& dflt) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::kString);
  return a ? a->s : dflt;
}
std::vector<int64_t> Node::attr_ints(const std::string& key, std::vector<int64_t> dflt) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::kInts);
  return a ? a->ints : dflt;
}
std::vector<float> Node::attr_floats(const std::string& key, std::vector<float> dflt) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::kFloats);
  return a ? a->floats : dflt;
}
const Tensor* Node::attr_tensor(const std::string& key) const {
  const Attribute* a = typed(*this, key, Attribute::Kind::kTensor);
  return a ? &a->t : nullptr;
}

bool ValueInfo::has_static_shape() const {
  if (!shape) return false;
  return std::all_of(shape->begin(), shape->end(), [](int64_t d) { return d >= 0; });
}

bool Graph::is_input(const std::string& value) const {
  return std::any_of(inputs.begin(), inputs.end(), [&](const NamedValue& v) { return v.name == value; });
}

bool Graph::is_output(const std::string& value) const {
  return std::any_of(outputs.begin(), outputs.end(), [&](const NamedValue& v) { return v.name == value; });
}

std::unordered_map<std::string, size_t> Graph::producers() const {
  std::unordered_map<std::string, size_t> out;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs)
      if (!o.empty()) out[o] = i;
  return out;
}

std::unordered_map<std::string, int> Graph::use_counts() const {
  std::unordered_map<std::string, int> out;
  for (const auto& n : nodes) {
    for (const auto& in : n.inputs)
      if (!in.empty()) ++out[in];
    for (const auto& in : outer_scope_reads(n)) ++out[in];  // read inside a subgraph
  }
  for (const auto& o : outputs) ++out[o.name];
  return out;
}

void Graph::topological_sort() {
  auto producer = producers();
  std::vector<int> pending(nodes.size(), 0);
  std::vector<std::vector<size_t>> consumers(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::unordered_set<size_t> deps;
    auto depend_on = [&](const std::string& in, const char* what) {
      auto it = producer.find(in);
      if (it != producer.end()) {
        deps.insert(it->second);
      } else if (!is_initializer(in) && !is_input(in)) {
        OT_THROW(kInvalidModel, nodes[i].context(), what, " '", in,
                 "' is not a graph input, an initializer or any node's output");
      }
    };
    for (const auto& in : nodes[i].inputs)
      if (!in.empty()) depend_on(in, "input");
    for (const auto& in : outer_scope_reads(nodes[i])) depend_on(in, "a subgraph reads");
    pending[i] = int(deps.size());
    for (size_t d : deps) consumers[d].push_back(i);
  }
  // Kahn's algorithm with a min-heap on the original index keeps the existing order when valid.
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (pending[i] == 0) ready.push(i);
  std::vector<Node> sorted;
  sorted.reserve(nodes.size());
  while (!ready.empty()) {
    size_t i = ready.top();
    ready.pop();
    sorted.push_back(std::move(nodes[i]));
    for (size_t c : consumers[i])
      if (--pending[c] == 0) ready.push(c);
  }
  if (sorted.size() != nodes.size()) {
    for (size_t i = 0; i < nodes.size(); ++i)
      if (pending[i] > 0) OT_THROW(kInvalidModel, nodes[i].context(), "the graph has a cycle through this node");
  }
  nodes = std::move(sorted);
}

std::string Graph::unique_name(const std::string& base) {
  auto taken = [&](const std::string& n) {
    if (is_initializer(n) || is_input(n) || is_output(n) || value_info.count(n)) return true;
    for (const auto& node : nodes) {
      if (node.name == n) return true;
      for (const auto& o : node.outputs) if (o == n) return true;
    }
    return false;
  };
  int& counter = name_counters_[base];
  std::string candidate = counter == 0 ? base : base + "_" + std::to_string(counter);
  while (taken(candidate)) candidate = base + "_" + std::to_string(++counter);
  ++counter;
  return candidate;
}

int64_t Model::opset(const std::string& domain) const {
  auto it = opsets.find(domain);
  if (it == opsets.end() && domain == "ai.onnx") it = opsets.find("");
  return it == opsets.end() ? 0 : it->second;
}

std::string to_string(const Graph& graph) {
  std::ostringstream os;
  os << "graph " << graph.name << "\n";
  for (const auto& in : graph.inputs)
    os << "  input " << in.name << ": " << dtype_name(in.info.dtype)
       << (in.info.shape ? shape_str(*in.info.shape) : "[?]") << "\n";
  for (const auto& [name, t] : graph.initializers)
    os << "  initializer " << name << ": " << dtype_name(t.dtype()) << shape_str(t.shape()) << "\n";
  for (const auto& n : graph.nodes) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << n.outputs[i];
    os << " = " << (n.domain.empty() ? "" : n.domain + ".") << n.op_type << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << n.inputs[i];
    os << ")";
    for (const auto& [k, a] : n.attributes) {
      os << " " << k << "=";
      switch (a.kind) {
        case Attribute::Kind::kInt: os << a.i; break;
        case Attribute::Kind::kFloat: os << a.f; break;
        case Attribute::Kind::kString: os << '"' << a.s << '"'; break;
        case Attribute::Kind::kInts: os << shape_str(a.ints); break;
        default: os << "<" << attribute_kind_name(a.kind) << ">";
      }
    }
    os << "  # " << n.name << "\n";
  }
  for (const auto& out : graph.outputs) os << "  output " << out.name << "\n";
  return os.str();
}

std::vector<std::string> default_forward_outputs(const Graph& graph) {
  std::vector<std::string> out;
  for (const auto& o : graph.outputs) {
    bool gradient = o.name.size() > 5 && o.name.compare(o.name.size() - 5, 5, "_grad") == 0 &&
                    (graph.is_input(o.name.substr(0, o.name.size() - 5)) ||
                     graph.is_initializer(o.name.substr(0, o.name.size() - 5)));
    if (!gradient) out.push_back(o.name);
  }
  return out;
}

bool name_matches(const std::string& name, const std::string& pattern) {
  if (pattern.find_first_of("*?[") != std::string::npos) return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
  return name.find(pattern) != std::string::npos;
}

}  // namespace onnxtrain

#include "ir/subgraph.h"

#include <memory>
#include <unordered_set>

namespace onnxtrain {

bool has_subgraphs(const Node& node) {
  for (const auto& [k, a] : node.attributes)
    if (a.kind == Attribute::Kind::kGraph && a.g) return true;
  return false;
}

namespace {

std::unordered_set<std::string> defined_in(const Graph& g) {
  std::unordered_set<std::string> defined;
  for (const auto& in : g.inputs) defined.insert(in.name);
  for (const auto& [name, t] : g.initializers) defined.insert(name);
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) defined.insert(o);
  return defined;
}

void add_reads(const Node& node, const std::unordered_set<std::string>& defined, std::vector<std::string>& out,
               std::unordered_set<std::string>& seen) {
  for (const auto& [k, a] : node.attributes) {
    if (a.kind != Attribute::Kind::kGraph || !a.g) continue;
    for (const auto& v : free_values(*a.g))
      if (!defined.count(v) && seen.insert(v).second) out.push_back(v);
  }
}

}  // namespace

std::vector<std::string> free_values(const Graph& graph) {
  const std::unordered_set<std::string> defined = defined_in(graph);
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const auto& n : graph.nodes) {
    for (const auto& in : n.inputs)
      if (!in.empty() && !defined.count(in) && seen.insert(in).second) out.push_back(in);
    add_reads(n, defined, out, seen);
  }
  for (const auto& o : graph.outputs)
    if (!defined.count(o.name) && seen.insert(o.name).second) out.push_back(o.name);
  return out;
}

std::vector<std::string> outer_scope_reads(const Node& node) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  add_reads(node, {}, out, seen);
  return out;
}

void rename_outer_reads(Node& node, const std::string& from, const std::string& to) {
  for (auto& [k, a] : node.attributes) {
    if (a.kind != Attribute::Kind::kGraph || !a.g) continue;
    if (defined_in(*a.g).count(from)) continue;  // shadowed: the subgraph's own value
    auto copy = std::make_shared<Graph>(*a.g);
    for (auto& n : copy->nodes) {
      for (auto& in : n.inputs)
        if (in == from) in = to;
      rename_outer_reads(n, from, to);
    }
    for (auto& o : copy->outputs)
      if (o.name == from) o.name = to;
    a.g = std::move(copy);
  }
}

}  // namespace onnxtrain

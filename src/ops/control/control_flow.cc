// Control flow: If, Loop, Scan. Their subgraphs run through SubgraphHost (ops/subgraph.h), which
// the executor implements: each subgraph is compiled once and planned per shape signature, and the
// values it reads from enclosing scopes are bound by name.
#include <climits>
#include <cstring>

#include "ir/subgraph.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"
#include "ops/subgraph.h"

namespace onnxtrain {

SubgraphHost& subgraph_host(KernelContext& ctx) {
  auto* host = dynamic_cast<SubgraphHost*>(&ctx);
  OT_CHECK(host, ctx.node().context(), "its subgraphs need an executor to run (it cannot run standalone)");
  return *host;
}

namespace {

SubgraphDifferentiator& differentiator() {
  static SubgraphDifferentiator fn;
  return fn;
}

}  // namespace

void set_subgraph_differentiator(SubgraphDifferentiator fn) { differentiator() = std::move(fn); }

namespace {

const Graph& graph_attr(const Node& n, const char* name) {
  const Attribute* a = n.attr(name);
  OT_CHECK(a && a->kind == Attribute::Kind::kGraph && a->g, n.context(), "expected a graph attribute '", name,
           "', got ", a ? attribute_kind_name(a->kind) : "none");
  return *a->g;
}

bool truth(const Node& n, const Tensor& t, const char* what) {
  OT_CHECK(t.numel() == 1, n.context(), what, " should hold one element, got shape ", shape_str(t.shape()));
  return t.item_as_double(0) != 0;
}

// Copies element `index` along `axis` of a contiguous tensor: the slice with that axis removed.
Tensor take(const Tensor& t, int64_t axis, int64_t index) {
  Shape shape = t.shape();
  int64_t outer = 1, n = shape[size_t(axis)];
  for (int64_t d = 0; d < axis; ++d) outer *= shape[size_t(d)];
  shape.erase(shape.begin() + axis);
  Tensor out = Tensor::empty(t.dtype(), shape);
  size_t inner = out.nbytes() / size_t(std::max<int64_t>(outer, 1));
  const char* src = static_cast<const char*>(t.data());
  char* dst = static_cast<char*>(out.data());
  for (int64_t o = 0; o < outer && inner; ++o) std::memcpy(dst + o * inner, src + (o * n + index) * inner, inner);
  return out;
}

// Stacks per-iteration values along a new `axis` (reversed for backward scans). Every part must
// have the same dtype and shape; `empty_shape` is the part shape to use for zero iterations.
Tensor stack(const Node& node, const std::vector<Tensor>& parts, int64_t axis, bool reverse, DType empty_dtype,
             const Shape& empty_part, const std::string& what) {
  const DType dtype = parts.empty() ? empty_dtype : parts[0].dtype();
  const Shape part = parts.empty() ? empty_part : parts[0].shape();
  OT_CHECK(axis >= 0 && axis <= int64_t(part.size()), node.context(), what, ": axis ", axis,
           " is out of range for per-iteration values of rank ", part.size());
  for (size_t j = 1; j < parts.size(); ++j)
    OT_CHECK(parts[j].dtype() == dtype && parts[j].shape() == part, node.context(), what,
             ": every iteration must give the same dtype and shape, expected ", dtype_name(dtype), shape_str(part),
             ", got ", dtype_name(parts[j].dtype()), shape_str(parts[j].shape()), " at iteration ", j);
  Shape shape = part;
  const int64_t n = int64_t(parts.size());
  shape.insert(shape.begin() + axis, n);
  Tensor out = Tensor::empty(dtype, shape);
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= part[size_t(d)];
  if (n == 0 || out.nbytes() == 0) return out;
  const size_t inner = out.nbytes() / size_t(outer * n);
  char* dst = static_cast<char*>(out.data());
  for (int64_t j = 0; j < n; ++j) {
    const char* src = static_cast<const char*>(parts[size_t(j)].data());
    int64_t slot = reverse ? n - 1 - j : j;
    for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + (o * n + slot) * inner, src + o * inner, inner);
  }
  return out;
}

// ---- If ----

// Both branches give the node's outputs: same count, and the same dtypes where both declare them.
void check_branches(const Node& n) {
  const Graph& then_g = graph_attr(n, "then_branch");
  const Graph& else_g = graph_attr(n, "else_branch");
  OT_CHECK(then_g.outputs.size() == else_g.outputs.size() && then_g.outputs.size() == n.outputs.size(),
           n.context(), "then_branch and else_branch must each give the node's ", n.outputs.size(),
           " outputs, they give ", then_g.outputs.size(), " and ", else_g.outputs.size());
  OT_CHECK(then_g.inputs.empty() && else_g.inputs.empty(), n.context(), "branches take no inputs, they take ",
           then_g.inputs.size(), " and ", else_g.inputs.size());
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    DType a = then_g.outputs[i].info.dtype, b = else_g.outputs[i].info.dtype;
    OT_CHECK(a == DType::kUndefined || b == DType::kUndefined || a == b, n.context(), "output ", i, " is ",
             dtype_name(a), " in then_branch but ", dtype_name(b), " in else_branch");
  }
}

void if_kernel(KernelContext& ctx) {
  const Node& n = ctx.node();
  check_branches(n);
  bool cond = truth(n, ctx.input(0), "the condition");
  std::vector<Tensor> outs = subgraph_host(ctx).run_subgraph(cond ? "then_branch" : "else_branch", {});
  for (size_t i = 0; i < outs.size(); ++i) ctx.set_output(i, std::move(outs[i]));
}

ValueInfo merge(const ValueInfo& a, const ValueInfo& b) {
  ValueInfo out;
  out.dtype = a.dtype != DType::kUndefined ? a.dtype : b.dtype;
  if (a.shape && b.shape && a.shape->size() == b.shape->size()) {
    Shape s = *a.shape;
    for (size_t d = 0; d < s.size(); ++d) if (s[d] != (*b.shape)[d]) s[d] = -1;
    out.shape = s;
  }
  return out;
}

// Outputs: the taken branch's declared outputs when the condition is a known constant, else what
// both branches agree on (dims that differ are unknown).
void if_rule(ShapeContext& ctx) {
  const Node& n = ctx.node();
  check_branches(n);
  const Graph& then_g = graph_attr(n, "then_branch");
  const Graph& else_g = graph_attr(n, "else_branch");
  const Tensor* c = ctx.input_value(0);
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    ValueInfo info = merge(then_g.outputs[i].info, else_g.outputs[i].info);
    if (c && c->numel() == 1) info = (c->item_as_double(0) != 0 ? then_g : else_g).outputs[i].info;
    if (info.dtype != DType::kUndefined) ctx.set_output(i, info.dtype, info.shape);
  }
}

ValueInfo info_in(const Graph& g, const std::string& v) {
  if (auto it = g.initializers.find(v); it != g.initializers.end()) return {it->second.dtype(), it->second.shape(), {}};
  if (auto it = g.value_info.find(v); it != g.value_info.end()) return it->second;
  for (const auto& in : g.inputs) if (in.name == v) return in.info;
  return {};
}

// y = cond ? then(v) : else(v) over the outer values v the branches read.
// dv = If(cond, then: dthen/dv^T dy, else: delse/dv^T dy): both branches' gradient graphs are built
// (each recomputes its branch's forward), the one the condition takes runs.
void if_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  OT_CHECK(differentiator(), g.context(), "no subgraph differentiator is installed");
  const std::vector<std::string> outer = outer_scope_reads(n);
  std::vector<std::string> wrt;
  std::vector<size_t> index;
  for (size_t k = 0; k < outer.size(); ++k)
    if (g.needs(n.inputs.size() + k)) {
      wrt.push_back(outer[k]);
      index.push_back(n.inputs.size() + k);
    }
  if (wrt.empty()) return;
  std::vector<std::string> dys;
  for (size_t i = 0; i < n.outputs.size(); ++i) dys.push_back(g.dy(i));
  Graph& graph = g.graph();
  auto outer_info = [&](const std::string& v) { return info_in(graph, v); };
  const std::map<std::string, int64_t> opsets{{kOnnxDomain, g.opset()}, {kOnnxTrainDomain, 1}};
  GraphBuilder::Attrs attrs;
  for (const char* branch : {"then_branch", "else_branch"}) {
    Attribute a;
    a.kind = Attribute::Kind::kGraph;
    a.g = std::make_shared<Graph>(differentiator()(graph_attr(n, branch), dys, wrt, outer_info, opsets));
    a.g->name = std::string(branch) + "_grad";
    attrs[branch] = std::move(a);
  }
  std::vector<std::string> grads = g.emit_n("If", {g.x(0)}, wrt.size(), std::move(attrs));
  for (size_t j = 0; j < wrt.size(); ++j) g.set(index[j], grads[j]);
}

// ---- Loop ----
// Inputs: M (max trip count, optional), cond (optional), v_initial...; body(iteration, cond, v...)
// -> (cond, v..., scan...); outputs: v_final..., scan outputs stacked along a new first axis.

struct LoopShape {
  size_t carried = 0, scans = 0;
};

LoopShape loop_shape(const Node& n) {
  const Graph& body = graph_attr(n, "body");
  LoopShape s;
  s.carried = n.inputs.size() - 2;
  OT_CHECK(body.inputs.size() == 2 + s.carried, n.context(), "body should take 2 + ", s.carried,
           " inputs (iteration number, condition, the loop-carried values), it takes ", body.inputs.size());
  OT_CHECK(body.outputs.size() >= 1 + s.carried, n.context(), "body should give 1 + ", s.carried,
           " outputs or more (condition, loop-carried values, scan outputs), it gives ", body.outputs.size());
  s.scans = body.outputs.size() - 1 - s.carried;
  OT_CHECK(n.outputs.size() == s.carried + s.scans, n.context(), "expected ", s.carried + s.scans,
           " outputs (", s.carried, " loop-carried, ", s.scans, " scan outputs), got ", n.outputs.size());
  return s;
}

void loop_kernel(KernelContext& ctx) {
  const Node& n = ctx.node();
  OT_CHECK(ctx.has_input(0) || ctx.has_input(1), n.context(),
           "has neither a trip count (input 0) nor a condition (input 1): the loop would never end");
  const LoopShape s = loop_shape(n);
  const Graph& body = graph_attr(n, "body");
  const int64_t trips = ctx.has_input(0) ? ctx.input(0).item_as_int(0) : INT64_MAX;
  OT_CHECK(!ctx.has_input(0) || ctx.input(0).numel() == 1, n.context(), "the trip count should hold one element");
  bool cond = ctx.has_input(1) ? truth(n, ctx.input(1), "the condition") : true;
  std::vector<Tensor> carried;
  for (size_t i = 0; i < s.carried; ++i) {
    OT_CHECK(ctx.has_input(2 + i), n.context(), "loop-carried input ", 2 + i, " is missing");
    carried.push_back(ctx.input(2 + i));
  }
  std::vector<std::vector<Tensor>> scans(s.scans);
  SubgraphHost& host = subgraph_host(ctx);
  for (int64_t it = 0; it < trips && cond; ++it) {
    std::vector<Tensor> in{Tensor::scalar<int64_t>(it), Tensor::scalar<bool>(cond)};
    in.insert(in.end(), carried.begin(), carried.end());
    std::vector<Tensor> out = host.run_subgraph("body", in);
    if (ctx.has_input(1)) cond = truth(n, out[0], "the body's condition output");  // ignored without input 1
    for (size_t i = 0; i < s.carried; ++i) carried[i] = std::move(out[1 + i]);
    for (size_t k = 0; k < s.scans; ++k) scans[k].push_back(std::move(out[1 + s.carried + k]));
  }
  for (size_t i = 0; i < s.carried; ++i) ctx.set_output(i, carried[i]);
  for (size_t k = 0; k < s.scans; ++k) {
    if (!ctx.output_requested(s.carried + k)) continue;
    const ValueInfo& decl = body.outputs[1 + s.carried + k].info;
    DType dt = decl.dtype == DType::kUndefined ? DType::kFloat32 : decl.dtype;
    Shape part = decl.has_static_shape() ? *decl.shape : Shape{};
    ctx.set_output(s.carried + k, stack(n, scans[k], 0, false, dt, part, "scan output " + std::to_string(k)));
  }
}

void loop_rule(ShapeContext& ctx) {
  const Node& n = ctx.node();
  const LoopShape s = loop_shape(n);
  const Graph& body = graph_attr(n, "body");
  for (size_t i = 0; i < s.carried; ++i) {
    DType dt = ctx.input_dtype(2 + i);
    if (dt == DType::kUndefined) dt = body.outputs[1 + i].info.dtype;
    if (dt != DType::kUndefined) ctx.set_output(i, dt);
  }
  for (size_t k = 0; k < s.scans; ++k) {
    DType dt = body.outputs[1 + s.carried + k].info.dtype;
    if (dt != DType::kUndefined) ctx.set_output(s.carried + k, dt);
  }
}

// ---- Scan (opset 9+) ----
// Inputs: N initial states, then M scan inputs; body(states..., slices...) -> (states..., K per-
// iteration values); outputs: final states, then the K values stacked along scan_output_axes.

struct ScanShape {
  size_t states = 0, inputs = 0, outputs = 0;
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
};

ScanShape scan_shape(const Node& n) {
  const Graph& body = graph_attr(n, "body");
  ScanShape s;
  int64_t m = n.attr_int("num_scan_inputs", -1);
  OT_CHECK(m >= 1 && m <= int64_t(n.inputs.size()), n.context(), "attribute num_scan_inputs should be in [1, ",
           n.inputs.size(), "], got ", m);
  s.inputs = size_t(m);
  s.states = n.inputs.size() - s.inputs;
  OT_CHECK(body.inputs.size() == s.states + s.inputs, n.context(), "body should take ", s.states + s.inputs,
           " inputs (", s.states, " states, ", s.inputs, " scan slices), it takes ", body.inputs.size());
  OT_CHECK(body.outputs.size() >= s.states, n.context(), "body should give at least the ", s.states,
           " states, it gives ", body.outputs.size(), " outputs");
  s.outputs = body.outputs.size() - s.states;
  OT_CHECK(n.outputs.size() == s.states + s.outputs, n.context(), "expected ", s.states + s.outputs,
           " outputs (", s.states, " states, ", s.outputs, " scan outputs), got ", n.outputs.size());
  auto list = [&](const char* name, size_t count) {
    auto v = n.attr_ints(name, std::vector<int64_t>(count, 0));
    OT_CHECK(v.size() == count, n.context(), "attribute ", name, " should have ", count, " entries, got ", v.size());
    return v;
  };
  s.in_axes = list("scan_input_axes", s.inputs);
  s.in_dirs = list("scan_input_directions", s.inputs);
  s.out_axes = list("scan_output_axes", s.outputs);
  s.out_dirs = list("scan_output_directions", s.outputs);
  return s;
}

void scan_kernel(KernelContext& ctx) {
  const Node& n = ctx.node();
  const ScanShape s = scan_shape(n);
  const Graph& body = graph_attr(n, "body");
  std::vector<Tensor> states;
  for (size_t i = 0; i < s.states; ++i) states.push_back(ctx.input(i));
  int64_t length = -1;
  std::vector<int64_t> axes(s.inputs);
  for (size_t j = 0; j < s.inputs; ++j) {
    const Tensor& x = ctx.input(s.states + j);
    int64_t r = x.rank(), a = s.in_axes[j] < 0 ? s.in_axes[j] + r : s.in_axes[j];
    OT_CHECK(a >= 0 && a < r, n.context(), "scan input ", j, ": axis ", s.in_axes[j], " is out of range for rank ", r);
    axes[j] = a;
    OT_CHECK(length < 0 || x.dim(int(a)) == length, n.context(), "scan inputs disagree in sequence length: ",
             length, " and ", x.dim(int(a)), " (input ", s.states + j, ")");
    length = x.dim(int(a));
  }
  std::vector<std::vector<Tensor>> scans(s.outputs);
  SubgraphHost& host = subgraph_host(ctx);
  for (int64_t t = 0; t < length; ++t) {
    std::vector<Tensor> in = states;
    for (size_t j = 0; j < s.inputs; ++j)
      in.push_back(take(ctx.input(s.states + j), axes[j], s.in_dirs[j] ? length - 1 - t : t));
    std::vector<Tensor> out = host.run_subgraph("body", in);
    for (size_t i = 0; i < s.states; ++i) states[i] = std::move(out[i]);
    for (size_t k = 0; k < s.outputs; ++k) scans[k].push_back(std::move(out[s.states + k]));
  }
  for (size_t i = 0; i < s.states; ++i) ctx.set_output(i, states[i]);
  for (size_t k = 0; k < s.outputs; ++k) {
    const ValueInfo& decl = body.outputs[s.states + k].info;
    DType dt = decl.dtype == DType::kUndefined ? DType::kFloat32 : decl.dtype;
    Shape part = !scans[k].empty() ? scans[k][0].shape() : decl.has_static_shape() ? *decl.shape : Shape{};
    int64_t r = int64_t(part.size()) + 1, a = s.out_axes[k] < 0 ? s.out_axes[k] + r : s.out_axes[k];
    ctx.set_output(s.states + k, stack(n, scans[k], a, s.out_dirs[k] != 0, dt, part,
                                       "scan output " + std::to_string(k)));
  }
}

void scan_rule(ShapeContext& ctx) {
  const Node& n = ctx.node();
  const ScanShape s = scan_shape(n);
  const Graph& body = graph_attr(n, "body");
  for (size_t i = 0; i < s.states; ++i)
    if (ctx.input_dtype(i) != DType::kUndefined) ctx.set_output(i, ctx.input_dtype(i));
  for (size_t k = 0; k < s.outputs; ++k) {
    DType dt = body.outputs[s.states + k].info.dtype;
    if (dt != DType::kUndefined) ctx.set_output(s.states + k, dt);
  }
}

}  // namespace

ONNXTRAIN_OP(If, kOnnxDomain, 1).inputs(1).outputs(1, INT_MAX).shape(if_rule).gradient(if_gradient)
    .cpu(if_kernel);
ONNXTRAIN_OP(Loop, kOnnxDomain, 1).inputs(2, INT_MAX).outputs(1, INT_MAX).shape(loop_rule)
    .gradient_not_implemented("backpropagation through iterations (keeping each iteration's values) is not built yet")
    .cpu(loop_kernel);
ONNXTRAIN_OP(Scan, kOnnxDomain, 9).inputs(1, INT_MAX).outputs(1, INT_MAX).shape(scan_rule)
    .gradient_not_implemented("backpropagation through iterations (keeping each iteration's values) is not built yet")
    .cpu(scan_kernel);

}  // namespace onnxtrain

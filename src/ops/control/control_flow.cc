// Control flow: If, Loop, Scan. Their subgraphs run through SubgraphHost (ops/subgraph.h), which
// the executor implements: each subgraph is compiled once and planned per shape signature, and the
// values it reads from enclosing scopes are bound by name.
#include <climits>
#include <cstring>
#include <string>
#include <map>
#include <unordered_set>

#include "core/memory.h"
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
  std::vector<Value> outs = subgraph_host(ctx).run_subgraph(cond ? "then_branch" : "else_branch", {});
  for (size_t i = 0; i < outs.size(); ++i) ctx.set_output_value(i, std::move(outs[i]));
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
    info.kind = then_g.outputs[i].info.kind;  // sequence and optional outputs
    if (c && c->numel() == 1) info = (c->item_as_double(0) != 0 ? then_g : else_g).outputs[i].info;
    if (info.dtype != DType::kUndefined || !info.is_tensor()) ctx.set_output_info(i, info);
  }
}

ValueInfo info_in(const Graph& g, const std::string& v) {
  if (auto it = g.initializers.find(v); it != g.initializers.end()) return {it->second.dtype(), it->second.shape(), {}};
  if (auto it = g.value_info.find(v); it != g.value_info.end()) return it->second;
  for (const auto& in : g.inputs) if (in.name == v) return in.info;
  return {};
}

// Fresh names for values added to a subgraph: apart from every name it uses and every outer
// value the subgraph must keep reading.
class Namer {
 public:
  Namer() = default;
  explicit Namer(const Graph& g) {
    for (const auto& in : g.inputs) used_.insert(in.name);
    for (const auto& [name, t] : g.initializers) used_.insert(name);
    for (const auto& n : g.nodes) {
      used_.insert(n.name);
      for (const auto& v : n.inputs) used_.insert(v);
      for (const auto& v : n.outputs) used_.insert(v);
    }
  }
  void reserve(const std::string& name) { used_.insert(name); }
  std::string operator()(const std::string& base) {
    std::string n = base;
    for (int i = 1; used_.count(n); ++i) n = base + "_" + std::to_string(i);
    used_.insert(n);
    return n;
  }

 private:
  std::unordered_set<std::string> used_;
};

// Fails when a gradient subgraph defines a value it must read from the enclosing graph.
void check_not_shadowed(const Node& n, const Graph& g, const std::vector<std::string>& reads) {
  std::unordered_set<std::string> defined;
  for (const auto& node : g.nodes) for (const auto& o : node.outputs) defined.insert(o);
  for (const auto& [name, t] : g.initializers) defined.insert(name);
  for (const auto& r : reads)
    OT_CHECK(r.empty() || !defined.count(r), n.context(), "the gradient subgraph defines '", r,
             "', which it must read from the enclosing graph");
}

Node make_node(std::string name, std::string op, std::vector<std::string> inputs, std::vector<std::string> outputs,
               std::map<std::string, Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attributes = std::move(attrs);
  return n;
}

Attribute graph_value(Graph g) {
  Attribute a;
  a.kind = Attribute::Kind::kGraph;
  a.g = std::make_shared<Graph>(std::move(g));
  return a;
}

std::map<std::string, int64_t> rule_opsets(const GradientBuilder& g) {
  return {{kOnnxDomain, g.opset()}, {kOnnxTrainDomain, 1}};
}

// The outer-scope values a subgraph reads whose gradients are wanted. They count as the node's
// inputs after its own, so `index` is where each one's gradient is set.
struct OuterWrt {
  std::vector<std::string> names;
  std::vector<size_t> index;
};

OuterWrt wanted_outer_values(GradientBuilder& g, const Node& n) {
  const std::vector<std::string> outer = outer_scope_reads(n);
  OuterWrt w;
  for (size_t k = 0; k < outer.size(); ++k)
    if (g.needs(n.inputs.size() + k)) {
      w.names.push_back(outer[k]);
      w.index.push_back(n.inputs.size() + k);
    }
  return w;
}

// The body with an Identity output added for each of its first `count` inputs, so that a forward
// run stacks every iteration's values of them as extra scan outputs.
Graph keeping_inputs(const Graph& body, size_t count) {
  Graph keeping = body;
  Namer body_names(body);
  for (size_t f = 0; f < count; ++f) {
    const auto& in = body.inputs[f];
    std::string kept = body_names("kept_" + in.name);
    keeping.nodes.push_back(make_node(body_names("keep_" + in.name), "Identity", {in.name}, {kept}));
    keeping.outputs.push_back({kept, ValueInfo{in.info.dtype, std::nullopt, {}}});
  }
  return keeping;
}

// y = cond ? then(v) : else(v) over the outer values v the branches read.
// dv = If(cond, then: dthen/dv^T dy, else: delse/dv^T dy): both branches' gradient graphs are built
// (each recomputes its branch's forward), the one the condition takes runs.
void if_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  OT_CHECK(differentiator(), g.context(), "no subgraph differentiator is installed");
  const OuterWrt outer = wanted_outer_values(g, n);
  const std::vector<std::string>& wrt = outer.names;
  if (wrt.empty()) return;
  std::vector<std::string> dys;
  std::vector<bool> seeded;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    dys.push_back(g.dy(i));
    seeded.push_back(!dys.back().empty());
  }
  Graph& graph = g.graph();
  auto outer_info = [&](const std::string& v) { return info_in(graph, v); };
  GraphBuilder::Attrs attrs;
  for (const char* branch : {"then_branch", "else_branch"}) {
    SubgraphGradient sg = differentiator()(graph_attr(n, branch), seeded, wrt, outer_info, rule_opsets(g));
    check_not_shadowed(n, sg.graph, dys);
    Namer fresh(sg.graph);
    std::vector<Node> seeds;  // seed_i = Identity(dy_i): the upstream gradients come from outside
    for (size_t i = 0; i < dys.size(); ++i)
      if (!sg.seeds[i].empty()) seeds.push_back(make_node(fresh("seed"), "Identity", {dys[i]}, {sg.seeds[i]}));
    sg.graph.nodes.insert(sg.graph.nodes.begin(), seeds.begin(), seeds.end());
    sg.graph.name = std::string(branch) + "_grad";
    attrs[branch] = graph_value(std::move(sg.graph));
  }
  std::vector<std::string> grads = g.emit_n("If", {g.x(0)}, wrt.size(), std::move(attrs));
  for (size_t j = 0; j < wrt.size(); ++j) g.set(outer.index[j], grads[j]);
}

// ---- Backpropagation through the iterations (Loop, Scan) ----
// Loop and Scan are both a recurrence over iterations t = 0 .. L-1:
//   (s_{t+1}, y_t) = body(..., s_t, x_t; W)
// with carried states s (the node's first outputs; their initial values are node inputs from
// `state_input` on, and the body takes and gives them from `state_input` / `state_output` on) and
// per-iteration values y_t stacked into the node's outputs after the states. The gradient is a Loop
// over t = L-1 .. 0 whose body is the body's gradient graph:
//   ds_t = (dbody/ds_t)^T (ds_{t+1}, dy_t),  dW += (dbody/dW)^T (ds_{t+1}, dy_t),
// from ds_L = dy(s_L); its results are ds_0 (the initial states') and dW (the outer values').
// Each rule recomputes its forward, then adds to the backward body the Gathers that restore the
// forward's values at iteration t (and Scan the dx_t it also gives back).
class BpttGradient {
 public:
  // Differentiates the body with respect to its floating states (an integer counter carries no
  // gradient); add_wrt and add_outer_values add more.
  BpttGradient(GradientBuilder& g, const Graph& body, size_t state_input, size_t state_output, size_t states,
               size_t scans)
      : g_(g), body_(body), state_input_(state_input), state_output_(state_output), states_(states), scans_(scans),
        state_wrt_(states, -1) {
    const Node& n = g.node();
    for (size_t k = 0; k < states_; ++k) {
      DType dt = body.inputs[state_input + k].info.dtype;
      if (dt == DType::kUndefined) dt = g.dtype(n.inputs[state_input + k]);
      if (dt == DType::kUndefined || is_floating(dt)) state_wrt_[k] = add_wrt(body.inputs[state_input + k].name);
    }
  }

  // Another body input to differentiate; returns its place among the body gradient's results.
  int add_wrt(const std::string& body_input) {
    wrt_.push_back(body_input);
    return int(wrt_.size()) - 1;
  }

  // The outer values whose gradients are wanted: summed over the iterations.
  void add_outer_values() {
    outer_ = wanted_outer_values(g_, g_.node());
    first_outer_ = wrt_.size();
    wrt_.insert(wrt_.end(), outer_.names.begin(), outer_.names.end());
  }

  // Builds the body's gradient, seeded by the next iteration's ds and this iteration's dy, and
  // starts the backward body: (j, c, ds..., dW...) at forward iteration t = last - j. `reads` are
  // the values it reads from the enclosing graph (the gradient must not redefine them).
  void differentiate_body(const std::string& last, const std::vector<std::string>& reads) {
    std::vector<bool> seeded(body_.outputs.size(), false);
    for (size_t k = 0; k < states_; ++k) seeded[state_output_ + k] = state_wrt_[k] >= 0;
    for (size_t m = 0; m < scans_; ++m) seeded[state_output_ + states_ + m] = !g_.dy(states_ + m).empty();
    Graph& graph = g_.graph();
    auto outer_info = [&](const std::string& v) { return info_in(graph, v); };
    sg_ = differentiator()(body_, seeded, wrt_, outer_info, rule_opsets(g_));
    check_not_shadowed(g_.node(), sg_.graph, reads);
    fresh_ = Namer(sg_.graph);
    for (const auto& r : reads) fresh_.reserve(r);
    for (const auto& in : body_.inputs) fresh_.reserve(in.name);
    inputs_ = {{fresh_("bptt_j"), ValueInfo{DType::kInt64, Shape{}, {}}},
               {fresh_("bptt_cond"), ValueInfo{DType::kBool, Shape{}, {}}}};
    step_ = fresh_("bptt_t");
    prologue_.push_back(make_node(fresh_("bptt_index"), "Sub", {last, iteration()}, {step_}));
  }

  const std::string& iteration() const { return inputs_[0].name; }  // j, counting backwards
  const std::string& step() const { return step_; }                 // t = last - j
  const std::string& seed(size_t body_output) const { return sg_.seeds[body_output]; }
  const std::string& grad(int wrt_index) const { return sg_.grads[size_t(wrt_index)]; }
  std::string fresh(const std::string& base) { return fresh_(base); }
  void prologue(Node node) { prologue_.push_back(std::move(node)); }

  // The backward body's loop-carried values: the state gradients ds (named `state_grad` where the
  // body's gradient has no seed for them), then the running sums dW.
  void carry(const char* state_grad) {
    outputs_ = {{fresh_("bptt_cond_out"), ValueInfo{DType::kBool, Shape{}, {}}}};
    epilogue_.push_back(make_node(fresh_("bptt_cond_id"), "Identity", {inputs_[1].name}, {outputs_[0].name}));
    for (size_t k = 0; k < states_; ++k) {
      const std::string& s = seed(state_output_ + k);
      std::string carried_in = s.empty() ? fresh_(state_grad) : s;
      inputs_.push_back({carried_in, ValueInfo{}});
      if (state_wrt_[k] >= 0) {
        outputs_.push_back({grad(state_wrt_[k]), ValueInfo{}});
        initial_.push_back(g_.dy(k).empty() ? g_.zeros_like(g_.y(k)) : g_.dy(k));
      } else {  // an integer counter: nothing flows, carry anything of the right kind
        std::string through = fresh_("bptt_pass");
        epilogue_.push_back(make_node(fresh_("bptt_pass_id"), "Identity", {carried_in}, {through}));
        outputs_.push_back({through, ValueInfo{}});
        initial_.push_back(g_.y(k));
      }
    }
    for (size_t j = 0; j < outer_.names.size(); ++j) {
      std::string acc_in = fresh_("bptt_dw"), acc_out = fresh_("bptt_dw_next");
      inputs_.push_back({acc_in, ValueInfo{}});
      const std::string& dw_t = grad(int(first_outer_ + j));
      epilogue_.push_back(make_node(fresh_("bptt_accumulate"), "Add", {acc_in, dw_t}, {acc_out}));
      outputs_.push_back({acc_out, ValueInfo{}});
      initial_.push_back(g_.zeros_like(outer_.names[j]));
    }
  }

  // A per-iteration output of the backward body, after the carried ones: the backward Loop
  // stacks it (row r from iteration last - r).
  void also_output(const std::string& name) { outputs_.push_back({name, ValueInfo{}}); }

  // Emits the backward Loop over `trip_count` iterations and sets the gradients of the initial
  // states and outer values; returns the stacked per-iteration outputs, in also_output's order.
  std::vector<std::string> emit(const std::string& trip_count) {
    // A carried gradient that is also another output's name must not be listed twice.
    for (size_t a = 1; a < outputs_.size(); ++a)
      for (size_t b = 1; b < a; ++b)
        if (outputs_[a].name == outputs_[b].name) {
          std::string copy = fresh_("bptt_copy");
          epilogue_.push_back(make_node(fresh_("bptt_copy_id"), "Identity", {outputs_[a].name}, {copy}));
          outputs_[a].name = copy;
        }
    Graph back = std::move(sg_.graph);
    back.nodes.insert(back.nodes.begin(), prologue_.begin(), prologue_.end());
    back.nodes.insert(back.nodes.end(), epilogue_.begin(), epilogue_.end());
    const size_t results = outputs_.size() - 1;  // all but the condition
    back.inputs = std::move(inputs_);
    back.outputs = std::move(outputs_);
    back.name = body_.name + "_grad";

    std::vector<std::string> loop_inputs{trip_count, ""};
    loop_inputs.insert(loop_inputs.end(), initial_.begin(), initial_.end());
    GraphBuilder::Attrs back_attrs;
    back_attrs["body"] = graph_value(std::move(back));
    std::vector<std::string> result = g_.emit_n("Loop", loop_inputs, results, std::move(back_attrs));
    for (size_t k = 0; k < states_; ++k)
      if (state_wrt_[k] >= 0) g_.set(state_input_ + k, result[k]);
    for (size_t j = 0; j < outer_.names.size(); ++j) g_.set(outer_.index[j], result[states_ + j]);
    const size_t carried = states_ + outer_.names.size();
    return std::vector<std::string>(result.begin() + long(carried), result.end());
  }

 private:
  GradientBuilder& g_;
  const Graph& body_;
  const size_t state_input_, state_output_, states_, scans_;
  std::vector<std::string> wrt_;  // body inputs, then outer values, the body is differentiated for
  std::vector<int> state_wrt_;    // state k's place in wrt_, -1 when it carries no gradient
  OuterWrt outer_;
  size_t first_outer_ = 0;        // where outer_ starts in wrt_
  SubgraphGradient sg_;
  Namer fresh_;
  std::vector<NamedValue> inputs_, outputs_;
  std::vector<Node> prologue_, epilogue_;
  std::string step_;
  std::vector<std::string> initial_;  // the backward Loop's initial carried values
};

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
  OT_CHECK(!ctx.has_input(0) || ctx.input(0).numel() == 1, n.context(), "the trip count should hold one element, got shape ",
           ctx.has_input(0) ? shape_str(ctx.input(0).shape()) : "");
  const int64_t trips = ctx.has_input(0) ? ctx.input(0).item_as_int(0) : INT64_MAX;
  bool cond = ctx.has_input(1) ? truth(n, ctx.input(1), "the condition") : true;
  // Loop-carried values may be sequences or optionals (an empty optional from opset 16).
  std::vector<Value> carried;
  for (size_t i = 0; i < s.carried; ++i) {
    const bool declared_optional = body.inputs[2 + i].info.kind == ValueKind::kOptionalTensor ||
                                   body.inputs[2 + i].info.kind == ValueKind::kOptionalSequence;
    OT_CHECK(ctx.input_kind(2 + i) != Value::Kind::kNone || declared_optional, n.context(), "loop-carried input ",
             2 + i, " is missing");
    carried.push_back(ctx.input_value(2 + i));
  }
  std::vector<std::vector<Tensor>> scans(s.scans);
  SubgraphHost& host = subgraph_host(ctx);
  const int64_t max_iterations = max_loop_iterations();  // include/onnxtrain/limits.h
  for (int64_t it = 0; it < trips && cond; ++it) {
    OT_CHECK(max_iterations == 0 || it < max_iterations, n.context(), "ran ", max_iterations,
             " iterations without ending (trip count ", ctx.has_input(0) ? std::to_string(trips) : "none",
             ", condition still true): past the iteration limit (ONNXTRAIN_MAX_LOOP_ITERATIONS or "
             "onnxtrain::set_resource_limits)");
    std::vector<Value> in{Tensor::scalar<int64_t>(it), Tensor::scalar<bool>(cond)};
    in.insert(in.end(), carried.begin(), carried.end());
    std::vector<Value> out = host.run_subgraph("body", in);
    if (ctx.has_input(1)) cond = truth(n, out[0].tensor, "the body's condition output");  // ignored without input 1
    for (size_t i = 0; i < s.carried; ++i) carried[i] = std::move(out[1 + i]);
    for (size_t k = 0; k < s.scans; ++k) {
      OT_CHECK(out[1 + s.carried + k].is_tensor(), n.context(), "scan output ", k, " of the body is ",
               value_kind_name(out[1 + s.carried + k].kind), ", expected a tensor");
      scans[k].push_back(std::move(out[1 + s.carried + k].tensor));
    }
  }
  for (size_t i = 0; i < s.carried; ++i) ctx.set_output_value(i, carried[i]);
  for (size_t k = 0; k < s.scans; ++k) {
    if (!ctx.output_requested(s.carried + k)) continue;
    const ValueInfo& decl = body.outputs[1 + s.carried + k].info;
    DType dt = decl.dtype == DType::kUndefined ? DType::kFloat32 : decl.dtype;
    Shape part = decl.has_static_shape() ? *decl.shape : Shape{};
    ctx.set_output(s.carried + k, stack(n, scans[k], 0, false, dt, part, "scan output " + std::to_string(k)));
  }
}

// Loop's and Scan's stacked per-iteration outputs (node outputs from `first_output` on) have the
// dtypes the body declares for its outputs from `first_body_output` on, where it declares them.
void set_stacked_dtypes(ShapeContext& ctx, const Graph& body, size_t first_body_output, size_t first_output,
                        size_t count) {
  for (size_t k = 0; k < count; ++k) {
    DType dt = body.outputs[first_body_output + k].info.dtype;
    if (dt != DType::kUndefined) ctx.set_output(first_output + k, dt);
  }
}

void loop_rule(ShapeContext& ctx) {
  const Node& n = ctx.node();
  const LoopShape s = loop_shape(n);
  const Graph& body = graph_attr(n, "body");
  for (size_t i = 0; i < s.carried; ++i) {
    ValueInfo info;
    info.dtype = ctx.input_dtype(2 + i);
    if (info.dtype == DType::kUndefined) info.dtype = body.outputs[1 + i].info.dtype;
    info.kind = body.outputs[1 + i].info.kind;  // a loop-carried sequence or optional
    if (info.dtype != DType::kUndefined || !info.is_tensor()) ctx.set_output_info(i, info);
  }
  set_stacked_dtypes(ctx, body, 1 + s.carried, s.carried, s.scans);
}

// Loop: (v_{t+1}, s_t) = body(t, c_t, v_t; W) for t < T; outputs v_T and the stacked s_t.
// Backpropagation through the iterations (BpttGradient): a Loop recomputes the forward keeping
// each iteration's inputs (t, c_t, v_t), then a Loop runs t = T-1 .. 0 over them with the body's
// gradient graph:
//   dv_t = (dbody/dv_t)^T (dv_{t+1}, ds_t),  dW += (dbody/dW)^T (dv_{t+1}, ds_t),
// starting from dv_T = dy(v_T); the results are dv_0 (the initial values') and dW (outer values').
void loop_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  OT_CHECK(differentiator(), g.context(), "no subgraph differentiator is installed");
  const LoopShape s = loop_shape(n);
  const Graph& body = graph_attr(n, "body");
  // The body takes (iteration, cond, v...) and gives (cond, v..., s...).
  BpttGradient bptt(g, body, /*state_input=*/2, /*state_output=*/1, s.carried, s.scans);
  bptt.add_outer_values();

  // 1. The forward again, also emitting each iteration's inputs as scan outputs.
  GraphBuilder::Attrs forward_attrs = n.attributes;
  forward_attrs["body"] = graph_value(keeping_inputs(body, body.inputs.size()));
  std::vector<std::string> forward =
      g.emit_n("Loop", n.inputs, s.carried + s.scans + body.inputs.size(), std::move(forward_attrs));
  std::vector<std::string> kept(forward.end() - long(body.inputs.size()), forward.end());
  const std::string zero = g.constant(Tensor::scalar<int64_t>(0));
  const std::string trips = g.emit("Gather", {g.shape(kept[0]), zero});  // T, a scalar
  const std::string last = g.sub(trips, g.constant(Tensor::scalar<int64_t>(1)));

  // 2. The backward body, restoring the forward body's inputs and ds_t at iteration t.
  std::vector<std::string> reads = kept;
  reads.push_back(last);
  for (size_t m = 0; m < s.scans; ++m) reads.push_back(g.dy(s.carried + m));
  bptt.differentiate_body(last, reads);
  for (size_t f = 0; f < body.inputs.size(); ++f)  // the forward body's inputs at iteration t
    bptt.prologue(make_node(bptt.fresh("bptt_restore"), "Gather", {kept[f], bptt.step()}, {body.inputs[f].name}));
  for (size_t m = 0; m < s.scans; ++m) {
    const std::string& seed = bptt.seed(1 + s.carried + m);
    if (!seed.empty())
      bptt.prologue(make_node(bptt.fresh("bptt_ds"), "Gather", {g.dy(s.carried + m), bptt.step()}, {seed}));
  }
  bptt.carry("bptt_dv");
  bptt.emit(trips);
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

// Runs a Scan body, whose inputs and outputs are all tensors.
std::vector<Tensor> run_tensors(SubgraphHost& host, const Node& n, const std::vector<Tensor>& inputs) {
  std::vector<Value> out = host.run_subgraph("body", std::vector<Value>(inputs.begin(), inputs.end()));
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < out.size(); ++i) {
    OT_CHECK(out[i].is_tensor(), n.context(), "body output ", i, " is ", value_kind_name(out[i].kind),
             ", expected a tensor");
    tensors.push_back(std::move(out[i].tensor));
  }
  return tensors;
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
    std::vector<Tensor> out = run_tensors(host, n, in);
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

// Scan-8: input 0 is sequence_lens (optional, [batch]); states [batch, ...] and scan inputs
// [batch, sequence, ...] carry a batch axis the body does not see. Each batch entry is scanned on
// its own over its first sequence_lens[b] steps; scan outputs are zero past a shorter sequence.
void scan8_kernel(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Graph& body = graph_attr(n, "body");
  const int64_t m = n.attr_int("num_scan_inputs", -1);
  OT_CHECK(m >= 1 && m <= int64_t(n.inputs.size()) - 1, n.context(), "attribute num_scan_inputs should be in [1, ",
           int64_t(n.inputs.size()) - 1, "], got ", m);
  const size_t inputs = size_t(m), states = n.inputs.size() - 1 - inputs;
  OT_CHECK(body.inputs.size() == states + inputs, n.context(), "body should take ", states + inputs, " inputs, it takes ",
           body.inputs.size());
  OT_CHECK(body.outputs.size() >= states && n.outputs.size() == body.outputs.size(), n.context(),
           "expected as many outputs as the body's ", body.outputs.size(), ", got ", n.outputs.size());
  const size_t outputs = body.outputs.size() - states;
  const std::vector<int64_t> dirs = n.attr_ints("directions", std::vector<int64_t>(inputs, 0));
  OT_CHECK(dirs.size() == inputs, n.context(), "attribute directions should have ", inputs, " entries");
  const Tensor& first = ctx.input(1 + states);
  OT_CHECK(first.rank() >= 2, n.context(), "scan inputs should be [batch, sequence, ...], got ", shape_str(first.shape()));
  const int64_t batch = first.dim(0), max_len = first.dim(1);
  std::vector<int64_t> lens(size_t(batch), max_len);
  if (ctx.has_input(0)) {
    const Tensor& l = ctx.input(0);
    OT_CHECK(l.numel() == batch, n.context(), "sequence_lens should have ", batch, " entries, got ", l.numel());
    for (int64_t b = 0; b < batch; ++b) {
      lens[size_t(b)] = l.item_as_int(b);
      OT_CHECK(lens[size_t(b)] >= 0 && lens[size_t(b)] <= max_len, n.context(), "sequence_lens[", b, "] = ",
               lens[size_t(b)], " is outside [0, ", max_len, "]");
    }
  }
  std::vector<std::vector<Tensor>> final_states(states), stacked(outputs);
  SubgraphHost& host = subgraph_host(ctx);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> st;
    for (size_t i = 0; i < states; ++i) st.push_back(take(ctx.input(1 + i), 0, b));
    std::vector<Tensor> seqs;
    for (size_t j = 0; j < inputs; ++j) seqs.push_back(take(ctx.input(1 + states + j), 0, b));
    std::vector<std::vector<Tensor>> per_step(outputs);
    const int64_t len = lens[size_t(b)];
    for (int64_t t = 0; t < len; ++t) {
      std::vector<Tensor> in = st;
      for (size_t j = 0; j < inputs; ++j) in.push_back(take(seqs[j], 0, dirs[j] ? len - 1 - t : t));
      std::vector<Tensor> out = run_tensors(host, n, in);
      for (size_t i = 0; i < states; ++i) st[i] = std::move(out[i]);
      for (size_t k = 0; k < outputs; ++k) per_step[k].push_back(std::move(out[states + k]));
    }
    for (size_t i = 0; i < states; ++i) final_states[i].push_back(st[i]);
    for (size_t k = 0; k < outputs; ++k) {
      const ValueInfo& decl = body.outputs[states + k].info;
      DType dt = !per_step[k].empty() ? per_step[k][0].dtype() : decl.dtype == DType::kUndefined ? DType::kFloat32 : decl.dtype;
      Shape part = !per_step[k].empty() ? per_step[k][0].shape() : decl.has_static_shape() ? *decl.shape : Shape{};
      while (int64_t(per_step[k].size()) < max_len) per_step[k].push_back(Tensor::zeros(dt, part));  // padding
      stacked[k].push_back(stack(n, per_step[k], 0, false, dt, part, "scan output " + std::to_string(k)));
    }
  }
  for (size_t i = 0; i < states; ++i)
    ctx.set_output(i, stack(n, final_states[i], 0, false, ctx.input(1 + i).dtype(), {}, "state " + std::to_string(i)));
  for (size_t k = 0; k < outputs; ++k)
    ctx.set_output(states + k, stack(n, stacked[k], 0, false, DType::kFloat32, {max_len}, "scan output " + std::to_string(k)));
}

void scan8_rule(ShapeContext& ctx) {
  const Node& n = ctx.node();
  const Graph& body = graph_attr(n, "body");
  const size_t states = n.inputs.size() - 1 - size_t(std::max<int64_t>(n.attr_int("num_scan_inputs", 1), 0));
  for (size_t i = 0; i < n.outputs.size() && i < body.outputs.size(); ++i) {
    DType dt = i < states ? ctx.input_dtype(1 + i) : body.outputs[i].info.dtype;
    if (dt != DType::kUndefined) ctx.set_output(i, dt);
  }
}

void scan_rule(ShapeContext& ctx) {
  const Node& n = ctx.node();
  const ScanShape s = scan_shape(n);
  const Graph& body = graph_attr(n, "body");
  for (size_t i = 0; i < s.states; ++i)
    if (ctx.input_dtype(i) != DType::kUndefined) ctx.set_output(i, ctx.input_dtype(i));
  set_stacked_dtypes(ctx, body, s.states, s.states, s.outputs);
}

// Scan: (s_{t+1}, y_t) = body(s_t, x_t; W) over the slices x_t of the scan inputs.
// Backpropagation through the iterations as for Loop: a Scan recomputes the forward keeping each
// iteration's states, then a Loop runs t = L-1 .. 0 with the body's gradient graph:
//   (ds_t, dx_t) = (dbody/d(s_t, x_t))^T (ds_{t+1}, dy_t),  dW += (dbody/dW)^T (ds_{t+1}, dy_t),
// from ds_L = dy(s_L); dx_t are stacked back in the scan inputs' order and axis.
void scan_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  OT_CHECK(differentiator(), g.context(), "no subgraph differentiator is installed");
  const ScanShape s = scan_shape(n);
  const Graph& body = graph_attr(n, "body");
  auto axis_attr = [](int64_t a) { return Attribute::of(a); };

  // The body takes (s..., x...) and gives (s..., y...).
  BpttGradient bptt(g, body, /*state_input=*/0, /*state_output=*/0, s.states, s.outputs);
  std::vector<int> input_wrt(s.inputs, -1);
  for (size_t j = 0; j < s.inputs; ++j)
    if (g.needs(s.states + j)) input_wrt[j] = bptt.add_wrt(body.inputs[s.states + j].name);
  bptt.add_outer_values();

  // 1. The forward again, also emitting each iteration's states (along axis 0, forwards).
  const std::string length = g.emit("Gather", {g.shape(n.inputs[s.states]), g.constant(Tensor::scalar<int64_t>(s.in_axes[0]))});
  const std::string last = g.sub(length, g.constant(Tensor::scalar<int64_t>(1)));
  std::vector<std::string> kept;
  if (s.states > 0) {
    GraphBuilder::Attrs attrs = n.attributes;
    attrs["body"] = graph_value(keeping_inputs(body, s.states));
    std::vector<int64_t> axes = s.out_axes, dirs = s.out_dirs;
    axes.resize(s.outputs + s.states, 0);
    dirs.resize(s.outputs + s.states, 0);
    attrs["scan_output_axes"] = Attribute::of(axes);
    attrs["scan_output_directions"] = Attribute::of(dirs);
    std::vector<std::string> forward = g.emit_n("Scan", n.inputs, 2 * s.states + s.outputs, std::move(attrs));
    kept.assign(forward.end() - long(s.states), forward.end());
  }

  // 2. The backward body, restoring s_t and slicing x_t and dy_t at iteration t; it also gives dx_t.
  std::vector<std::string> reads = kept;
  reads.push_back(last);
  for (size_t j = 0; j < s.inputs; ++j) reads.push_back(n.inputs[s.states + j]);
  for (size_t m = 0; m < s.outputs; ++m) reads.push_back(g.dy(s.states + m));
  bptt.differentiate_body(last, reads);
  const std::string& j_name = bptt.iteration();
  const std::string& t = bptt.step();
  for (size_t k = 0; k < s.states; ++k)
    bptt.prologue(make_node(bptt.fresh("bptt_restore"), "Gather", {kept[k], t}, {body.inputs[k].name}));
  for (size_t j = 0; j < s.inputs; ++j)  // slice index t forwards, L-1-t = j backwards
    bptt.prologue(make_node(bptt.fresh("bptt_slice"), "Gather", {n.inputs[s.states + j], s.in_dirs[j] ? j_name : t},
                            {body.inputs[s.states + j].name}, {{"axis", axis_attr(s.in_axes[j])}}));
  for (size_t m = 0; m < s.outputs; ++m) {
    const std::string& seed = bptt.seed(s.states + m);
    if (!seed.empty())
      bptt.prologue(make_node(bptt.fresh("bptt_dy"), "Gather", {g.dy(s.states + m), s.out_dirs[m] ? j_name : t},
                              {seed}, {{"axis", axis_attr(s.out_axes[m])}}));
  }
  bptt.carry("bptt_ds");
  std::vector<size_t> dx_inputs;
  for (size_t j = 0; j < s.inputs; ++j)
    if (input_wrt[j] >= 0) {
      bptt.also_output(bptt.grad(input_wrt[j]));
      dx_inputs.push_back(j);
    }
  std::vector<std::string> stacked_dx = bptt.emit(length);
  for (size_t d = 0; d < dx_inputs.size(); ++d) {
    const size_t j = dx_inputs[d];
    // Row r of the stack is iteration L-1-r: the input's order already when it was read backwards.
    std::string dx = stacked_dx[d];
    if (!s.in_dirs[j])
      dx = g.emit("Slice", {dx, g.ints({-1}), g.ints({INT64_MIN}), g.ints({0}), g.ints({-1})});
    int64_t axis = s.in_axes[j];
    if (axis != 0) {
      std::optional<Shape> shape = g.static_shape(n.inputs[s.states + j]);
      OT_CHECK(shape.has_value(), g.context(), "the gradient of scan input ", j, " along axis ", axis,
               " needs the input's rank, which is not known statically");
      const int64_t rank = int64_t(shape->size());
      if (axis < 0) axis += rank;
      std::vector<int64_t> perm;
      for (int64_t d2 = 1; d2 <= axis; ++d2) perm.push_back(d2);
      perm.push_back(0);
      for (int64_t d2 = axis + 1; d2 < rank; ++d2) perm.push_back(d2);
      dx = g.emit("Transpose", {dx}, {{"perm", Attribute::of(perm)}});
    }
    g.set(s.states + j, dx);
  }
}

}  // namespace

ONNXTRAIN_OP(If, kOnnxDomain, 1).inputs(1).outputs(1, INT_MAX).shape(if_rule).gradient(if_gradient)
    .cpu(if_kernel);
ONNXTRAIN_OP(Loop, kOnnxDomain, 1).inputs(2, INT_MAX).outputs(1, INT_MAX).shape(loop_rule)
    .gradient(loop_gradient).cpu(loop_kernel);
ONNXTRAIN_OP(Scan, kOnnxDomain, 8).inputs(2, INT_MAX).outputs(1, INT_MAX).shape(scan8_rule)
    .gradient_not_implemented("Scan-8 (batched, sequence_lens) has no gradient rule; Scan-9+ has")
    .cpu(scan8_kernel);
ONNXTRAIN_OP(Scan, kOnnxDomain, 9).inputs(1, INT_MAX).outputs(1, INT_MAX).shape(scan_rule)
    .gradient(scan_gradient).cpu(scan_kernel);

}  // namespace onnxtrain

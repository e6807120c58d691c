// The compute optimizer: a selection of a few positions (Gather of token 0 or of the last token,
// Slice of the first or last positions) moves up past elementwise ops, LayerNorm, Softmax and
// MatMul, and forward and gradients stay those of the full graph. Each pattern is checked on its
// own graph (the move happened, the numbers are the dense ones), and the classification head's
// upstream MatMuls shrink to the selected rows.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "passes/compute_optimizer.h"
#include "passes/shape_inference.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "training/forward_backward.h"

namespace onnxtrain {
using test::make_model;
using test::make_node;

namespace {

constexpr int64_t kB = 3, kS = 5, kH = 4, kF = 6;

Tensor filled(Shape shape, float scale, float shift) {
  std::vector<float> v(size_t(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(float(i) * 0.61f + shift);
  return Tensor::from_vector(v, shape);
}

Tensor ints(std::vector<int64_t> v) { return Tensor::from_vector<int64_t>(v, {int64_t(v.size())}); }

// The selections under test, each as one node from "n" to "sel" (constants added to `g`).
enum class Pick { kGatherFirst, kGatherLast, kSliceFirst, kSliceLast, kSliceHidden };

Node pick(Graph& g, Pick p, const std::string& in, const std::string& out) {
  switch (p) {
    case Pick::kGatherFirst:
    case Pick::kGatherLast: {
      g.initializers["pick_index"] = Tensor::scalar<int64_t>(p == Pick::kGatherFirst ? 0 : -1);
      Node n = make_node("Gather", {in, "pick_index"}, {out});
      n.attributes["axis"] = Attribute::of(int64_t(1));
      return n;
    }
    case Pick::kSliceFirst:
    case Pick::kSliceLast:
    case Pick::kSliceHidden:
      g.initializers["pick_starts"] = ints({p == Pick::kSliceLast ? -1 : 0});
      g.initializers["pick_ends"] = ints({p == Pick::kSliceLast ? INT64_MAX : p == Pick::kSliceHidden ? 2 : 1});
      g.initializers["pick_axes"] = ints({p == Pick::kSliceHidden ? -1 : 1});
      return make_node("Slice", {in, "pick_starts", "pick_ends", "pick_axes"}, {out});
  }
  return {};
}

// y = Gather(LN(x + W2 Relu(W1 x + b1)), 0, axis 1) @ Wh: a residual block, then token 0's head.
Model head_on_token(Pick p) {
  Graph g;
  g.inputs = {test::value("x", DType::kFloat32, Shape{kB, kS, kH})};
  g.initializers["W1"] = filled({kH, kF}, 0.5f, 0.1f);
  g.initializers["b1"] = filled({kF}, 0.2f, 0.3f);
  g.initializers["W2"] = filled({kF, kH}, 0.5f, 0.7f);
  g.initializers["gamma"] = filled({kH}, 0.3f, 1.1f);
  g.initializers["beta"] = filled({kH}, 0.1f, 1.9f);
  g.initializers["Wh"] = filled({kH, 2}, 0.4f, 2.3f);
  g.nodes = {make_node("MatMul", {"x", "W1"}, {"h"}), make_node("Add", {"h", "b1"}, {"hb"}),
             make_node("Relu", {"hb"}, {"a"}), make_node("MatMul", {"a", "W2"}, {"f"}),
             make_node("Add", {"x", "f"}, {"r"}), make_node("LayerNormalization", {"r", "gamma", "beta"}, {"n"}),
             pick(g, p, "n", "cls"), make_node("MatMul", {"cls", "Wh"}, {"y"})};
  g.outputs = {test::value("y", DType::kFloat32, std::nullopt)};
  return make_model(std::move(g), 17);
}

// One op P between the input and the selection: y = Sel(P(x, operand)) * scale. The operand "u"
// (an input, so its gradient is checked too) has the shape `operand`; none for one-input ops.
Model one_op(const std::string& op, Pick p, std::optional<Shape> operand) {
  Graph g;
  g.inputs = {test::value("x", DType::kFloat32, Shape{kB, kS, kH})};
  std::vector<std::string> in{"x"};
  if (operand) {
    g.inputs.push_back(test::value("u", DType::kFloat32, *operand));
    in.push_back("u");
  }
  if (op == "LayerNormalization") {
    g.initializers["gamma"] = filled({kH}, 0.3f, 1.1f);
    g.initializers["beta"] = filled({kH}, 0.1f, 1.9f);
    in = {"x", "gamma", "beta"};
  }
  if (op == "MatMul") {
    g.initializers["W"] = filled({kH, kF}, 0.5f, 0.1f);
    in = {"x", "W"};
  }
  g.initializers["scale"] = filled({1}, 1.0f, 0.9f);
  g.nodes = {make_node(op, in, {"p"}), pick(g, p, "p", "sel"), make_node("Mul", {"sel", "scale"}, {"y"})};
  g.outputs = {test::value("y", DType::kFloat32, std::nullopt)};
  return make_model(std::move(g), 17);
}

// Forward outputs, then the gradients of every input and initializer.
std::vector<Tensor> forward_and_gradients(const Model& m, bool compute_optimizer, std::vector<std::string>* forward_ops) {
  ForwardBackwardOptions o;
  for (const auto& [name, t] : m.graph.initializers)
    if (is_floating(t.dtype())) o.bind.push_back(name);
  o.wrt = o.bind;
  std::map<std::string, Tensor> feeds;
  float shift = 0.4f;
  for (const auto& in : m.graph.inputs) {
    o.wrt.push_back(in.name);
    feeds[in.name] = filled(*in.info.shape, 1.0f, shift += 0.5f);
  }
  o.compute_optimizer = compute_optimizer;
  ForwardBackwardGraphs fb = build_forward_backward(m, o);
  for (const auto& n : fb.forward.graph.nodes) forward_ops->push_back(n.op_type);
  for (const auto& p : o.bind) feeds[p] = m.graph.initializers.at(p);
  Executor fwd(fb.forward), bwd(fb.backward);
  std::map<std::string, Tensor> f, b;
  for (const auto& name : fb.forward_feeds) f[name] = feeds.at(name);
  auto outs = fwd.run(f);
  for (const auto& name : fb.backward_feeds) b[name] = feeds.at(name);
  for (const auto& s : fb.saved)
    for (size_t k = 0; k < fb.forward.graph.outputs.size(); ++k)
      if (fb.forward.graph.outputs[k].name == s) b[s] = outs[k];
  b[fb.seeds.at(0)] = filled(outs[0].shape(), 1.0f, 0.2f);
  std::vector<Tensor> result{outs[0]};
  for (auto& t : bwd.run(b)) result.push_back(t);
  return result;
}

// With the optimizer on and off: the same outputs and gradients; returns whether the forward changed.
bool same_numbers(const Model& m) {
  std::vector<std::string> ops_on, ops_off;
  auto on = forward_and_gradients(m, true, &ops_on), off = forward_and_gradients(m, false, &ops_off);
  EXPECT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size() && i < off.size(); ++i) {
    EXPECT_EQ(on[i].shape(), off[i].shape()) << i;
    if (on[i].shape() != off[i].shape()) continue;
    for (int64_t k = 0; k < on[i].numel(); ++k)
      EXPECT_NEAR(on[i].data<float>()[k], off[i].data<float>()[k], 1e-5f * (1 + std::fabs(off[i].data<float>()[k])))
          << "output " << i << " element " << k;
  }
  return ops_on != ops_off;
}

// The node producing the value P reads first, after the pass: the selection when it moved.
std::string op_before(const Model& m, const std::string& op) {
  const auto producers = m.graph.producers();
  for (const auto& n : m.graph.nodes)
    if (n.op_type == op && producers.count(n.inputs[0])) return m.graph.nodes[producers.at(n.inputs[0])].op_type;
  return "";
}

}  // namespace

TEST(ComputeOptimizer, GatherMovesAboveLayerNormAndMatMuls) {
  Model m = head_on_token(Pick::kGatherFirst);
  EXPECT_GE(move_selections_upstream(m), 5) << to_string(m.graph);  // LN, Add, MatMul, Relu, Add(bias), MatMul
  // The first MatMul now reads the gathered rows of x.
  const auto producers = m.graph.producers();
  bool first_matmul_gathered = false;
  for (const auto& n : m.graph.nodes)
    if (n.op_type == "MatMul" && producers.count(n.inputs[0]) &&
        m.graph.nodes[producers.at(n.inputs[0])].op_type == "Gather" &&
        m.graph.nodes[producers.at(n.inputs[0])].inputs[0] == "x")
      first_matmul_gathered = true;
  EXPECT_TRUE(first_matmul_gathered) << to_string(m.graph);
}

// Slice of the first or last position: every MatMul of the block computes one row per sequence.
TEST(ComputeOptimizer, SliceShrinksTheUpstreamMatMuls) {
  for (Pick p : {Pick::kSliceFirst, Pick::kSliceLast}) {
    Model m = head_on_token(p);
    EXPECT_EQ(move_selections_upstream(m), 6) << to_string(m.graph);  // LN, Add, MatMul, Relu, Add(bias), MatMul
    infer_shapes(m.graph, m.opsets);
    int matmuls = 0;
    for (const auto& n : m.graph.nodes) {
      if (n.op_type != "MatMul") continue;
      ++matmuls;
      const Shape out = *known_shape(m.graph, n.outputs[0]);
      EXPECT_EQ(out[1], 1) << n.name << " " << to_string(m.graph);  // [B, 1, .] instead of [B, S, .]
    }
    EXPECT_EQ(matmuls, 3);
    EXPECT_EQ(op_before(m, "MatMul"), "Slice");
    EXPECT_TRUE(same_numbers(head_on_token(p)));
  }
}

TEST(ComputeOptimizer, SameOutputsAndGradients) {
  for (Pick p : {Pick::kGatherFirst, Pick::kGatherLast, Pick::kSliceFirst, Pick::kSliceLast})
    EXPECT_TRUE(same_numbers(head_on_token(p)));
}

// One pattern at a time: the selection moves above P, and forward and gradients (the operand's
// included) are those of the dense graph.
TEST(ComputeOptimizer, EachPatternMovesAndMatches) {
  struct Case {
    std::string op;
    std::optional<Shape> operand;
  };
  const std::vector<Case> cases = {
      {"Relu", std::nullopt},
      {"Tanh", std::nullopt},
      {"Add", Shape{kB, kS, kH}},     // the operand is selected alike
      {"Mul", Shape{kH}},             // spans only the hidden axis: broadcasts as before
      {"Sub", Shape{kB, 1, kH}},      // size 1 on the selected axis
      {"Div", Shape{kS, kH}},         // lower rank, spans the selected axis
      {"LayerNormalization", std::nullopt},
      {"Softmax", std::nullopt},
      {"MatMul", std::nullopt},
  };
  for (Pick p : {Pick::kGatherFirst, Pick::kGatherLast, Pick::kSliceFirst, Pick::kSliceLast})
    for (const auto& c : cases) {
      SCOPED_TRACE(c.op + " pick " + std::to_string(int(p)));
      Model m = one_op(c.op, p, c.operand);
      EXPECT_EQ(move_selections_upstream(m), 1) << to_string(m.graph);
      EXPECT_EQ(op_before(m, c.op), p == Pick::kGatherFirst || p == Pick::kGatherLast ? "Gather" : "Slice");
      EXPECT_TRUE(same_numbers(one_op(c.op, p, c.operand)));
    }
}

// A selection of hidden columns does not treat rows one by one: LayerNorm, Softmax (over the
// hidden axis) and MatMul (its reduction) stay above it, and the numbers stay the dense ones.
TEST(ComputeOptimizer, HiddenSliceStaysBelowNormsAndMatMul) {
  for (const std::string op : {"LayerNormalization", "Softmax", "MatMul"}) {
    Model m = one_op(op, Pick::kSliceHidden, std::nullopt);
    EXPECT_EQ(move_selections_upstream(m), 0) << op << "\n" << to_string(m.graph);
    EXPECT_FALSE(same_numbers(one_op(op, Pick::kSliceHidden, std::nullopt))) << op;
  }
  Model relu = one_op("Relu", Pick::kSliceHidden, std::nullopt);  // elementwise: any axis moves
  EXPECT_EQ(move_selections_upstream(relu), 1);
}

}  // namespace onnxtrain

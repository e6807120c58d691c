// The compute optimizer: a classification head's Gather of token 0 moves up past the last block's
// elementwise ops, LayerNorm and MatMuls, and forward and gradients stay those of the full graph.
#include <gtest/gtest.h>

#include <cmath>

#include "passes/compute_optimizer.h"
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

// y = Gather(LN(x + W2 Relu(W1 x + b1)), 0, axis 1) @ Wh: a residual block, then token 0's head.
Model head_on_token0() {
  Graph g;
  g.inputs = {test::value("x", DType::kFloat32, Shape{kB, kS, kH})};
  g.initializers["W1"] = filled({kH, kF}, 0.5f, 0.1f);
  g.initializers["b1"] = filled({kF}, 0.2f, 0.3f);
  g.initializers["W2"] = filled({kF, kH}, 0.5f, 0.7f);
  g.initializers["gamma"] = filled({kH}, 0.3f, 1.1f);
  g.initializers["beta"] = filled({kH}, 0.1f, 1.9f);
  g.initializers["Wh"] = filled({kH, 2}, 0.4f, 2.3f);
  g.initializers["zero"] = Tensor::scalar<int64_t>(0);
  g.nodes = {make_node("MatMul", {"x", "W1"}, {"h"}), make_node("Add", {"h", "b1"}, {"hb"}),
             make_node("Relu", {"hb"}, {"a"}), make_node("MatMul", {"a", "W2"}, {"f"}),
             make_node("Add", {"x", "f"}, {"r"}), make_node("LayerNormalization", {"r", "gamma", "beta"}, {"n"}),
             make_node("Gather", {"n", "zero"}, {"cls"}), make_node("MatMul", {"cls", "Wh"}, {"y"})};
  g.nodes[6].attributes["axis"] = Attribute::of(int64_t(1));
  g.outputs = {test::value("y", DType::kFloat32, std::nullopt)};
  return make_model(std::move(g), 17);
}

std::vector<Tensor> forward_and_gradients(bool compute_optimizer, std::vector<std::string>* forward_ops) {
  Model m = head_on_token0();
  ForwardBackwardOptions o;
  o.bind = {"W1", "b1", "W2", "gamma", "beta", "Wh"};
  o.wrt = o.bind;
  o.wrt.push_back("x");
  o.compute_optimizer = compute_optimizer;
  ForwardBackwardGraphs fb = build_forward_backward(m, o);
  for (const auto& n : fb.forward.graph.nodes) forward_ops->push_back(n.op_type);
  std::map<std::string, Tensor> feeds{{"x", filled({kB, kS, kH}, 1.0f, 0.4f)}};
  for (const auto& p : o.bind) feeds[p] = m.graph.initializers.at(p);
  Executor fwd(fb.forward), bwd(fb.backward);
  std::map<std::string, Tensor> f, b;
  for (const auto& name : fb.forward_feeds) f[name] = feeds.at(name);
  auto outs = fwd.run(f);
  for (const auto& name : fb.backward_feeds) b[name] = feeds.at(name);
  for (const auto& s : fb.saved)
    for (size_t k = 0; k < fb.forward.graph.outputs.size(); ++k)
      if (fb.forward.graph.outputs[k].name == s) b[s] = outs[k];
  b[fb.seeds.at(0)] = filled({kB, 2}, 1.0f, 0.2f);
  std::vector<Tensor> result{outs[0]};
  for (auto& t : bwd.run(b)) result.push_back(t);
  return result;
}

}  // namespace

TEST(ComputeOptimizer, GatherMovesAboveLayerNormAndMatMuls) {
  Model m = head_on_token0();
  EXPECT_GE(move_gathers_upstream(m), 5) << to_string(m.graph);  // LN, Add, MatMul, Relu, Add(bias), MatMul
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

TEST(ComputeOptimizer, SameOutputsAndGradients) {
  std::vector<std::string> ops_on, ops_off;
  auto on = forward_and_gradients(true, &ops_on), off = forward_and_gradients(false, &ops_off);
  ASSERT_EQ(on.size(), off.size());
  for (size_t i = 0; i < on.size(); ++i) {
    ASSERT_EQ(on[i].shape(), off[i].shape()) << i;
    for (int64_t k = 0; k < on[i].numel(); ++k)
      EXPECT_NEAR(on[i].data<float>()[k], off[i].data<float>()[k], 1e-5f * (1 + std::fabs(off[i].data<float>()[k])))
          << "output " << i << " element " << k;
  }
  EXPECT_NE(ops_on, ops_off);
}

}  // namespace onnxtrain

// build_gradient_graph's node order: a Shape node that sum_to reads in the backward runs right
// after its forward value, so the executor keeps no activation alive only for its shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "autodiff/autodiff.h"
#include "runtime/executor.h"
#include "test_util.h"

namespace onnxtrain {
using test::make_model;
using test::make_node;
using test::value;

namespace {

constexpr int64_t kIn = 16, kOut = 64;

Tensor filled(Shape shape, float shift) {
  std::vector<float> v(size_t(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * std::sin(float(i) * 0.37f + shift);
  return Tensor::from_vector(v, shape);
}

// loss = ReduceSum(x W1 + x W2) with x [batch, kIn], batch symbolic: the Add's gradient reduces
// to each operand's shape, which only the run knows.
Model add_of_two_projections() {
  Graph g;
  g.inputs = {{"x", ValueInfo{DType::kFloat32, Shape{-1, kIn}, {"batch", ""}}}};
  g.outputs = {value("loss", DType::kFloat32, Shape{})};
  g.initializers["W1"] = filled({kIn, kOut}, 0.5f);
  g.initializers["W2"] = filled({kIn, kOut}, 1.5f);
  g.initializers["no_axes"] = Tensor::from_vector(std::vector<int64_t>{}, {0});
  g.nodes = {make_node("MatMul", {"x", "W1"}, {"a"}), make_node("MatMul", {"x", "W2"}, {"b"}),
             make_node("Add", {"a", "b"}, {"y"}), make_node("ReduceSum", {"y", "no_axes"}, {"loss"})};
  return make_model(std::move(g), 18);
}

TEST(Autodiff, ShapeOfAForwardValueRunsRightAfterItsProducer) {
  const Model m = build_gradient_graph(add_of_two_projections(), {"W1", "W2"}, {"loss"});
  const auto& nodes = m.graph.nodes;
  const auto producers = m.graph.producers();
  int shapes = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].op_type != "Shape" || !producers.count(nodes[i].inputs[0])) continue;  // of x: runs first
    ++shapes;
    ASSERT_GT(i, 0u);
    const auto& before = nodes[i - 1].outputs;
    const bool after_producer = std::find(before.begin(), before.end(), nodes[i].inputs[0]) != before.end() ||
                                nodes[i - 1].op_type == "Shape";
    EXPECT_TRUE(after_producer) << "Shape of '" << nodes[i].inputs[0] << "' at node " << i << " follows '"
                                << nodes[i - 1].name << "'";
  }
  EXPECT_GT(shapes, 0) << "the Add's gradient reduces through sum_to with a dynamic shape";

  // Only what the backward needs stays stashed: x (for dW1, dW2), not a or b ([batch, kOut] each).
  Executor exec(m);
  const int64_t batch = 32;
  exec.run({{"x", filled({batch, kIn}, 0.25f)}});
  const MemoryReport r = exec.memory_report();
  EXPECT_EQ(r.stashed_bytes, 0u) << "a and b are " << batch * kOut * 4 << " bytes each";
}

}  // namespace
}  // namespace onnxtrain

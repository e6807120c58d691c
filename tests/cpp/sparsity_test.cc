// Label sparsity on a language-model head: the loss over the kept rows equals the dense loss (also
// when every label is ignored, and when the kept count is rounded up with ignored rows); losses it
// cannot shrink are left alone; a padding index for a table the model lacks is an error.
#include <gtest/gtest.h>

#include <cmath>

#include "passes/sparsity.h"
#include "runtime/executor.h"
#include "test_util.h"

namespace onnxtrain {
using test::make_model;
using test::make_node;

namespace {

constexpr int64_t kB = 4, kS = 10, kH = 4, kV = 7, kIgnore = -1;

Tensor filled(Shape shape, float scale, float shift) {
  std::vector<float> v(size_t(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(float(i) * 0.61f + shift);
  return Tensor::from_vector(v, shape);
}

// loss = SCE(Reshape(LN(x) @ W, [-1, V]), labels): a language model's head and loss.
Model lm_head(const std::string& reduction) {
  Graph g;
  g.inputs = {test::value("x", DType::kFloat32, Shape{kB, kS, kH}),
              test::value("labels", DType::kInt64, Shape{kB * kS})};
  g.initializers["gamma"] = filled({kH}, 0.3f, 1.1f);
  g.initializers["beta"] = filled({kH}, 0.1f, 1.9f);
  g.initializers["W"] = filled({kH, kV}, 0.7f, 0.4f);
  g.initializers["rows"] = Tensor::from_vector<int64_t>({-1, kV}, {2});
  g.nodes = {make_node("LayerNormalization", {"x", "gamma", "beta"}, {"n"}), make_node("MatMul", {"n", "W"}, {"logits"}),
             make_node("Reshape", {"logits", "rows"}, {"scores"}),
             make_node("SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"})};
  g.nodes[3].attributes["ignore_index"] = Attribute::of(kIgnore);
  g.nodes[3].attributes["reduction"] = Attribute::of(reduction);
  g.outputs = {test::value("loss", DType::kFloat32, std::nullopt)};
  return make_model(std::move(g), 17);
}

Tensor loss_of(const Model& m, const std::vector<int64_t>& labels) {
  Executor ex(m);
  return ex.run({{"x", filled({kB, kS, kH}, 1.3f, 0.2f)}, {"labels", Tensor::from_vector(labels, {kB * kS})}})[0];
}

// Every `keep_every`-th label kept (class i % V), the rest ignored.
std::vector<int64_t> labels_keeping(int keep_every) {
  std::vector<int64_t> v(size_t(kB * kS), kIgnore);
  for (size_t i = 0; keep_every > 0 && i < v.size(); i += size_t(keep_every)) v[i] = int64_t(i) % kV;
  return v;
}

int count_ops(const Model& m, const std::string& op) {
  int n = 0;
  for (const auto& node : m.graph.nodes) n += node.op_type == op;
  return n;
}

}  // namespace

TEST(LabelSparsity, KeptRowsGiveTheDenseLoss) {
  for (const char* reduction : {"mean", "sum"}) {
    const Model dense = lm_head(reduction);
    Model sparse = dense;
    ASSERT_EQ(compute_kept_labels_only(sparse), 1);
    // The LayerNorm and the MatMul now take the gathered rows; the Reshape is gone.
    EXPECT_EQ(count_ops(sparse, "NonZero"), 2);  // kept rows, and the ignored ones that round K up
    // Two Reshapes flatten the NonZeros; the head's Reshape to [-1, V] went.
    EXPECT_EQ(count_ops(sparse, "Reshape") - count_ops(dense, "Reshape"), 1);
    for (int keep_every : {1, 3, 7}) {  // 40, 14 and 6 kept: 14 and 6 are rounded up with ignored rows
      const float want = loss_of(dense, labels_keeping(keep_every)).data<float>()[0];
      const float got = loss_of(sparse, labels_keeping(keep_every)).data<float>()[0];
      EXPECT_NEAR(got, want, 1e-6f * std::fabs(want)) << reduction << ", every " << keep_every << " kept";
    }
  }
}

// loss = SCE(Reshape(LN(h) @ W, [-1, V]), labels), h = x + Relu(x @ U): a residual block under the
// head. With `observed`, an If branch also reads h from the outer scope (as a graph output).
Model residual_head(bool observed) {
  Model m = lm_head("mean");
  Graph& g = m.graph;
  g.initializers["U"] = filled({kH, kH}, 0.5f, 0.7f);
  std::vector<Node> block = {make_node("MatMul", {"x", "U"}, {"xu"}), make_node("Relu", {"xu"}, {"r"}),
                             make_node("Add", {"x", "r"}, {"h"})};
  g.nodes[0].inputs[0] = "h";  // the head's LayerNorm reads the block's output
  g.nodes.insert(g.nodes.begin(), block.begin(), block.end());
  if (observed) {
    g.inputs.push_back(test::value("cond", DType::kBool, Shape{}));
    Node choose = make_node("If", {"cond"}, {"seen"});
    choose.attributes["then_branch"] = test::one_node_branch("Identity", "h");
    choose.attributes["else_branch"] = test::one_node_branch("Neg", "h");
    g.nodes.push_back(choose);
    g.outputs.push_back(test::value("seen", DType::kFloat32, std::nullopt));
  }
  return m;
}

// The rows the block's MatMul reads: gathered (kept rows only) or the dense x.
bool block_on_kept_rows(const Model& m) {
  const auto producers = m.graph.producers();
  for (const Node& n : m.graph.nodes)
    if (n.op_type == "MatMul" && n.inputs[1] == "U") {
      auto it = producers.find(n.inputs[0]);
      return it != producers.end() && m.graph.nodes[it->second].op_type == "Gather";
    }
  return false;
}

TEST(LabelSparsity, ARegionWithBranchesRunsOnTheKeptRowsUnlessAValueIsReadOutsideIt) {
  for (bool observed : {false, true}) {
    const Model dense = residual_head(observed);
    Model sparse = dense;
    ASSERT_EQ(compute_kept_labels_only(sparse), 1);
    // Unobserved, the residual block joins the head (x gathered once for both of its readers);
    // observed, h stays whole for the If branch and the gather sits above the head only.
    EXPECT_EQ(block_on_kept_rows(sparse), !observed) << "observed " << observed;
    std::map<std::string, Tensor> feeds{{"x", filled({kB, kS, kH}, 1.3f, 0.2f)},
                                        {"labels", Tensor::from_vector(labels_keeping(3), {kB * kS})}};
    if (observed) feeds["cond"] = Tensor::scalar(true);
    const std::vector<Tensor> want = Executor(dense).run(feeds), got = Executor(sparse).run(feeds);
    EXPECT_NEAR(got[0].data<float>()[0], want[0].data<float>()[0], 1e-6f * std::fabs(want[0].data<float>()[0]));
    if (observed) {  // the branch still sees the whole h
      ASSERT_EQ(got[1].numel(), want[1].numel());
      for (int64_t i = 0; i < want[1].numel(); ++i) EXPECT_EQ(got[1].data<float>()[i], want[1].data<float>()[i]);
    }
  }
}

TEST(LabelSparsity, EveryLabelIgnoredGivesWhatTheDenseLossGives) {
  const Model dense = lm_head("mean");
  Model sparse = dense;
  ASSERT_EQ(compute_kept_labels_only(sparse), 1);
  const float want = loss_of(dense, labels_keeping(0)).data<float>()[0];
  const float got = loss_of(sparse, labels_keeping(0)).data<float>()[0];
  EXPECT_EQ(std::isnan(got), std::isnan(want));
  if (!std::isnan(want)) {
    EXPECT_EQ(got, want);
  }
}

TEST(LabelSparsity, PerRowLossesAreLeftAlone) {
  Model m = lm_head("none");
  EXPECT_EQ(compute_kept_labels_only(m), 0);
  EXPECT_EQ(count_ops(m, "NonZero"), 0);
}

// loss = SCE(Transpose(LN(x) @ W, [0, 2, 1]), labels) with batch and sequence symbolic: the form
// on-device artifacts have (their CrossEntropy takes [N, C, S]).
Model classes_second_head() {
  Graph g;
  g.inputs = {test::value("x", DType::kFloat32, Shape{-1, -1, kH}), test::value("labels", DType::kInt64, Shape{-1, -1})};
  g.initializers["gamma"] = filled({kH}, 0.3f, 1.1f);
  g.initializers["beta"] = filled({kH}, 0.1f, 1.9f);
  g.initializers["W"] = filled({kH, kV}, 0.7f, 0.4f);
  g.nodes = {make_node("LayerNormalization", {"x", "gamma", "beta"}, {"n"}), make_node("MatMul", {"n", "W"}, {"logits"}),
             make_node("Transpose", {"logits"}, {"scores"}), make_node("SoftmaxCrossEntropyLoss", {"scores", "labels"}, {"loss"})};
  g.nodes[2].attributes["perm"] = Attribute::of(std::vector<int64_t>{0, 2, 1});
  g.nodes[3].attributes["ignore_index"] = Attribute::of(kIgnore);
  g.outputs = {test::value("loss", DType::kFloat32, std::nullopt)};
  return make_model(std::move(g), 17);
}

TEST(LabelSparsity, SymbolicLengthsAndClassesSecondLogits) {
  const Model dense = classes_second_head();
  Model sparse = dense;
  ASSERT_EQ(compute_kept_labels_only(sparse), 1);
  EXPECT_EQ(count_ops(sparse, "Transpose"), 0);  // the loss reads token rows [N, V] instead
  // The LayerNorm on the kept rows: its row count shows the rounding, which reads the labels'
  // length from their shape (ceil(n / 16) rows a step).
  for (const Node& node : sparse.graph.nodes)
    if (node.op_type == "LayerNormalization") sparse.graph.outputs.push_back(test::value(node.outputs[0], DType::kFloat32, std::nullopt));
  ASSERT_EQ(sparse.graph.outputs.size(), 2u);
  struct Case { int64_t b, s; int keep_every; int64_t rows; };
  for (Case c : {Case{4, 10, 4, 12}, Case{2, 9, 4, 6}, Case{3, 5, 1, 15}, Case{1, 7, 7, 1}}) {
    std::vector<int64_t> labels(size_t(c.b * c.s), kIgnore);
    for (size_t i = 0; i < labels.size(); i += size_t(c.keep_every)) labels[i] = int64_t(i) % kV;
    const std::map<std::string, Tensor> feeds{{"x", filled({c.b, c.s, kH}, 1.3f, 0.2f)},
                                              {"labels", Tensor::from_vector(labels, {c.b, c.s})}};
    const float want = Executor(dense).run(feeds)[0].data<float>()[0];
    const std::vector<Tensor> got = Executor(sparse).run(feeds);
    EXPECT_NEAR(got[0].data<float>()[0], want, 1e-6f * std::fabs(want)) << c.b << "x" << c.s;
    EXPECT_EQ(got[1].dim(0), c.rows) << c.b << "x" << c.s << ", every " << c.keep_every << " kept";
  }
}

TEST(PaddingSparsity, ATableTheModelLacksIsAnError) {
  Model m = lm_head("mean");
  EXPECT_NE(test::error_of([&] { strip_padding(m, {{"tokens.weight", 0}}); })
                .find("padding index 0 given for 'tokens.weight', which is not the table of any embedding lookup"),
            std::string::npos);
}

}  // namespace onnxtrain

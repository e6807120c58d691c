// build_forward_backward: the forward and backward graphs, run one after the other, give the
// gradients of the math; BatchNorm statistics
// follow torch's update; bad names are errors.
#include <gtest/gtest.h>

#include <cmath>

#include "onnx/model_io.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "training/forward_backward.h"

namespace onnxtrain {
using test::make_model;
using test::make_node;
using test::value;

namespace {

constexpr int64_t kN = 4, kIn = 3, kOut = 5;

std::vector<float> ramp(int64_t n, float scale, float shift) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = std::sin(float(i) * scale + shift);
  return v;
}

// y = Relu(x @ W + B), with W and B initializers.
Model dense_model() {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{kN, kIn})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.initializers["W"] = Tensor::from_vector(ramp(kIn * kOut, 0.7f, 0.1f), {kIn, kOut});
  g.initializers["B"] = Tensor::from_vector(ramp(kOut, 1.3f, 0.5f), {kOut});
  g.nodes = {make_node("MatMul", {"x", "W"}, {"h"}), make_node("Add", {"h", "B"}, {"z"}), make_node("Relu", {"z"}, {"y"})};
  return make_model(std::move(g));
}

// Runs forward then backward; returns the gradients parallel to wrt.
std::vector<Tensor> forward_then_backward(const ForwardBackwardGraphs& fb, const std::map<std::string, Tensor>& feeds,
                                          const Tensor& dy) {
  Executor forward(fb.forward), backward(fb.backward);
  std::map<std::string, Tensor> fwd_feeds;
  for (const auto& name : fb.forward_feeds) fwd_feeds[name] = feeds.at(name);
  auto outs = forward.run(fwd_feeds);
  std::map<std::string, Tensor> bwd_feeds;
  for (const auto& name : fb.backward_feeds) bwd_feeds[name] = feeds.at(name);
  for (size_t i = 0; i < fb.saved.size(); ++i)
    for (size_t k = 0; k < fb.forward.graph.outputs.size(); ++k)
      if (fb.forward.graph.outputs[k].name == fb.saved[i]) bwd_feeds[fb.saved[i]] = outs[k];
  bwd_feeds[fb.seeds.at(0)] = dy;
  return backward.run(bwd_feeds);
}

void expect_dense_gradients() {
  Model m = dense_model();
  Tensor w = m.graph.initializers.at("W"), b = m.graph.initializers.at("B");
  ForwardBackwardOptions o;
  o.bind = {"W", "B"};
  o.wrt = {"W", "B", "x"};
  ForwardBackwardGraphs fb = build_forward_backward(m, o);
  ASSERT_EQ(fb.inputs, (std::vector<std::string>{"x", "W", "B"}));
  ASSERT_EQ(fb.seeded_outputs, std::vector<std::string>{"y"});
  EXPECT_FALSE(fb.saved.empty());

  Tensor x = Tensor::from_vector(ramp(kN * kIn, 0.9f, 0.3f), {kN, kIn});
  Tensor dy = Tensor::from_vector(ramp(kN * kOut, 0.4f, 1.0f), {kN, kOut});
  auto grads = forward_then_backward(fb, {{"x", x}, {"W", w}, {"B", b}}, dy);
  ASSERT_EQ(grads.size(), 3u);

  // dz = dy * (z > 0); dW = x^T dz; dB = sum_n dz; dx = dz W^T.
  std::vector<float> dz(size_t(kN * kOut));
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t j = 0; j < kOut; ++j) {
      float z = b.data<float>()[j];
      for (int64_t i = 0; i < kIn; ++i) z += x.data<float>()[n * kIn + i] * w.data<float>()[i * kOut + j];
      dz[size_t(n * kOut + j)] = z > 0 ? dy.data<float>()[n * kOut + j] : 0.0f;
    }
  for (int64_t i = 0; i < kIn; ++i)
    for (int64_t j = 0; j < kOut; ++j) {
      float want = 0;
      for (int64_t n = 0; n < kN; ++n) want += x.data<float>()[n * kIn + i] * dz[size_t(n * kOut + j)];
      EXPECT_NEAR(grads[0].data<float>()[i * kOut + j], want, 1e-5) << "dW " << i << "," << j;
    }
  for (int64_t j = 0; j < kOut; ++j) {
    float want = 0;
    for (int64_t n = 0; n < kN; ++n) want += dz[size_t(n * kOut + j)];
    EXPECT_NEAR(grads[1].data<float>()[j], want, 1e-5) << "dB " << j;
  }
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t i = 0; i < kIn; ++i) {
      float want = 0;
      for (int64_t j = 0; j < kOut; ++j) want += dz[size_t(n * kOut + j)] * w.data<float>()[i * kOut + j];
      EXPECT_NEAR(grads[2].data<float>()[n * kIn + i], want, 1e-5) << "dx " << n << "," << i;
    }
}

}  // namespace

TEST(ForwardBackward, SplitGraphsGiveTheGradients) { expect_dense_gradients(); }

TEST(ForwardBackward, ForwardOnlyWithoutWrt) {
  ForwardBackwardOptions o;
  o.bind = {"W"};
  ForwardBackwardGraphs fb = build_forward_backward(dense_model(), o);
  EXPECT_TRUE(fb.backward.graph.nodes.empty());
  EXPECT_EQ(fb.forward_feeds, (std::vector<std::string>{"x", "W"}));
  EXPECT_TRUE(fb.forward.graph.is_initializer("B"));
}

TEST(ForwardBackward, BatchNormStatisticsFollowTorch) {
  // x [4, 2]: n = 4 values per channel. torch: rv' = m_t * var_unbiased + (1 - m_t) * rv, with
  // ONNX's momentum m = 1 - m_t.
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{4, 2})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.initializers["scale"] = Tensor::from_vector<float>({1, 1}, {2});
  g.initializers["bias"] = Tensor::from_vector<float>({0, 0}, {2});
  g.initializers["mean"] = Tensor::from_vector<float>({0.5f, -0.5f}, {2});
  g.initializers["var"] = Tensor::from_vector<float>({2.0f, 3.0f}, {2});
  Node bn = make_node("BatchNormalization", {"x", "scale", "bias", "mean", "var"}, {"y", "new_mean", "new_var"});
  bn.attributes["momentum"] = Attribute::of(0.9f);
  bn.attributes["training_mode"] = Attribute::of(int64_t(1));
  g.nodes = {bn};
  ForwardBackwardOptions o;
  o.bind = {"scale", "bias", "mean", "var"};
  o.wrt = {"scale", "bias"};
  const Model model = make_model(std::move(g));
  // The bound values as initializers, and as the inputs TrainModule's stripped exports make them.
  const Model stripped = load_model_from_bytes(
      initializers_as_inputs(save_model_to_bytes(model), {"scale", "bias", "mean", "var"}));
  ASSERT_TRUE(stripped.graph.initializers.empty());
  ASSERT_EQ(stripped.graph.inputs.size(), 5u);
  for (const Model* form : {&model, &stripped}) {
    ForwardBackwardGraphs fb = build_forward_backward(*form, o);
    ASSERT_EQ(fb.buffers, (std::vector<std::string>{"mean", "var"}));

    std::vector<float> xs = {1, 10, 2, 20, 4, 30, 7, 40};
    Executor forward(fb.forward);
    std::map<std::string, Tensor> feeds{{"x", Tensor::from_vector(xs, {4, 2})}};
    feeds["scale"] = Tensor::from_vector<float>({1, 1}, {2});
    feeds["bias"] = Tensor::from_vector<float>({0, 0}, {2});
    feeds["mean"] = Tensor::from_vector<float>({0.5f, -0.5f}, {2});
    feeds["var"] = Tensor::from_vector<float>({2.0f, 3.0f}, {2});
    std::map<std::string, Tensor> used;
    for (const auto& name : fb.forward_feeds) used[name] = feeds.at(name);
    auto outs = forward.run(used);
    const float old_mean[2] = {0.5f, -0.5f}, old_var[2] = {2.0f, 3.0f};
    for (int c = 0; c < 2; ++c) {
      float mu = 0, ss = 0;
      for (int n = 0; n < 4; ++n) mu += xs[size_t(n * 2 + c)] / 4;
      for (int n = 0; n < 4; ++n) ss += (xs[size_t(n * 2 + c)] - mu) * (xs[size_t(n * 2 + c)] - mu);
      size_t mean_out = 0, var_out = 0;
      for (size_t k = 0; k < fb.forward.graph.outputs.size(); ++k) {
        if (fb.forward.graph.outputs[k].name == fb.buffer_outputs[0]) mean_out = k;
        if (fb.forward.graph.outputs[k].name == fb.buffer_outputs[1]) var_out = k;
      }
      EXPECT_NEAR(outs[mean_out].data<float>()[c], 0.9f * old_mean[c] + 0.1f * mu, 1e-4);
      EXPECT_NEAR(outs[var_out].data<float>()[c], 0.9f * old_var[c] + 0.1f * ss / 3, 1e-3) << "unbiased: / (n - 1)";
    }
  }
}

TEST(ForwardBackward, BadNamesAreErrors) {
  ForwardBackwardOptions o;
  o.bind = {"nope"};
  EXPECT_THROW(
      {
        try {
          build_forward_backward(dense_model(), o);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("'nope' is neither an initializer nor an input"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  o.bind = {"W"};
  o.wrt = {"B"};  // an initializer the host did not bind: not differentiable here
  EXPECT_THROW(build_forward_backward(dense_model(), o), Error);
}

}  // namespace onnxtrain

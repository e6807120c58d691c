// The multi-tensor update kernels (src/optim) against straightforward scalar references written
// from the papers / reference implementations, over several steps; the update ops; LR schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "ops/kernel.h"
#include "ops/registry.h"
#include "optim/loss_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "ops/optimizer/optimizer_ops.h"
#include "test_util.h"

namespace onnxtrain::optim {
namespace {

// Sizes cover scalars, odd tails, an empty tensor and several chunks (parallel, multi-chunk).
const std::vector<Shape> kShapes = {{}, {7}, {3, 11}, {0, 4}, {70000}, {5, 17}};

using Vec = std::vector<double>;
using test::error_of;

struct RefParam {
  Vec p, m, v, vmax, buf, sum;
};

Vec random_vec(std::mt19937& rng, int64_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  Vec v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

template <typename T>
Tensor to_tensor(const Vec& v, const Shape& shape) {
  std::vector<T> t(v.begin(), v.end());
  return Tensor::from_vector<T>(t, shape);
}

template <typename T>
Vec from_tensor(const Tensor& t) {
  const T* d = t.data<T>();
  return Vec(d, d + t.numel());
}

// Scalar references, one element at a time, straight from the reference implementations.
void ref_step(const OptimizerConfig& c, int64_t step, std::vector<RefParam>& ps, std::vector<Vec> grads) {
  // Global clipping (torch.nn.utils.clip_grad_norm_).
  if (c.max_grad_norm > 0) {
    double sq = 0;
    for (auto& g : grads) for (double x : g) sq += x * x;
    double coef = c.max_grad_norm / (std::sqrt(sq) + 1e-6);
    if (coef < 1)
      for (auto& g : grads) for (double& x : g) x *= coef;
  }
  const double b1 = c.betas[0], b2 = c.betas[1], lr = c.lr, wd = c.weight_decay;
  for (size_t t = 0; t < ps.size(); ++t) {
    RefParam& r = ps[t];
    Vec& g = grads[t];
    size_t n = r.p.size();
    if (c.maximize) for (double& x : g) x = -x;
    switch (c.type) {
      case OptimizerType::kAdamW:
      case OptimizerType::kAdam: {
        for (size_t i = 0; i < n; ++i) {
          double gi = g[i];
          if (c.type == OptimizerType::kAdam) gi += wd * r.p[i];
          else r.p[i] *= 1 - lr * wd;
          r.m[i] = b1 * r.m[i] + (1 - b1) * gi;
          r.v[i] = b2 * r.v[i] + (1 - b2) * gi * gi;
          double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
          double vv = r.v[i];
          if (c.amsgrad) vv = r.vmax[i] = std::max(r.vmax[i], r.v[i]);
          r.p[i] -= lr / bc1 * r.m[i] / (std::sqrt(vv) / std::sqrt(bc2) + c.eps);
        }
        break;
      }
      case OptimizerType::kHFAdamW: {
        double step_size = lr;
        if (c.correct_bias) step_size = lr * std::sqrt(1 - std::pow(b2, step)) / (1 - std::pow(b1, step));
        for (size_t i = 0; i < n; ++i) {
          r.m[i] = b1 * r.m[i] + (1 - b1) * g[i];
          r.v[i] = b2 * r.v[i] + (1 - b2) * g[i] * g[i];
          r.p[i] -= step_size * r.m[i] / (std::sqrt(r.v[i]) + c.eps);
          if (wd > 0) r.p[i] -= lr * wd * r.p[i];
        }
        break;
      }
      case OptimizerType::kSGD: {
        for (size_t i = 0; i < n; ++i) {
          double d = g[i] + wd * r.p[i];
          if (c.momentum != 0) {
            r.buf[i] = step == 1 ? d : c.momentum * r.buf[i] + (1 - c.dampening) * d;
            d = c.nesterov ? d + c.momentum * r.buf[i] : r.buf[i];
          }
          r.p[i] -= lr * d;
        }
        break;
      }
      case OptimizerType::kAdagrad: {
        double clr = lr / (1 + (step - 1) * c.lr_decay);
        for (size_t i = 0; i < n; ++i) {
          double gi = g[i] + wd * r.p[i];
          r.sum[i] += gi * gi;
          r.p[i] -= clr * gi / (std::sqrt(r.sum[i]) + c.eps);
        }
        break;
      }
      case OptimizerType::kLamb: {
        double bc1 = c.correct_bias ? 1 - std::pow(b1, step) : 1, bc2 = c.correct_bias ? 1 - std::pow(b2, step) : 1;
        Vec u(n);
        double pn = 0, un = 0;
        for (size_t i = 0; i < n; ++i) {
          double gi = g[i];
          if (!c.adam_w_mode) gi += wd * r.p[i];
          r.m[i] = b1 * r.m[i] + (c.grad_averaging ? 1 - b1 : 1.0) * gi;
          r.v[i] = b2 * r.v[i] + (1 - b2) * gi * gi;
          u[i] = (r.m[i] / bc1) / (std::sqrt(r.v[i] / bc2) + c.eps);
          if (c.adam_w_mode) u[i] += wd * r.p[i];
          pn += r.p[i] * r.p[i];
          un += u[i] * u[i];
        }
        pn = std::sqrt(pn);
        un = std::sqrt(un);
        double ratio = (c.use_nvlamb || wd != 0) && pn > 0 && un > 0 ? lr * pn / un : lr;
        for (size_t i = 0; i < n; ++i) r.p[i] -= ratio * u[i];
        break;
      }
    }
  }
}

double max_rel_diff(const Vec& a, const Vec& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den > 0 ? num / den : num;
}

// Runs `steps` updates through MultiTensorOptimizer and the reference; returns the worst
// normwise relative difference over parameters and state.
template <typename T>
double run_against_reference(OptimizerConfig cfg, int steps, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::vector<RefParam> ref;
  std::vector<Tensor> params;
  for (const auto& s : kShapes) {
    RefParam r;
    r.p = random_vec(rng, numel(s));
    size_t n = r.p.size();
    r.m = r.v = r.vmax = r.buf = Vec(n, 0.0);
    r.sum = Vec(n, cfg.initial_accumulator_value);
    params.push_back(to_tensor<T>(r.p, s));
    if constexpr (std::is_same_v<T, float>)  // the reference starts from the rounded values
      r.p = from_tensor<float>(params.back());
    ref.push_back(r);
  }
  MultiTensorOptimizer opt(cfg);
  OptimizerState state;
  for (int k = 1; k <= steps; ++k) {
    std::vector<Vec> g;
    std::vector<Tensor> grads;
    for (size_t t = 0; t < kShapes.size(); ++t) {
      g.push_back(random_vec(rng, numel(kShapes[t]), 0.5));
      grads.push_back(to_tensor<T>(g.back(), kShapes[t]));
      if constexpr (std::is_same_v<T, float>) g.back() = from_tensor<float>(grads.back());
    }
    opt.step(params, grads, state);
    ref_step(cfg, k, ref, g);
  }
  EXPECT_EQ(state.step, steps);
  double worst = 0;
  for (size_t t = 0; t < kShapes.size(); ++t) {
    worst = std::max(worst, max_rel_diff(from_tensor<T>(params[t]), ref[t].p));
    for (const auto& name : cfg.state_names()) {
      const Vec& r = name == "exp_avg" ? ref[t].m : name == "exp_avg_sq" ? ref[t].v
                   : name == "max_exp_avg_sq" ? ref[t].vmax : name == "momentum_buffer" ? ref[t].buf : ref[t].sum;
      worst = std::max(worst, max_rel_diff(from_tensor<T>(state.tensors.at(name)[t]), r));
    }
  }
  return worst;
}

OptimizerConfig cfg_of(OptimizerType type) {
  OptimizerConfig c = OptimizerConfig::defaults(type);
  c.lr = 1e-2;
  return c;
}

// torch.amp.GradScaler's defaults: x0.5 and a skip on overflow, x2 after 2000 finite steps in a row.
TEST(LossScaler, BacksOffOnOverflowAndGrowsAfter2000FiniteSteps) {
  LossScaler s;
  EXPECT_EQ(s.scale, 65536.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.skipped_steps, 1);
  for (int i = 0; i < 1999; ++i) EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.good_steps, 1999);
  EXPECT_TRUE(s.update(true));  // the 2000th
  EXPECT_EQ(s.scale, 65536.0);
  EXPECT_EQ(s.good_steps, 0);
  for (int i = 0; i < 1500; ++i) s.update(true);
  EXPECT_FALSE(s.update(false));  // an overflow restarts the count
  EXPECT_EQ(s.good_steps, 0);
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.skipped_steps, 2);
}

TEST(LossScaler, AllFiniteFindsEveryNonFiniteValue) {
  for (DType dt : {DType::kFloat32, DType::kFloat64}) {
    std::vector<Tensor> ts = {Tensor::zeros(dt, {7}), Tensor::zeros(dt, {300001})};
    EXPECT_TRUE(all_finite(ts));
    for (double bad : {INFINITY, -INFINITY, NAN})
      for (int64_t at : {int64_t(0), int64_t(65536), int64_t(300000)}) {
        auto set = [&](double v) {
          if (dt == DType::kFloat32) ts[1].data<float>()[at] = float(v);
          else ts[1].data<double>()[at] = v;
        };
        set(bad);
        EXPECT_FALSE(all_finite(ts)) << dtype_name(dt) << " " << bad << " at " << at;
        set(3.0e38);  // large but finite
        EXPECT_TRUE(all_finite(ts));
        set(0);
      }
  }
  EXPECT_THROW(all_finite({Tensor::zeros(DType::kFloat16, {2})}), Error);
}

TEST(OptimAdam, AdamWMatchesReference) {
  OptimizerConfig c = cfg_of(OptimizerType::kAdamW);
  c.weight_decay = 0.1;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  EXPECT_LT(run_against_reference<float>(c, 6), 1e-5);
  c.amsgrad = true;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  c.maximize = true;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
}

TEST(OptimAdam, AdamL2MatchesReference) {
  OptimizerConfig c = cfg_of(OptimizerType::kAdam);
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  c.weight_decay = 0.05;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  EXPECT_LT(run_against_reference<float>(c, 6), 1e-5);
  c.amsgrad = true;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
}

TEST(OptimAdam, HFAdamWMatchesReference) {
  OptimizerConfig c = cfg_of(OptimizerType::kHFAdamW);
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  c.weight_decay = 0.1;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  c.correct_bias = false;
  EXPECT_LT(run_against_reference<double>(c, 6), 1e-12);
  EXPECT_LT(run_against_reference<float>(c, 6), 1e-5);
}

TEST(OptimSGD, MatchesReference) {
  OptimizerConfig c = cfg_of(OptimizerType::kSGD);
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);  // plain
  c.weight_decay = 0.01;
  c.momentum = 0.9;
  c.dampening = 0.1;
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  c.dampening = 0;
  c.nesterov = true;
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  EXPECT_LT(run_against_reference<float>(c, 5), 1e-5);
  c.maximize = true;
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
}

TEST(OptimAdagrad, MatchesReference) {
  OptimizerConfig c = cfg_of(OptimizerType::kAdagrad);
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  c.lr_decay = 0.1;
  c.weight_decay = 0.02;
  c.initial_accumulator_value = 0.3;
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  EXPECT_LT(run_against_reference<float>(c, 5), 1e-5);
}

TEST(OptimLamb, MatchesReference) {
  OptimizerConfig c = cfg_of(OptimizerType::kLamb);
  c.max_grad_norm = 0;
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  c.max_grad_norm = 1.0;  // apex's default: clipping on
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  EXPECT_LT(run_against_reference<float>(c, 5), 1e-5);
  c.adam_w_mode = false;
  c.correct_bias = false;
  c.grad_averaging = false;
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  c.weight_decay = 0;  // no trust ratio ...
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
  c.use_nvlamb = true;  // ... unless NVLAMB
  EXPECT_LT(run_against_reference<double>(c, 5), 1e-12);
}

TEST(OptimClip, GlobalNormScalesEveryRule) {
  for (auto type : {OptimizerType::kAdamW, OptimizerType::kSGD, OptimizerType::kAdagrad}) {
    OptimizerConfig c = cfg_of(type);
    c.max_grad_norm = 0.5;  // the random gradients' norm is far above: clipping is active
    EXPECT_LT(run_against_reference<double>(c, 4), 1e-12) << optimizer_type_name(type);
  }
}

TEST(OptimClip, ReportsNormAndCoefficient) {
  std::vector<Tensor> params = {Tensor::from_vector<double>({1, 2, 3}, {3}), Tensor::from_vector<double>({4}, {1})};
  std::vector<Tensor> grads = {Tensor::from_vector<double>({3, 0, 0}, {3}), Tensor::from_vector<double>({4}, {1})};
  EXPECT_DOUBLE_EQ(global_l2_norm(grads), 5.0);
  OptimizerConfig c = OptimizerConfig::defaults(OptimizerType::kSGD);
  c.lr = 1.0;
  c.max_grad_norm = 1.0;
  MultiTensorOptimizer opt(c);
  OptimizerState state;
  StepStats s = opt.step(params, grads, state);
  EXPECT_DOUBLE_EQ(s.grad_norm, 5.0);
  EXPECT_NEAR(s.clip_coef, 1.0 / (5.0 + 1e-6), 1e-15);
  EXPECT_NEAR(params[0].data<double>()[0], 1 - 3 * s.clip_coef, 1e-15);
  EXPECT_NEAR(params[1].data<double>()[0], 4 - 4 * s.clip_coef, 1e-15);
  // Gradients are read, never scaled in place.
  EXPECT_EQ(grads[0].data<double>()[0], 3.0);
  // Below the threshold nothing is scaled.
  c.max_grad_norm = 10.0;
  StepStats s2 = MultiTensorOptimizer(c).step(params, grads, state);
  EXPECT_EQ(s2.clip_coef, 1.0);
}

TEST(OptimState, NamesInitAndChecks) {
  OptimizerConfig c = OptimizerConfig::defaults(OptimizerType::kAdamW);
  EXPECT_EQ(c.state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  c.amsgrad = true;
  EXPECT_EQ(c.state_names().back(), "max_exp_avg_sq");
  EXPECT_EQ(OptimizerConfig::defaults(OptimizerType::kSGD).state_names().size(), 0u);
  OptimizerConfig sgd = OptimizerConfig::defaults(OptimizerType::kSGD);
  sgd.momentum = 0.9;
  EXPECT_EQ(sgd.state_names(), (std::vector<std::string>{"momentum_buffer"}));
  OptimizerConfig ada = OptimizerConfig::defaults(OptimizerType::kAdagrad);
  ada.initial_accumulator_value = 0.25;
  std::vector<Tensor> params = {Tensor::zeros(DType::kFloat32, {2, 3})};
  OptimizerState st;
  MultiTensorOptimizer(ada).init_state(params, st);
  ASSERT_EQ(st.tensors.at("sum").size(), 1u);
  EXPECT_EQ(st.tensors.at("sum")[0].data<float>()[5], 0.25f);
  // Torch's defaults.
  auto adamw = OptimizerConfig::defaults(OptimizerType::kAdamW);
  EXPECT_EQ(adamw.lr, 1e-3);
  EXPECT_EQ(adamw.betas[0], 0.9);
  EXPECT_EQ(adamw.betas[1], 0.999);
  EXPECT_EQ(adamw.eps, 1e-8);
  EXPECT_EQ(adamw.weight_decay, 1e-2);
  EXPECT_EQ(OptimizerConfig::defaults(OptimizerType::kAdam).weight_decay, 0.0);
  EXPECT_EQ(parse_optimizer_type("AdamW"), OptimizerType::kAdamW);
  EXPECT_EQ(parse_optimizer_type("hf"), OptimizerType::kHFAdamW);
  EXPECT_THROW(parse_optimizer_type("rmsprop"), Error);
}

TEST(OptimErrors, BadInputsAreClearErrors) {
  MultiTensorOptimizer opt(OptimizerConfig::defaults(OptimizerType::kAdamW));
  std::vector<Tensor> params = {Tensor::zeros(DType::kFloat32, {2, 3}), Tensor::zeros(DType::kFloat32, {4})};
  std::vector<Tensor> grads = {Tensor::zeros(DType::kFloat32, {2, 3}), Tensor::zeros(DType::kFloat32, {5})};
  OptimizerState st;
  EXPECT_NE(error_of([&] { opt.step(params, grads, st); }).find("gradient 1 has dtype float32 and shape [5]"),
            std::string::npos);
  grads[1] = Tensor::zeros(DType::kFloat64, {4});
  EXPECT_NE(error_of([&] { opt.step(params, grads, st); }).find("gradient 1"), std::string::npos);
  grads.pop_back();
  EXPECT_NE(error_of([&] { opt.step(params, grads, st); }).find("2 parameters but 1 gradients"), std::string::npos);
  std::vector<Tensor> ints = {Tensor::zeros(DType::kInt32, {2})};
  OptimizerState st2;
  EXPECT_NE(error_of([&] { opt.step(ints, ints, st2); }).find("float32 or float64"), std::string::npos);
  // Aliased parameters would be updated twice.
  Tensor p = Tensor::zeros(DType::kFloat32, {3});
  std::vector<Tensor> twice = {p, p}, g2 = {Tensor::zeros(DType::kFloat32, {3}), Tensor::zeros(DType::kFloat32, {3})};
  OptimizerState st3;
  EXPECT_NE(error_of([&] { opt.step(twice, g2, st3); }).find("shares its memory"), std::string::npos);
  // Rejected hyperparameters.
  OptimizerConfig bad = OptimizerConfig::defaults(OptimizerType::kAdamW);
  bad.betas[1] = 1.0;
  EXPECT_THROW(MultiTensorOptimizer{bad}, Error);
  OptimizerConfig nes = OptimizerConfig::defaults(OptimizerType::kSGD);
  nes.nesterov = true;
  EXPECT_NE(error_of([&] { MultiTensorOptimizer{nes}; }).find("nesterov"), std::string::npos);
  OptimizerConfig neg = OptimizerConfig::defaults(OptimizerType::kSGD);
  neg.lr = -1;
  EXPECT_THROW(MultiTensorOptimizer{neg}, Error);
}

// ---- the update ops ------------------------------------------------------------------------------

Node update_node(const OptimizerConfig& cfg, int64_t n, bool in_place) {
  Node node;
  node.op_type = update_op_type(cfg.type);
  node.domain = kOnnxTrainDomain;
  node.name = "update";
  node.attributes = update_op_attributes(cfg, in_place);
  size_t k = cfg.state_names().size();
  node.inputs = {"lr", "step"};
  for (int64_t g = 0; g < int64_t(2 + k); ++g)
    for (int64_t i = 0; i < n; ++i) node.inputs.push_back("in" + std::to_string(g) + "_" + std::to_string(i));
  for (int64_t g = 0; g < int64_t(1 + k); ++g)
    for (int64_t i = 0; i < n; ++i) node.outputs.push_back("out" + std::to_string(g) + "_" + std::to_string(i));
  return node;
}

TEST(OptimOps, UpdateOpsMatchTheOptimizer) {
  OptimizerConfig lamb = OptimizerConfig::defaults(OptimizerType::kLamb);
  OptimizerConfig sgd = OptimizerConfig::defaults(OptimizerType::kSGD);
  sgd.momentum = 0.5;
  sgd.nesterov = true;
  OptimizerConfig adam = OptimizerConfig::defaults(OptimizerType::kAdam);
  adam.amsgrad = true;
  adam.weight_decay = 0.125;  // exact in float32 attributes
  OptimizerConfig hf = OptimizerConfig::defaults(OptimizerType::kHFAdamW);
  hf.weight_decay = 0.25;
  for (OptimizerConfig cfg : {OptimizerConfig::defaults(OptimizerType::kAdamW), adam, hf, sgd, lamb,
                              OptimizerConfig::defaults(OptimizerType::kAdagrad)}) {
    for (bool in_place : {true, false}) {
      SCOPED_TRACE(std::string(optimizer_type_name(cfg.type)) + (in_place ? " in place" : " copy"));
      // Attributes are float32: compare against the config they round-trip to.
      OptimizerConfig c = config_from_update_node(update_node(cfg, 1, in_place));
      EXPECT_EQ(c.type, cfg.type);
      EXPECT_EQ(c.amsgrad, cfg.amsgrad);
      EXPECT_EQ(c.nesterov, cfg.nesterov);
      c.lr = double(0.05f);  // the op reads its float32 lr input
      std::mt19937 rng(3);
      const std::vector<Shape> shapes = {{4, 5}, {3}};
      std::vector<Tensor> inputs = {Tensor::scalar<float>(0.05f), Tensor::scalar<int64_t>(1)};
      std::vector<Tensor> params, grads;
      for (const auto& s : shapes) params.push_back(to_tensor<float>(random_vec(rng, numel(s)), s));
      for (const auto& s : shapes) grads.push_back(to_tensor<float>(random_vec(rng, numel(s)), s));
      for (auto& p : params) inputs.push_back(p.clone());
      for (auto& g : grads) inputs.push_back(g);
      size_t k = c.state_names().size();
      for (size_t s = 0; s < k; ++s)
        for (const auto& sh : shapes) inputs.push_back(Tensor::zeros(DType::kFloat32, sh));
      std::vector<Tensor> before;
      for (auto& t : inputs) before.push_back(t.clone());

      Node node = update_node(cfg, int64_t(shapes.size()), in_place);
      // Two steps through the op (the second one feeds the first one's outputs back).
      auto out = run_node_once(node, 1, inputs);
      ASSERT_EQ(out.size(), shapes.size() * (1 + k));
      std::vector<Tensor> in2 = {Tensor::scalar<float>(0.05f), Tensor::scalar<int64_t>(2)};
      for (size_t j = 0; j < shapes.size(); ++j) in2.push_back(out[j]);
      for (auto& g : grads) in2.push_back(g);
      for (size_t j = shapes.size(); j < out.size(); ++j) in2.push_back(out[j]);
      auto out2 = run_node_once(node, 1, in2);

      MultiTensorOptimizer opt(c);
      OptimizerState st;
      opt.step(params, grads, st);
      opt.step(params, grads, st);
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(from_tensor<float>(out2[i]), from_tensor<float>(params[i])) << "parameter " << i;
        EXPECT_EQ(out2[i].shape(), shapes[i]);
        // In place: the output is the input's buffer; otherwise the input is untouched.
        EXPECT_EQ(out[i].data() == inputs[2 + i].data(), in_place);
        if (!in_place) {
          EXPECT_EQ(from_tensor<float>(inputs[2 + i]), from_tensor<float>(before[2 + i]));
        }
      }
      for (size_t s = 0; s < k; ++s)
        for (size_t i = 0; i < shapes.size(); ++i)
          EXPECT_EQ(from_tensor<float>(out2[shapes.size() * (1 + s) + i]),
                    from_tensor<float>(st.tensors.at(c.state_names()[s])[i]));
    }
  }
}

TEST(OptimOps, RegisteredAndChecked) {
  for (const char* op : {"AdamW", "Adam", "SGD", "Lamb", "Adagrad"}) {
    const OpSchema* s = OpRegistry::global().find(kOnnxTrainDomain, op, 1);
    ASSERT_NE(s, nullptr) << op;
    EXPECT_EQ(s->gradient_status, GradientStatus::kNotDifferentiable) << op;
    EXPECT_TRUE(bool(s->shape)) << op;
  }
  OptimizerConfig cfg = OptimizerConfig::defaults(OptimizerType::kAdamW);
  Node node = update_node(cfg, 1, true);
  std::vector<Tensor> inputs = {Tensor::scalar<float>(0.1f), Tensor::scalar<int64_t>(1), Tensor::zeros(DType::kFloat32, {2}),
                                Tensor::zeros(DType::kFloat32, {2}), Tensor::zeros(DType::kFloat32, {2})};
  EXPECT_NE(error_of([&] { run_node_once(node, 1, inputs); }).find("equally long lists"), std::string::npos);
  inputs.push_back(Tensor::zeros(DType::kFloat32, {3}));  // exp_avg_sq of the wrong shape
  std::string msg = error_of([&] { run_node_once(node, 1, inputs); });
  EXPECT_NE(msg.find("node 'update'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exp_avg_sq"), std::string::npos) << msg;
  inputs[5] = Tensor::zeros(DType::kFloat32, {2});
  inputs[1] = Tensor::scalar<float>(1.0f);
  EXPECT_NE(error_of([&] { run_node_once(node, 1, inputs); }).find("step"), std::string::npos);
}

// ---- LR schedules --------------------------------------------------------------------------------

TEST(LRSchedule, LinearMatchesOnnxRuntime) {
  // warmup 4, total 10: 0, .25, .5, .75, then (10 - s) / 6, 0 from 10 on.
  const double lr = 0.1;
  EXPECT_DOUBLE_EQ(linear_lr(0, 4, 10, lr), 0.0);
  EXPECT_DOUBLE_EQ(linear_lr(1, 4, 10, lr), 0.025);
  EXPECT_DOUBLE_EQ(linear_lr(3, 4, 10, lr), 0.075);
  EXPECT_DOUBLE_EQ(linear_lr(4, 4, 10, lr), 0.1);
  EXPECT_DOUBLE_EQ(linear_lr(7, 4, 10, lr), 0.05);
  EXPECT_DOUBLE_EQ(linear_lr(10, 4, 10, lr), 0.0);
  EXPECT_DOUBLE_EQ(linear_lr(15, 4, 10, lr), 0.0);
  EXPECT_DOUBLE_EQ(linear_lr(0, 0, 10, lr), 0.1);   // no warmup
  EXPECT_DOUBLE_EQ(linear_lr(5, 0, 10, lr), 0.05);
}

TEST(LRSchedule, CosineStepConstant) {
  const double lr = 2.0, pi = std::acos(-1.0);
  EXPECT_DOUBLE_EQ(cosine_lr(0, 2, 12, lr), 0.0);
  EXPECT_DOUBLE_EQ(cosine_lr(1, 2, 12, lr), 1.0);
  EXPECT_DOUBLE_EQ(cosine_lr(2, 2, 12, lr), 2.0);
  EXPECT_NEAR(cosine_lr(7, 2, 12, lr), 1.0, 1e-15);  // halfway
  EXPECT_NEAR(cosine_lr(12, 2, 12, lr), 0.0, 1e-15);
  EXPECT_NEAR(cosine_lr(5, 2, 12, lr), lr * 0.5 * (1 + std::cos(pi * 0.3)), 1e-15);
  EXPECT_NEAR(cosine_lr(7, 2, 12, lr, 1.0), 0.0, 1e-15);  // one full cycle: zero halfway ...
  EXPECT_NEAR(cosine_lr(12, 2, 12, lr, 1.0), 2.0, 1e-15);  // ... and back up
  EXPECT_DOUBLE_EQ(step_lr(0, 3, 0.5, lr), 2.0);
  EXPECT_DOUBLE_EQ(step_lr(2, 3, 0.5, lr), 2.0);
  EXPECT_DOUBLE_EQ(step_lr(3, 3, 0.5, lr), 1.0);
  EXPECT_DOUBLE_EQ(step_lr(7, 3, 0.5, lr), 0.5);
  EXPECT_DOUBLE_EQ(constant_lr(0, 4, lr), 0.0);
  EXPECT_DOUBLE_EQ(constant_lr(2, 4, lr), 1.0);
  EXPECT_DOUBLE_EQ(constant_lr(4, 4, lr), 2.0);
  EXPECT_DOUBLE_EQ(constant_lr(400, 4, lr), 2.0);
}

TEST(LRSchedule, NamedConstructorsValidate) {
  LRSchedule s = LRSchedule::linear(2, 4, 1.0);
  EXPECT_DOUBLE_EQ(s.value(0), 0.0);
  EXPECT_DOUBLE_EQ(s.value(1), 0.5);
  EXPECT_DOUBLE_EQ(s.value(2), 1.0);
  EXPECT_DOUBLE_EQ(s.value(3), 0.5);
  EXPECT_DOUBLE_EQ(s.value(4), 0.0);
  EXPECT_NEAR(LRSchedule::stepped(2, 0.1, 1.0).value(2), 0.1, 1e-16);
  EXPECT_THROW(LRSchedule::linear(5, 3, 1.0), Error);  // total < warmup
  EXPECT_THROW(LRSchedule::stepped(0, 0.1, 1.0), Error);
  EXPECT_THROW(LRSchedule::constant(-1, 1.0), Error);
}

}  // namespace
}  // namespace onnxtrain::optim

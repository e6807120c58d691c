// The memory optimizer on a two-layer pre-LN transformer built by hand: clusters and bytes as
// computed by hand, training bit-identical with and without recompute, a smaller arena at level 1,
// the TrainModule split, and bad configs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "onnxtrain/artifacts.h"
#include "passes/memory_optimizer.h"
#include "runtime/executor.h"
#include "test_util.h"
#include "training/artifacts.h"
#include "training/forward_backward.h"

namespace onnxtrain {
using test::make_model;
using test::make_node;
using test::value;

namespace {

constexpr int64_t kS = 4, kH = 8, kF = 32, kLayers = 2;

Tensor filled(Shape shape, float scale, float shift) {
  std::vector<float> v(size_t(numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(float(i) * 0.37f + shift);
  return Tensor::from_vector(v, shape);
}

// x [batch, S, H] -> kLayers x (x + Attn(LN(x)), then x + W2 Gelu(W1 LN(x))), attention
// probabilities through Dropout(0.1).
Model transformer(bool symbolic_batch, int64_t batch = 2) {
  Graph g;
  ValueInfo x{DType::kFloat32, Shape{symbolic_batch ? -1 : batch, kS, kH}, {symbolic_batch ? "batch" : "", "", ""}};
  g.inputs = {{"x", x}};
  g.initializers["scale"] = Tensor::scalar<float>(0.35f);
  g.initializers["ratio"] = Tensor::scalar<float>(0.1f);
  Tensor training = Tensor::empty(DType::kBool, Shape{});
  training.data<bool>()[0] = true;
  g.initializers["training"] = training;
  std::string cur = "x";
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "L" + std::to_string(l) + "_";
    for (const char* ln : {"ln1", "ln2"}) {
      g.initializers[p + ln + "_g"] = filled({kH}, 0.2f, 1.0f + float(l));
      g.initializers[p + ln + "_b"] = filled({kH}, 0.1f, 2.0f);
    }
    for (const char* w : {"Wq", "Wk", "Wv", "Wo"}) g.initializers[p + w] = filled({kH, kH}, 0.3f, float(w[1]) + float(l));
    g.initializers[p + "W1"] = filled({kH, kF}, 0.3f, 0.5f + float(l));
    g.initializers[p + "W2"] = filled({kF, kH}, 0.3f, 0.7f + float(l));
    auto n = [&](std::string op, std::vector<std::string> in, std::vector<std::string> out) {
      for (auto& v : in) if (v.rfind("$", 0) == 0) v = p + v.substr(1);
      for (auto& v : out) v = p + v;
      g.nodes.push_back(make_node(std::move(op), std::move(in), std::move(out)));
      return &g.nodes.back();
    };
    n("LayerNormalization", {cur, "$ln1_g", "$ln1_b"}, {"h"});
    for (const char* w : {"q", "k", "v"}) n("MatMul", {"$h", std::string("$W") + w}, {w});
    n("Transpose", {"$k"}, {"kt"})->attributes["perm"] = Attribute::of(std::vector<int64_t>{0, 2, 1});
    n("MatMul", {"$q", "$kt"}, {"s"});
    n("Mul", {"$s", "scale"}, {"ss"});
    n("Softmax", {"$ss"}, {"prob"})->attributes["axis"] = Attribute::of(int64_t(-1));
    n("Dropout", {"$prob", "ratio", "training"}, {"pd"});
    n("MatMul", {"$pd", "$v"}, {"c"});
    n("MatMul", {"$c", "$Wo"}, {"o"});
    n("Add", {cur, "$o"}, {"x1"});
    n("LayerNormalization", {"$x1", "$ln2_g", "$ln2_b"}, {"h2"});
    n("MatMul", {"$h2", "$W1"}, {"f1"});
    n("Gelu", {"$f1"}, {"a"})->domain = kOnnxTrainDomain;
    n("MatMul", {"$a", "$W2"}, {"f2"});
    n("Add", {"$x1", "$f2"}, {"x2"});
    cur = p + "x2";
  }
  g.outputs = {{cur, ValueInfo{}}};
  Model m = make_model(std::move(g), 17);
  m.opsets[kOnnxTrainDomain] = 1;
  return m;
}

TrainingGraphs training_graphs(const Model& m) {
  TrainingGraphOptions o;
  for (const auto& [name, t] : m.graph.initializers)
    if (t.numel() > 1) o.requires_grad.push_back(name);
  o.loss = LossType::kMSE;
  return build_training_graphs(m, o);
}

struct TrainRun {
  std::vector<float> losses;
  std::map<std::string, Tensor> params;
  size_t arena = 0;
  MemoryReport report;
};

// 20 SGD steps through the training graph, Dropout seeded alike.
TrainRun train(const Model& inference, const TrainingGraphs& graphs, int steps = 20) {
  Executor exec(graphs.training, ExecutorOptions{false, false, 1234});
  TrainRun run;
  for (const auto& name : graphs.trainable) run.params[name] = inference.graph.initializers.at(name).clone();
  const Tensor x = filled({2, kS, kH}, 1.0f, 0.3f), target = filled({2, kS, kH}, 0.5f, 1.1f);
  for (int s = 0; s < steps; ++s) {
    std::map<std::string, Tensor> feeds{{"x", x}, {"target", target}};
    for (const auto& [k, v] : run.params) feeds[k] = v;
    std::vector<std::string> outs{graphs.loss_output};
    outs.insert(outs.end(), graphs.gradient_outputs.begin(), graphs.gradient_outputs.end());
    auto r = exec.run(feeds, outs);
    run.losses.push_back(r[0].data<float>()[0]);
    for (size_t i = 0; i < graphs.trainable.size(); ++i) {
      float* p = run.params[graphs.trainable[i]].data<float>();
      const float* gr = r[i + 1].data<float>();
      for (int64_t k = 0; k < r[i + 1].numel(); ++k) p[k] -= 0.05f * gr[k];
    }
  }
  run.report = exec.memory_report();
  run.arena = run.report.planned_arena_bytes;
  return run;
}

void expect_bit_identical(const TrainRun& a, const TrainRun& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << what << ": step " << i;
  for (const auto& [name, t] : a.params)
    EXPECT_EQ(std::memcmp(t.data(), b.params.at(name).data(), t.nbytes()), 0) << what << ": parameter " << name;
}

const RecomputeCluster* find(const MemoryPlan& plan, const std::string& name) {
  for (const auto& c : plan.clusters) if (c.name == name) return &c;
  return nullptr;
}

std::string names(const MemoryPlan& plan) {
  std::string s;
  for (const auto& c : plan.clusters) s += c.name + " ";
  return s;
}

}  // namespace

TEST(MemoryOptimizer, PlanTableHasTheClustersAndBytesByHand) {
  TrainingGraphs graphs = training_graphs(transformer(/*symbolic_batch=*/true));
  MemoryPlan plan = analyze_memory(graphs.training, default_forward_outputs(graphs.training.graph), {}, {{"batch", 2}});
  // Gelu's output [batch, S, F] fp32 is read by dW2 = a^T df2; Gelu's input stays for GeluGrad, so
  // one Gelu recomputes it: 4 * S * F = 512 bytes per batch row, 8 FLOPs per element.
  const RecomputeCluster* gelu = find(plan, "Gelu+");
  ASSERT_NE(gelu, nullptr) << names(plan);
  EXPECT_EQ(gelu->stashed.size(), size_t(kLayers));
  EXPECT_EQ(gelu->bytes_formula, "512*batch");
  EXPECT_EQ(gelu->bytes_saved, 1024);
  EXPECT_EQ(gelu->extra_flops, 8 * 2 * kS * kF);
  // Dropout's output [batch, S, S] (read by dV = pd^T dc) is re-applied from the kept mask.
  const RecomputeCluster* dropout = find(plan, "Dropout+");
  ASSERT_NE(dropout, nullptr) << names(plan);
  EXPECT_EQ(dropout->bytes_formula, "64*batch");
  EXPECT_EQ(dropout->bytes_saved, 128);
  EXPECT_GT(plan.stashed_bytes_before, 0);
  EXPECT_EQ(plan.stashed_bytes_after, plan.stashed_bytes_before) << "level 0 without config applies nothing";
  EXPECT_TRUE(plan.recompute_nodes.empty());
  const std::string table = plan_table(plan);
  EXPECT_NE(table.find("Gelu+ | 2 | 512*batch | 1024"), std::string::npos) << table;
}

TEST(MemoryOptimizer, RecomputeTrainsBitIdenticallyWithLessMemory) {
  const Model m = transformer(false);
  TrainingGraphs base = training_graphs(m);
  const TrainRun dense = train(m, base);
  const TrainingGraphs& dense_graphs = base;

  TrainingGraphs layerwise = training_graphs(m);
  MemoryPlan plan = optimize_memory(layerwise.training, default_forward_outputs(layerwise.training.graph), {1, ""});
  EXPECT_EQ(plan.layer_boundaries, 2 * int(kLayers) + 1) << plan_table(plan);  // the input, each residual sum
  EXPECT_FALSE(plan.recompute_nodes.empty());
  EXPECT_LT(plan.stashed_bytes_after, plan.stashed_bytes_before * 6 / 10) << plan_table(plan);
  EXPECT_EQ(layerwise.training.metadata.count(kMetaMemoryPlan), 1u);
  const TrainRun level1 = train(m, layerwise);
  expect_bit_identical(dense, level1, "level 1");
  EXPECT_LT(level1.arena, dense.arena) << "recomputed values live only from recompute to last use";
  // The executor's own account: stashed buffers shrink, the peak's stashed part too.
  EXPECT_GT(dense.report.stashed_bytes, 0u);
  EXPECT_LT(level1.report.stashed_bytes, dense.report.stashed_bytes);
  EXPECT_LT(level1.report.stashed_at_peak_bytes, dense.report.stashed_at_peak_bytes);
  EXPECT_LE(dense.report.peak_live_bytes, dense.report.planned_arena_bytes);
  EXPECT_LE(dense.report.stashed_at_peak_bytes, dense.report.peak_live_bytes);

  // Level 1 keeps the FFN up-projection's output (it ranks below the goal by bytes per FLOP: see
  // LevelOneRecomputesTheMostBytesPerFlopFirst); a config entry on top recomputes it as well.
  auto backward_reads = [](const Model& model, const std::string& v) {  // a node outside the forward reads v
    const Graph& g = model.graph;
    const auto producers = g.producers();
    std::set<size_t> forward;
    std::vector<std::string> pending = default_forward_outputs(g);
    while (!pending.empty()) {
      auto it = producers.find(pending.back());
      pending.pop_back();
      if (it == producers.end() || !forward.insert(it->second).second) continue;
      for (const auto& in : g.nodes[it->second].inputs) pending.push_back(in);
    }
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (!forward.count(i))
        for (const auto& in : g.nodes[i].inputs) if (in == v) return true;
    return false;
  };
  EXPECT_TRUE(backward_reads(dense_graphs.training, "L0_h")) << "the dense backward reads the LayerNorm output";
  EXPECT_TRUE(backward_reads(layerwise.training, "L0_f1")) << to_string(layerwise.training.graph);
  EXPECT_FALSE(backward_reads(layerwise.training, "L0_h")) << "the attention's LayerNorm output is recomputed";
  TrainingGraphs all = training_graphs(m);
  MemoryPlan all_plan = optimize_memory(all.training, {}, {1, "MatMul+:1:-1"});
  EXPECT_FALSE(backward_reads(all.training, "L0_f1")) << plan_table(all_plan);
  EXPECT_LT(all_plan.stashed_bytes_after, plan.stashed_bytes_after);
  expect_bit_identical(dense, train(m, all), "level 1 + config");

  TrainingGraphs configured = training_graphs(m);
  optimize_memory(configured.training, {}, {0, "Gelu+:1:-1,Dropout+:1:1"});
  expect_bit_identical(dense, train(m, configured), "config");

  TrainingGraphs level2 = training_graphs(m);
  optimize_memory(level2.training, {}, {2, ""});
  expect_bit_identical(dense, train(m, level2), "level 2");
}

// Level 1 ranks the stashed values inside the layers by bytes saved per FLOP of recomputing each
// (every other stashed value kept) and recomputes the best until 45% of the stashed bytes are
// saved. By hand, per layer (batch 2, fp32; S = 4, H = 8, F = 32):
//   pd   = Dropout(prob)  2*S*S*4  = 128 B, re-applied from the mask: 2*S*S = 32        -> 4
//   h, h2 = LayerNorm      2*S*H*4  = 256 B, 8 FLOPs per element: 512                   -> 1/2
//   c    = pd v           256 B, 2 * (2*S*H) * S = 512                                 -> 1/2
//   a    = Gelu(f1)       2*S*F*4  = 1024 B, 8 per element: 2048                       -> 1/2
//   q, k, v = h W         256 B, 2 * (2*S*H) * H = 1024                                -> 1/4
//   f1   = h2 W1          1024 B, 2 * (2*S*F) * H = 4096                               -> 1/4
//   prob = Softmax(q k^T * scale)  128 B, 2*(2*S*S)*H + 32 + 8*32 = 800                -> 0.16
// o and f2 are read by the backward only for their shape (sum_to): not candidates.
TEST(MemoryOptimizer, LevelOneRecomputesTheMostBytesPerFlopFirst) {
  TrainingGraphs graphs = training_graphs(transformer(false));
  const TrainRun dense = train(transformer(false), graphs);
  MemoryPlan plan = optimize_memory(graphs.training, {}, {1, ""});
  std::map<std::string, MemoryPlan::LayerwiseCandidate> by_value;
  std::string ranked;
  for (const auto& c : plan.layerwise) {
    by_value[c.value] = c;
    ranked += c.value + (c.recomputed ? "* " : " ");
  }
  const std::string table = plan_table(plan) + "ranked (* recomputed): " + ranked;
  const std::map<std::string, std::pair<int64_t, int64_t>> by_hand = {
      {"pd", {128, 32}}, {"h", {256, 512}}, {"h2", {256, 512}}, {"c", {256, 512}}, {"a", {1024, 2048}},
      {"q", {256, 1024}}, {"k", {256, 1024}}, {"v", {256, 1024}}, {"f1", {1024, 4096}}, {"prob", {128, 800}}};
  ASSERT_EQ(plan.layerwise.size(), by_hand.size() * kLayers) << table;
  for (int64_t l = 0; l < kLayers; ++l)
    for (const auto& [name, bytes_cost] : by_hand) {
      const std::string v = "L" + std::to_string(l) + "_" + name;
      ASSERT_EQ(by_value.count(v), 1u) << v << "\n" << table;
      EXPECT_EQ(by_value[v].bytes, bytes_cost.first) << v;
      EXPECT_EQ(by_value[v].cost, bytes_cost.second) << v;
    }
  // Stashed and read for data: the candidates (3840 B a layer), the dropout masks (2*S*S bools,
  // 32 B), the residual sums L0_x1, L0_x2 and L1_x1 (kept: the boundaries; x is a graph input and
  // L1_x2 an output) and MSE's difference (256 B): 2 * (3840 + 32) + 3 * 256 + 256 = 8768 B; the
  // goal is 45% of it, 3945 B.
  EXPECT_EQ(plan.stashed_bytes_before, 8768) << table;
  // Taken by ratio: both pd (4 B per FLOP), then h, c, h2, a of both layers (1/2): 256 + 2 * 1792
  // = 3840 B. 105 B are missing: next by ratio is L0_q (256 B for 1024 FLOPs), but L0_prob (128 B)
  // reaches the goal alone for 800 FLOPs, so it is taken instead and the rest are kept.
  std::set<std::string> recomputed;
  for (const auto& c : plan.layerwise) if (c.recomputed) recomputed.insert(c.value);
  const std::set<std::string> expected = {"L0_pd", "L1_pd", "L0_h", "L0_c", "L0_h2", "L0_a",
                                          "L1_h", "L1_c", "L1_h2", "L1_a", "L0_prob"};
  EXPECT_EQ(recomputed, expected) << table;
  EXPECT_EQ(plan.stashed_bytes_after, 8768 - 3968) << table;
  EXPECT_NE(table.find("11 of 20 stashed values inside the layers recomputed"), std::string::npos) << table;
  const TrainRun level1 = train(transformer(false), graphs);
  expect_bit_identical(dense, level1, "level 1");
}

TEST(MemoryOptimizer, TrainModuleSplitSavesFewerValues) {
  const Model m = transformer(false);
  ForwardBackwardOptions o;
  for (const auto& [name, t] : m.graph.initializers)
    if (t.numel() > 1) o.bind.push_back(name), o.wrt.push_back(name);
  ForwardBackwardGraphs plain = build_forward_backward(m, o);
  o.memory.level = 1;
  ForwardBackwardGraphs recompute = build_forward_backward(m, o);
  EXPECT_LT(recompute.saved.size(), plain.saved.size());
  EXPECT_FALSE(recompute.memory_plan.recompute_nodes.empty());
  for (const auto& node : recompute.forward.graph.nodes)
    EXPECT_EQ(node.name.find("/recompute"), std::string::npos) << node.name << " belongs to the backward";

  // Same gradients: forward, then backward from the saved values.
  auto gradients = [&](const ForwardBackwardGraphs& fb) {
    Executor fwd(fb.forward, ExecutorOptions{false, false, 7}), bwd(fb.backward);
    std::map<std::string, Tensor> feeds{{"x", filled({2, kS, kH}, 1.0f, 0.3f)}};
    for (const auto& [name, t] : m.graph.initializers) feeds[name] = t;
    std::map<std::string, Tensor> f;
    for (const auto& name : fb.forward_feeds) f[name] = feeds.at(name);
    auto outs = fwd.run(f);
    std::map<std::string, Tensor> b;
    for (const auto& name : fb.backward_feeds) b[name] = feeds.at(name);
    for (const auto& s : fb.saved)
      for (size_t k = 0; k < fb.forward.graph.outputs.size(); ++k)
        if (fb.forward.graph.outputs[k].name == s) b[s] = outs[k];
    b[fb.seeds.at(0)] = filled({2, kS, kH}, 0.1f, 0.9f);
    return bwd.run(b);
  };
  auto g0 = gradients(plain), g1 = gradients(recompute);
  ASSERT_EQ(g0.size(), g1.size());
  for (size_t i = 0; i < g0.size(); ++i)
    EXPECT_EQ(std::memcmp(g0[i].data(), g1[i].data(), g0[i].nbytes()), 0) << plain.gradients[i];
}

// kLayers x (x + W2 (h * Sigmoid(h) * u)) with h = W1 x, u = W3 x: the SwiGLU MLP of LLMs, with
// a symbolic batch so that the Muls' gradients take sum_to's Shape of their forward operands.
Model swiglu_mlp() {
  Graph g;
  g.inputs = {{"x", ValueInfo{DType::kFloat32, Shape{-1, kS, kH}, {"batch", "", ""}}}};
  std::string cur = "x";
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "L" + std::to_string(l) + "_";
    g.initializers[p + "W1"] = filled({kH, kF}, 0.3f, 0.5f + float(l));
    g.initializers[p + "W3"] = filled({kH, kF}, 0.3f, 0.9f + float(l));
    g.initializers[p + "W2"] = filled({kF, kH}, 0.3f, 0.7f + float(l));
    g.nodes.push_back(make_node("MatMul", {cur, p + "W1"}, {p + "h"}));
    g.nodes.push_back(make_node("MatMul", {cur, p + "W3"}, {p + "u"}));
    g.nodes.push_back(make_node("Sigmoid", {p + "h"}, {p + "s"}));
    g.nodes.push_back(make_node("Mul", {p + "h", p + "s"}, {p + "a"}));
    g.nodes.push_back(make_node("Mul", {p + "a", p + "u"}, {p + "m"}));
    g.nodes.push_back(make_node("MatMul", {p + "m", p + "W2"}, {p + "y"}));
    g.nodes.push_back(make_node("Add", {cur, p + "y"}, {p + "x1"}));
    cur = p + "x1";
  }
  g.outputs = {{cur, ValueInfo{}}};
  return make_model(std::move(g), 17);
}

// Autodiff places sum_to's Shape of a forward value beside the value's producer; a recomputed
// copy must still be emitted before its first data reader in the backward, not before that
// Shape (which put the copy in the forward, so it was stashed after all and the arena kept it).
TEST(MemoryOptimizer, RecomputedCopiesRunInTheBackwardDespiteShapeReaders) {
  const Model m = swiglu_mlp();
  const TrainingGraphs base = training_graphs(m);
  bool shape_in_forward = false;
  for (const auto& n : base.training.graph.nodes) {
    if (n.op_type == "Sigmoid") break;
    shape_in_forward = shape_in_forward || (n.op_type == "Shape" && n.inputs[0] == "L0_h");
  }
  ASSERT_TRUE(shape_in_forward) << "the case needs a Shape of a forward value inside the forward";
  TrainingGraphs rc = training_graphs(m);
  MemoryPlan plan = optimize_memory(rc.training, {}, {0, "Sigmoid+:1:-1,Mul+:1:-1"});
  ASSERT_FALSE(plan.recompute_nodes.empty()) << plan_table(plan);
  const auto& nodes = rc.training.graph.nodes;
  size_t last_forward = 0;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& o : nodes[i].outputs) if (o == rc.loss_output) last_forward = i;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].name.find("/recompute") == std::string::npos) continue;
    EXPECT_GT(i, last_forward) << nodes[i].name << " runs in the forward";
  }
  const TrainRun dense = train(m, base), recomputed = train(m, rc);
  expect_bit_identical(dense, recomputed, "SwiGLU recompute");
  // Per layer and batch row, s, h * s and their product with u (3 x S x F floats) are no longer
  // live at the end of the forward.
  EXPECT_LE(recomputed.report.peak_live_bytes + 3 * 4 * 2 * kS * kF, dense.report.peak_live_bytes)
      << recomputed.report.peak_live_bytes << " vs " << dense.report.peak_live_bytes;
}

TEST(MemoryOptimizer, BadConfigsListTheClusters) {
  TrainingGraphs graphs = training_graphs(transformer(false));
  Model& t = graphs.training;
  std::string e = test::error_of([&] { optimize_memory(t, {}, {0, "Nope+:1:-1"}); });
  EXPECT_NE(e.find("names no cluster"), std::string::npos) << e;
  EXPECT_NE(e.find("Gelu+"), std::string::npos) << e;
  e = test::error_of([&] { optimize_memory(t, {}, {0, "Gelu+:1"}); });
  EXPECT_NE(e.find("is not cluster:strategy:count"), std::string::npos) << e;
  e = test::error_of([&] { optimize_memory(t, {}, {0, "Gelu+:7:-1"}); });
  EXPECT_NE(e.find("strategy must be"), std::string::npos) << e;
  e = test::error_of([&] { optimize_memory(t, {}, {3, ""}); });
  EXPECT_NE(e.find("level must be 0, 1 or 2, got 3"), std::string::npos) << e;
  EXPECT_NE(e.find("Dropout+"), std::string::npos) << e;
  // Gelu+ has no cheaper part: a compromised plan is reported, not applied.
  const size_t nodes = t.graph.nodes.size();
  MemoryPlan plan = optimize_memory(t, {}, {0, "Gelu+:2:-1"});
  EXPECT_EQ(t.graph.nodes.size(), nodes);
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes[0].find("not applied"), std::string::npos) << plan.notes[0];
}

}  // namespace onnxtrain

// onnxtrain's training graphs in ONNX Runtime training's conventions (ort_export.h). Each
// onnxtrain-domain op of a training graph has one ORT form here:
//
//   same op, com.microsoft      ReluGrad, ConvGrad, LayerNormalizationGrad (with the forward's Mean
//                               and InvStdDev), SliceGrad, Gelu/GeluGrad (FastGelu/FastGeluGrad for
//                               approximate="tanh"), FusedMatMul, SoftmaxCrossEntropyLossGrad
//   renamed or reordered        SoftmaxGrad -> SoftmaxGrad_13 (SoftmaxGrad with coerce_2d), the same
//                               for LogSoftmaxGrad; GatherGrad(dY, shape, idx) -> (shape, idx, dY)
//   ORT's pair                  BatchNormalization(training_mode=1) + BatchNormalizationGrad ->
//                               BatchNormInternal + com.microsoft.BatchNormalizationGrad over its
//                               saved mean and inverse std; MaxPool + MaxPoolGrad(dY, X) -> MaxPool
//                               with Indices + ai.onnx MaxPoolGrad(dY, Indices), ORT's domain for it
//   ai.onnx ops                 SumTo(X, shape) = Reshape(ReduceSum(X, BroadcastGradientArgs(shape,
//                               Shape(X))[0], keepdims, noop_with_empty_axes), shape);
//                               GlobalPoolGrad (average) = Expand(dY / spatial size, Shape(X));
//                               ClipGrad(dY, X, Y) = Where(X == Y, dY, 0)
#include "training/ort_export.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "onnxtrain/training.h"
#include "optim/optimizer.h"

namespace onnxtrain {
namespace {

const std::string kBufferSuffix = "_grad.accumulation.buffer";
const std::string kAccumulatedSuffix = "_grad.accumulation.out";
const std::string kLazyReset = "lazy_reset_grad";

using Attrs = std::map<std::string, Attribute>;

// Rewrites one graph's nodes into `out`, inventing value names that collide with none.
class OrtRewriter {
 public:
  OrtRewriter(Model& model, const char* which) : model_(model), g_(model.graph), which_(which) {
    for (const Node& n : g_.nodes)
      for (const auto& o : n.outputs) names_.insert(o);
    for (const auto& in : g_.inputs) names_.insert(in.name);
    for (const auto& [name, t] : g_.initializers) names_.insert(name);
  }

  void run() {
    index_forwards();
    std::vector<Node> nodes = std::move(g_.nodes);
    g_.nodes.clear();
    for (Node& n : nodes) rewrite(std::move(n));
    for (Node& n : g_.nodes) {
      if (n.domain != kOnnxTrainDomain) continue;
      OT_THROW(kNotImplemented, n.context(), "generate_artifacts(ort_compatible): the ", which_, " graph uses onnxtrain's op '",
               n.op_type, "', which has no ONNX Runtime training form here");
    }
    model_.opsets.erase(kOnnxTrainDomain);  // none is left
    model_.opsets[kMsDomain] = 1;
    g_.topological_sort();
  }

 private:
  std::string fresh(const std::string& base) {
    std::string name = base;
    for (int k = 1; names_.count(name); ++k) name = base + "_" + std::to_string(k);
    names_.insert(name);
    return name;
  }
  std::string constant(const std::string& base, Tensor t) {
    std::string name = fresh(base);
    g_.initializers[name] = std::move(t);
    return name;
  }
  std::string emit(const std::string& op, std::vector<std::string> inputs, Attrs attrs, const std::string& at,
                   const std::string& domain = kOnnxDomain) {
    std::string out = fresh(at + "/" + op);
    g_.nodes.push_back(Node{out, op, domain, std::move(inputs), {out}, std::move(attrs)});
    return out;
  }

  // First pass: the outputs backward ops read from their forwards (BatchNormInternal's saved
  // statistics, MaxPool's Indices, LayerNormalization's Mean and InvStdDev) are added in place.
  void index_forwards() {
    std::map<std::pair<std::string, std::string>, size_t> batch_norm, layer_norm;
    std::map<std::string, size_t> max_pool, cross_entropy;
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      Node& n = g_.nodes[i];
      if (n.op_type == "SoftmaxCrossEntropyLoss" && (n.domain.empty() || n.domain == kOnnxTrainDomain))
        cross_entropy[n.inputs[0]] = i;
      if (!n.domain.empty()) continue;
      if (n.op_type == "MaxPool") max_pool[n.inputs[0]] = i;
      if (n.op_type == "LayerNormalization" && n.inputs.size() >= 2) layer_norm[{n.inputs[0], n.inputs[1]}] = i;
      if (n.op_type == "BatchNormalization" && n.attr_int("training_mode", 0) == 1) {
        batch_norm[{n.inputs[0], n.inputs[1]}] = i;
        n.outputs.resize(5);  // Y, running mean and var, saved mean and inverse std
        const char* suffix[] = {"", "_running_mean", "_running_var", "_saved_mean", "_saved_inv_std"};
        for (size_t k = 1; k < 5; ++k)
          if (n.outputs[k].empty()) n.outputs[k] = fresh(n.outputs[0] + suffix[k]);
      }
    }
    auto forward = [&](auto& map, const auto& key, const Node& grad) -> Node& {
      auto it = map.find(key);
      OT_CHECK(it != map.end(), grad.context(), "generate_artifacts(ort_compatible): the forward node of this gradient "
               "was not found");
      return g_.nodes[it->second];
    };
    for (Node& n : g_.nodes) {
      if (n.domain != kOnnxTrainDomain) continue;
      if (n.op_type == "SoftmaxCrossEntropyLossGrad" && n.attr_int("from_scores", 0) != 0) {
        // ORT's gradient reads the forward's log_prob output, never the scores.
        Node& fwd = forward(cross_entropy, n.inputs[1], n);
        if (!fwd.has_output(1)) {
          fwd.outputs.resize(2);
          fwd.outputs[1] = fresh(fwd.outputs[0] + "_log_prob");
        }
        n.inputs[1] = fwd.outputs[1];
        n.attributes.erase("from_scores");
      } else if (n.op_type == "BatchNormalizationGrad") {
        const Node& fwd = forward(batch_norm, std::make_pair(n.inputs[1], n.inputs[2]), n);
        n.inputs = {n.inputs[0], n.inputs[1], n.inputs[2], fwd.outputs[3], fwd.outputs[4]};
      } else if (n.op_type == "MaxPoolGrad") {
        Node& fwd = forward(max_pool, n.inputs[1], n);
        if (!fwd.has_output(1)) {
          fwd.outputs.resize(2);
          fwd.outputs[1] = fresh(fwd.outputs[0] + "_indices");
        }
        n.inputs = {n.inputs[0], fwd.outputs[1]};
        n.attributes = fwd.attributes;
      } else if (n.op_type == "LayerNormalizationGrad" && (!n.has_input(3) || !n.has_input(4))) {
        Node& fwd = forward(layer_norm, std::make_pair(n.inputs[1], n.inputs[2]), n);
        fwd.outputs.resize(std::max<size_t>(fwd.outputs.size(), 3));
        if (fwd.outputs[1].empty()) fwd.outputs[1] = fresh(fwd.outputs[0] + "_mean");
        if (fwd.outputs[2].empty()) fwd.outputs[2] = fresh(fwd.outputs[0] + "_inv_std_dev");
        n.inputs = {n.inputs[0], n.inputs[1], n.inputs[2], fwd.outputs[1], fwd.outputs[2]};
      }
    }
  }

  void rewrite(Node n) {
    const std::string op = n.op_type;
    if (n.domain.empty() && op == "BatchNormalization" && n.attr_int("training_mode", 0) == 1) {
      // ORT's BatchNormInternal saves the statistics its BatchNormalizationGrad reads.
      n.domain = kMsDomain;
      n.op_type = "BatchNormInternal";
      g_.nodes.push_back(std::move(n));
      return;
    }
    if (n.domain != kOnnxTrainDomain) {
      g_.nodes.push_back(std::move(n));
      return;
    }
    if (op == "FusedMatMul" && n.has_input(2)) {  // ORT's has no bias input: Y = FusedMatMul(A, B) + bias
      OT_CHECK(!n.has_attr("output_dtype"), n.context(), "mixed precision is not ORT-compatible");
      const std::string at = n.name.empty() ? n.outputs[0] : n.name, bias = n.inputs[2], y = n.outputs[0];
      n.inputs.resize(2);
      n.outputs[0] = fresh(at + "/product");
      n.domain = kMsDomain;
      const std::string product = n.outputs[0];
      g_.nodes.push_back(std::move(n));
      g_.nodes.push_back(Node{at + "/bias", "Add", kOnnxDomain, {product, bias}, {y}, {}});
      return;
    }
    if (op == "ReluGrad" || op == "ConvGrad" || op == "SliceGrad" || op == "FusedMatMul" ||
        op == "SoftmaxCrossEntropyLossGrad") {
      OT_CHECK(op != "SoftmaxCrossEntropyLossGrad" || !n.has_output(1), n.context(),
               "ORT's SoftmaxCrossEntropyLossGrad has no class-weight gradient output");
      OT_CHECK(op != "FusedMatMul" || !n.has_attr("output_dtype"), n.context(), "mixed precision is not ORT-compatible");
      n.domain = kMsDomain;
    } else if (op == "Gelu" || op == "GeluGrad") {
      const bool tanh = n.attr_string("approximate", "none") == "tanh";
      n.attributes.erase("approximate");
      n.op_type = tanh ? (op == "Gelu" ? "FastGelu" : "FastGeluGrad") : op;
      n.domain = kMsDomain;
    } else if (op == "SoftmaxGrad" || op == "LogSoftmaxGrad") {
      const bool coerce = n.attr_int("coerce_2d", 0) != 0;
      n.attributes.erase("coerce_2d");
      n.op_type = coerce ? op : op + "_13";
      n.domain = kMsDomain;
    } else if (op == "GatherGrad") {  // onnxtrain's (dY, shape, idx), ORT's (shape, idx, dY)
      n.inputs = {n.inputs[1], n.inputs[2], n.inputs[0]};
      n.domain = kMsDomain;
    } else if (op == "LayerNormalizationGrad") {
      n.domain = kMsDomain;
    } else if (op == "BatchNormalizationGrad") {
      OT_CHECK(!n.has_output(3) && !n.has_output(4), n.context(),
               "gradients of the running statistics have no ORT form (ORT's BatchNormalizationGrad has 3 outputs)");
      n.outputs.resize(std::min<size_t>(n.outputs.size(), 3));
      n.attributes = {{"epsilon", Attribute::of(n.attr_float("epsilon", 1e-5f))}};  // the forward's
      n.domain = kMsDomain;
    } else if (op == "MaxPoolGrad") {
      n.domain = kOnnxDomain;  // where ORT registers its MaxPoolGrad (inputs and attributes set above)
    } else if (op == "SumTo") {
      const std::string at = n.name.empty() ? n.outputs[0] : n.name;
      std::string shape_x = emit("Shape", {n.inputs[0]}, {}, at);
      std::string axes = fresh(at + "/axes");
      g_.nodes.push_back(Node{axes, "BroadcastGradientArgs", kMsDomain, {n.inputs[1], shape_x}, {axes, ""}, {}});
      std::string summed = emit("ReduceSum", {n.inputs[0], axes},
                                {{"keepdims", Attribute::of(int64_t(1))}, {"noop_with_empty_axes", Attribute::of(int64_t(1))}}, at);
      g_.nodes.push_back(Node{at + "/Reshape", "Reshape", kOnnxDomain, {summed, n.inputs[1]}, {n.outputs[0]}, {}});
      return;
    } else if (op == "GlobalPoolGrad") {
      OT_CHECK(n.attr_string("mode", "") == "average", n.context(),
               "GlobalMaxPool's gradient has no ONNX Runtime form here");
      const std::string at = n.name.empty() ? n.outputs[0] : n.name;
      std::string shape_x = emit("Shape", {n.inputs[1]}, {}, at);
      std::string spatial = emit("Slice", {shape_x, constant(at + "/two", Tensor::from_vector<int64_t>({2}, {1})),
                                           constant(at + "/end", Tensor::from_vector<int64_t>({std::numeric_limits<int64_t>::max()}, {1}))},
                                 {}, at);
      std::string size = emit("ReduceProd", {spatial}, {{"keepdims", Attribute::of(int64_t(0))}}, at);
      std::string count = emit("Cast", {size}, {{"to", Attribute::of(int64_t(DType::kFloat32))}}, at);
      std::string scaled = emit("Div", {n.inputs[0], count}, {}, at);
      g_.nodes.push_back(Node{at + "/Expand", "Expand", kOnnxDomain, {scaled, shape_x}, {n.outputs[0]}, {}});
      return;
    } else if (op == "ClipGrad") {  // dY where X passed the clamp (X == Y), else 0
      const std::string at = n.name.empty() ? n.outputs[0] : n.name;
      std::string passed = emit("Equal", {n.inputs[1], n.inputs[2]}, {}, at);
      std::string zero = constant(at + "/zero", Tensor::scalar<float>(0.0f));
      g_.nodes.push_back(Node{at + "/Where", "Where", kOnnxDomain, {passed, n.inputs[0], zero}, {n.outputs[0]}, {}});
      return;
    }
    g_.nodes.push_back(std::move(n));
  }

  Model& model_;
  Graph& g_;
  const char* which_;
  std::set<std::string> names_;
};

}  // namespace

void check_ort_compatible(const ArtifactOptions& o) {
  auto refuse = [](const std::string& what) {
    OT_THROW(kInvalidArgument, "generate_artifacts(ort_compatible): ", what,
             " cannot be expressed for ONNX Runtime's training API (1.19)");
  };
  const OptimizerConfig& c = o.optimizer;
  if (c.type == OptimizerType::kSGD) {
    if (c.momentum != 0 || c.weight_decay != 0 || c.nesterov || c.maximize)
      refuse("SGD with momentum, weight decay, nesterov or maximize (ORT's SGDOptimizerV2 is plain SGD)");
  } else if (c.type == OptimizerType::kAdamW || c.type == OptimizerType::kHFAdamW) {
    if (c.amsgrad || c.maximize) refuse("AdamW with amsgrad or maximize");
    if (c.type == OptimizerType::kAdamW && !c.correct_bias) refuse("torch's AdamW without bias correction");
  } else {
    refuse(std::string("the optimizer '") + optim::optimizer_type_name(c.type) + "' (ORT has AdamW and SGD)");
  }
  if (c.max_grad_norm > 0) refuse("gradient clipping (max_grad_norm)");
  // ORT's Optimizer starts at 0.001 whatever the files hold (1.19.2 reads a checkpoint's
  // initial_learning_rate but starts from its default): another rate would train differently in
  // each engine, so it is set at run time, in both, with set_learning_rate or an LR scheduler.
  if (c.lr != 1e-3)
    refuse("a learning rate other than 0.001 (ORT's Optimizer starts at 0.001 whatever the artifacts hold: set it "
           "at run time with Optimizer.set_learning_rate)");
  if (!o.graphs.mixed_precision.empty()) refuse("mixed precision");
  if (o.lora) refuse("LoRA");
  if (o.memory.level != 0 || !o.memory.config.empty()) refuse("the memory optimizer");
  if (o.graphs.label_sparsity) refuse("label sparsity");
}

void to_ort_training_graphs(TrainingGraphs& graphs) {
  Graph& g = graphs.training.graph;
  OT_CHECK(graphs.gradient_outputs.size() == graphs.trainable.size(), "generate_artifacts(ort_compatible): ",
           graphs.trainable.size(), " trainable parameters but ", graphs.gradient_outputs.size(), " gradients");
  const std::set<std::string> drop(graphs.buffer_outputs.begin(), graphs.buffer_outputs.end());
  std::erase_if(g.outputs, [&](const NamedValue& o) {
    return drop.count(o.name) ||
           std::find(graphs.gradient_outputs.begin(), graphs.gradient_outputs.end(), o.name) != graphs.gradient_outputs.end();
  });
  const ValueInfo flag{DType::kBool, Shape{1}, {}};
  for (size_t i = 0; i < graphs.trainable.size(); ++i) {
    const std::string& p = graphs.trainable[i];
    ValueInfo info;
    for (const auto& in : g.inputs)
      if (in.name == p) info = in.info;
    const std::string buffer = p + kBufferSuffix, out = p + kAccumulatedSuffix;
    g.inputs.push_back({buffer, info});
    g.nodes.push_back(Node{"GradientAccumulator_" + p, "InPlaceAccumulatorV2", kMsDomain,
                           {buffer, graphs.gradient_outputs[i], kLazyReset}, {out}, {}});
    g.outputs.push_back({out, flag});
  }
  g.inputs.push_back({kLazyReset, flag});
  OrtRewriter(graphs.training, "training").run();
  OrtRewriter(graphs.eval, "eval").run();
}

Model ort_optimizer_model(const OptimizerConfig& config) {
  Model m;
  m.opsets = {{kOnnxDomain, 17}, {kMsDomain, 1}};
  Graph& g = m.graph;
  g.name = "optimizer";  // ORT's Optimizer reads the inputs by position: its generator's order
  ValueInfo seq{DType::kFloat32, std::nullopt, {}, ValueKind::kSequence};
  g.inputs.push_back({"learning_rate", ValueInfo{DType::kFloat32, Shape{1}, {}}});
  g.inputs.push_back({"step", ValueInfo{DType::kInt64, Shape{1}, {}}});
  g.inputs.push_back({"params", seq});
  g.inputs.push_back({"gradients", seq});
  g.inputs.push_back({"first_order_moments", seq});
  Node update;
  update.domain = kMsDomain;
  update.name = "optimizer";
  if (config.type == OptimizerType::kSGD) {
    update.op_type = "SGDOptimizerV2";
    update.inputs = {"learning_rate", "params", "gradients"};
    update.outputs = {"update_completed"};
  } else {
    g.inputs.push_back({"second_order_moments", seq});
    update.op_type = "AdamWOptimizer";
    update.inputs = {"learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"};
    update.outputs = {"updated_flag"};
    // adam_mode 0: torch.optim.AdamW; 1: transformers' AdamW (ort_artifacts.cc reads it back).
    update.attributes = {{"adam_mode", Attribute::of(int64_t(config.type == OptimizerType::kHFAdamW))},
                         {"alpha", Attribute::of(float(config.betas[0]))},
                         {"beta", Attribute::of(float(config.betas[1]))},
                         {"epsilon", Attribute::of(float(config.eps))},
                         {"weight_decay", Attribute::of(float(config.weight_decay))},
                         {"correct_bias", Attribute::of(int64_t(config.correct_bias))}};
  }
  g.nodes.push_back(update);
  g.outputs.push_back({update.outputs[0], ValueInfo{DType::kBool, Shape{1}, {}}});
  return m;
}

}  // namespace onnxtrain

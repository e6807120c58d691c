// ONNX Runtime training's artifacts in onnxtrain's conventions (ort_artifacts.h). What ORT's
// generator writes (1.19.2), and what becomes of it here:
//
//   training graph inputs   user inputs, parameters (the checkpoint's names), one
//                           `<p>_grad.accumulation.buffer` per trainable parameter, `lazy_reset_grad`
//   training graph outputs  the loss, one `<p>_grad.accumulation.out` (InPlaceAccumulatorV2's flag)
//                           per trainable parameter
//   -> parameters stay inputs (bound to the checkpoint as for onnxtrain's artifacts); each
//      accumulator goes and its gradient value becomes the output `<p>_grad`; Module accumulates
//      into the parameter's gradient and lazy_reset_grad() makes the next step overwrite it.
#include "training/ort_artifacts.h"

#include <algorithm>
#include <set>

#include "ops/registry.h"
#include "onnxtrain/training.h"

namespace onnxtrain {
namespace {

const std::string kBufferSuffix = "_grad.accumulation.buffer";
const std::string kLazyReset = "lazy_reset_grad";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every node's op must have a kernel here: an ORT graph that uses one we lack is refused up front,
// naming the op and where it came from (not as an unknown op in the middle of a step).
void check_ops(const Model& model, const char* which) {
  for (const Node& n : model.graph.nodes) {
    if (OpRegistry::global().find(n.domain, n.op_type, model.opset(n.domain))) continue;
    const std::string op = (n.domain.empty() ? "" : n.domain + ".") + n.op_type;
    OT_THROW(kNotImplemented, n.context(), "ONNX Runtime's training artifacts: the ", which, " model uses op '", op,
             "', which ORT's generator (onnxruntime.training.artifacts) emitted and onnxtrain does not implement");
  }
}

}  // namespace

bool is_ort_training_model(const Model& model) {
  bool reset = false, buffer = false;
  for (const auto& in : model.graph.inputs) {
    reset = reset || in.name == kLazyReset;
    buffer = buffer || ends_with(in.name, kBufferSuffix);
  }
  return reset && buffer;
}

namespace {

// An initializer that the checkpoint holds becomes a graph input bound to it.
void initializer_to_input(Graph& g, const std::string& name) {
  auto it = g.initializers.find(name);
  if (it == g.initializers.end()) return;
  g.inputs.push_back({name, ValueInfo{it->second.dtype(), it->second.shape(), {}}});
  g.initializers.erase(it);
}

}  // namespace

void adapt_ort_training_model(Model& model, CheckpointState& state) {
  Graph& g = model.graph;
  // The running statistics ORT's default checkpoint leaves in the graph (onnxruntime#19370: ORT
  // never updates them) move to the checkpoint, so that training updates them as torch does.
  for (const Node& n : g.nodes) {
    if (n.domain != kMsDomain || n.op_type != "BatchNormInternal") continue;
    for (size_t k : {size_t(3), size_t(4)}) {
      if (!n.has_input(k) || !g.is_initializer(n.inputs[k])) continue;
      if (!state.has_parameter(n.inputs[k]))
        state.add_parameter(n.inputs[k], g.initializers.at(n.inputs[k]).clone(), /*requires_grad=*/false);
      initializer_to_input(g, n.inputs[k]);
    }
  }
  std::set<std::string> dropped_outputs;
  std::vector<Node> kept;
  std::vector<Node> added;
  for (Node& n : g.nodes) {
    if (n.domain == kMsDomain && n.op_type == "InPlaceAccumulatorV2" && n.has_input(0) && n.has_input(1) &&
        ends_with(n.inputs[0], kBufferSuffix)) {
      const std::string param = n.inputs[0].substr(0, n.inputs[0].size() - kBufferSuffix.size());
      OT_CHECK(state.has_parameter(param), n.context(), "ONNX Runtime's training model accumulates the gradient of '",
               param, "', which is not a parameter of the checkpoint: the checkpoint belongs to another model");
      const std::string grad = param + "_grad";
      if (n.inputs[1] != grad)
        added.push_back(Node{grad + "/identity", "Identity", "", {n.inputs[1]}, {grad}, {}});
      for (const auto& o : n.outputs) dropped_outputs.insert(o);
      // The gradient takes the flag's place among the outputs: the outputs keep ORT's order.
      for (auto& out : g.outputs)
        if (n.has_output(0) && out.name == n.outputs[0]) {
          const Parameter& p = state.parameter(param);
          out = {grad, ValueInfo{p.dtype(), p.shape(), {}}};
        }
      continue;
    }
    // ORT's BatchNormInternal computes the new running statistics and drops them (onnxruntime#19370):
    // here they go back to the checkpoint, as a user expects and onnxtrain's own artifacts do.
    if (n.domain == kMsDomain && n.op_type == "BatchNormInternal") {
      for (size_t k : {size_t(1), size_t(2)}) {
        if (!n.has_output(k) || !n.has_input(k + 2) || !state.has_parameter(n.inputs[k + 2])) continue;
        const std::string name = n.inputs[k + 2] + "_updated";
        added.push_back(Node{name + "/identity", "Identity", "", {n.outputs[k]}, {name}, {}});
        g.outputs.push_back({name, ValueInfo{}});
      }
    }
    kept.push_back(std::move(n));
  }
  kept.insert(kept.end(), added.begin(), added.end());
  g.nodes = std::move(kept);
  std::erase_if(g.outputs, [&](const NamedValue& o) { return dropped_outputs.count(o.name) > 0; });
  std::set<std::string> read;
  for (const Node& n : g.nodes) read.insert(n.inputs.begin(), n.inputs.end());
  std::erase_if(g.inputs, [&](const NamedValue& in) {
    return (in.name == kLazyReset || ends_with(in.name, kBufferSuffix)) && !read.count(in.name);
  });
  // ORT's MaxPoolGrad (in the ai.onnx domain there) scatters dY by MaxPool's Indices output and
  // takes dX's shape from ORT's shape inference; onnxtrain's takes the pool's input instead and
  // finds the same (first) maximum of each window.
  const auto producers = g.producers();
  for (Node& n : g.nodes) {
    if (!n.domain.empty() || n.op_type != "MaxPoolGrad" || n.inputs.size() != 2) continue;
    auto it = producers.find(n.inputs[1]);
    OT_CHECK(it != producers.end() && g.nodes[it->second].op_type == "MaxPool", n.context(),
             "ONNX Runtime's MaxPoolGrad should read the Indices output of a MaxPool, got '", n.inputs[1], "'");
    n.inputs[1] = g.nodes[it->second].inputs[0];
    n.domain = kOnnxTrainDomain;
    model.opsets.emplace(kOnnxTrainDomain, 1);
  }
  // A MaxPool whose Indices nothing reads any more computes Y alone, by the pooling kernels' fast
  // paths (with Indices: the digits CNN's pool 1.7 ms a step against ORT's 0.55).
  std::set<std::string> still_read;
  for (const Node& n : g.nodes) still_read.insert(n.inputs.begin(), n.inputs.end());
  for (Node& n : g.nodes)
    if (n.domain.empty() && n.op_type == "MaxPool" && n.outputs.size() == 2 && !still_read.count(n.outputs[1]) &&
        !g.is_output(n.outputs[1]))
      n.outputs.pop_back();
  g.topological_sort();
  check_ops(model, "training");
}

void adapt_ort_eval_model(Model& model, const CheckpointState& state) {
  Graph& g = model.graph;
  std::vector<std::string> held;
  for (const auto& [name, t] : g.initializers)
    if (state.has_parameter(name)) held.push_back(name);
  for (const auto& name : held) initializer_to_input(g, name);
  std::set<std::string> read;
  for (const Node& n : g.nodes) read.insert(n.inputs.begin(), n.inputs.end());
  for (Node& n : g.nodes) {
    if (n.domain != kOnnxDomain || n.op_type != "BatchNormalization" || n.attr_int("training_mode", 0) != 0) continue;
    if (model.opset() < 14) continue;  // before 14 the extra outputs mean training mode
    while (n.outputs.size() > 1 && (n.outputs.back().empty() ||
                                    (!read.count(n.outputs.back()) && !g.is_output(n.outputs.back()))))
      n.outputs.pop_back();
  }
  check_ops(model, "eval");
}

std::optional<OptimizerConfig> ort_optimizer_config(const Model& model) {
  for (const Node& n : model.graph.nodes) {
    if (n.domain != kMsDomain) continue;
    if (n.op_type == "AdamWOptimizer") {
      // adam_mode 0: torch.optim.AdamW (decay first, moments bias-corrected); 1: transformers'
      // AdamW (bias correction folded into the step size, decay after the update).
      const int64_t mode = n.attr_int("adam_mode", 0);
      const bool correct_bias = n.attr_int("correct_bias", 1) != 0;
      OT_CHECK(mode == 0 || mode == 1, n.context(), "AdamWOptimizer: adam_mode ", mode, " is not 0 or 1");
      OT_CHECK(mode == 1 || correct_bias, n.context(), "AdamWOptimizer: adam_mode 0 with correct_bias 0 is not "
               "implemented (torch's AdamW always corrects the bias)");
      OptimizerConfig c = OptimizerConfig::defaults(mode == 1 ? OptimizerType::kHFAdamW : OptimizerType::kAdamW);
      c.betas = {n.attr_float("alpha", 0.9f), n.attr_float("beta", 0.999f)};
      c.eps = n.attr_float("epsilon", 1e-8f);
      c.weight_decay = n.attr_float("weight_decay", 0.0f);
      c.correct_bias = correct_bias;
      c.lr = 1e-3;  // ORT's Optimizer starts at 0.001 unless the checkpoint holds a learning rate
      return c;
    }
    if (n.op_type == "SGDOptimizerV2") {
      OptimizerConfig c = OptimizerConfig::defaults(OptimizerType::kSGD);
      c.momentum = 0;
      c.weight_decay = 0;
      c.lr = 1e-3;
      return c;
    }
  }
  for (const Node& n : model.graph.nodes)
    if (n.domain == kMsDomain)
      OT_THROW(kNotImplemented, n.context(), "ONNX Runtime's optimizer model uses op 'com.microsoft.", n.op_type,
               "', which ORT's generator emitted and onnxtrain does not implement (AdamWOptimizer and "
               "SGDOptimizerV2 are)");
  return std::nullopt;
}

}  // namespace onnxtrain

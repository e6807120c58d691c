#include "passes/mixed_precision.h"

#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/dispatch.h"
#include "onnxtrain/cpu_features.h"
#include "passes/passes.h"
#include "passes/shape_inference.h"

namespace onnxtrain {
namespace {

enum class OpClass { kLow, kFollow, kFp32, kAny };

OpClass classify(const Node& n) {
  if (n.domain == kOnnxTrainDomain) {
    if (n.op_type == "FusedMatMul") return OpClass::kLow;
    if (n.op_type == "Gelu") return OpClass::kFollow;
    return OpClass::kFp32;
  }
  if (!n.domain.empty()) return OpClass::kFp32;
  static const std::set<std::string> low{"MatMul", "Gemm", "Conv"};
  static const std::set<std::string> follow{
      "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Gelu", "Tanh", "Sigmoid", "Dropout",
      "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split", "Slice",
      "Gather", "Expand", "Where", "Tile", "Max", "Min", "Softmax", "MaxPool", "AveragePool"};
  static const std::set<std::string> any{"Shape", "Size", "Cast"};
  if (low.count(n.op_type)) return OpClass::kLow;
  if (follow.count(n.op_type)) return OpClass::kFollow;
  if (any.count(n.op_type)) return OpClass::kAny;
  return OpClass::kFp32;
}

// Inputs a follow op reads as control rather than data: left in their own dtype.
bool control_input(const Node& n, size_t i) { return n.domain.empty() && n.op_type == "Dropout" && i == 1; }

Tensor converted(const Tensor& t, DType to) {
  Tensor out = Tensor::empty(to, t.shape());
  dispatch_float(t.dtype(), [&]<typename From>() {
    dispatch_float(to, [&]<typename To>() {
      const From* src = t.data<From>();
      To* dst = out.data<To>();
      for (int64_t i = 0; i < t.numel(); ++i) dst[i] = cast_value<To>(src[i]);
    });
  });
  return out;
}

class Converter {
 public:
  Converter(Model& m, DType low, const std::set<std::string>& parameters)
      : m_(m), g_(m.graph), low_(low), params_(parameters) {}

  int run() {
    infer_shapes(g_, m_.opsets);
    for (const auto& in : g_.inputs) dtype_[in.name] = in.info.dtype;
    for (const auto& [name, t] : g_.initializers) dtype_[name] = t.dtype();
    for (const auto& [name, info] : g_.value_info)
      if (!dtype_.count(name)) dtype_[name] = info.dtype;
    // Named in graph order: inputs, initializers, then the first node output.
    std::vector<std::string> order;
    for (const auto& in : g_.inputs) order.push_back(in.name);
    for (const auto& [name, t] : g_.initializers) order.push_back(name);
    for (const auto& n : g_.nodes) order.insert(order.end(), n.outputs.begin(), n.outputs.end());
    for (const auto& name : order) {
      DType dt = dtype(name);
      if (dt != DType::kFloat16 && dt != DType::kBFloat16) continue;
      OT_THROW(kInvalidArgument, "mixed precision (", mixed_precision_name(low_), "): value '", name, "' is already ",
               dtype_name(dt), "; the pass converts fp32 models (export the model in fp32)");
    }
    for (const auto& n : g_.nodes)
      if (n.domain.empty() && n.op_type == "Constant")
        for (const auto& o : n.outputs) constants_.insert(o);

    // The rewritten list is built beside the original, so fresh names never clash with the
    // values of nodes not visited yet.
    for (const Node& n : g_.nodes) convert(Node(n));
    g_.nodes = std::move(out_);
    keep_output_dtypes();
    for (const auto& v : changed_) g_.value_info.erase(v);
    infer_shapes(g_, m_.opsets);
    return inserted_;
  }

 private:
  bool floating32(const std::string& v) const {
    auto it = dtype_.find(v);
    return it != dtype_.end() && (it->second == DType::kFloat32 || it->second == low_);
  }
  DType dtype(const std::string& v) const {
    auto it = dtype_.find(v);
    return it == dtype_.end() ? DType::kUndefined : it->second;
  }
  // Constants adapt to the op's precision instead of widening it (PyTorch's scalars do too).
  bool weak(const std::string& v) const {
    return (g_.is_initializer(v) && !params_.count(v)) || constants_.count(v);
  }

  // v in dtype `to`: one conversion per (value, dtype), wherever it is read.
  std::string cast(const std::string& v, DType to) {
    auto key = std::make_pair(v, to);
    if (auto it = casts_.find(key); it != casts_.end()) return it->second;
    if (auto src = source_.find(v); src != source_.end() && dtype(src->second) == to) return src->second;
    std::string name = g_.unique_name(v + "/" + (to == DType::kFloat32 ? std::string("fp32") : mixed_precision_name(to)));
    if (g_.is_initializer(v) && !params_.count(v)) {
      g_.initializers[name] = converted(g_.initializers.at(v), to);  // a constant: converted once, here
    } else {
      Node c;
      c.name = name + "/cast";
      c.op_type = "Cast";
      c.inputs = {v};
      c.outputs = {name};
      c.attributes["to"] = Attribute::of(int64_t(to));
      out_.push_back(std::move(c));
      ++inserted_;
    }
    casts_[key] = name;
    source_[name] = v;
    dtype_[name] = to;
    return name;
  }

  void convert(Node n) {
    OpClass cls = classify(n);
    if (cls == OpClass::kAny) {
      out_.push_back(std::move(n));
      return;
    }
    std::vector<size_t> data;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.has_input(i) && floating32(n.inputs[i]) && !control_input(n, i)) data.push_back(i);
    DType target = DType::kFloat32;
    if (cls == OpClass::kLow) {
      target = low_;
    } else if (cls == OpClass::kFollow) {
      bool strong32 = false, any_low = false;
      for (size_t i : data) {
        strong32 = strong32 || (dtype(n.inputs[i]) == DType::kFloat32 && !weak(n.inputs[i]));
        any_low = any_low || dtype(n.inputs[i]) == low_;
      }
      target = !strong32 && any_low ? low_ : DType::kFloat32;
    }
    for (size_t i : data)
      if (dtype(n.inputs[i]) != target) n.inputs[i] = cast(n.inputs[i], target);
    if (target == low_)
      for (const auto& o : n.outputs)
        if (!o.empty() && dtype(o) == DType::kFloat32) {
          dtype_[o] = low_;
          changed_.insert(o);
        }
    out_.push_back(std::move(n));
  }

  // A graph output that became low precision is computed under a new name and cast back.
  void keep_output_dtypes() {
    for (auto& out : g_.outputs) {
      if (!changed_.count(out.name)) continue;
      std::string lp = g_.unique_name(out.name + "/" + mixed_precision_name(low_));
      for (auto& n : g_.nodes) {
        for (auto& v : n.outputs) if (v == out.name) v = lp;
        for (auto& v : n.inputs) if (v == out.name) v = lp;
      }
      Node c;
      c.name = out.name + "/cast";
      c.op_type = "Cast";
      c.inputs = {lp};
      c.outputs = {out.name};
      c.attributes["to"] = Attribute::of(int64_t(DType::kFloat32));
      g_.nodes.push_back(std::move(c));
      ++inserted_;
      dtype_[lp] = low_;
      dtype_[out.name] = DType::kFloat32;
      changed_.insert(lp);
    }
  }

  Model& m_;
  Graph& g_;
  DType low_;
  const std::set<std::string>& params_;
  std::unordered_map<std::string, DType> dtype_;
  std::vector<Node> out_;
  std::set<std::string> constants_, changed_;
  std::map<std::pair<std::string, DType>, std::string> casts_;
  std::unordered_map<std::string, std::string> source_;  // cast output -> the value it converts
  int inserted_ = 0;
};

}  // namespace

namespace {

// What a user who asked for bf16 on a CPU where it does not pay is told, once.
std::string bf16_slower_note(const GemmRates& rates, const std::string& cpu) {
  char line[768];
  const char* what = rates.bf16_gflops > 0.0 ? "bf16 GEMMs run at %.0f GFLOP/s here against fp32's %.0f (%s)"
                                             : "this CPU has no native bf16 GEMM (%.0f GFLOP/s: bf16 computes through fp32 at %.0f; %s)";
  std::string rates_text(256, '\0');
  rates_text.resize(size_t(std::snprintf(rates_text.data(), rates_text.size(), what, rates.bf16_gflops,
                                         rates.fp32_gflops, rates.source.c_str())));
  std::snprintf(line, sizeof line,
                "onnxtrain: bf16 mixed precision on %s: %s, so bf16 training steps are slower than fp32 ones on this "
                "CPU. You still get bf16 activations and gradients (about half the activation memory) with fp32 master "
                "weights; for speed, train in fp32 (onnxtrain.cpu_features() reports the rates).",
                cpu.empty() ? "this CPU" : cpu.c_str(), rates_text.c_str());
  return line;
}

}  // namespace

int convert_to_mixed_precision(Model& model, DType low, const std::set<std::string>& parameters) {
  OT_CHECK(low == DType::kBFloat16 || low == DType::kFloat16, "mixed precision: the low precision is bf16 or fp16, got ",
           dtype_name(low));
  if (low == DType::kBFloat16) {  // said once per process, where bf16 does not pay
    static std::once_flag said;
    std::call_once(said, [] {
      const GemmRates& rates = gemm_rates();
      if (!rates.bf16_pays()) std::fprintf(stderr, "%s\n", bf16_slower_note(rates, cpu_features().model).c_str());
    });
  }
  return Converter(model, low, parameters).run();
}

int fold_casts_into_gemms(Model& model) {
  Graph& g = model.graph;
  infer_shapes(g, model.opsets);
  auto dtype = [&](const std::string& v) {
    auto it = g.value_info.find(v);
    if (it != g.value_info.end()) return it->second.dtype;
    if (auto init = g.initializers.find(v); init != g.initializers.end()) return init->second.dtype();
    for (const auto& in : g.inputs)
      if (in.name == v) return in.info.dtype;
    return DType::kUndefined;
  };
  std::unordered_map<std::string, int> readers;
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& v : g.nodes[i].inputs)
      if (!v.empty()) ++readers[v];
    for (const auto& v : g.nodes[i].outputs) producer[v] = i;
  }
  for (const auto& out : g.outputs) ++readers[out.name];
  std::vector<bool> folded(g.nodes.size(), false);
  int count = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& cast = g.nodes[i];
    if (!cast.domain.empty() || cast.op_type != "Cast" || cast.inputs.empty() ||
        cast.attr_int("to", 0) != int64_t(DType::kFloat32))
      continue;
    const std::string& product = cast.inputs[0];
    auto p = producer.find(product);
    if (p == producer.end() || readers[product] != 1) continue;
    Node& mm = g.nodes[p->second];
    const bool fused = mm.domain == kOnnxTrainDomain && mm.op_type == "FusedMatMul";
    if (!fused && !(mm.domain.empty() && mm.op_type == "MatMul")) continue;
    if (fused && mm.attr_int("output_dtype", 0) != 0) continue;
    const DType a = dtype(mm.inputs[0]);
    if ((a != DType::kBFloat16 && a != DType::kFloat16) || dtype(mm.inputs[1]) != a) continue;
    if (!fused) {  // onnxtrain.FusedMatMul computes MatMul's product with its defaults
      mm.op_type = "FusedMatMul";
      mm.domain = kOnnxTrainDomain;
      model.opsets.emplace(kOnnxTrainDomain, 1);
    }
    mm.attributes["output_dtype"] = Attribute::of(int64_t(DType::kFloat32));
    mm.outputs[0] = cast.outputs[0];
    g.value_info.erase(product);
    folded[i] = true;
    ++count;
  }
  if (count == 0) return 0;
  std::vector<Node> kept;
  kept.reserve(g.nodes.size() - size_t(count));
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!folded[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  infer_shapes(g, model.opsets);
  return count;
}

std::string scale_loss(Model& forward, const std::string& loss) {
  Graph& g = forward.graph;
  OT_CHECK(!g.is_input(kLossScaleInput) && !g.is_initializer(kLossScaleInput) && !g.producers().count(kLossScaleInput),
           "loss scaling: the model already has a value named '", kLossScaleInput, "' (the loss scale's input)");
  infer_shapes(g, forward.opsets);
  auto info = g.value_info.find(loss);
  const DType loss_dtype = info != g.value_info.end() ? info->second.dtype : DType::kUndefined;
  OT_CHECK(loss_dtype == DType::kFloat32, "loss scaling: the loss '", loss, "' should be float32, got ",
           dtype_name(loss_dtype));
  g.inputs.push_back({kLossScaleInput, ValueInfo{DType::kFloat32, Shape{}, {}}});
  const std::string scaled = g.unique_name(loss + "_scaled");
  g.nodes.push_back(Node{"loss_scaling/scale", "Mul", "", {loss, kLossScaleInput}, {scaled}, {}});
  return scaled;
}

void unscale_gradients(Model& training, const std::vector<std::string>& gradient_outputs) {
  Graph& g = training.graph;
  OT_CHECK(g.is_input(kLossScaleInput), "loss scaling: the training graph has no '", kLossScaleInput, "' input");
  const std::string inverse = g.unique_name("loss_scale_inverse");
  g.nodes.push_back(Node{"loss_scaling/inverse", "Reciprocal", "", {kLossScaleInput}, {inverse}, {}});
  for (const std::string& grad : gradient_outputs) {
    const std::string scaled = g.unique_name(grad + "_scaled");
    bool renamed = false;
    for (auto& n : g.nodes)
      for (auto& v : n.outputs)
        if (v == grad) {
          v = scaled;
          renamed = true;
        }
    OT_CHECK(renamed, "loss scaling: no node computes the gradient '", grad, "'");
    for (auto& n : g.nodes)
      for (auto& v : n.inputs)
        if (v == grad) v = scaled;
    g.value_info.erase(grad);
    g.nodes.push_back(Node{"loss_scaling/unscale/" + grad, "Mul", "", {scaled, inverse}, {grad}, {}});
  }
  g.topological_sort();
}

}  // namespace onnxtrain

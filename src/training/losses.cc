#include "training/losses.h"

#include "ops/graph_builder.h"
#include "passes/shape_inference.h"

namespace onnxtrain {

namespace {

const std::vector<std::pair<LossType, const char*>> kLossNames = {
    {LossType::kMSE, "MSELoss"}, {LossType::kL1, "L1Loss"}, {LossType::kSmoothL1, "SmoothL1Loss"},
    {LossType::kHuber, "HuberLoss"}, {LossType::kCrossEntropy, "CrossEntropyLoss"}, {LossType::kNLL, "NLLLoss"},
    {LossType::kBCE, "BCELoss"}, {LossType::kBCEWithLogits, "BCEWithLogitsLoss"}, {LossType::kKLDiv, "KLDivLoss"}};

using Attrs = GraphBuilder::Attrs;

// mean / sum / none over every element, the last step of the elementwise losses.
std::string reduce(GraphBuilder& b, const std::string& per_element, const std::string& reduction,
                   const std::string& out) {
  Attrs keep0{{"keepdims", Attribute::of(int64_t(0))}};
  if (reduction == "mean") return b.emit_named(out, "ReduceMean", {per_element}, keep0);
  if (reduction == "sum") return b.emit_named(out, "ReduceSum", {per_element}, keep0);
  if (reduction == "none") return b.emit_named(out, "Identity", {per_element});
  OT_THROW(kInvalidArgument, "loss reduction '", reduction, "' is not one of mean, sum, none");
}

}  // namespace

LossType loss_type_from_name(const std::string& name) {
  for (const auto& [t, n] : kLossNames)
    if (name == n) return t;
  std::string known;
  for (const auto& [t, n] : kLossNames) known += std::string(known.empty() ? "" : ", ") + n;
  OT_THROW(kInvalidArgument, "unknown loss '", name, "' (known: ", known, ")");
}

std::string loss_type_name(LossType type) {
  for (const auto& [t, n] : kLossNames)
    if (t == type) return n;
  return "?";
}

std::string add_loss(Model& model, LossType type, const std::string& p, const std::string& t,
                     const std::string& out, const LossOptions& o) {
  Graph& g = model.graph;
  infer_shapes(g, model.opsets);  // dtypes for the constants below
  GraphBuilder b(model, loss_type_name(type));
  const std::string& red = o.reduction;
  std::string result;
  switch (type) {
    case LossType::kMSE: {  // (p - t)^2
      std::string d = b.sub(p, t);
      result = reduce(b, b.mul(d, d), red, out);
      break;
    }
    case LossType::kL1:  // |p - t|
      result = reduce(b, b.emit("Abs", {b.sub(p, t)}), red, out);
      break;
    case LossType::kSmoothL1:    // d < beta ? 0.5 d^2 / beta : d - 0.5 beta
    case LossType::kHuber: {     // d < delta ? 0.5 d^2 : delta (d - 0.5 delta)
      OT_CHECK(o.beta > 0, loss_type_name(type), ": beta/delta must be positive, got ", o.beta);
      std::string d = b.emit("Abs", {b.sub(p, t)});
      std::string beta = b.scalar_like(o.beta, p);
      std::string half = b.scalar_like(0.5, p);
      std::string quad = b.mul(b.mul(half, d), d);
      std::string lin = b.sub(d, b.mul(half, beta));
      if (type == LossType::kSmoothL1) quad = b.div(quad, beta);
      else lin = b.mul(beta, lin);
      result = reduce(b, b.emit("Where", {b.emit("Less", {d, beta}), quad, lin}), red, out);
      break;
    }
    case LossType::kCrossEntropy:
    case LossType::kNLL: {
      OT_CHECK(red == "mean" || red == "sum" || red == "none", loss_type_name(type), ": reduction '", red,
               "' is not one of mean, sum, none");
      Attrs attrs{{"reduction", Attribute::of(red)}, {"ignore_index", Attribute::of(o.ignore_index)}};
      std::vector<std::string> ins = {p, t};
      if (!o.class_weights.empty()) ins.push_back(o.class_weights);
      // ai.onnx has these ops from opset 12; older models get onnxtrain's copies.
      const std::string loss_domain = model.opset("") >= 12 ? "" : kOnnxTrainDomain;
      if (loss_domain == kOnnxTrainDomain) model.opsets.emplace(kOnnxTrainDomain, 1);
      if (type == LossType::kNLL) {
        result = b.emit_named(out, "NegativeLogLikelihoodLoss", ins, attrs, loss_domain);
        break;
      }
      if (o.label_smoothing == 0.0) {
        result = b.emit_named(out, "SoftmaxCrossEntropyLoss", ins, attrs, loss_domain);
        break;
      }
      OT_CHECK(model.opset("") >= 13, "CrossEntropyLoss: label smoothing needs a model of ai.onnx opset 13 or ",
               "newer (its LogSoftmax and Unsqueeze forms), got ", model.opset(""));
      // Label smoothing (torch): (1 - e) * nll + e * smooth, where smooth is the weighted mean over
      // classes of -log p, reduced like nll (for "mean", over the weights of the kept targets).
      OT_CHECK(o.label_smoothing > 0 && o.label_smoothing <= 1, "CrossEntropyLoss: label_smoothing must be in [0, 1]");
      std::string logp = b.emit("LogSoftmax", {p}, {{"axis", Attribute::of(int64_t(1))}});
      Attrs none_attrs{{"reduction", Attribute::of(std::string("none"))}, {"ignore_index", Attribute::of(o.ignore_index)}};
      std::vector<std::string> nll_in = {logp, t};
      if (!o.class_weights.empty()) nll_in.push_back(o.class_weights);
      std::string nll = b.emit("NegativeLogLikelihoodLoss", nll_in, none_attrs);  // [N, ...]
      std::string weighted = logp;
      if (!o.class_weights.empty()) {  // weights along axis 1: reshape [C] -> [C, 1, ...] by unsqueeze
        auto rank = b.static_shape(p);
        OT_CHECK(rank.has_value(), "CrossEntropyLoss with label smoothing and class weights needs a known rank");
        std::vector<int64_t> tail;
        for (int64_t d = 1; d + 1 < int64_t(rank->size()); ++d) tail.push_back(d);
        std::string w = tail.empty() ? o.class_weights : b.unsqueeze(o.class_weights, tail);
        weighted = b.mul(logp, w);
      }
      std::string smooth = b.neg(b.reduce_sum(weighted, {1}, false));  // [N, ...]
      // Ignored targets contribute nothing: mask = (t != ignore_index).
      std::string ignore = b.constant(Tensor::scalar<int64_t>(o.ignore_index));
      std::string keep = b.emit("Cast", {b.emit("Not", {b.emit("Equal", {t, ignore})})},
                                {{"to", Attribute::of(int64_t(b.dtype(p) == DType::kUndefined ? DType::kFloat32 : b.dtype(p)))}});
      smooth = b.mul(smooth, keep);
      std::string n_classes = b.emit("CastLike", {b.emit("Gather", {b.shape(p), b.ints({1})}), p});
      std::string eps = b.scalar_like(o.label_smoothing, p);
      std::string one_minus = b.scalar_like(1.0 - o.label_smoothing, p);
      std::string per = b.add(b.mul(one_minus, nll), b.div(b.mul(eps, smooth), n_classes));
      if (red == "none") {
        result = b.emit_named(out, "Identity", {per});
      } else if (red == "sum") {
        result = b.emit_named(out, "ReduceSum", {per}, {{"keepdims", Attribute::of(int64_t(0))}});
      } else {
        // mean: divide by the total weight of kept targets (their count without class weights).
        std::string denom = keep;
        if (!o.class_weights.empty()) {
          std::string safe_t = b.emit("Where", {b.emit("Equal", {t, ignore}), b.constant(Tensor::scalar<int64_t>(0)), t});
          denom = b.mul(b.emit("Gather", {o.class_weights, safe_t}), keep);
        }
        Attrs k0{{"keepdims", Attribute::of(int64_t(0))}};
        result = b.emit_named(out, "Div", {b.emit("ReduceSum", {per}, k0), b.emit("ReduceSum", {denom}, k0)});
      }
      break;
    }
    case LossType::kBCE: {  // -(t log p + (1 - t) log(1 - p)), logs clamped at -100 as torch does
      std::string one = b.scalar_like(1.0, p);
      std::string floor = b.scalar_like(-100.0, p);
      std::string log_p = b.emit("Max", {b.emit("Log", {p}), floor});
      std::string log_1mp = b.emit("Max", {b.emit("Log", {b.sub(one, p)}), floor});
      std::string l = b.neg(b.add(b.mul(t, log_p), b.mul(b.sub(one, t), log_1mp)));
      result = reduce(b, l, red, out);
      break;
    }
    case LossType::kBCEWithLogits: {  // (1 - t) x + w softplus(-x), w = 1 + (pos_weight - 1) t
      std::string one = b.scalar_like(1.0, p);
      std::string sp = b.emit("Softplus", {b.neg(p)});
      std::string w = o.pos_weight.empty() ? sp : b.mul(b.add(one, b.mul(b.sub(o.pos_weight, one), t)), sp);
      result = reduce(b, b.add(b.mul(b.sub(one, t), p), w), red, out);
      break;
    }
    case LossType::kKLDiv: {  // t (log t - p), 0 where t = 0; log_target: exp(t) (t - p)
      std::string l;
      if (o.log_target) {
        l = b.mul(b.emit("Exp", {t}), b.sub(t, p));
      } else {
        std::string zero = b.scalar_like(0.0, p);
        std::string positive = b.emit("Greater", {t, zero});
        std::string safe_t = b.emit("Where", {positive, t, b.scalar_like(1.0, p)});
        l = b.emit("Where", {positive, b.mul(t, b.sub(b.emit("Log", {safe_t}), p)), zero});
      }
      if (red == "batchmean") {
        Attrs k0{{"keepdims", Attribute::of(int64_t(0))}};
        std::string n = b.emit("CastLike", {b.emit("Gather", {b.shape(p), b.ints({0})}), p});
        result = b.emit_named(out, "Div", {b.emit("ReduceSum", {l}, k0), b.squeeze(n, {0})});
      } else {
        result = reduce(b, l, red, out);
      }
      break;
    }
  }
  b.commit();
  return result;
}

}  // namespace onnxtrain

// The gather-and-reduce half shared by NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss:
// given log-probabilities [N, C, d1, ...] and labels [N, d1, ...],
//   loss[n, d] = -logp[n, label, d] * w[label]   (0, with weight 0, where label == ignore_index)
// reduced by `reduction`: none (shape of labels), sum, or mean = sum(loss) / sum(w of the
// non-ignored targets) (the count of them when there are no weights).
#pragma once

#include <string>

#include "ops/common.h"

namespace onnxtrain {

enum class LossReduction { kNone, kSum, kMean };

inline LossReduction loss_reduction(const Node& node) {
  std::string r = node.attr_string("reduction", "mean");
  if (r == "none") return LossReduction::kNone;
  if (r == "sum") return LossReduction::kSum;
  OT_CHECK(r == "mean", node.context(), "reduction must be none, sum or mean, got '", r, "'");
  return LossReduction::kMean;
}

// Output 0 of both losses: the labels' shape for reduction none, a scalar otherwise.
inline void shape_loss_output(ShapeContext& ctx) {
  if (loss_reduction(ctx.node()) == LossReduction::kNone) ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(1));
  else ctx.set_output(0, ctx.input_dtype(0), Shape{});
}

struct LossDims {
  int64_t n = 1, c = 1, d = 1;
};

// Checks scores [N, C, d...] against labels [N, d...] (and weight [C]); returns the (N, C, D) view.
inline LossDims check_loss_inputs(const KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& t = ctx.input(1);
  OT_CHECK(x.rank() >= 2, node.context(), "expected input of shape [N, C, d1, ...], got ", shape_str(x.shape()));
  OT_CHECK(t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32, node.context(),
           "expected int32 or int64 labels, got ", dtype_name(t.dtype()));
  bool ok = t.rank() == x.rank() - 1 && t.dim(0) == x.dim(0);
  for (int i = 1; ok && i < t.rank(); ++i) ok = t.dim(i) == x.dim(i + 1);
  OT_CHECK(ok, node.context(), "labels of shape ", shape_str(t.shape()), " do not match input of shape ",
           shape_str(x.shape()), " (expected [N, d1, ...])");
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    OT_CHECK(w.rank() == 1 && w.dim(0) == x.dim(1) && w.dtype() == x.dtype(), node.context(),
             "weight must be a [", x.dim(1), "] tensor of ", dtype_name(x.dtype()), ", got ",
             dtype_name(w.dtype()), " ", shape_str(w.shape()));
  }
  LossDims dims;
  dims.n = x.dim(0);
  dims.c = x.dim(1);
  for (int i = 2; i < x.rank(); ++i) dims.d *= x.dim(i);
  return dims;
}

// Writes output 0 from log-probabilities logp laid out as [N, C, D].
template <typename T>
void nll_reduce(KernelContext& ctx, const T* logp, const LossDims& dims) {
  using C = compute_t<T>;
  const Node& node = ctx.node();
  const Tensor& t = ctx.input(1);
  const LossReduction red = loss_reduction(node);
  const bool has_ignore = node.has_attr("ignore_index");
  const int64_t ignore = node.attr_int("ignore_index", 0);
  const T* w = ctx.has_input(2) ? ctx.input(2).data<T>() : nullptr;
  Tensor& out = ctx.output(0, ctx.input(0).dtype(), red == LossReduction::kNone ? t.shape() : Shape{});
  T* po = out.data<T>();
  const int64_t total = dims.n * dims.d;
  double sum = 0, wsum = 0;
  bool bad = false;
  int64_t bad_label = 0;
  auto label_at = [&](int64_t i) -> int64_t {
    return t.dtype() == DType::kInt64 ? t.data<int64_t>()[i] : int64_t(t.data<int32_t>()[i]);
  };
  for (int64_t i = 0; i < total; ++i) {
    const int64_t n = i / dims.d, d = i % dims.d;
    const int64_t label = label_at(i);
    C loss = 0, wt = 0;
    if (!(has_ignore && label == ignore)) {
      if (label < 0 || label >= dims.c) {
        bad = true;
        bad_label = label;
        break;
      }
      wt = w ? C(w[label]) : C(1);
      loss = -C(logp[(n * dims.c + label) * dims.d + d]) * wt;
    }
    if (red == LossReduction::kNone) po[i] = T(loss);
    sum += double(loss);
    wsum += double(wt);
  }
  OT_CHECK(!bad, node.context(), "label ", bad_label, " is out of range [0, ", dims.c, ")",
           has_ignore ? " and is not ignore_index" : "");
  if (red == LossReduction::kSum) po[0] = T(C(sum));
  else if (red == LossReduction::kMean) po[0] = T(C(sum / wsum));
}

}  // namespace onnxtrain

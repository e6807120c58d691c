// The gather-and-reduce half shared by NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss:
// given log-probabilities [N, C, d1, ...] and labels [N, d1, ...],
//   loss[n, d] = -logp[n, label, d] * w[label]   (0, with weight 0, where label == ignore_index)
// reduced by `reduction`: none (shape of labels), sum, or mean = sum(loss) / sum(w of the
// non-ignored targets) (the count of them when there are no weights).
#pragma once

#include <map>
#include <string>

#include "ops/common.h"
#include "ops/nn/softmax_rows.h"

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

// ---- Backward ----
// The gradients of loss = reduce(-logp[n, t, d] * w[t]) from dLoss (input 0 of the grad op), with
// logp laid out as [N, C, D], labels as input 2 and weights as optional input 3 of the grad op.
// Per target: f = w[t] * coef, coef = dLoss[n, d] (none), dLoss (sum) or dLoss / sum(w) (mean); 0
// for ignored targets and where w[t] = 0.
//   kSoftmax (SoftmaxCrossEntropyLoss, logp = log_softmax(x)):  dx = (exp(logp) - onehot(t)) * f
//   else     (NegativeLogLikelihoodLoss, logp = x):             dx = -onehot(t) * f
// Output 1 (when requested) is dW[c] = sum over targets of class c of coef * (-logp[t] - L), with
// L the mean loss for reduction mean and 0 otherwise.
template <bool kSoftmax, typename T>
void loss_backward(KernelContext& ctx, const T* logp, const LossDims& dims) {
  using C = compute_t<T>;
  const Node& node = ctx.node();
  const Tensor& dloss = ctx.input(0);
  const Tensor& t = ctx.input(2);
  const LossReduction red = loss_reduction(node);
  const bool has_ignore = node.has_attr("ignore_index");
  const int64_t ignore = node.attr_int("ignore_index", 0);
  const T* w = ctx.has_input(3) ? ctx.input(3).data<T>() : nullptr;
  const int64_t total = dims.n * dims.d;
  OT_CHECK(dloss.numel() == (red == LossReduction::kNone ? total : 1), node.context(), "dLoss of shape ",
           shape_str(dloss.shape()), " does not match the loss (", red == LossReduction::kNone ? total : 1, " values)");
  const Tensor& like = ctx.input(1);
  Tensor& dx = ctx.output(0, like.dtype(), like.shape());
  auto label_at = [&](int64_t i) -> int64_t {
    return t.dtype() == DType::kInt64 ? t.data<int64_t>()[i] : int64_t(t.data<int32_t>()[i]);
  };
  // Per target: the label (-1 when ignored) and its factor f.
  std::vector<int64_t> label(static_cast<size_t>(total));
  std::vector<C> f(static_cast<size_t>(total));
  double wsum = 0, lsum = 0;
  for (int64_t i = 0; i < total; ++i) {
    int64_t l = label_at(i);
    if (has_ignore && l == ignore) {
      label[size_t(i)] = -1;
      continue;
    }
    OT_CHECK(l >= 0 && l < dims.c, node.context(), "label ", l, " is out of range [0, ", dims.c, ")",
             has_ignore ? " and is not ignore_index" : "");
    label[size_t(i)] = l;
    const double wt = w ? double(C(w[l])) : 1.0;
    wsum += wt;
    lsum += -double(C(logp[((i / dims.d) * dims.c + l) * dims.d + i % dims.d])) * wt;
  }
  const T* pdl = dloss.data<T>();
  auto coef = [&](int64_t i) -> double {
    if (red == LossReduction::kNone) return double(C(pdl[i]));
    if (red == LossReduction::kSum) return double(C(pdl[0]));
    return double(C(pdl[0])) / wsum;
  };
  for (int64_t i = 0; i < total; ++i) {
    int64_t l = label[size_t(i)];
    double wt = l < 0 ? 0.0 : w ? double(C(w[l])) : 1.0;
    f[size_t(i)] = wt == 0.0 ? C(0) : C(wt * coef(i));
  }
  T* pdx = dx.data<T>();
  const int64_t cc = dims.c, dd = dims.d;
  parallel_for(dims.n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(cc * dd, 1)), [&](int64_t b, int64_t e) {
    T* const out = pdx;  // locals, so the inner loops vectorise with plain loads
    const T* const lpb = logp;
    for (int64_t n = b; n < e; ++n) {
      const C* fn = f.data() + n * dd;
      const int64_t* ln = label.data() + n * dd;
      if (dd == 1) {  // [N, C]: vectorise along the classes, then fix the target's entry
        const C fv = fn[0];
        const int64_t l = ln[0];
        T* o = out + n * cc;
        const T* lp = lpb + n * cc;
        if constexpr (kSoftmax) {
#pragma omp simd
          for (int64_t c = 0; c < cc; ++c) o[c] = T(exp_shifted<C>(C(lp[c])) * fv);
          if (l >= 0) o[l] = T((exp_shifted<C>(C(lp[l])) - C(1)) * fv);
        } else {
#pragma omp simd
          for (int64_t c = 0; c < cc; ++c) o[c] = T(C(0));
          if (l >= 0) o[l] = T(-fv);
        }
        continue;
      }
      for (int64_t c = 0; c < cc; ++c) {
        const int64_t off = (n * cc + c) * dd;
        if constexpr (kSoftmax) {
          const T* lp = lpb + off;
          T* o = out + off;
#pragma omp simd
          for (int64_t d = 0; d < dd; ++d) o[d] = T((exp_shifted<C>(C(lp[d])) - (ln[d] == c ? C(1) : C(0))) * fn[d]);
        } else {
          T* o = out + off;
#pragma omp simd
          for (int64_t d = 0; d < dd; ++d) o[d] = T(ln[d] == c ? -fn[d] : C(0));
        }
      }
    }
  });
  if (!ctx.output_requested(1)) return;
  OT_CHECK(w, node.context(), "the weight gradient needs the weight input");
  const Tensor& wt = ctx.input(3);
  Tensor& dw = ctx.output(1, wt.dtype(), wt.shape());
  const double mean_loss = red == LossReduction::kMean ? lsum / wsum : 0.0;
  std::vector<double> acc(size_t(dims.c), 0.0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t l = label[size_t(i)];
    if (l < 0) continue;
    double lp = double(C(logp[((i / dims.d) * dims.c + l) * dims.d + i % dims.d]));
    acc[size_t(l)] += coef(i) * (-lp - mean_loss);
  }
  T* pw = dw.data<T>();
  for (int64_t c = 0; c < dims.c; ++c) pw[c] = T(C(acc[size_t(c)]));
}

// The grad ops' inputs (dLoss, X or log_prob, labels, weight?) checked as the forward checks
// (X, labels, weight?); returns the (N, C, D) view.
inline LossDims check_loss_grad_inputs(const KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(1);
  const Tensor& t = ctx.input(2);
  OT_CHECK(x.rank() >= 2, node.context(), "expected input of shape [N, C, d1, ...], got ", shape_str(x.shape()));
  OT_CHECK(t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32, node.context(),
           "expected int32 or int64 labels, got ", dtype_name(t.dtype()));
  bool ok = t.rank() == x.rank() - 1 && t.dim(0) == x.dim(0);
  for (int i = 1; ok && i < t.rank(); ++i) ok = t.dim(i) == x.dim(i + 1);
  OT_CHECK(ok, node.context(), "labels of shape ", shape_str(t.shape()), " do not match input of shape ",
           shape_str(x.shape()), " (expected [N, d1, ...])");
  OT_CHECK(ctx.input(0).dtype() == x.dtype(), node.context(), "dLoss must have the input's dtype ",
           dtype_name(x.dtype()), ", got ", dtype_name(ctx.input(0).dtype()));
  if (ctx.has_input(3)) {
    const Tensor& w = ctx.input(3);
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

// Shape rule of the grad ops: dX like input 1, dW like input 3.
inline void shape_loss_grad(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
  if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.input_dtype(3), ctx.input_shape(3));
}

// The attributes a loss's grad op copies from the forward node.
inline std::map<std::string, Attribute> loss_grad_attrs(const Node& node) {
  std::map<std::string, Attribute> attrs{{"reduction", Attribute::of(node.attr_string("reduction", "mean"))}};
  if (node.has_attr("ignore_index")) attrs["ignore_index"] = Attribute::of(node.attr_int("ignore_index", 0));
  return attrs;
}

}  // namespace onnxtrain

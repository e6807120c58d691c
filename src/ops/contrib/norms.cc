// RMSNorm and the skip-connection norms of transformer graphs (ONNX Runtime's contrib schemas):
//   SimplifiedLayerNormalization (ai.onnx domain, as ONNX Runtime registers it):
//       y = x / sqrt(mean(x^2) + eps) * scale over the dims from `axis` on; output 1: inv_std_var.
//   SkipSimplifiedLayerNormalization (com.microsoft): s = input + skip (+ bias); y = RMSNorm(s) * gamma
//   SkipLayerNormalization (com.microsoft):           s = input + skip (+ bias); y = LayerNorm(s) * gamma + beta
//       outputs: y, mean (the row mean of s), inv_std_var, input_skip_bias_sum = s;
//       skip is [B, S, H], [1, S, H] or [S, H]; the norm runs over the last dim.
// Gradients: RMSNorm through onnxtrain.SimplifiedLayerNormalizationGrad (below), LayerNorm through
// onnxtrain.LayerNormalizationGrad (src/ops/nn/layer_norm.cc); the skip sum's gradient is ds itself.
#include <cmath>
#include <vector>

#include "ops/contrib/contrib.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// Normalises `rows` rows of d values: s = x + skip + bias (skip row r % skip_rows), then RMS or
// LayerNorm; writes y, and when asked s, mean and inv_std_var per row.
template <typename T>
void norm_rows(int64_t rows, int64_t d, const T* x, const T* skip, int64_t skip_rows, const T* bias, const T* gamma,
               const T* beta, bool rms, double eps, T* y, T* sum, T* mean_out, T* inv_out) {
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<T> buf(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * d;
      T* s = sum ? sum + r * d : buf.data();
      const T* sk = skip ? skip + (r % skip_rows) * d : nullptr;
      for (int64_t i = 0; i < d; ++i) s[i] = xr[i] + (sk ? sk[i] : T(0)) + (bias ? bias[i] : T(0));
      T mu = 0;  // RMSNorm centres nothing; its saved mean output still reports the row mean
      if (!rms || mean_out) {
        for (int64_t i = 0; i < d; ++i) mu += s[i];
        mu /= T(d);
      }
      const T c = rms ? T(0) : mu;
      T var = 0;
      for (int64_t i = 0; i < d; ++i) var += (s[i] - c) * (s[i] - c);
      T inv = T(1) / std::sqrt(var / T(d) + T(eps));
      T* yr = y + r * d;
      for (int64_t i = 0; i < d; ++i) yr[i] = (s[i] - c) * inv * gamma[i] + (beta ? beta[i] : T(0));
      if (mean_out) mean_out[r] = mu;
      if (inv_out) inv_out[r] = inv;
    }
  });
}

template <typename T>
const T* vector_input(const KernelContext& ctx, size_t i, int64_t d, const char* what) {
  if (!ctx.has_input(i)) return nullptr;
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.dtype() == ctx.input(0).dtype() && t.numel() == d, ctx.node().context(), "expected ", what, " of ", d,
           " values of the input's dtype, got ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
  return t.data<T>();
}

// --- SimplifiedLayerNormalization ---------------------------------------------------------------

void simplified_ln_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  ctx.set_output(0, ctx.input_dtype(0), x);
  if (ctx.num_outputs() > 1) {
    std::optional<Shape> s;
    if (x && !x->empty()) {
      int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", -1), int64_t(x->size()));
      s = *x;
      for (size_t i = size_t(axis); i < s->size(); ++i) (*s)[i] = 1;
    }
    ctx.set_output(1, ctx.input_dtype(0), s);
  }
}

void simplified_ln_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 1, node.context(), "expected X of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  int64_t d = 1;
  for (int i = int(axis); i < x.rank(); ++i) d *= x.dim(i);
  int64_t rows = d ? x.numel() / d : 0;
  dispatch_f32_f64(node, x.dtype(), [&]<typename T>() {
    const T* gamma = vector_input<T>(ctx, 1, d, "scale");
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    T* inv = nullptr;
    if (ctx.output_requested(1)) {
      Shape s = x.shape();
      for (size_t i = size_t(axis); i < s.size(); ++i) s[i] = 1;
      inv = ctx.output(1, x.dtype(), s).template data<T>();
    }
    norm_rows<T>(rows, d, x.data<T>(), nullptr, 1, nullptr, gamma, nullptr, true, node.attr_float("epsilon", 1e-5f),
                 y.data<T>(), nullptr, nullptr, inv);
  });
}

// onnxtrain.SimplifiedLayerNormalizationGrad(dY, X, scale) -> dX, dScale (shape X.shape[axis:]).
// xh = x r, r = 1 / sqrt(mean(x^2) + eps), g = dy * scale:  dx = r (g - xh mean(g xh)), dscale = sum(dy xh)
void simplified_ln_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype() && x.rank() >= 1, node.context(),
           "expected dY and X of one shape, got ", shape_str(dy.shape()), " and ", shape_str(x.shape()));
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  Shape ns(x.shape().begin() + axis, x.shape().end());
  const int64_t d = numel(ns), rows = d ? x.numel() / d : 0;
  const double eps = node.attr_float("epsilon", 1e-5f);
  dispatch_f32_f64(node, x.dtype(), [&]<typename T>() {
    const T* gamma = ctx.input(2).template data<T>();
    OT_CHECK(ctx.input(2).numel() == d, node.context(), "expected scale of ", d, " values");
    Tensor& dx = ctx.output(0, x.dtype(), x.shape());
    const bool want_ds = ctx.output_requested(1);
    T* ds = want_ds ? ctx.output(1, x.dtype(), ns).template data<T>() : nullptr;
    const T *px = x.data<T>(), *pg = dy.data<T>();
    T* pd = dx.data<T>();
    int threads = std::max(1, omp_get_max_threads());
    std::vector<T> partial(want_ds ? size_t(threads) * size_t(d) : 0, T(0));
    parallel_for(rows, std::max<int64_t>(1, rows / threads), [&](int64_t r0, int64_t r1) {
      T* acc = want_ds ? partial.data() + size_t(omp_get_thread_num()) * size_t(d) : nullptr;
      for (int64_t r = r0; r < r1; ++r) {
        const T *xr = px + r * d, *gr = pg + r * d;
        T ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
        T inv = T(1) / std::sqrt(ss / T(d) + T(eps));
        T m = 0;
        for (int64_t i = 0; i < d; ++i) m += gr[i] * gamma[i] * xr[i] * inv;
        m /= T(d);
        for (int64_t i = 0; i < d; ++i) pd[r * d + i] = inv * (gr[i] * gamma[i] - xr[i] * inv * m);
        if (acc)
          for (int64_t i = 0; i < d; ++i) acc[i] += gr[i] * xr[i] * inv;
      }
    });
    if (ds)
      for (int64_t i = 0; i < d; ++i) {
        T a = 0;
        for (int t = 0; t < threads; ++t) a += partial[size_t(t) * size_t(d) + size_t(i)];
        ds[i] = a;
      }
  });
}

void simplified_ln_grad_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(1);
  ctx.set_output(0, ctx.input_dtype(1), x);
  if (ctx.num_outputs() > 1) {
    std::optional<Shape> p;
    if (x && !x->empty()) {
      int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", -1), int64_t(x->size()));
      p = Shape(x->begin() + axis, x->end());
    }
    ctx.set_output(1, ctx.input_dtype(1), p);
  }
}

// y = x r scale, r = 1/sqrt(mean(x^2) + eps).  dx = r (g - x r mean(g x r)), g = dy scale; dscale = sum(dy x r)
void simplified_ln_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  if (g.has_dy(1)) OT_THROW(kNotImplemented, g.context(), "no gradient flows through the inv_std_var output");
  GraphBuilder::Attrs attrs{{"axis", Attribute::of(n.attr_int("axis", -1))},
                            {"epsilon", Attribute::of(n.attr_float("epsilon", 1e-5f))}};
  auto outs = g.emit_n("SimplifiedLayerNormalizationGrad", {g.dy(0), g.x(0), g.x(1)}, g.needs(1) ? 2 : 1, attrs,
                       kOnnxTrainDomain);
  if (g.needs(0)) g.set(0, outs[0]);
  if (g.needs(1)) g.set(1, g.reshape_like(outs[1], g.x(1)));
}

// --- Skip(Simplified)LayerNormalization ---------------------------------------------------------

template <bool kRms>
void skip_norm_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  DType dt = ctx.input_dtype(0);
  ctx.set_output(0, dt, x);
  std::optional<Shape> stat;
  if (x && !x->empty()) {
    stat = *x;
    stat->back() = 1;
  }
  if (ctx.num_outputs() > 1) ctx.set_output(1, dt, stat);
  if (ctx.num_outputs() > 2) ctx.set_output(2, dt, stat);
  if (ctx.num_outputs() > 3) ctx.set_output(3, dt, x);
}

template <bool kRms>
void skip_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& skip = ctx.input(1);
  OT_CHECK(x.rank() >= 2, node.context(), "expected input of rank 2 or 3, got ", shape_str(x.shape()));
  const int64_t d = x.dim(-1), rows = x.numel() / std::max<int64_t>(d, 1);
  const int64_t skip_rows = skip.numel() / std::max<int64_t>(d, 1);
  OT_CHECK(skip.dtype() == x.dtype() && skip.dim(-1) == d && skip_rows > 0 && rows % skip_rows == 0, node.context(),
           "expected skip of shape [B, S, H], [1, S, H] or [S, H] matching input ", shape_str(x.shape()), ", got ",
           shape_str(skip.shape()));
  const size_t ibeta = kRms ? 99 : 3, ibias = kRms ? 3 : 4;
  dispatch_f32_f64(node, x.dtype(), [&]<typename T>() {
    const T* gamma = vector_input<T>(ctx, 2, d, "gamma");
    const T* beta = kRms ? nullptr : vector_input<T>(ctx, ibeta, d, "beta");
    const T* bias = vector_input<T>(ctx, ibias, d, "bias");
    Shape stat = x.shape();
    stat.back() = 1;
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    T* mean = ctx.output_requested(1) ? ctx.output(1, x.dtype(), stat).template data<T>() : nullptr;
    T* inv = ctx.output_requested(2) ? ctx.output(2, x.dtype(), stat).template data<T>() : nullptr;
    T* sum = ctx.output_requested(3) ? ctx.output(3, x.dtype(), x.shape()).template data<T>() : nullptr;
    norm_rows<T>(rows, d, x.data<T>(), skip.data<T>(), skip_rows, bias, gamma, beta, kRms,
                 node.attr_float("epsilon", 1e-12f), y.data<T>(), sum, mean, inv);
  });
}

// s = input + skip + bias, y = norm(s) (* gamma + beta).  ds = normgrad(dy, s) (+ d input_skip_bias_sum);
// dinput = ds, dskip = sum_to(ds, skip), dbias = sum_to(ds, bias); dgamma, dbeta from the norm's grad.
template <bool kRms>
void skip_norm_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  if (g.has_dy(1) || g.has_dy(2))
    OT_THROW(kNotImplemented, g.context(), "no gradient flows through the mean/inv_std_var outputs");
  const size_t ibeta = 3, ibias = kRms ? 3 : 4;
  std::string s;
  if (n.has_output(3)) {
    s = g.y(3);
  } else {
    s = g.add(g.x(0), g.x(1));
    if (g.has_input(ibias)) s = g.add(s, g.x(ibias));
  }
  float eps = n.attr_float("epsilon", 1e-12f);
  GraphBuilder::Attrs attrs{{"axis", Attribute::of(int64_t(-1))}, {"epsilon", Attribute::of(eps)}};
  bool need_beta = !kRms && g.has_input(ibeta) && g.needs(ibeta);
  size_t nout = need_beta ? 3 : g.needs(2) ? 2 : 1;
  std::vector<std::string> outs;
  std::string ds;
  if (g.has_dy(0)) {
    outs = kRms ? g.emit_n("SimplifiedLayerNormalizationGrad", {g.dy(0), s, g.x(2)}, std::min<size_t>(nout, 2), attrs,
                           kOnnxTrainDomain)
                : g.emit_n("LayerNormalizationGrad", {g.dy(0), s, g.x(2)}, nout, attrs, kOnnxTrainDomain);
    ds = outs[0];
  }
  if (g.has_dy(3)) ds = ds.empty() ? g.dy(3) : g.add(ds, g.dy(3));
  if (ds.empty()) ds = g.zeros_like(g.x(0));
  if (g.needs(0)) g.set(0, ds);
  if (g.needs(1)) g.set(1, g.sum_to(ds, g.x(1)));
  if (g.has_input(ibias) && g.needs(ibias)) g.set(ibias, g.sum_to(ds, g.x(ibias)));
  auto param = [&](size_t i, size_t k) {
    g.set(i, outs.empty() ? g.zeros_like(g.x(i)) : g.reshape_like(outs[k], g.x(i)));
  };
  if (g.needs(2)) param(2, 1);
  if (need_beta) param(ibeta, 2);
}

}  // namespace

ONNXTRAIN_OP(SimplifiedLayerNormalization, kOnnxDomain, 1).inputs(2).outputs(1, 2).shape(simplified_ln_shape)
    .cpu(simplified_ln_kernel).gradient(simplified_ln_gradient);
ONNXTRAIN_OP(SimplifiedLayerNormalization, kMsDomain, 1).inputs(2).outputs(1, 2).shape(simplified_ln_shape)
    .cpu(simplified_ln_kernel).gradient(simplified_ln_gradient);
// (dX, dScale) = SimplifiedLayerNormalizationGrad(dY, X, scale); second derivatives are not needed.
ONNXTRAIN_OP(SimplifiedLayerNormalizationGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1, 2)
    .shape(simplified_ln_grad_shape).cpu(simplified_ln_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed for training");
// ONNX Runtime's training artifacts: (dX, dScale) = SimplifiedLayerNormalizationGrad(dY, X, scale,
// inv_std_var) with the forward's axis and epsilon; the kernel recomputes inv_std_var from X.
ONNXTRAIN_OP(SimplifiedLayerNormalizationGrad, kMsDomain, 1).inputs(3, 4).outputs(1, 2)
    .shape(simplified_ln_grad_shape).cpu(simplified_ln_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed for training");
ONNXTRAIN_OP(SkipSimplifiedLayerNormalization, kMsDomain, 1).inputs(3, 4).outputs(1, 4).shape(skip_norm_shape<true>)
    .cpu(skip_norm_kernel<true>).gradient(skip_norm_gradient<true>);
ONNXTRAIN_OP(SkipLayerNormalization, kMsDomain, 1).inputs(3, 5).outputs(1, 4).shape(skip_norm_shape<false>)
    .cpu(skip_norm_kernel<false>).gradient(skip_norm_gradient<false>);

}  // namespace onnxtrain

// BatchNormalization. Inference: y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c], folded
// into y = x * a[c] + b[c] over (N, C, spatial) rows. Opset 14/15 with training_mode=1 normalises
// with the batch statistics (population variance over N and the spatial dims) and also outputs
// running_mean = mean * momentum + batch_mean * (1 - momentum), and likewise running_var; opsets
// 9-13 are in training mode when they ask for those outputs, and can also output the batch
// statistics (saved_mean, saved_var).
// Opsets before 9 with spatial=0 keep one parameter per (channel, position): the view is then
// (N, C * D1 * ..., 1).
#include <cmath>

#include "ops/gradient_builder.h"
#include "ops/nn/norm_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void shape_batch_norm(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  DType t2 = ctx.input_dtype(3);
  std::optional<Shape> c;
  if (const auto& s = ctx.input_shape(3)) c = *s;
  for (size_t i = 1; i < ctx.num_outputs(); ++i) ctx.set_output(i, t2, c);
}

// kOrt: com.microsoft.BatchNormInternal, ONNX Runtime's training form: training unless
// training_mode = 0, and outputs 3 and 4 are the batch mean and 1 / sqrt(batch var + epsilon)
// (its BatchNormalizationGrad's inputs).
template <bool kOrt = false>
void batch_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  bool training = kOrt ? node.attr_int("training_mode", 1) != 0 : batch_norm_training(node, ctx.opset());
  if (!training)
    for (size_t i = 1; i < ctx.num_outputs(); ++i)
      if (ctx.output_requested(i))
        OT_THROW(kInvalidModel, node.context(), "running_mean/running_var outputs need training_mode=1");
  const bool spatial = ctx.opset() >= 9 || node.attr_int("spatial", 1) != 0;
  OT_CHECK(spatial || !training, node.context(), "spatial=0 is not supported in training mode");
  const int64_t n = x.dim(0);
  int64_t c = x.dim(1), s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  if (!spatial) { c *= s; s = 1; }
  const float eps = node.attr_float("epsilon", 1e-5f);
  const float momentum = node.attr_float("momentum", 0.9f);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());

  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    std::vector<C> scale = channel_param<C>(node, ctx.input(1), c, "scale");
    std::vector<C> bias = channel_param<C>(node, ctx.input(2), c, "B");
    std::vector<C> mean = channel_param<C>(node, ctx.input(3), c, "input_mean");
    std::vector<C> var = channel_param<C>(node, ctx.input(4), c, "input_var");
    const T* px = x.data<T>();
    T* py = y.data<T>();
    if (training) {
      std::vector<C> bm(static_cast<size_t>(c)), bv(static_cast<size_t>(c));
      const C inv_count = C(1) / C(std::max<int64_t>(n * s, 1));
      parallel_for(c, 1, [&](int64_t b, int64_t e) {
        for (int64_t ch = b; ch < e; ++ch) {
          C sum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* row = px + (i * c + ch) * s;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < s; ++j) sum += C(row[j]);
          }
          const C mu = sum * inv_count;
          C sq = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* row = px + (i * c + ch) * s;
#pragma omp simd reduction(+ : sq)
            for (int64_t j = 0; j < s; ++j) { C dd = C(row[j]) - mu; sq += dd * dd; }
          }
          bm[size_t(ch)] = mu;
          bv[size_t(ch)] = sq * inv_count;
        }
      });
      // Opsets 9-13 also output the batch statistics themselves (saved_mean, saved_var).
      for (size_t k = 3; k <= 4 && k < ctx.num_outputs(); ++k) {
        if (!ctx.output_requested(k)) continue;
        const Tensor& like = ctx.input(k == 3 ? 3 : 4);
        Tensor& out = ctx.output(k, like.dtype(), like.shape());
        const std::vector<C>& batch = k == 3 ? bm : bv;
        const bool inv_std = kOrt && k == 4;
        dispatch_float(like.dtype(), [&]<typename U>() {
          U* po = out.data<U>();
          for (int64_t ch = 0; ch < c; ++ch)
            po[ch] = cast_value<U>(inv_std ? C(1) / std::sqrt(batch[size_t(ch)] + C(eps)) : batch[size_t(ch)]);
        });
      }
      for (size_t k = 1; k <= 2; ++k) {
        if (!ctx.output_requested(k)) continue;
        const Tensor& src = ctx.input(k + 2);
        Tensor& out = ctx.output(k, src.dtype(), src.shape());
        const std::vector<C>& run = k == 1 ? mean : var;
        const std::vector<C>& batch = k == 1 ? bm : bv;
        dispatch_float(src.dtype(), [&]<typename U>() {
          U* po = out.data<U>();
          for (int64_t ch = 0; ch < c; ++ch)
            po[ch] = cast_value<U>(run[size_t(ch)] * C(momentum) + batch[size_t(ch)] * (C(1) - C(momentum)));
        });
      }
      mean = std::move(bm);
      var = std::move(bv);
    }
    std::vector<C> a(static_cast<size_t>(c)), b(static_cast<size_t>(c));
    for (int64_t ch = 0; ch < c; ++ch) {
      a[size_t(ch)] = scale[size_t(ch)] / std::sqrt(var[size_t(ch)] + C(eps));
      b[size_t(ch)] = bias[size_t(ch)] - mean[size_t(ch)] * a[size_t(ch)];
    }
    int64_t rows = n * c;
    if (s == 1) {  // one parameter per element of a row of c
      parallel_for(n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(c, 1)), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const T* xr = px + i * c;
          T* yr = py + i * c;
#pragma omp simd
          for (int64_t ch = 0; ch < c; ++ch) yr[ch] = T(C(xr[ch]) * a[size_t(ch)] + b[size_t(ch)]);
        }
      });
      return;
    }
    parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(s, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const C ar = a[size_t(r % c)], br = b[size_t(r % c)];
        const T* xr = px + r * s;
        T* yr = py + r * s;
#pragma omp simd
        for (int64_t j = 0; j < s; ++j) yr[j] = T(C(xr[j]) * ar + br);
      }
    });
  });
}

// onnxtrain.BatchNormalizationGrad(dY, X, scale, mean, var) -> dX, dScale, dB, dMean, dVar with the
// forward's epsilon, training_mode and (pre-9) spatial. Training mode recomputes the batch
// statistics (the forward does not save them) and differentiates through them; mean and var are
// then unused and dMean/dVar are 0. Inference mode uses mean and var as constants. Parallel over
// channels; each channel's rows are three sweeps (statistics, sums, dX).
// kOrt: com.microsoft.BatchNormalizationGrad(dY, X, scale, saved_mean, saved_inv_std) -> dX,
// dScale, dB of ONNX Runtime's training artifacts: always training mode; the batch statistics are
// recomputed from X, as for onnxtrain's own form.
template <bool kOrt = false>
void batch_norm_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), node.context(), "dY and X must match, got ",
           dtype_name(dy.dtype()), " ", shape_str(dy.shape()), " and ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  const bool training = kOrt || node.attr_int("training_mode", 0) != 0;
  const bool spatial = node.attr_int("spatial", 1) != 0;
  const int64_t n = x.dim(0);
  int64_t c = x.dim(1), s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  if (!spatial) { c *= s; s = 1; }
  const float eps = node.attr_float("epsilon", 1e-5f);
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::vector<C> scale = channel_param<C>(node, ctx.input(2), c, "scale");
    std::vector<C> mean(size_t(c), C(0)), var(size_t(c), C(1));
    if (!training) {
      mean = channel_param<C>(node, ctx.input(3), c, "input_mean");
      var = channel_param<C>(node, ctx.input(4), c, "input_var");
    }
    std::vector<C> ds(static_cast<size_t>(c)), db(static_cast<size_t>(c)), dm(static_cast<size_t>(c)), dv(static_cast<size_t>(c));
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(c, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(3 * n * s, 1)), [&](int64_t b, int64_t e) {
      for (int64_t ch = b; ch < e; ++ch) {
        C mu = mean[size_t(ch)], r = C(1) / std::sqrt(var[size_t(ch)] + C(eps)), sdy = 0, sdyxh = 0;
        const C gamma = scale[size_t(ch)];
        norm_group_backward<T, C>(pdy, px, pdx, n, s, [&](int64_t i) { return (i * c + ch) * s; }, gamma, training,
                                  C(eps), mu, r, sdy, sdyxh);
        ds[size_t(ch)] = sdyxh;
        db[size_t(ch)] = sdy;
        dm[size_t(ch)] = training ? C(0) : -gamma * r * sdy;
        dv[size_t(ch)] = training ? C(0) : C(-0.5) * gamma * r * r * sdyxh;
      }
    });
    write_channel_output(ctx, 1, ctx.input(2), ds);
    write_channel_output(ctx, 2, ctx.input(2), db);
    if (!kOrt && (ctx.output_requested(3) || ctx.output_requested(4))) {
      OT_CHECK(ctx.has_input(3) && ctx.has_input(4), node.context(), "dMean and dVar need the mean and var inputs");
      write_channel_output(ctx, 3, ctx.input(3), dm);
      write_channel_output(ctx, 4, ctx.input(4), dv);
    }
  });
}

void shape_batch_norm_grad(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
  for (size_t i = 1; i < ctx.num_outputs(); ++i) {
    size_t like = i <= 2 ? 2 : i;
    ctx.set_output(i, ctx.input_dtype(like), ctx.input_shape(like));
  }
}

// y = xh * scale + B, xh = (x - mean) / sqrt(var + eps).  Inference: dx = dy * scale / sqrt(var + eps);
// training: dx = r * (g - mean(g) - xh * mean(g * xh)) with g = dy * scale, r = 1/sqrt(var + eps);
// dscale = sum(dy * xh), dB = sum(dy)  (sums over N and spatial dims). Inference also gives
// dmean = -sum(dy) * scale * r and dvar = -sum(dy * xh) * scale * r^2 / 2; in training the
// running-statistic outputs give dmean = momentum * drunning_mean, dvar = momentum * drunning_var.
void batch_norm_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  const bool training = batch_norm_training(n, g.opset());
  GraphBuilder::Attrs attrs{{"epsilon", Attribute::of(n.attr_float("epsilon", 1e-5f))},
                            {"training_mode", Attribute::of(int64_t(training ? 1 : 0))}};
  if (g.opset() < 9 && n.attr_int("spatial", 1) == 0) attrs["spatial"] = Attribute::of(int64_t(0));
  if (g.has_dy(3) || g.has_dy(4))
    OT_THROW(kNotImplemented, g.context(), "gradients through saved_mean/saved_var (opsets 9-13)");
  const bool running_grads = g.has_dy(1) || g.has_dy(2);
  if (running_grads && g.needs(0))
    OT_THROW(kNotImplemented, g.context(), "the gradient of running_mean/running_var with respect to X");
  bool want_x = g.has_dy(0) && (g.needs(0) || g.needs(1) || g.needs(2) || (!training && (g.needs(3) || g.needs(4))));
  std::vector<std::string> outs;
  if (want_x) {
    size_t nout = !training && (g.needs(3) || g.needs(4)) ? 5 : g.needs(2) ? 3 : g.needs(1) ? 2 : 1;
    outs = g.emit_n("BatchNormalizationGrad", {g.dy(0), g.x(0), g.x(1), g.x(3), g.x(4)}, nout, attrs, kOnnxTrainDomain);
  }
  auto out_or_zero = [&](size_t k, size_t input) { return k < outs.size() ? outs[k] : g.zeros_like(g.x(input)); };
  if (g.needs(0)) g.set(0, out_or_zero(0, 0));
  if (g.needs(1)) g.set(1, out_or_zero(1, 1));
  if (g.needs(2)) g.set(2, out_or_zero(2, 2));
  for (size_t k = 3; k <= 4; ++k) {
    if (!g.needs(k)) continue;
    if (training) {  // running = input * momentum + batch * (1 - momentum)
      g.set(k, g.has_dy(k - 2) ? g.mul(g.dy(k - 2), g.scalar_like(n.attr_float("momentum", 0.9f), g.x(k)))
                               : g.zeros_like(g.x(k)));
    } else {
      g.set(k, out_or_zero(k, k));
    }
  }
}

// Training mode: outputs 1 and 2 are the new running mean and variance (inputs 3 and 4).
std::vector<StateUpdate> batch_norm_state_updates(const Node& node, int64_t opset) {
  std::vector<StateUpdate> updates;
  if (!batch_norm_training(node, opset)) return updates;
  if (node.has_output(1)) updates.push_back({.input = 3, .output = 1});
  if (node.has_output(2)) updates.push_back({.input = 4, .output = 2, .running_variance = true});
  return updates;
}

void batch_norm_inference_form(Node& node, int64_t opset) {
  if (!batch_norm_training(node, opset)) return;
  node.attributes.erase("training_mode");
  node.outputs.resize(1);
}

}  // namespace

ONNXTRAIN_OP(BatchNormalization, kOnnxDomain, 1).inputs(5).outputs(1, 5).shape(shape_batch_norm).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(batch_norm_kernel<>).gradient(batch_norm_gradient)
    .state_inputs({3, 4}).state_updates(batch_norm_state_updates).inference_form(batch_norm_inference_form);
// (dX, dScale, dB, dMean, dVar) = BatchNormalizationGrad(dY, X, scale, mean, var); second derivatives are not needed.
ONNXTRAIN_OP(BatchNormalizationGrad, kOnnxTrainDomain, 1).inputs(5).outputs(1, 5).shape(shape_batch_norm_grad)
    .inplace(0, 0).cpu(batch_norm_grad_kernel<>).gradient_not_implemented("second derivatives are not needed");
// ONNX Runtime's training form (its artifacts rewrite training-mode BatchNormalization to it):
// (Y, running_mean, running_var, saved_mean, saved_inv_std) = BatchNormInternal(X, scale, B, mean, var).
ONNXTRAIN_OP(BatchNormInternal, kMsDomain, 1).inputs(5).outputs(1, 5).shape(shape_batch_norm)
    .work(memory_bound_work).cpu(batch_norm_kernel<true>)
    .gradient_not_implemented("ONNX Runtime's artifacts come differentiated (BatchNormalizationGrad)");
// (dX, dScale, dB) = BatchNormalizationGrad(dY, X, scale, saved_mean, saved_inv_std), ORT's form.
ONNXTRAIN_OP(BatchNormalizationGrad, kMsDomain, 1).inputs(5).outputs(1, 3).shape(shape_batch_norm_grad)
    .inplace(0, 0).cpu(batch_norm_grad_kernel<true>).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

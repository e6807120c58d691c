// BatchNormalization. Inference: y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c], folded
// into y = x * a[c] + b[c] over (N, C, spatial) rows. Opset 14/15 with training_mode=1 normalises
// with the batch statistics (population variance over N and the spatial dims) and also outputs
// running_mean = mean * momentum + batch_mean * (1 - momentum), and likewise running_var.
// Opsets before 9 with spatial=0 keep one parameter per (channel, position): the view is then
// (N, C * D1 * ..., 1).
#include <cmath>

#include "ops/nn/norm_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

bool training_mode(const Node& node, int64_t opset) {
  return opset >= 14 && node.attr_int("training_mode", 0) != 0;
}

void shape_batch_norm(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  DType t2 = ctx.input_dtype(3);
  std::optional<Shape> c;
  if (const auto& s = ctx.input_shape(3)) c = *s;
  for (size_t i = 1; i < ctx.num_outputs(); ++i) ctx.set_output(i, t2, c);
}

void batch_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  bool training = training_mode(node, ctx.opset());
  if (!training) {
    for (size_t i = 1; i < ctx.num_outputs(); ++i)
      if (ctx.output_requested(i))
        OT_THROW(kNotImplemented, node.context(),
                 ctx.opset() >= 14 ? "running_mean/running_var outputs need training_mode=1"
                                   : "training outputs (mean, var, saved_mean, saved_var) of opsets before 14 are not supported");
  }
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
    parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / s), [&](int64_t lo, int64_t hi) {
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

}  // namespace

// y = xh * scale + B, xh = (x - mean) / sqrt(var + eps).  Inference: dx = dy * scale / sqrt(var + eps);
// training: dx = r * (g - mean(g) - xh * mean(g * xh)) with g = dy * scale, r = 1/sqrt(var + eps);
// dscale = sum(dy * xh), dB = sum(dy)  (sums over N and spatial dims)
ONNXTRAIN_OP(BatchNormalization, kOnnxDomain, 1).inputs(5).outputs(1, 5).shape(shape_batch_norm).inplace(0, 0)
    .cpu(batch_norm_kernel);

}  // namespace onnxtrain

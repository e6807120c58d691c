// InstanceNormalization: for every (n, c) the spatial values are normalised with their own mean
// and population variance, then y = scale[c] * xh + B[c]. One row per (n, c), parallel over rows,
// three vectorised sweeps per row.
#include <cmath>

#include "ops/gradient_builder.h"
#include "ops/nn/norm_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void instance_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  const int64_t c = x.dim(1), rows = x.dim(0) * c;
  int64_t s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  const float eps = node.attr_float("epsilon", 1e-5f);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::vector<C> scale = channel_param<C>(node, ctx.input(1), c, "scale");
    std::vector<C> bias = channel_param<C>(node, ctx.input(2), c, "B");
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const C inv_s = C(1) / C(std::max<int64_t>(s, 1));
    parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / (3 * std::max<int64_t>(s, 1))),
                 [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * s;
        T* yr = py + r * s;
        C sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < s; ++j) sum += C(xr[j]);
        const C mean = sum * inv_s;
        C sq = 0;
#pragma omp simd reduction(+ : sq)
        for (int64_t j = 0; j < s; ++j) { C d = C(xr[j]) - mean; sq += d * d; }
        const C a = scale[size_t(r % c)] / std::sqrt(sq * inv_s + C(eps));
        const C off = bias[size_t(r % c)] - mean * a;
#pragma omp simd
        for (int64_t j = 0; j < s; ++j) yr[j] = T(C(xr[j]) * a + off);
      }
    });
  });
}

// onnxtrain.InstanceNormalizationGrad(dY, X, scale) -> dX, dScale, dB with the forward's epsilon.
// Each (n, c) row recomputes its statistics and is differentiated through them (three sweeps);
// rows are parallel and the per-row parameter sums are folded over N at the end.
void instance_norm_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), node.context(), "dY and X must match, got ",
           dtype_name(dy.dtype()), " ", shape_str(dy.shape()), " and ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  const int64_t n = x.dim(0), c = x.dim(1), rows = n * c;
  int64_t s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  const float eps = node.attr_float("epsilon", 1e-5f);
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::vector<C> scale = channel_param<C>(node, ctx.input(2), c, "scale");
    std::vector<C> row_dyxh(static_cast<size_t>(rows)), row_dy(static_cast<size_t>(rows));
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / (3 * std::max<int64_t>(s, 1))), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        C mu = 0, inv = 0;
        norm_group_backward<T, C>(pdy + r * s, px + r * s, pdx + r * s, 1, s, [](int64_t) { return int64_t(0); },
                                  scale[size_t(r % c)], true, C(eps), mu, inv, row_dy[size_t(r)], row_dyxh[size_t(r)]);
      }
    });
    std::vector<C> ds(size_t(c), C(0)), db(size_t(c), C(0));
    for (int64_t r = 0; r < rows; ++r) {
      ds[size_t(r % c)] += row_dyxh[size_t(r)];
      db[size_t(r % c)] += row_dy[size_t(r)];
    }
    write_channel_output(ctx, 1, ctx.input(2), ds);
    write_channel_output(ctx, 2, ctx.input(2), db);
  });
}

void shape_instance_norm_grad(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
  for (size_t i = 1; i < ctx.num_outputs(); ++i) ctx.set_output(i, ctx.input_dtype(2), ctx.input_shape(2));
}

}  // namespace

// y = xh * scale[c] + B[c], xh = (x - mu) * r per (n, c).  dx = r * (g - mean(g) - xh * mean(g * xh)),
// g = dy * scale[c]; dscale = sum(dy * xh), dB = sum(dy)
ONNXTRAIN_OP(InstanceNormalization, kOnnxDomain, 1).inputs(3).outputs(1).shape(shape_same_as_input)
    .inplace(0, 0).cpu(instance_norm_kernel).gradient([](GradientBuilder& g) {
      size_t nout = g.needs(2) ? 3 : g.needs(1) ? 2 : 1;
      auto outs = g.emit_n("InstanceNormalizationGrad", {g.dy(0), g.x(0), g.x(1)}, nout,
                           {{"epsilon", Attribute::of(g.node().attr_float("epsilon", 1e-5f))}}, kOnnxTrainDomain);
      for (size_t i = 0; i < nout; ++i) g.set(i, outs[i]);
    });
// (dX, dScale, dB) = InstanceNormalizationGrad(dY, X, scale); second derivatives are not needed.
ONNXTRAIN_OP(InstanceNormalizationGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1, 3).shape(shape_instance_norm_grad)
    .inplace(0, 0).cpu(instance_norm_grad_kernel).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

// LayerNormalization (opset 17): normalises over the dims [axis, rank) of X, then applies Scale and
// the optional bias B, both broadcast to those dims. Optional outputs Mean and InvStdDev have shape
// X.shape[:axis] + [1] * (rank - axis) and the dtype named by stash_type. The statistics are
// computed in float (double for double inputs): per row one thread makes three vectorised sweeps
// over data in cache (mean, variance about the mean, output); rows are spread with parallel_for.
#include <cmath>

#include "ops/nn/norm_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

DType stash_dtype(const Node& node) {
  int64_t s = node.attr_int("stash_type", 1);
  OT_CHECK(s == 1 || s == 11 || s == 16, node.context(),
           "stash_type must be float (1), double (11) or bfloat16 (16), got ", s);
  return DType(int32_t(s));
}

Shape stat_shape(const Shape& x, int64_t axis) {
  Shape s(x.begin(), x.begin() + axis);
  s.resize(x.size(), 1);
  return s;
}

void shape_layer_norm(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  ctx.set_output(0, ctx.input_dtype(0), in);
  DType u = stash_dtype(ctx.node());
  if (!in) {
    ctx.set_output(1, u);
    ctx.set_output(2, u);
    return;
  }
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", -1), int64_t(in->size()));
  ctx.set_output(1, u, stat_shape(*in, axis));
  ctx.set_output(2, u, stat_shape(*in, axis));
}

void layer_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() > 0, node.context(), "expected X of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  float eps = node.attr_float("epsilon", 1e-5f);
  DType u = stash_dtype(node);
  Shape norm_shape(x.shape().begin() + axis, x.shape().end());
  int64_t d = numel(norm_shape), rows = numel(Shape(x.shape().begin(), x.shape().begin() + axis));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  Tensor* mean_out = ctx.output_requested(1) ? &ctx.output(1, u, stat_shape(x.shape(), axis)) : nullptr;
  Tensor* inv_out = ctx.output_requested(2) ? &ctx.output(2, u, stat_shape(x.shape(), axis)) : nullptr;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    OT_CHECK(ctx.input(1).dtype() == x.dtype(), node.context(), "Scale must have X's dtype ",
             dtype_name(x.dtype()), ", got ", dtype_name(ctx.input(1).dtype()));
    std::vector<C> scale = broadcast_param<C>(node, ctx.input(1), norm_shape, "Scale");
    std::vector<C> bias = ctx.has_input(2) ? broadcast_param<C>(node, ctx.input(2), norm_shape, "B")
                                           : std::vector<C>(static_cast<size_t>(d), C(0));
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const C* ps = scale.data();
    const C* pb = bias.data();
    const C inv_d = C(1) / C(std::max<int64_t>(d, 1));
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (4 * std::max<int64_t>(d, 1)));
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * d;
        T* yr = py + r * d;
        C sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < d; ++i) sum += C(xr[i]);
        const C mean = sum * inv_d;
        C sq = 0;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < d; ++i) {
          C c = C(xr[i]) - mean;
          sq += c * c;
        }
        const C inv = C(1) / std::sqrt(sq * inv_d + C(eps));
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) yr[i] = T((C(xr[i]) - mean) * inv * ps[i] + pb[i]);
        if (mean_out || inv_out) {
          dispatch_float(u, [&]<typename U>() {
            if (mean_out) mean_out->data<U>()[r] = cast_value<U>(mean);
            if (inv_out) inv_out->data<U>()[r] = cast_value<U>(inv);
          });
        }
      }
    });
  });
}

}  // namespace

// y = (x - mu) * r * scale + b, r = 1/sqrt(var + eps), xh = (x - mu) * r, g = dy * scale.
// dx = r * (g - mean(g) - xh * mean(g * xh)), dscale = sum(dy * xh), db = sum(dy)  (over the rows)
ONNXTRAIN_OP(LayerNormalization, kOnnxDomain, 17).inputs(2, 3).outputs(1, 3).shape(shape_layer_norm)
    .inplace(0, 0).cpu(layer_norm_kernel);

}  // namespace onnxtrain

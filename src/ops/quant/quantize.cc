// Linear quantization: QuantizeLinear, DequantizeLinear (opset 10, and 13 with per-axis scales)
// and DynamicQuantizeLinear (opset 11).
//
//   QuantizeLinear:        y = saturate(round_half_even(x / scale) + zero_point)
//   DequantizeLinear:      y = (x - zero_point) * scale
//   DynamicQuantizeLinear: scale = (max(x, 0) - min(x, 0)) / 255,
//                          zero_point = saturate(round_half_even(0 - min(x, 0) / scale)), uint8
//
// scale and zero_point are scalars (per tensor) or, from opset 13, 1-D along `axis` (per axis).
// Quantized types are uint8 and int8 (and int32 input for DequantizeLinear, with no zero point).
#include <cfenv>
#include <cmath>
#include <limits>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// Rounds half to even (the default floating-point rounding mode), then saturates into Q's range.
// NaN maps to 0 before the zero point is added, so no undefined cast is ever made.
template <typename Q, typename F>
Q saturate_round(F v, int32_t zero_point) {
  F r = std::isnan(v) ? F(0) : std::nearbyint(v);
  F q = r + F(zero_point);
  constexpr F lo = F(std::numeric_limits<Q>::min()), hi = F(std::numeric_limits<Q>::max());
  return Q(q < lo ? lo : (q > hi ? hi : q));
}

// How scale/zero point index the elements: per tensor, or per channel along `axis`, where
// element i's channel is (i / inner) % channels.
struct QuantLayout {
  int64_t channels = 1, inner = 1;  // channels == 1: per tensor
};

QuantLayout quant_layout(const KernelContext& ctx, const Tensor& x, const Tensor& scale) {
  const Node& node = ctx.node();
  QuantLayout q;
  OT_CHECK(scale.rank() <= 1, node.context(), "expected a scalar or 1-D scale, got shape ", shape_str(scale.shape()));
  if (scale.numel() == 1) return q;  // per tensor
  OT_CHECK(ctx.opset() >= 13, node.context(), "per-axis scales need opset 13, the model has opset ", ctx.opset());
  OT_CHECK(x.rank() > 0, node.context(), "a per-axis scale needs an x of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", 1), x.rank());
  OT_CHECK(scale.numel() == x.dim(int(axis)), node.context(), "expected a scale of length ", x.dim(int(axis)),
           " (x's dim ", axis, "), got ", scale.numel());
  q.channels = scale.numel();
  for (int i = int(axis) + 1; i < x.rank(); ++i) q.inner *= x.dim(i);
  return q;
}

// Zero points as int32 per channel (all 0 when absent); checks shape agreement with the scale.
std::vector<int32_t> zero_points(const KernelContext& ctx, size_t i, const Tensor& scale, DType expected) {
  std::vector<int32_t> zp(size_t(std::max<int64_t>(scale.numel(), 1)), 0);
  if (!ctx.has_input(i)) return zp;
  const Tensor& z = ctx.input(i);
  OT_CHECK(z.dtype() == expected, ctx.node().context(), "expected a zero point of dtype ", dtype_name(expected),
           ", got ", dtype_name(z.dtype()));
  OT_CHECK(z.numel() == scale.numel(), ctx.node().context(), "zero point shape ", shape_str(z.shape()),
           " does not match scale shape ", shape_str(scale.shape()));
  for (size_t k = 0; k < zp.size(); ++k) zp[k] = int32_t(z.item_as_int(int64_t(k)));
  return zp;
}

// ---- QuantizeLinear ----------------------------------------------------------------------------

template <typename X, typename Q, typename S>
void quantize(const Tensor& x, const Tensor& scale, const std::vector<int32_t>& zp, const QuantLayout& q, Tensor& y) {
  // float32 (and half) inputs divide in float as the reference does; double and int32 in double.
  using F = std::conditional_t<std::is_same_v<X, double> || std::is_same_v<X, int32_t>, double, float>;
  const X* xp = x.data<X>();
  const S* sp = scale.data<S>();
  Q* yp = y.data<Q>();
  if (q.channels == 1) {
    F s = F(compute_t<S>(sp[0]));
    int32_t z = zp[0];
    unary_map(xp, yp, x.numel(), [s, z](X v) { return saturate_round<Q>(F(compute_t<X>(v)) / s, z); });
    return;
  }
  int64_t n = x.numel(), outer = n / (q.channels * q.inner);
  parallel_for(outer * q.channels, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(q.inner, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t row = b; row < e; ++row) {
                   int64_t c = row % q.channels;
                   F s = F(compute_t<S>(sp[c]));
                   int32_t z = zp[size_t(c)];
                   for (int64_t i = row * q.inner, end = i + q.inner; i < end; ++i)
                     yp[i] = saturate_round<Q>(F(compute_t<X>(xp[i])) / s, z);
                 }
               });
}

void quantize_linear_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  OT_CHECK(is_floating(scale.dtype()), node.context(), "expected a floating-point y_scale, got ",
           dtype_name(scale.dtype()));
  DType qt = ctx.has_input(2) ? ctx.input(2).dtype() : DType::kUint8;
  OT_CHECK(qt == DType::kUint8 || qt == DType::kInt8, node.context(), "expected a uint8 or int8 y_zero_point, got ",
           dtype_name(qt));
  QuantLayout q = quant_layout(ctx, x, scale);
  std::vector<int32_t> zp = zero_points(ctx, 2, scale, qt);
  Tensor& y = ctx.output(0, qt, x.shape());
  auto by_q = [&]<typename X, typename S>() {
    if (qt == DType::kUint8) quantize<X, uint8_t, S>(x, scale, zp, q, y);
    else quantize<X, int8_t, S>(x, scale, zp, q, y);
  };
  auto by_x = [&]<typename S>() {
    if (x.dtype() == DType::kInt32) by_q.template operator()<int32_t, S>();
    else dispatch_float(x.dtype(), [&]<typename X>() { by_q.template operator()<X, S>(); });
  };
  dispatch_float(scale.dtype(), [&]<typename S>() { by_x.template operator()<S>(); });
}

void quantize_linear_shape(ShapeContext& ctx) {
  DType qt = ctx.has_input(2) ? ctx.input_dtype(2) : DType::kUint8;
  ctx.set_output(0, qt, ctx.input_shape(0));
}

// ---- DequantizeLinear --------------------------------------------------------------------------

template <typename Q, typename S>
void dequantize(const Tensor& x, const Tensor& scale, const std::vector<int32_t>& zp, const QuantLayout& q, Tensor& y) {
  using F = compute_t<S>;
  const Q* xp = x.data<Q>();
  const S* sp = scale.data<S>();
  S* yp = y.data<S>();
  if (q.channels == 1) {
    F s = F(sp[0]);
    int32_t z = zp[0];
    unary_map(xp, yp, x.numel(), [s, z](Q v) { return S(F(int32_t(v) - z) * s); });
    return;
  }
  int64_t n = x.numel(), outer = n / (q.channels * q.inner);
  parallel_for(outer * q.channels, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(q.inner, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t row = b; row < e; ++row) {
                   int64_t c = row % q.channels;
                   F s = F(sp[c]);
                   int32_t z = zp[size_t(c)];
                   for (int64_t i = row * q.inner, end = i + q.inner; i < end; ++i) yp[i] = S(F(int32_t(xp[i]) - z) * s);
                 }
               });
}

void dequantize_linear_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  OT_CHECK(is_floating(scale.dtype()), node.context(), "expected a floating-point x_scale, got ",
           dtype_name(scale.dtype()));
  OT_CHECK(x.dtype() == DType::kUint8 || x.dtype() == DType::kInt8 || x.dtype() == DType::kInt32, node.context(),
           "expected x of dtype uint8, int8 or int32, got ", dtype_name(x.dtype()));
  QuantLayout q = quant_layout(ctx, x, scale);
  std::vector<int32_t> zp = zero_points(ctx, 2, scale, x.dtype());
  if (x.dtype() == DType::kInt32)
    for (int32_t z : zp) OT_CHECK(z == 0, node.context(), "an int32 x takes no zero point (or 0), got ", z);
  Tensor& y = ctx.output(0, scale.dtype(), x.shape());
  dispatch_float(scale.dtype(), [&]<typename S>() {
    switch (x.dtype()) {
      case DType::kUint8: dequantize<uint8_t, S>(x, scale, zp, q, y); break;
      case DType::kInt8: dequantize<int8_t, S>(x, scale, zp, q, y); break;
      default: dequantize<int32_t, S>(x, scale, zp, q, y); break;
    }
  });
}

void dequantize_linear_shape(ShapeContext& ctx) {
  DType st = ctx.input_dtype(1);
  ctx.set_output(0, st == DType::kUndefined ? DType::kFloat32 : st, ctx.input_shape(0));
}

// ---- DynamicQuantizeLinear ---------------------------------------------------------------------

void dynamic_quantize_linear_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.dtype() == DType::kFloat32, node.context(), "expected a float32 x, got ", dtype_name(x.dtype()));
  const float* xp = x.data<float>();
  int64_t n = x.numel();
  // The range always includes 0. NaNs are ignored by the min/max.
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, xp[i]);
    hi = std::max(hi, xp[i]);
  }
  OT_CHECK(std::isfinite(lo) && std::isfinite(hi), node.context(), "x holds an infinite value; no scale fits it");
  constexpr float qmin = 0.0f, qmax = 255.0f;
  float scale = (hi - lo) / (qmax - qmin);
  float zp_f = scale > 0 ? qmin - lo / scale : 0.0f;
  uint8_t zp = uint8_t(std::nearbyint(std::min(qmax, std::max(qmin, zp_f))));
  Tensor y = ctx.output(0, DType::kUint8, x.shape());
  Tensor ys = ctx.output(1, DType::kFloat32, {});
  Tensor yz = ctx.output(2, DType::kUint8, {});
  ys.data<float>()[0] = scale;
  yz.data<uint8_t>()[0] = zp;
  uint8_t* yp = y.data<uint8_t>();
  if (scale > 0) {
    unary_map(xp, yp, n, [scale, zp](float v) { return saturate_round<uint8_t>(v / scale, zp); });
  } else {
    std::fill(yp, yp + n, uint8_t(0));  // x is all zeros
  }
}

void dynamic_quantize_linear_shape(ShapeContext& ctx) {
  ctx.set_output(0, DType::kUint8, ctx.input_shape(0));
  ctx.set_output(1, DType::kFloat32, Shape{});
  ctx.set_output(2, DType::kUint8, Shape{});
}

}  // namespace

// Integer outputs: no gradient flows (straight-through estimators are a training-graph choice).
ONNXTRAIN_OP(QuantizeLinear, kOnnxDomain, 10).inputs(2, 3).outputs(1).shape(quantize_linear_shape)
    .not_differentiable().cpu(quantize_linear_kernel);
// Opset 13: per-axis scale and zero point along `axis`.
ONNXTRAIN_OP(QuantizeLinear, kOnnxDomain, 13).inputs(2, 3).outputs(1).shape(quantize_linear_shape)
    .not_differentiable().cpu(quantize_linear_kernel);
ONNXTRAIN_OP(DequantizeLinear, kOnnxDomain, 10).inputs(2, 3).outputs(1).shape(dequantize_linear_shape)
    .not_differentiable().cpu(dequantize_linear_kernel);
// Opset 13: per-axis scale and zero point along `axis`.
ONNXTRAIN_OP(DequantizeLinear, kOnnxDomain, 13).inputs(2, 3).outputs(1).shape(dequantize_linear_shape)
    .not_differentiable().cpu(dequantize_linear_kernel);
ONNXTRAIN_OP(DynamicQuantizeLinear, kOnnxDomain, 11).inputs(1).outputs(3).shape(dynamic_quantize_linear_shape)
    .not_differentiable().cpu(dynamic_quantize_linear_kernel);

}  // namespace onnxtrain

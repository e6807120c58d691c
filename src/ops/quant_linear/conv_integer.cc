// ConvInteger (opset 10): y = conv(x - x_zero_point, w - w_zero_point) in int32, with Conv's
// attributes (auto_pad, dilations, group, kernel_shape, pads, strides). x_zero_point is per tensor,
// w_zero_point per tensor or per output channel.
//
// QLinearConv (opset 10): the same convolution plus an optional int32 bias B, requantized:
// y = saturate(round_half_even((acc + B) * x_scale * w_scale[m] / y_scale) + y_zero_point), y of
// y_zero_point's dtype (uint8 or int8).
#include "ops/quant_linear/quant_linear_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

using namespace quant_linear;

void conv_integer_shape_rule(ShapeContext& ctx) {
  ctx.set_output(0, DType::kInt32, conv_integer_shape(ctx.node(), ctx.input_shape(0), ctx.input_shape(1)));
}

void conv_integer_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  check_quant_input(ctx, x, "x", 2);
  check_quant_input(ctx, w, "w", 3);
  QuantParam xz = read_param(ctx, 2, "x_zero_point", 1, 0.0);
  QuantParam wz = read_param(ctx, 3, "w_zero_point", w.rank() >= 1 ? w.dim(0) : 1, 0.0);
  Shape out;
  std::vector<int32_t> acc = conv_integer(ctx, x, xz, w, wz, nullptr, out);
  Tensor& y = ctx.output(0, DType::kInt32, out);
  std::copy(acc.begin(), acc.end(), y.data<int32_t>());
}

// Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B.
DType qlinear_conv_out_dtype(DType y_zp, DType x) { return y_zp == DType::kUndefined ? x : y_zp; }

void qlinear_conv_shape(ShapeContext& ctx) {
  ctx.set_output(0, qlinear_conv_out_dtype(ctx.input_dtype(7), ctx.input_dtype(0)),
                 conv_integer_shape(ctx.node(), ctx.input_shape(0), ctx.input_shape(3)));
}

void qlinear_conv_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(3);
  check_quant_input(ctx, x, "x", 2);
  check_quant_input(ctx, w, "w", 5);
  const int64_t M = w.rank() >= 1 ? w.dim(0) : 1;
  DType out_dt = qlinear_conv_out_dtype(ctx.has_input(7) ? ctx.input(7).dtype() : DType::kUndefined, x.dtype());
  OT_CHECK(out_dt == DType::kUint8 || out_dt == DType::kInt8, node.context(), "y_zero_point must be uint8 or int8, got ",
           dtype_name(out_dt));
  QuantParam xs = read_param(ctx, 1, "x_scale", 1, 1.0), xz = read_param(ctx, 2, "x_zero_point", 1, 0.0);
  QuantParam ws = read_param(ctx, 4, "w_scale", M, 1.0), wz = read_param(ctx, 5, "w_zero_point", M, 0.0);
  QuantParam ys = read_param(ctx, 6, "y_scale", 1, 1.0), yz = read_param(ctx, 7, "y_zero_point", 1, 0.0);
  const Tensor* bias = ctx.has_input(8) ? &ctx.input(8) : nullptr;
  Shape out;
  std::vector<int32_t> acc = conv_integer(ctx, x, xz, w, wz, bias, out);
  Tensor& y = ctx.output(0, out_dt, out);
  const int64_t plane = out.size() >= 2 ? numel(out) / std::max<int64_t>(out[0] * out[1], 1) : 1;
  std::vector<float> mult(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) {
    mult[size_t(m)] = float(xs.at(0)) * float(ws.at(m)) / float(ys.at(0));
    OT_CHECK(std::isfinite(mult[size_t(m)]), node.context(), "the scales give a non-finite multiplier (y_scale 0?)");
  }
  const double zp = yz.at(0);
  auto write = [&]<typename Q>() {
    Q* py = y.data<Q>();
    for (size_t i = 0; i < acc.size(); ++i) {
      int64_t m = (int64_t(i) / std::max<int64_t>(plane, 1)) % M;
      py[i] = requantize<Q>(acc[i], mult[size_t(m)], zp);
    }
  };
  if (out_dt == DType::kUint8) write.template operator()<uint8_t>();
  else write.template operator()<int8_t>();
}

}  // namespace

// Integer outputs: no gradient.
ONNXTRAIN_OP(ConvInteger, kOnnxDomain, 10).inputs(2, 4).outputs(1).shape(conv_integer_shape_rule).not_differentiable()
    .cpu(conv_integer_kernel);
// Quantized outputs: no gradient.
ONNXTRAIN_OP(QLinearConv, kOnnxDomain, 10).inputs(8, 9).outputs(1).shape(qlinear_conv_shape).not_differentiable()
    .cpu(qlinear_conv_kernel);

}  // namespace onnxtrain

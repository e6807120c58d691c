// Integer convolution and matmul cores shared by ConvInteger, QLinearConv, MatMulInteger and
// QLinearMatMul: int32 accumulation of (x - x_zero_point) * (w - w_zero_point), then (for the
// QLinear ops) requantization y = saturate(round_half_even(acc * x_scale * w_scale / y_scale) + y_zp).
#pragma once

#include <cmath>
#include <limits>

#include "ops/common.h"
#include "ops/conv/conv_util.h"

namespace onnxtrain::quant_linear {

// One quantization parameter (scale or zero point) per tensor, or per channel of some axis. An
// absent input reads as `dflt`.
struct QuantParam {
  std::vector<double> values;  // 1 value: per tensor
  double at(int64_t c) const { return values.size() == 1 ? values[0] : values[size_t(c)]; }
};

// Reads input i as a per-tensor value (numel 1) or one value per channel (numel == channels).
QuantParam read_param(const KernelContext& ctx, size_t i, const char* what, int64_t channels, double dflt);

// Checks that x is uint8 or int8 and, when zero point input zp is given, that it has x's dtype.
void check_quant_input(const KernelContext& ctx, const Tensor& x, const char* what, size_t zp);

// Requantizes one int32 accumulator: multiplier in float, as the reference runtimes do.
template <typename Q>
Q requantize(int64_t acc, float multiplier, double zero_point) {
  float v = float(acc) * multiplier;
  double r = std::isnan(v) ? 0.0 : std::nearbyint(double(v)) + zero_point;
  constexpr double lo = double(std::numeric_limits<Q>::min()), hi = double(std::numeric_limits<Q>::max());
  return Q(r < lo ? lo : (r > hi ? hi : r));
}

// Integer convolution: x [N, C, spatial...] and w [M, C / group, kernel...] of uint8/int8 with
// zero points (x per tensor, w per tensor or per output channel M); optional int32 bias [M].
// Returns the accumulators in Y's layout and sets out_shape.
std::vector<int32_t> conv_integer(const KernelContext& ctx, const Tensor& x, const QuantParam& x_zp, const Tensor& w,
                                  const QuantParam& w_zp, const Tensor* bias, Shape& out_shape);
// Static output shape of the convolution for shape rules (dims -1 when unknown).
std::optional<Shape> conv_integer_shape(const Node& node, const std::optional<Shape>& x, const std::optional<Shape>& w);

// numpy-matmul of integer a [..., M, K] and b [..., K, N] with zero points per tensor, per row of
// a (M or batch * M values) and per column of b (N or batch * N values). Returns the int32
// accumulators in Y's layout, sets out_shape, and gives each output element's row (in a's
// per-row parameters) and column (in b's) through row_of / col_of.
struct MatmulIntResult {
  Shape out_shape;
  std::vector<int32_t> acc;
  std::vector<int64_t> a_row, b_col;  // per output element: index into a's / b's per-row / per-col params
};
MatmulIntResult matmul_integer(const KernelContext& ctx, const Tensor& a, size_t a_zp_input, const Tensor& b,
                               size_t b_zp_input);
// The number of per-row (a) and per-column (b) parameters a matmul accepts besides 1.
void matmul_param_counts(const Shape& a, const Shape& b, int64_t& a_rows, int64_t& a_rows_batched,
                         int64_t& b_cols, int64_t& b_cols_batched);

}  // namespace onnxtrain::quant_linear

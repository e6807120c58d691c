// MatMulInteger (opset 10): Y = (A - a_zero_point) @ (B - b_zero_point) in int32 (numpy matmul
// broadcasting); zero points per tensor, per row of A and per column of B.
//
// QLinearMatMul (opset 10): the same product requantized,
// y = saturate(round_half_even(acc * a_scale * b_scale / y_scale) + y_zero_point), scales and zero
// points per tensor (or per row of a / column of b), y of y_zero_point's dtype.
#include "ops/linalg/matmul_util.h"
#include "ops/quant_linear/quant_linear_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

using namespace quant_linear;

std::optional<Shape> matmul_shape_of(const ShapeContext& ctx, size_t a, size_t b) {
  const auto& sa = ctx.input_shape(a);
  const auto& sb = ctx.input_shape(b);
  if (!sa || !sb || sa->empty() || sb->empty()) return std::nullopt;
  return matmul_static_shape(*sa, *sb);
}

void matmul_integer_shape(ShapeContext& ctx) { ctx.set_output(0, DType::kInt32, matmul_shape_of(ctx, 0, 1)); }

void matmul_integer_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  check_quant_input(ctx, a, "A", 2);
  check_quant_input(ctx, b, "B", 3);
  MatmulIntResult r = matmul_integer(ctx, a, 2, b, 3);
  Tensor& y = ctx.output(0, DType::kInt32, r.out_shape);
  std::copy(r.acc.begin(), r.acc.end(), y.data<int32_t>());
}

// Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point.
void qlinear_matmul_shape(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(7), matmul_shape_of(ctx, 0, 3)); }

// A scale per tensor, or indexed by a row/column number (plain or batched).
std::vector<double> read_scale(const KernelContext& ctx, size_t i, const char* what, int64_t per, int64_t batched) {
  const Tensor& t = ctx.input(i);
  OT_CHECK(is_floating(t.dtype()) && (t.numel() == 1 || t.numel() == per || t.numel() == batched),
           ctx.node().context(), what, " must be a floating-point scalar or hold ", per, " values, got ",
           dtype_name(t.dtype()), " ", shape_str(t.shape()));
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t j = 0; j < t.numel(); ++j) v[size_t(j)] = t.item_as_double(j);
  return v;
}

void qlinear_matmul_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(3);
  check_quant_input(ctx, a, "a", 2);
  check_quant_input(ctx, b, "b", 5);
  const Tensor& yzt = ctx.input(7);
  OT_CHECK(yzt.numel() == 1 && (yzt.dtype() == DType::kUint8 || yzt.dtype() == DType::kInt8), node.context(),
           "y_zero_point must be one uint8 or int8, got ", dtype_name(yzt.dtype()), " ", shape_str(yzt.shape()));
  int64_t a_rows, a_rows_b, b_cols, b_cols_b;
  matmul_param_counts(a.shape(), b.shape(), a_rows, a_rows_b, b_cols, b_cols_b);
  std::vector<double> as = read_scale(ctx, 1, "a_scale", a_rows, a_rows_b);
  std::vector<double> bs = read_scale(ctx, 4, "b_scale", b_cols, b_cols_b);
  std::vector<double> ys = read_scale(ctx, 6, "y_scale", 1, 1);
  MatmulIntResult r = matmul_integer(ctx, a, 2, b, 5);
  Tensor& y = ctx.output(0, yzt.dtype(), r.out_shape);
  const double zp = yzt.item_as_double(0);
  auto pick = [](const std::vector<double>& v, int64_t idx, int64_t per) {
    return v.size() == 1 ? v[0] : v[size_t(int64_t(v.size()) == per ? idx % per : idx)];
  };
  auto write = [&]<typename Q>() {
    Q* py = y.data<Q>();
    for (size_t i = 0; i < r.acc.size(); ++i) {
      float m = float(pick(as, r.a_row[i], a_rows)) * float(pick(bs, r.b_col[i], b_cols)) / float(ys[0]);
      OT_CHECK(std::isfinite(m), node.context(), "the scales give a non-finite multiplier (y_scale 0?)");
      py[i] = requantize<Q>(r.acc[i], m, zp);
    }
  };
  if (yzt.dtype() == DType::kUint8) write.template operator()<uint8_t>();
  else write.template operator()<int8_t>();
}

}  // namespace

// Integer outputs: no gradient.
ONNXTRAIN_OP(MatMulInteger, kOnnxDomain, 10).inputs(2, 4).outputs(1).shape(matmul_integer_shape).not_differentiable()
    .cpu(matmul_integer_kernel);
// Quantized outputs: no gradient.
ONNXTRAIN_OP(QLinearMatMul, kOnnxDomain, 10).inputs(8).outputs(1).shape(qlinear_matmul_shape).not_differentiable()
    .cpu(qlinear_matmul_kernel);

}  // namespace onnxtrain

// onnxtrain.FusedMatMul(A, B [, bias]): Y = alpha * op(A) op(B) + bias, op() transposing the last
// two dims when transA / transB is set (read through strides by oneDNN, never copied), batch dims
// broadcast as numpy.matmul, 1-D operands promoted (their trans flags ignored), bias a length-N
// vector broadcast along the last dim (fused into the oneDNN primitive when alpha is 1).
// The MatMul, Gemm and Einsum gradient rules emit it; a MatMul + Add(bias) fusion can too.
// output_dtype (onnxtrain domain; 0 = A's dtype) = 1 (float) with bf16/fp16 A and B writes the
// fp32 accumulator out unrounded: mixed precision folds a Cast to fp32 after the product into it
// (fold_mixed_precision_casts).
#include "ops/gradient_builder.h"
#include "backends/cpu/gemm.h"
#include "ops/common.h"
#include "ops/contrib/contrib.h"
#include "ops/linalg/matmul_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// Y's dtype: A's, or the output_dtype attribute (fp32 for half A and B).
DType output_dtype(const Node& n, DType a) {
  const int64_t code = n.attr_int("output_dtype", 0);
  if (code == 0) return a;
  const DType out = DType(int32_t(code));
  const bool half = a == DType::kBFloat16 || a == DType::kFloat16;
  OT_CHECK(out == a || (out == DType::kFloat32 && (half || a == DType::kUndefined)), n.context(),
           "output_dtype must be 0, A's dtype or float (1) for bfloat16/float16 A, got ", code, " for ",
           dtype_name(a), " A");
  return out;
}

void fused_matmul_shape(ShapeContext& ctx) {
  DType dt = output_dtype(ctx.node(), ctx.input_dtype(0));
  const auto& a = ctx.input_shape(0);
  const auto& b = ctx.input_shape(1);
  if (!a || !b || a->empty() || b->empty()) {
    ctx.set_output(0, dt);
    return;
  }
  const Node& n = ctx.node();
  ctx.set_output(0, dt, matmul_static_shape(*a, *b, n.attr_int("transA", 0) != 0, n.attr_int("transB", 0) != 0));
}

class FusedMatMulKernel final : public Kernel {
 public:
  explicit FusedMatMulKernel(const Node& node)
      : trans_a_(node.attr_int("transA", 0) != 0), trans_b_(node.attr_int("transB", 0) != 0),
        alpha_(node.attr_float("alpha", 1.0f)) {
    OT_CHECK(node.attr_int("transBatchA", 0) == 0 && node.attr_int("transBatchB", 0) == 0, node.context(),
             "transBatchA/transBatchB are not supported");
  }

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    OT_CHECK(a.dtype() == b.dtype(), node.context(), "A and B must share a dtype, got ", dtype_name(a.dtype()),
             " and ", dtype_name(b.dtype()));
    MatmulPlan plan = plan_matmul(node, a.shape(), b.shape(), trans_a_, trans_b_);
    plan.dims.alpha = alpha_;
    Tensor& y = ctx.output(0, output_dtype(node, a.dtype()), plan.out_shape);
    const Tensor* bias = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    if (bias) {
      OT_CHECK(bias->dtype() == a.dtype(), node.context(), "bias must have A's dtype ", dtype_name(a.dtype()),
               ", got ", dtype_name(bias->dtype()));
      OT_CHECK(bias->numel() == plan.dims.n && (bias->rank() == 0 || bias->dim(-1) == plan.dims.n), node.context(),
               "bias must be a vector of the output's last dim ", plan.dims.n, ", got ", shape_str(bias->shape()));
      const bool via_onednn = a.dtype() == DType::kFloat32 || a.dtype() == DType::kBFloat16 ||
                              a.dtype() == DType::kFloat16;
      if (alpha_ == 1.0f || !via_onednn) {
        plan.dims.bias = true;  // fused: alpha * AB + bias in one pass
      } else {
        // oneDNN's output scale would also scale a fused bias: start from the broadcast bias instead.
        dispatch_numeric(y.dtype(), [&]<typename T>() {
          dispatch_numeric(bias->dtype(), [&]<typename B>() {
            const B* pb = bias->data<B>();
            T* py = y.data<T>();
            for (int64_t i = 0; i < y.numel(); ++i) py[i] = cast_value<T>(pb[i % plan.dims.n]);
          });
        });
        plan.dims.beta = 1.0f;
        bias = nullptr;
      }
    }
    run_matmul(node, plan.dims, a, b, y, cache_, bias, ctx.input_is_constant(1));
  }

 private:
  bool trans_a_, trans_b_;
  float alpha_;
  cpu::MatmulCache cache_;
};

#if ONNXTRAIN_CUDA
// cuBLASLt's bias epilogue adds the bias after alpha scales the product, as the op defines.
void fused_matmul_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  OT_CHECK(node.attr_int("transBatchA", 0) == 0 && node.attr_int("transBatchB", 0) == 0, node.context(),
           "transBatchA/transBatchB are not supported");
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.dtype() == b.dtype(), node.context(), "A and B must share a dtype, got ", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()));
  if (!is_floating(a.dtype()) || a.dtype() == DType::kFloat64 || output_dtype(node, a.dtype()) != a.dtype())
    return run_on_host(ctx, "dtype " + dtype_name(a.dtype()) + " into " + dtype_name(output_dtype(node, a.dtype())));
  MatmulPlan plan = plan_matmul(node, a.shape(), b.shape(), node.attr_int("transA", 0) != 0,
                                node.attr_int("transB", 0) != 0);
  plan.dims.alpha = node.attr_float("alpha", 1.0f);
  Tensor& y = ctx.output(0, a.dtype(), plan.out_shape);
  const Tensor* bias = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  if (bias) {
    OT_CHECK(bias->dtype() == a.dtype(), node.context(), "bias must have A's dtype ", dtype_name(a.dtype()), ", got ",
             dtype_name(bias->dtype()));
    OT_CHECK(bias->numel() == plan.dims.n && (bias->rank() == 0 || bias->dim(-1) == plan.dims.n), node.context(),
             "bias must be a vector of the output's last dim ", plan.dims.n, ", got ", shape_str(bias->shape()));
  }
  run_matmul_cuda(node, plan.dims, a, b, y, bias, ctx.stream());
}
#endif

}  // namespace

// Y = alpha op(A) op(B) + bias.  dop(A) = alpha dY op(B)^T, dop(B) = alpha op(A)^T dY (transposed
// back for transA/transB, batch dims by sum_to), dbias = sum_to(dY, bias); an fp32 Y of half A
// and B (output_dtype) is Y = cast(half product), so dY is cast to A's dtype first.
ONNXTRAIN_OP(FusedMatMul, kOnnxTrainDomain, 1).inputs(2, 3).outputs(1).shape(fused_matmul_shape)
    .cpu_kernel<FusedMatMulKernel>().work(matmul_work).cuda(OT_CUDA(fused_matmul_cuda))
    .gradient([](GradientBuilder& g) {
      const Node& n = g.node();
      const DType a = g.dtype(g.x(0));
      const std::string dy = output_dtype(n, a) != a && a != DType::kUndefined
                                 ? g.emit("Cast", {g.dy(0)}, {{"to", Attribute::of(int64_t(a))}})
                                 : g.dy(0);
      matmul_gradient(g, 0, 1, n.attr_int("transA", 0) != 0, n.attr_int("transB", 0) != 0,
                      n.attr_float("alpha", 1.0f), dy);
      if (g.has_input(2) && g.needs(2)) g.set(2, g.sum_to(dy, g.x(2)));
    });

// ONNX Runtime's com.microsoft.FusedMatMul (what its optimizer writes into saved models): the same
// op, imported as is; its transBatchA/transBatchB (batch-dim transposes) are refused by name.
ONNXTRAIN_OP(FusedMatMul, kMsDomain, 1).inputs(2).outputs(1).shape(fused_matmul_shape)
    .cpu_kernel<FusedMatMulKernel>().work(matmul_work).cuda(OT_CUDA(fused_matmul_cuda))
    .gradient([](GradientBuilder& g) {
      const Node& n = g.node();
      matmul_gradient(g, 0, 1, n.attr_int("transA", 0) != 0, n.attr_int("transB", 0) != 0,
                      n.attr_float("alpha", 1.0f));
    });

}  // namespace onnxtrain

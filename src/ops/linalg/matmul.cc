// MatMul: numpy matmul semantics (batched, broadcast batch dims, 1-D operands promoted and the
// added dim removed). fp32 through oneDNN (cached per shape), other dtypes through the reference.
#include "ops/gradient_builder.h"
#include "backends/cpu/gemm.h"
#include "ops/common.h"
#include "ops/linalg/matmul_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void matmul_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& a = ctx.input_shape(0);
  const auto& b = ctx.input_shape(1);
  if (!a || !b || a->empty() || b->empty()) {
    ctx.set_output(0, dt);
    return;
  }
  ctx.set_output(0, dt, matmul_static_shape(*a, *b));
}

class MatMulKernel final : public Kernel {
 public:
  explicit MatMulKernel(const Node&) {}
  void compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    OT_CHECK(a.dtype() == b.dtype(), ctx.node().context(), "inputs must share a dtype, got ",
             dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
    MatmulPlan plan = plan_matmul(ctx.node(), a.shape(), b.shape());
    Tensor& y = ctx.output(0, a.dtype(), plan.out_shape);
    run_matmul(ctx.node(), plan.dims, a, b, y, cache_, nullptr, ctx.input_is_constant(1));
  }

 private:
  cpu::MatmulCache cache_;
};

#if ONNXTRAIN_CUDA
void matmul_cuda(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.dtype() == b.dtype(), ctx.node().context(), "inputs must share a dtype, got ", dtype_name(a.dtype()),
           " and ", dtype_name(b.dtype()));
  if (!is_floating(a.dtype()) || a.dtype() == DType::kFloat64) return run_on_host(ctx, "dtype " + dtype_name(a.dtype()));
  MatmulPlan plan = plan_matmul(ctx.node(), a.shape(), b.shape());
  Tensor& y = ctx.output(0, a.dtype(), plan.out_shape);
  run_matmul_cuda(ctx.node(), plan.dims, a, b, y, nullptr, ctx.stream());
}
#endif

}  // namespace

// Y = A B.  dA = dY B^T, dB = A^T dY (batch dims reduced with sum_to; 1-D operands unsqueezed)
ONNXTRAIN_OP(MatMul, kOnnxDomain, 1).inputs(2).outputs(1).shape(matmul_shape).cpu_kernel<MatMulKernel>().work(matmul_work)
    .cuda(OT_CUDA(matmul_cuda))
    .gradient([](GradientBuilder& g) { matmul_gradient(g, 0, 1, false, false, 1.0f); });

}  // namespace onnxtrain

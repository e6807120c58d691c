// Gemm: Y = alpha * op(A) op(B) + beta * C, C broadcast (unidirectionally) to [M, N].
#include "ops/gradient_builder.h"
#include "backends/cpu/gemm.h"
#include "ops/common.h"
#include "ops/linalg/matmul_util.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
namespace {

void gemm_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& a = ctx.input_shape(0);
  const auto& b = ctx.input_shape(1);
  if (!a || !b || a->size() != 2 || b->size() != 2) {
    ctx.set_output(0, dt);
    return;
  }
  bool ta = ctx.node().attr_int("transA", 0) != 0, tb = ctx.node().attr_int("transB", 0) != 0;
  ctx.set_output(0, dt, Shape{ta ? (*a)[1] : (*a)[0], tb ? (*b)[0] : (*b)[1]});
}

// C's rows and columns (1 where it broadcasts), checked against A's dtype and Y's [m, n].
std::pair<int64_t, int64_t> c_extent(const Node& node, const Tensor& c, DType a, int64_t m, int64_t n) {
  OT_CHECK(c.dtype() == a, node.context(), "C must have A's dtype ", dtype_name(a), ", got ", dtype_name(c.dtype()));
  OT_CHECK(c.rank() <= 2, node.context(), "C must have rank <= 2, got ", shape_str(c.shape()));
  const int64_t cr = c.rank() == 2 ? c.dim(0) : 1, cc = c.rank() >= 1 ? c.dim(-1) : 1;
  OT_CHECK((cr == 1 || cr == m) && (cc == 1 || cc == n), node.context(), "C of shape ", shape_str(c.shape()),
           " cannot be broadcast to [", m, ", ", n, "]");
  return {cr, cc};
}

class GemmKernel final : public Kernel {
 public:
  explicit GemmKernel(const Node& node)
      : trans_a_(node.attr_int("transA", 0) != 0), trans_b_(node.attr_int("transB", 0) != 0),
        alpha_(node.attr_float("alpha", 1.0f)), beta_(node.attr_float("beta", 1.0f)) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    OT_CHECK(a.rank() == 2 && b.rank() == 2, node.context(), "A and B must be 2-D, got ", shape_str(a.shape()),
             " and ", shape_str(b.shape()));
    OT_CHECK(a.dtype() == b.dtype(), node.context(), "A and B must share a dtype, got ", dtype_name(a.dtype()),
             " and ", dtype_name(b.dtype()));
    cpu::MatmulDims d;
    d.trans_a = trans_a_;
    d.trans_b = trans_b_;
    d.m = trans_a_ ? a.dim(1) : a.dim(0);
    d.k = trans_a_ ? a.dim(0) : a.dim(1);
    d.n = trans_b_ ? b.dim(0) : b.dim(1);
    int64_t kb = trans_b_ ? b.dim(1) : b.dim(0);
    OT_CHECK(d.k == kb, node.context(), "inner dims must agree: op(A) is [", d.m, ", ", d.k, "], op(B) is [", kb,
             ", ", d.n, "]");
    d.alpha = alpha_;
    Tensor& y = ctx.output(0, a.dtype(), {d.m, d.n});
    const Tensor* bias = nullptr;
    if (ctx.has_input(2) && beta_ != 0.0f) {
      const Tensor& c = ctx.input(2);
      const auto extent = c_extent(node, c, a.dtype(), d.m, d.n);
      const int64_t cr = extent.first, cc = extent.second;  // named: clang 14 cannot capture structured bindings
      if (cr == 1 && cc == d.n && beta_ == 1.0f && alpha_ == 1.0f) {
        d.bias = true;  // a bias row: fused into the product
        bias = &c;
      } else {
        d.beta = beta_;  // Y = C broadcast, then Y = alpha * AB + beta * Y
        dispatch_numeric(a.dtype(), [&]<typename T>() {
          const T* pc = c.data<T>();
          T* py = y.data<T>();
          for (int64_t i = 0; i < d.m; ++i)
            for (int64_t j = 0; j < d.n; ++j) py[i * d.n + j] = pc[(cr == 1 ? 0 : i * cc) + (cc == 1 ? 0 : j)];
        });
      }
    }
    run_matmul(node, d, a, b, y, cache_, bias, ctx.input_is_constant(1));
  }

 private:
  bool trans_a_, trans_b_;
  float alpha_, beta_;
  cpu::MatmulCache cache_;
};

#if ONNXTRAIN_CUDA
// Y = alpha op(A) op(B) + beta C: a bias row (beta 1) rides cuBLASLt's bias epilogue; any other C
// is first broadcast into Y, which the product then accumulates onto with beta.
void gemm_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.rank() == 2 && b.rank() == 2, node.context(), "A and B must be 2-D, got ", shape_str(a.shape()), " and ",
           shape_str(b.shape()));
  OT_CHECK(a.dtype() == b.dtype(), node.context(), "A and B must share a dtype, got ", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()));
  if (!is_floating(a.dtype()) || a.dtype() == DType::kFloat64) return run_on_host(ctx, "dtype " + dtype_name(a.dtype()));
  cpu::MatmulDims d;
  d.trans_a = node.attr_int("transA", 0) != 0;
  d.trans_b = node.attr_int("transB", 0) != 0;
  d.m = d.trans_a ? a.dim(1) : a.dim(0);
  d.k = d.trans_a ? a.dim(0) : a.dim(1);
  d.n = d.trans_b ? b.dim(0) : b.dim(1);
  const int64_t kb = d.trans_b ? b.dim(1) : b.dim(0);
  OT_CHECK(d.k == kb, node.context(), "inner dims must agree: op(A) is [", d.m, ", ", d.k, "], op(B) is [", kb, ", ",
           d.n, "]");
  d.alpha = node.attr_float("alpha", 1.0f);
  const float beta = node.attr_float("beta", 1.0f);
  Tensor& y = ctx.output(0, a.dtype(), {d.m, d.n});
  const Tensor* bias = nullptr;
  if (ctx.has_input(2) && beta != 0.0f) {
    const Tensor& c = ctx.input(2);
    const auto [cr, cc] = c_extent(node, c, a.dtype(), d.m, d.n);
    if (cr == 1 && cc == d.n && beta == 1.0f && d.k > 0) {
      bias = &c;
    } else {
      cuda::unary(cuda::Unary::kCopy, c.dtype(), c.data(), c.shape(), y.data(), y.shape(), ctx.stream());
      d.beta = beta;
      if (d.k == 0 && beta != 1.0f) return run_on_host(ctx, "empty product with beta");
    }
  }
  run_matmul_cuda(node, d, a, b, y, bias, ctx.stream());
}
#endif

}  // namespace

// Y = alpha A' B' + beta C.  dA' = alpha dY B'^T, dB' = alpha A'^T dY (then transposed back per
// transA/transB), dC = beta sum_to(dY, C)
ONNXTRAIN_OP(Gemm, kOnnxDomain, 1).inputs(2, 3).outputs(1).shape(gemm_shape).cpu_kernel<GemmKernel>().work(matmul_work)
    .cuda(OT_CUDA(gemm_cuda))
    .gradient([](GradientBuilder& g) {
      const Node& n = g.node();
      matmul_gradient(g, 0, 1, n.attr_int("transA", 0) != 0, n.attr_int("transB", 0) != 0,
                      n.attr_float("alpha", 1.0f));
      if (g.has_input(2) && g.needs(2)) {
        float beta = n.attr_float("beta", 1.0f);
        if (beta == 0.0f) g.set(2, g.zeros_like(g.x(2)));
        else if (beta == 1.0f) g.set(2, g.sum_to(g.dy(0), g.x(2)));
        else g.set(2, g.sum_to(g.mul(g.dy(0), g.scalar_like(beta, g.x(2))), g.x(2)));
      }
    });

}  // namespace onnxtrain

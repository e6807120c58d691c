// Variadic elementwise reductions over 1..N inputs with numpy broadcasting: Max, Min, Sum, Mean.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/half_round.h"
#include "ops/elementwise/elementwise.h"

namespace onnxtrain {

namespace grad = elementwise::grad;
namespace {

struct MaxFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_floating_point_v<C>) if (std::isnan(x)) return x;  // NaN wins, as numpy
    return x > y ? x : y;  // y NaN: y
  }
};
struct MinFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_floating_point_v<C>) if (std::isnan(x)) return x;
    return x < y ? x : y;
  }
};
struct SumFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_integral_v<C>) return C(elementwise::wrap_t<C>(x) + elementwise::wrap_t<C>(y));
    else return x + y;
  }
};

// out (already of the broadcast shape) = in broadcast to out's shape. out may alias in.
template <typename T>
void broadcast_copy(const Tensor& in, Tensor& out) {
  const T* pi = in.data<T>();
  T* po = out.data<T>();
  if (out.numel() == 0 || static_cast<const void*>(pi) == static_cast<const void*>(po)) return;
  auto plan = make_broadcast_plan<1>(out.shape(), {&in.shape()});
  bool contiguous = plan.inner_stride[0] != 0;
  for_each_broadcast_run(plan, [&](int64_t o, const std::array<int64_t, 1>& off, int64_t n) {
    if (contiguous) std::memmove(po + o, pi + off[0], size_t(n) * sizeof(T));
    else std::fill(po + o, po + o + n, pi[off[0]]);
  });
}

// The inputs' broadcast shape, checking that they share a dtype.
Shape variadic_shape(const KernelContext& ctx) {
  size_t n = ctx.num_inputs();
  OT_CHECK(n >= 1, ctx.node().context(), "expected at least one input, got none");
  const Tensor& first = ctx.input(0);
  Shape shape = first.shape();
  for (size_t i = 1; i < n; ++i) {
    const Tensor& t = ctx.input(i);
    OT_CHECK(t.dtype() == first.dtype(), ctx.node().context(), "inputs must share a dtype, got ",
             dtype_name(first.dtype()), " for input 0 and ", dtype_name(t.dtype()), " for input ", i);
    shape = broadcast_shapes(ctx.node(), shape, t.shape());
  }
  return shape;
}

template <typename Fn, bool kMean>
void variadic_kernel(KernelContext& ctx) {
  const size_t n = ctx.num_inputs();
  const Shape shape = variadic_shape(ctx);
  const Tensor& first = ctx.input(0);
  Tensor& out = ctx.output(0, first.dtype(), shape);
  auto body = [&]<typename T>() {
    using C = compute_t<T>;
    auto fn = [](T x, T y) { return round_to<T>(Fn::apply(C(x), C(y))); };
    size_t next = 1;
    if (n >= 2 && (first.shape() == shape || ctx.input(1).shape() == shape)) {
      binary_broadcast<T, T, T>(first, ctx.input(1), out, fn);  // safe: one operand spans the output
      next = 2;
    } else {
      broadcast_copy<T>(first, out);
    }
    // out now has the full shape, so folding the rest into it in place is elementwise-safe.
    for (size_t i = next; i < n; ++i) binary_broadcast<T, T, T>(out, ctx.input(i), out, fn);
    if constexpr (kMean) {
      C scale = C(1) / C(double(n));
      T* po = out.data<T>();
      unary_map(po, po, out.numel(), [scale](T v) { return round_to<T>(C(v) * scale); });
    }
  };
  if constexpr (kMean) dispatch_float(first.dtype(), body);
  else dispatch_numeric(first.dtype(), body);
}

#if ONNXTRAIN_CUDA
// Sum on CUDA tensors: the broadcasting family's kAdd folded into the output input by input, in the
// CPU kernel's order (half types round at the same steps).
void sum_cuda(KernelContext& ctx) {
  const size_t n = ctx.num_inputs();
  const Shape shape = variadic_shape(ctx);
  const Tensor& first = ctx.input(0);
  const DType dt = first.dtype();
  if (!cuda::elementwise_supports(dt)) return run_on_host(ctx, "dtype " + dtype_name(dt));
  Tensor& out = ctx.output(0, dt, shape);
  size_t next = 1;
  if (n >= 2 && (first.shape() == shape || ctx.input(1).shape() == shape)) {  // one operand spans the output
    const Tensor& second = ctx.input(1);
    cuda::binary(cuda::Binary::kAdd, dt, first.data(), first.shape(), second.data(), second.shape(), out.data(), shape,
                 ctx.stream());
    next = 2;
  } else if (out.data() != first.data()) {
    cuda::unary(cuda::Unary::kCopy, dt, first.data(), first.shape(), out.data(), shape, ctx.stream());
  }
  // out has the full shape now, so adding the rest into it in place is elementwise-safe.
  for (size_t i = next; i < n; ++i) {
    const Tensor& t = ctx.input(i);
    cuda::binary(cuda::Binary::kAdd, dt, out.data(), shape, t.data(), t.shape(), out.data(), shape, ctx.stream());
  }
}
#endif

// Max / Min: dy goes to every input equal to the output.
void select_gradient(GradientBuilder& g) {
  for (size_t i = 0; i < g.num_inputs(); ++i) {
    if (!g.needs(i)) continue;
    std::string selected = g.emit("Equal", {g.x(i), g.y(0)});
    g.set(i, g.sum_to(elementwise::grad::where_or_zero(g, selected, g.dy(0), g.x(i)), g.x(i)));
  }
}

}  // namespace

// y = max(x_i).  dx_i = sum_to(dy * (x_i == y), x_i)
// Ties: every input equal to the output gets the full dy (as ONNX Runtime does), so the gradients
// of tied inputs sum to a multiple of dy; finite differences there are one-sided.
ONNXTRAIN_OP(Max, kOnnxDomain, 1).inputs(1, INT_MAX).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(variadic_kernel<MaxFn, false>).gradient(select_gradient);
// y = min(x_i).  dx_i = sum_to(dy * (x_i == y), x_i)  (ties as for Max)
ONNXTRAIN_OP(Min, kOnnxDomain, 1).inputs(1, INT_MAX).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(variadic_kernel<MinFn, false>).gradient(select_gradient);
// y = sum(x_i).  dx_i = sum_to(dy, x_i)
ONNXTRAIN_OP(Sum, kOnnxDomain, 1).inputs(1, INT_MAX).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(variadic_kernel<SumFn, false>).cuda(OT_CUDA(sum_cuda)).gradient([](GradientBuilder& g) {
      for (size_t i = 0; i < g.num_inputs(); ++i)
        if (g.needs(i)) g.set(i, g.sum_to(g.dy(0), g.x(i)));
    });
// y = sum(x_i) / n.  dx_i = sum_to(dy / n, x_i)
ONNXTRAIN_OP(Mean, kOnnxDomain, 1).inputs(1, INT_MAX).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(variadic_kernel<SumFn, true>).gradient([](GradientBuilder& g) {
      std::string scaled = g.mul(g.dy(0), grad::c(g, 1.0 / double(g.num_inputs()), g.x(0)));
      for (size_t i = 0; i < g.num_inputs(); ++i)
        if (g.needs(i)) g.set(i, g.sum_to(scaled, g.x(i)));
    });

}  // namespace onnxtrain

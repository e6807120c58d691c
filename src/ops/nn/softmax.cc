// Softmax, LogSoftmax and Hardmax. Before opset 13 the input is coerced to 2D at `axis` (default
// 1) and the op runs over the flattened trailing dims; from 13 it runs along the single `axis`
// (default -1). Both are an (outer, n, inner) view, inner == 1 for the legacy form.
#include "ops/gradient_builder.h"
#include "ops/nn/softmax_rows.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
namespace {

struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};

AxisView axis_view(const Node& node, const Shape& shape, bool legacy) {
  int64_t rank = int64_t(shape.size());
  AxisView v;
  if (legacy) {
    int64_t axis = node.attr_int("axis", 1);
    // The 2D coercion accepts axis == rank (everything in the outer dim).
    if (axis < 0) axis += rank;
    OT_CHECK(axis >= 0 && axis <= rank, node.context(), "axis ", node.attr_int("axis", 1),
             " is out of range for rank ", rank);
    for (int64_t d = 0; d < rank; ++d) (d < axis ? v.outer : v.n) *= shape[size_t(d)];
    return v;
  }
  OT_CHECK(rank > 0, node.context(), "expected an input of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), rank);
  for (int64_t d = 0; d < rank; ++d) {
    if (d < axis) v.outer *= shape[size_t(d)];
    else if (d == axis) v.n = shape[size_t(d)];
    else v.inner *= shape[size_t(d)];
  }
  return v;
}

template <bool kLog, bool kLegacy>
void softmax_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  AxisView v = axis_view(ctx.node(), x.shape(), kLegacy);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    softmax_along<kLog>(x.data<T>(), y.data<T>(), v.outer, v.n, v.inner);
  });
}

template <bool kLegacy>
void hardmax_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  AxisView v = axis_view(ctx.node(), x.shape(), kLegacy);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    int64_t n = v.n, inner = v.inner;
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (n * inner));
    parallel_for(v.outer, grain, [&](int64_t b, int64_t e) {
      std::vector<int64_t> best(static_cast<size_t>(inner));
      std::vector<C> bv(static_cast<size_t>(inner));
      for (int64_t o = b; o < e; ++o) {
        const T* xo = px + o * n * inner;
        T* yo = py + o * n * inner;
        for (int64_t j = 0; j < inner; ++j) { bv[size_t(j)] = C(xo[j]); best[size_t(j)] = 0; }
        for (int64_t i = 1; i < n; ++i)
          for (int64_t j = 0; j < inner; ++j) {
            C c = C(xo[i * inner + j]);
            if (c > bv[size_t(j)]) { bv[size_t(j)] = c; best[size_t(j)] = i; }
          }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < inner; ++j) yo[i * inner + j] = T(best[size_t(j)] == i ? C(1) : C(0));
      }
    });
  });
}

// onnxtrain.SoftmaxGrad / LogSoftmaxGrad(dY, Y): attribute `axis` as the forward had it (default
// -1) and `coerce_2d` = 1 for the forward's pre-13 semantics (the dims from `axis` on flattened).
// ONNX Runtime's com.microsoft forms fix the semantics by name: SoftmaxGrad_13 (kCoerce 0), and
// SoftmaxGrad (kCoerce 1, axis default 1); kCoerce -1 reads the attribute.
// The grad op's (dY, Y) checked against each other, and its axis view.
AxisView softmax_grad_view(const KernelContext& ctx, int coerce_form) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& y = ctx.input(1);
  OT_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype(), node.context(), "dY and Y must match, got ",
           dtype_name(dy.dtype()), " ", shape_str(dy.shape()), " and ", dtype_name(y.dtype()), " ", shape_str(y.shape()));
  const bool coerce = coerce_form < 0 ? node.attr_int("coerce_2d", 0) != 0 : coerce_form == 1;
  return axis_view(node, y.shape(), coerce);
}

template <bool kLog, int kCoerce = -1>
void softmax_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& y = ctx.input(1);
  AxisView v = softmax_grad_view(ctx, kCoerce);
  Tensor& dx = ctx.output(0, y.dtype(), y.shape());
  dispatch_float(y.dtype(), [&]<typename T>() {
    softmax_grad_along<kLog>(dy.data<T>(), y.data<T>(), dx.data<T>(), v.outer, v.n, v.inner);
  });
}

#if ONNXTRAIN_CUDA
template <bool kLog, bool kLegacy>
void softmax_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  AxisView v = axis_view(ctx.node(), x.shape(), kLegacy);
  if (!is_floating(x.dtype()) || x.dtype() == DType::kFloat64) return run_on_host(ctx, "dtype " + dtype_name(x.dtype()));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  cuda::softmax(kLog, x.dtype(), x.data(), y.data(), v.outer, v.n, v.inner, ctx.stream());
}

template <bool kLog, int kCoerce = -1>
void softmax_grad_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& y = ctx.input(1);
  AxisView v = softmax_grad_view(ctx, kCoerce);
  if (!is_floating(y.dtype()) || y.dtype() == DType::kFloat64) return run_on_host(ctx, "dtype " + dtype_name(y.dtype()));
  Tensor& dx = ctx.output(0, y.dtype(), y.shape());
  cuda::softmax_grad(kLog, y.dtype(), dy.data(), y.data(), dx.data(), v.outer, v.n, v.inner, ctx.stream());
}
#endif

void shape_softmax_grad(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1)); }

template <bool kLog>
void softmax_gradient(GradientBuilder& g) {
  bool legacy = g.opset() < 13;
  GraphBuilder::Attrs attrs{{"axis", Attribute::of(g.node().attr_int("axis", legacy ? 1 : -1))},
                            {"coerce_2d", Attribute::of(int64_t(legacy ? 1 : 0))}};
  g.set(0, g.emit(kLog ? "LogSoftmaxGrad" : "SoftmaxGrad", {g.dy(0), g.y(0)}, attrs, kOnnxTrainDomain));
}

}  // namespace

// y = softmax(x).  dx = y * (dy - sum(dy * y, axis))
ONNXTRAIN_OP(Softmax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(softmax_kernel<false, true>).cuda(OT_CUDA((softmax_cuda<false, true>))).gradient(softmax_gradient<false>);
// y = softmax(x).  dx = y * (dy - sum(dy * y, axis))
ONNXTRAIN_OP(Softmax, kOnnxDomain, 13).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .work(memory_bound_work)
    .cpu(softmax_kernel<false, false>).cuda(OT_CUDA((softmax_cuda<false, false>))).gradient(softmax_gradient<false>);
// y = x - logsumexp(x).  dx = dy - exp(y) * sum(dy, axis)
ONNXTRAIN_OP(LogSoftmax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(softmax_kernel<true, true>).cuda(OT_CUDA((softmax_cuda<true, true>))).gradient(softmax_gradient<true>);
// y = x - logsumexp(x).  dx = dy - exp(y) * sum(dy, axis)
ONNXTRAIN_OP(LogSoftmax, kOnnxDomain, 13).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(softmax_kernel<true, false>).cuda(OT_CUDA((softmax_cuda<true, false>))).gradient(softmax_gradient<true>);
ONNXTRAIN_OP(Hardmax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).not_differentiable()
    .cpu(hardmax_kernel<true>);
ONNXTRAIN_OP(Hardmax, kOnnxDomain, 13).inputs(1).outputs(1).shape(shape_same_as_input).not_differentiable()
    .cpu(hardmax_kernel<false>);

// dX = SoftmaxGrad(dY, Y) = Y * (dY - sum(dY * Y, axis)). Linear in dY; second derivatives are not needed.
ONNXTRAIN_OP(SoftmaxGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(shape_softmax_grad).inplace(0, 0)
    .cpu(softmax_grad_kernel<false>).cuda(OT_CUDA(softmax_grad_cuda<false>)).gradient_not_implemented("second derivatives are not needed");
// dX = LogSoftmaxGrad(dY, Y) = dY - exp(Y) * sum(dY, axis). Second derivatives are not needed.
ONNXTRAIN_OP(LogSoftmaxGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(shape_softmax_grad).inplace(0, 0)
    .cpu(softmax_grad_kernel<true>).cuda(OT_CUDA(softmax_grad_cuda<true>)).gradient_not_implemented("second derivatives are not needed");
// ONNX Runtime's training artifacts: SoftmaxGrad_13 / LogSoftmaxGrad_13 for opset >= 13 forwards,
// SoftmaxGrad / LogSoftmaxGrad for older ones (the dims from `axis` on flattened).
ONNXTRAIN_OP(SoftmaxGrad_13, kMsDomain, 1).inputs(2).outputs(1).shape(shape_softmax_grad).inplace(0, 0)
    .cpu(softmax_grad_kernel<false, 0>).cuda(OT_CUDA((softmax_grad_cuda<false, 0>))).gradient_not_implemented("second derivatives are not needed");
ONNXTRAIN_OP(LogSoftmaxGrad_13, kMsDomain, 1).inputs(2).outputs(1).shape(shape_softmax_grad).inplace(0, 0)
    .cpu(softmax_grad_kernel<true, 0>).cuda(OT_CUDA((softmax_grad_cuda<true, 0>))).gradient_not_implemented("second derivatives are not needed");
ONNXTRAIN_OP(SoftmaxGrad, kMsDomain, 1).inputs(2).outputs(1).shape(shape_softmax_grad).inplace(0, 0)
    .cpu(softmax_grad_kernel<false, 1>).cuda(OT_CUDA((softmax_grad_cuda<false, 1>))).gradient_not_implemented("second derivatives are not needed");
ONNXTRAIN_OP(LogSoftmaxGrad, kMsDomain, 1).inputs(2).outputs(1).shape(shape_softmax_grad).inplace(0, 0)
    .cpu(softmax_grad_kernel<true, 1>).cuda(OT_CUDA((softmax_grad_cuda<true, 1>))).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

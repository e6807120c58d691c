// SoftmaxCrossEntropyLoss: log_prob = log_softmax(scores, axis 1) over [N, C, d1, ...] (written
// to the optional second output, or to scratch), then the NLL gather and reduction of
// loss_common.h.
#include "ops/gradient_builder.h"
#include "ops/loss/loss_common.h"
#include "ops/nn/softmax_rows.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include <limits>

#include "backends/cuda/kernels.h"
#include "core/device.h"
#endif

namespace onnxtrain {
namespace {

void shape_sce(ShapeContext& ctx) {
  shape_loss_output(ctx);
  ctx.set_output(1, ctx.input_dtype(0), ctx.input_shape(0));
}

void sce_kernel(KernelContext& ctx) {
  LossDims dims = check_loss_inputs(ctx);
  const Tensor& x = ctx.input(0);
  Tensor scratch;
  Tensor* logp = nullptr;
  if (ctx.output_requested(1)) {
    logp = &ctx.output(1, x.dtype(), x.shape());
  } else {
    scratch = Tensor::empty(x.dtype(), x.shape());
    logp = &scratch;
  }
  dispatch_float(x.dtype(), [&]<typename T>() {
    softmax_along<true>(x.data<T>(), logp->data<T>(), dims.n, dims.c, dims.d);
    nll_reduce<T>(ctx, logp->data<T>(), dims);
  });
}

// onnxtrain.SoftmaxCrossEntropyLossGrad(dLoss, log_prob, labels, weights?) -> dX, dW? with the
// forward's reduction and ignore_index. With from_scores=1 input 1 holds the scores instead (the
// forward did not output log_prob) and log_softmax is recomputed into scratch first.
void sce_grad_kernel(KernelContext& ctx) {
  LossDims dims = check_loss_grad_inputs(ctx);
  const Tensor& in = ctx.input(1);
  const bool from_scores = ctx.node().attr_int("from_scores", 0) != 0;
  dispatch_float(in.dtype(), [&]<typename T>() {
    if (!from_scores) return loss_backward<true, T>(ctx, in.data<T>(), dims);
    Tensor logp = Tensor::empty(in.dtype(), in.shape());
    softmax_along<true>(in.data<T>(), logp.data<T>(), dims.n, dims.c, dims.d);
    loss_backward<true, T>(ctx, logp.data<T>(), dims);
  });
}

#if ONNXTRAIN_CUDA
// The CUDA form: int64 labels and no class weights (else the host). A label outside [0, C) is
// flagged on the device and reported after the kernel, as the CPU kernel reports it.
bool sce_on_device(const KernelContext& ctx, const Tensor& x, const Tensor& labels, size_t weight_input) {
  return (x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat16 || x.dtype() == DType::kBFloat16) &&
         labels.dtype() == DType::kInt64 && !ctx.has_input(weight_input);
}
int cuda_reduction(const Node& node) {
  const LossReduction r = loss_reduction(node);
  return r == LossReduction::kNone ? 0 : r == LossReduction::kSum ? 1 : 2;
}
int64_t ignore_index(const Node& node) {
  return node.has_attr("ignore_index") ? node.attr_int("ignore_index", 0) : std::numeric_limits<int64_t>::min();
}
// A zeroed device flag, and the check of it once the kernel has run.
struct LabelFlag {
  Tensor flag;
  explicit LabelFlag(const KernelContext& ctx) : flag(empty_on(ctx.device(), DType::kInt32, {1})) {
    cuda::memset_zero(flag.data(), sizeof(int32_t), ctx.stream());
  }
  void check(const KernelContext& ctx, int64_t c) const {
    const Tensor host = to_device(flag, Device::kCpu, Stream(std::shared_ptr<void>(), ctx.stream()));
    OT_CHECK(host.data<int32_t>()[0] == 0, ctx.node().context(), "a label is out of range [0, ", c, ")",
             ctx.node().has_attr("ignore_index") ? " and is not ignore_index" : "");
  }
};

void sce_cuda(KernelContext& ctx) {
  LossDims dims = check_loss_inputs(ctx);
  const Tensor& x = ctx.input(0);
  const Tensor& labels = ctx.input(1);
  if (!sce_on_device(ctx, x, labels, 2)) return run_on_host(ctx, "class weights, int32 labels or dtype " + dtype_name(x.dtype()));
  const Node& node = ctx.node();
  Tensor logp = ctx.output_requested(1) ? ctx.output(1, x.dtype(), x.shape()) : empty_on(ctx.device(), x.dtype(), x.shape());
  const int reduction = cuda_reduction(node);
  Tensor& loss = ctx.output(0, x.dtype(), reduction == 0 ? labels.shape() : Shape{});
  cuda::softmax(true, x.dtype(), x.data(), logp.data(), dims.n, dims.c, dims.d, ctx.stream());
  LabelFlag bad(ctx);
  cuda::nll_loss(x.dtype(), logp.data(), labels.data<int64_t>(), loss.data(), dims.n, dims.c, dims.d, ignore_index(node),
                 reduction, bad.flag.data<int32_t>(), ctx.stream());
  bad.check(ctx, dims.c);
}

void sce_grad_cuda(KernelContext& ctx) {
  LossDims dims = check_loss_grad_inputs(ctx);
  const Node& node = ctx.node();
  const Tensor& in = ctx.input(1);
  const Tensor& labels = ctx.input(2);
  if (!sce_on_device(ctx, in, labels, 3) || (ctx.num_outputs() > 1 && ctx.output_requested(1)))
    return run_on_host(ctx, "class weights, int32 labels or dtype " + dtype_name(in.dtype()));
  Tensor logp = in;
  if (node.attr_int("from_scores", 0) != 0) {
    logp = empty_on(ctx.device(), in.dtype(), in.shape());
    cuda::softmax(true, in.dtype(), in.data(), logp.data(), dims.n, dims.c, dims.d, ctx.stream());
  }
  Tensor& dx = ctx.output(0, in.dtype(), in.shape());
  LabelFlag bad(ctx);
  cuda::nll_loss_grad(in.dtype(), ctx.input(0).data(), logp.data(), labels.data<int64_t>(), dx.data(), dims.n, dims.c,
                      dims.d, ignore_index(node), cuda_reduction(node), bad.flag.data<int32_t>(), ctx.stream());
  bad.check(ctx, dims.c);
}
#endif

// loss = -w[t] * log_softmax(x)[t], reduced.  dx = (softmax(x) - onehot(t)) * w[t] * dloss
// (/ sum(w) for mean; 0 for ignored targets); dw[c] = sum_{t = c} dloss' * (-log_prob[t] - L_mean).
// A gradient into log_prob adds dx += dlogp - softmax(x) * sum(dlogp, axis 1).
void sce_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  const bool saved = n.has_output(1);
  GraphBuilder::Attrs attrs = loss_grad_attrs(n);
  if (!saved) attrs["from_scores"] = Attribute::of(int64_t(1));
  std::string dx;
  if (g.has_dy(0)) {
    std::vector<std::string> ins{g.dy(0), saved ? g.y(1) : g.x(0), g.x(1)};
    if (g.has_input(2)) ins.push_back(g.x(2));
    auto outs = g.emit_n("SoftmaxCrossEntropyLossGrad", ins, g.needs(2) ? 2 : 1, attrs, kOnnxTrainDomain);
    dx = outs[0];
    if (g.needs(2)) g.set(2, outs[1]);
  } else if (g.needs(2)) {
    g.set(2, g.zeros_like(g.x(2)));
  }
  if (g.has_dy(1)) {
    std::string d = g.emit("LogSoftmaxGrad", {g.dy(1), g.y(1)}, {{"axis", Attribute::of(int64_t(1))}}, kOnnxTrainDomain);
    dx = dx.empty() ? d : g.add(dx, d);
  }
  if (g.needs(0)) g.set(0, dx);
}

}  // namespace

ONNXTRAIN_OP(SoftmaxCrossEntropyLoss, kOnnxDomain, 12).inputs(2, 3).outputs(1, 2).shape(shape_sce)
    .cpu(sce_kernel).cuda(OT_CUDA(sce_cuda)).gradient(sce_gradient);
// The same op for models whose ai.onnx opset predates it (< 12): losses attached by
// generate_artifacts use this domain there (src/training/losses.cc).
ONNXTRAIN_OP(SoftmaxCrossEntropyLoss, kOnnxTrainDomain, 1).inputs(2, 3).outputs(1, 2).shape(shape_sce)
    .cpu(sce_kernel).cuda(OT_CUDA(sce_cuda)).gradient(sce_gradient);
// (dX, dW) = SoftmaxCrossEntropyLossGrad(dLoss, log_prob, labels, weights?); second derivatives are not needed.
ONNXTRAIN_OP(SoftmaxCrossEntropyLossGrad, kOnnxTrainDomain, 1).inputs(3, 4).outputs(1, 2).shape(shape_loss_grad)
    .cpu(sce_grad_kernel).cuda(OT_CUDA(sce_grad_cuda)).gradient_not_implemented("second derivatives are not needed");
// ONNX Runtime's form in its training artifacts: com.microsoft.SoftmaxCrossEntropyLossGrad(dLoss,
// log_prob, labels, weights?) -> dX, with the same reduction and ignore_index attributes.
ONNXTRAIN_OP(SoftmaxCrossEntropyLossGrad, kMsDomain, 1).inputs(3, 4).outputs(1).shape(shape_loss_grad)
    .cpu(sce_grad_kernel).cuda(OT_CUDA(sce_grad_cuda)).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

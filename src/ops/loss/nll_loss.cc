// NegativeLogLikelihoodLoss: input holds log-probabilities [N, C, d1, ...]; see loss_common.h for
// the gather, weights, ignore_index and reduction.
#include "ops/gradient_builder.h"
#include "ops/loss/loss_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void nll_kernel(KernelContext& ctx) {
  LossDims dims = check_loss_inputs(ctx);
  const Tensor& x = ctx.input(0);
  dispatch_float(x.dtype(), [&]<typename T>() { nll_reduce<T>(ctx, x.data<T>(), dims); });
}

// onnxtrain.NegativeLogLikelihoodLossGrad(dLoss, input, labels, weights?) -> dX, dW? with the
// forward's reduction and ignore_index.
void nll_grad_kernel(KernelContext& ctx) {
  LossDims dims = check_loss_grad_inputs(ctx);
  const Tensor& x = ctx.input(1);
  dispatch_float(x.dtype(), [&]<typename T>() { loss_backward<false, T>(ctx, x.data<T>(), dims); });
}

void nll_gradient(GradientBuilder& g) {
  std::vector<std::string> ins{g.dy(0), g.x(0), g.x(1)};
  if (g.has_input(2)) ins.push_back(g.x(2));
  auto outs = g.emit_n("NegativeLogLikelihoodLossGrad", ins, g.needs(2) ? 2 : 1, loss_grad_attrs(g.node()),
                       kOnnxTrainDomain);
  g.set(0, outs[0]);
  if (g.needs(2)) g.set(2, outs[1]);
}

}  // namespace

// loss = -x[n, t, d] * w[t], reduced.  dx[n, t, d] = -w[t] * dloss (/ sum(w) for mean), 0 elsewhere;
// dw[c] = sum_{t = c} dloss' * (-x[t] - L_mean)
ONNXTRAIN_OP(NegativeLogLikelihoodLoss, kOnnxDomain, 12).inputs(2, 3).outputs(1).shape(shape_loss_output)
    .cpu(nll_kernel).gradient(nll_gradient);
// The same op for models whose ai.onnx opset predates it (< 12), as SoftmaxCrossEntropyLoss.
ONNXTRAIN_OP(NegativeLogLikelihoodLoss, kOnnxTrainDomain, 1).inputs(2, 3).outputs(1).shape(shape_loss_output)
    .cpu(nll_kernel).gradient(nll_gradient);
// (dX, dW) = NegativeLogLikelihoodLossGrad(dLoss, input, labels, weights?); second derivatives are not needed.
ONNXTRAIN_OP(NegativeLogLikelihoodLossGrad, kOnnxTrainDomain, 1).inputs(3, 4).outputs(1, 2).shape(shape_loss_grad)
    .cpu(nll_grad_kernel).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

// SoftmaxCrossEntropyLoss: log_prob = log_softmax(scores, axis 1) over [N, C, d1, ...] (written
// to the optional second output, or to scratch), then the NLL gather and reduction of
// loss_common.h.
#include "ops/loss/loss_common.h"
#include "ops/nn/softmax_rows.h"
#include "ops/registry.h"

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

}  // namespace

// loss = -w[t] * log_softmax(x)[t], reduced.  dx = (softmax(x) - onehot(t)) * w[t] * dloss
// (/ sum(w) for mean; 0 for ignored targets)
ONNXTRAIN_OP(SoftmaxCrossEntropyLoss, kOnnxDomain, 12).inputs(2, 3).outputs(1, 2).shape(shape_sce)
    .cpu(sce_kernel);

}  // namespace onnxtrain

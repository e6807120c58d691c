// NegativeLogLikelihoodLoss: input holds log-probabilities [N, C, d1, ...]; see loss_common.h for
// the gather, weights, ignore_index and reduction.
#include "ops/loss/loss_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void nll_kernel(KernelContext& ctx) {
  LossDims dims = check_loss_inputs(ctx);
  const Tensor& x = ctx.input(0);
  dispatch_float(x.dtype(), [&]<typename T>() { nll_reduce<T>(ctx, x.data<T>(), dims); });
}

}  // namespace

// loss = -x[n, t, d] * w[t], reduced.  dx[n, t, d] = -w[t] * dloss (/ sum(w) for mean), 0 elsewhere
ONNXTRAIN_OP(NegativeLogLikelihoodLoss, kOnnxDomain, 12).inputs(2, 3).outputs(1).shape(shape_loss_output)
    .cpu(nll_kernel);

}  // namespace onnxtrain

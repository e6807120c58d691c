// Adagrad (ai.onnx.preview.training, since version 1): one ADAGRAD step over n tensors.
//
//   inputs  R, T, X_1..X_n, G_1..G_n, H_1..H_n
//   outputs X_new_1..n, H_new_1..n
//
//   r     = R / (1 + T * decay_factor)
//   G_reg = norm_coefficient * X + G
//   H_new = H + G_reg^2
//   X_new = X - r * G_reg / (sqrt(H_new) + epsilon)
#include <cmath>

#include "ops/training/training_common.h"

namespace onnxtrain {
namespace {

using namespace training;

void adagrad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  int64_t n = tensor_count(node, ctx.num_inputs(), 3);
  double r = learning_rate(ctx);
  int64_t t = update_count(ctx);
  double decay = node.attr_float("decay_factor", 0.0f);
  double eps = node.attr_float("epsilon", 1e-6f);
  double norm = node.attr_float("norm_coefficient", 0.0f);
  double rate = r / (1.0 + double(t) * decay);
  for_each_update<3, 2>(ctx, n, [&]<typename T>(int64_t count, const std::array<const T*, 3>& in,
                                                const std::array<T*, 2>& out) {
    using C = compute_t<T>;
    const C ce = C(eps), cn = C(norm), cr = C(rate);
    const T *x = in[0], *g = in[1], *h = in[2];
    T *xo = out[0], *ho = out[1];
    parallel_for(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        C xv = C(x[k]);
        C gr = cn * xv + C(g[k]);
        C hn = C(h[k]) + gr * gr;
        if (xo) xo[k] = T(xv - cr * gr / (std::sqrt(hn) + ce));
        if (ho) ho[k] = T(hn);
      }
    });
  });
}

void adagrad_shape(ShapeContext& ctx) { update_shape_rule(ctx, 3, {0, 2}); }

}  // namespace

// An optimizer step: it runs after the gradient graph, so it has no gradient of its own.
ONNXTRAIN_OP(Adagrad, kTrainingDomain, 1).inputs(5, INT_MAX).outputs(1, INT_MAX).shape(adagrad_shape)
    .not_differentiable().cpu(adagrad_kernel);

}  // namespace onnxtrain

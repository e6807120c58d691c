// Adam (ai.onnx.preview.training, since version 1): one Adam step over n tensors.
//
//   inputs  R, T, X_1..X_n, G_1..G_n, V_1..V_n, H_1..H_n
//   outputs X_new_1..n, V_new_1..n, H_new_1..n
//
//   G_reg = norm_coefficient * X + G
//   V_new = alpha * V + (1 - alpha) * G_reg
//   H_new = beta * H + (1 - beta) * G_reg^2
//   R_adj = T > 0 ? R * sqrt(1 - beta^T) / (1 - alpha^T) : R    (no bias correction when T == 0)
//   X_new = (1 - norm_coefficient_post) * (X - R_adj * V_new / (sqrt(H_new) + epsilon))
#include <cmath>

#include "ops/training/training_common.h"

namespace onnxtrain {
namespace {

using namespace training;

void adam_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  int64_t n = tensor_count(node, ctx.num_inputs(), 4);
  double r = learning_rate(ctx);
  int64_t t = update_count(ctx);
  double alpha = node.attr_float("alpha", 0.9f);
  double beta = node.attr_float("beta", 0.999f);
  double eps = node.attr_float("epsilon", 1e-6f);
  double norm = node.attr_float("norm_coefficient", 0.0f);
  double post = node.attr_float("norm_coefficient_post", 0.0f);
  double r_adj = t > 0 ? r * std::sqrt(1.0 - std::pow(beta, double(t))) / (1.0 - std::pow(alpha, double(t))) : r;
  for_each_update<4, 3>(ctx, n, [&]<typename T>(int64_t count, const std::array<const T*, 4>& in,
                                                const std::array<T*, 3>& out) {
    using C = compute_t<T>;
    const C ca = C(alpha), cb = C(beta), ce = C(eps), cn = C(norm), cr = C(r_adj), keep = C(1.0 - post);
    const T *x = in[0], *g = in[1], *v = in[2], *h = in[3];
    T *xo = out[0], *vo = out[1], *ho = out[2];
    parallel_for(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        C xv = C(x[k]);
        C gr = cn * xv + C(g[k]);
        C vn = ca * C(v[k]) + (C(1) - ca) * gr;
        C hn = cb * C(h[k]) + (C(1) - cb) * gr * gr;
        if (xo) xo[k] = T(keep * (xv - cr * vn / (std::sqrt(hn) + ce)));
        if (vo) vo[k] = T(vn);
        if (ho) ho[k] = T(hn);
      }
    });
  });
}

void adam_shape(ShapeContext& ctx) { update_shape_rule(ctx, 4, {0, 2, 3}); }

}  // namespace

// An optimizer step: it runs after the gradient graph, so it has no gradient of its own.
ONNXTRAIN_OP(Adam, kTrainingDomain, 1).inputs(6, INT_MAX).outputs(1, INT_MAX).shape(adam_shape)
    .not_differentiable().cpu(adam_kernel);

}  // namespace onnxtrain

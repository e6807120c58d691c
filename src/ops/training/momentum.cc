// Momentum (ai.onnx.preview.training, since version 1): one SGD-with-momentum step over n tensors.
//
//   inputs  R, T, X_1..X_n, G_1..G_n, V_1..V_n
//   outputs X_new_1..n, V_new_1..n
//
//   G_reg  = norm_coefficient * X + G
//   beta'  = T > 0 ? beta : 1                     (the first step takes the whole gradient)
//   V_new  = alpha * V + beta' * G_reg
//   X_new  = X - R * V_new                        mode "standard"
//   X_new  = X - R * (G_reg + alpha * V_new)      mode "nesterov"
#include "ops/training/training_common.h"

namespace onnxtrain {
namespace {

using namespace training;

void momentum_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  int64_t n = tensor_count(node, ctx.num_inputs(), 3);
  double r = learning_rate(ctx);
  int64_t t = update_count(ctx);
  double alpha = required_float(node, "alpha");
  double beta = required_float(node, "beta");
  double norm = required_float(node, "norm_coefficient");
  OT_CHECK(node.has_attr("mode"), node.context(), "missing required attribute 'mode'");
  std::string mode = node.attr_string("mode", "standard");
  OT_CHECK(mode == "standard" || mode == "nesterov", node.context(), "mode must be standard or nesterov, got '",
           mode, "'");
  const bool nesterov = mode == "nesterov";
  double beta_adj = t > 0 ? beta : 1.0;
  for_each_update<3, 2>(ctx, n, [&]<typename T>(int64_t count, const std::array<const T*, 3>& in,
                                                const std::array<T*, 2>& out) {
    using C = compute_t<T>;
    const C ca = C(alpha), cb = C(beta_adj), cn = C(norm), cr = C(r);
    const T *x = in[0], *g = in[1], *v = in[2];
    T *xo = out[0], *vo = out[1];
    parallel_for(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        C xv = C(x[k]);
        C gr = cn * xv + C(g[k]);
        C vn = ca * C(v[k]) + cb * gr;
        if (xo) xo[k] = T(nesterov ? xv - cr * (gr + ca * vn) : xv - cr * vn);
        if (vo) vo[k] = T(vn);
      }
    });
  });
}

void momentum_shape(ShapeContext& ctx) { update_shape_rule(ctx, 3, {0, 2}); }

}  // namespace

// An optimizer step: it runs after the gradient graph, so it has no gradient of its own.
ONNXTRAIN_OP(Momentum, kTrainingDomain, 1).inputs(5, INT_MAX).outputs(1, INT_MAX).shape(momentum_shape)
    .not_differentiable().cpu(momentum_kernel);

}  // namespace onnxtrain

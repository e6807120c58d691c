// InstanceNormalization: for every (n, c) the spatial values are normalised with their own mean
// and population variance, then y = scale[c] * xh + B[c]. One row per (n, c), parallel over rows,
// three vectorised sweeps per row.
#include <cmath>

#include "ops/nn/norm_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void instance_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  const int64_t c = x.dim(1), rows = x.dim(0) * c;
  int64_t s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  const float eps = node.attr_float("epsilon", 1e-5f);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::vector<C> scale = channel_param<C>(node, ctx.input(1), c, "scale");
    std::vector<C> bias = channel_param<C>(node, ctx.input(2), c, "B");
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const C inv_s = C(1) / C(std::max<int64_t>(s, 1));
    parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / (3 * std::max<int64_t>(s, 1))),
                 [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * s;
        T* yr = py + r * s;
        C sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < s; ++j) sum += C(xr[j]);
        const C mean = sum * inv_s;
        C sq = 0;
#pragma omp simd reduction(+ : sq)
        for (int64_t j = 0; j < s; ++j) { C d = C(xr[j]) - mean; sq += d * d; }
        const C a = scale[size_t(r % c)] / std::sqrt(sq * inv_s + C(eps));
        const C off = bias[size_t(r % c)] - mean * a;
#pragma omp simd
        for (int64_t j = 0; j < s; ++j) yr[j] = T(C(xr[j]) * a + off);
      }
    });
  });
}

}  // namespace

// y = xh * scale[c] + B[c], xh = (x - mu) * r per (n, c).  dx = r * (g - mean(g) - xh * mean(g * xh)),
// g = dy * scale[c]; dscale = sum(dy * xh), dB = sum(dy)
ONNXTRAIN_OP(InstanceNormalization, kOnnxDomain, 1).inputs(3).outputs(1).shape(shape_same_as_input)
    .inplace(0, 0).cpu(instance_norm_kernel);

}  // namespace onnxtrain

// LRN (local response normalisation across channels):
//   y = x / (bias + alpha / size * sum_{c' in window(c)} x[c']^2) ^ beta,
// window(c) = [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to [0, C). Parallel over
// (n, c) rows, vectorised over the spatial dims.
#include <cmath>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void lrn_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  OT_CHECK(node.has_attr("size"), node.context(), "the size attribute is required");
  const int64_t size = node.attr_int("size", 1);
  OT_CHECK(size > 0, node.context(), "size must be positive, got ", size);
  const float alpha = node.attr_float("alpha", 1e-4f), beta = node.attr_float("beta", 0.75f);
  const float bias = node.attr_float("bias", 1.0f);
  const int64_t c = x.dim(1), rows = x.dim(0) * c;
  int64_t s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const C k = C(alpha) / C(size);
    parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / (std::max<int64_t>(s, 1) * size)),
                 [&](int64_t b, int64_t e) {
      std::vector<C> sq(static_cast<size_t>(s));
      for (int64_t r = b; r < e; ++r) {
        const int64_t n = r / c, ch = r % c;
        std::fill(sq.begin(), sq.end(), C(0));
        for (int64_t cc = std::max<int64_t>(0, ch - lo); cc <= std::min(c - 1, ch + hi); ++cc) {
          const T* xr = px + (n * c + cc) * s;
#pragma omp simd
          for (int64_t j = 0; j < s; ++j) { C v = C(xr[j]); sq[size_t(j)] += v * v; }
        }
        const T* xr = px + r * s;
        T* yr = py + r * s;
        for (int64_t j = 0; j < s; ++j)
          yr[j] = T(C(xr[j]) / std::pow(C(bias) + k * sq[size_t(j)], C(beta)));
      }
    });
  });
}

}  // namespace

// y = x * d^-beta, d = bias + alpha/size * window_sum(x^2).
// dx = dy * d^-beta - 2 * alpha * beta / size * x * window_sum^T(dy * x * d^(-beta-1))
ONNXTRAIN_OP(LRN, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).cpu(lrn_kernel);

}  // namespace onnxtrain

// MeanVarianceNormalization: y = (x - mean) / (sqrt(var) + 1e-9) with mean and (population)
// variance over `axes` (default [0, 2, 3]). The statistics come from the reduction driver (two
// passes: mean, then mean squared deviation); the normalisation is a broadcast over the
// keepdims-shaped statistics.
#include <cmath>

#include "ops/gradient_builder.h"
#include "ops/reduce/reduce_plan.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

template <typename C>
struct MeanInto {
  C* out;
  const C* center = nullptr;  // when set: mean of (v - center)^2
  C inv_count;
  C init() const { return C(0); }
  C map(C v, int64_t o) const {
    if (!center) return v;
    C d = v - center[o];
    return d * d;
  }
  C combine(C a, C b) const { return a + b; }
  void store(int64_t o, C acc) { out[o] = acc * inv_count; }
};

void mvn_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> axes = node.attr_ints("axes", {0, 2, 3});
  std::vector<bool> mask(size_t(x.rank()), false);
  for (int64_t a : axes) mask[size_t(normalize_axis(node, a, x.rank()))] = true;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  Shape stat_shape = reduced_shape(x.shape(), mask, true);
  int64_t count = 1;
  for (size_t d = 0; d < mask.size(); ++d) if (mask[d]) count *= x.shape()[d];
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    Tensor mean = Tensor::empty(dtype_v<C>, stat_shape);
    Tensor den = Tensor::empty(dtype_v<C>, stat_shape);
    MeanInto<C> m{mean.data<C>(), nullptr, C(1) / C(count)};
    run_reduction<T, C>(x.data<T>(), x.shape(), mask, m);
    MeanInto<C> v{den.data<C>(), mean.data<C>(), C(1) / C(count)};
    run_reduction<T, C>(x.data<T>(), x.shape(), mask, v);
    C* pd = den.data<C>();
    for (int64_t i = 0; i < den.numel(); ++i) pd[i] = C(1) / (std::sqrt(pd[i]) + C(1e-9));
    binary_broadcast<T, C, T>(x, mean, y, [](T a, C b) { return T(C(a) - b); });
    binary_broadcast<T, C, T>(y, den, y, [](T a, C b) { return T(C(a) * b); });
  });
}

}  // namespace

// y = c * r, c = x - mean(x), s = sqrt(mean(c^2)), r = 1 / (s + 1e-9) over axes.
// dx = r * (dy - mean(dy)) - (r^2 / s) * c * mean(dy * c)  (exact; the statistics are recomputed)
ONNXTRAIN_OP(MeanVarianceNormalization, kOnnxDomain, 9).inputs(1).outputs(1).shape(shape_same_as_input)
    .cpu(mvn_kernel).gradient([](GradientBuilder& g) {
      std::vector<int64_t> axes = g.node().attr_ints("axes", {0, 2, 3});
      std::string x = g.x(0), dy = g.dy(0);
      std::string c = g.sub(x, g.reduce_mean(x, axes, true));
      std::string sd = g.emit("Sqrt", {g.reduce_mean(g.mul(c, c), axes, true)});
      std::string r = g.emit("Reciprocal", {g.add(sd, g.scalar_like(1e-9, x))});
      std::string first = g.mul(r, g.sub(dy, g.reduce_mean(dy, axes, true)));
      std::string k = g.div(g.mul(r, r), sd);
      std::string second = g.mul(c, g.mul(k, g.reduce_mean(g.mul(dy, c), axes, true)));
      g.set(0, g.sub(first, second));
    });

}  // namespace onnxtrain

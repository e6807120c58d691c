// LRN (local response normalisation across channels):
//   y = x / (bias + alpha / size * sum_{c' in window(c)} x[c']^2) ^ beta,
// window(c) = [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to [0, C). Parallel over
// (n, c) rows, vectorised over the spatial dims.
#include <cmath>

#include "ops/gradient_builder.h"
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

// onnxtrain.LRNGrad(dY, X) with the forward's size, alpha, beta and bias:
//   dx[c] = dy[c] d[c]^-beta - 2 k beta x[c] sum_{c' : c in window(c')} dy[c'] x[c'] d[c']^(-beta-1),
// k = alpha / size, d = bias + k window_sum(x^2). c in window(c') <=> c' in [c - hi, c + lo].
// Tasks are (n, block of spatial positions); each holds d^-beta and t = dy x d^(-beta-1) for all
// channels of its block, vectorised along the block.
void lrn_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(x.rank() >= 2, node.context(), "expected X of shape [N, C, ...], got ", shape_str(x.shape()));
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), node.context(), "dY and X must match, got ",
           dtype_name(dy.dtype()), " ", shape_str(dy.shape()), " and ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  const int64_t size = node.attr_int("size", 1);
  OT_CHECK(size > 0, node.context(), "size must be positive, got ", size);
  const float alpha = node.attr_float("alpha", 1e-4f), beta = node.attr_float("beta", 0.75f);
  const float bias = node.attr_float("bias", 1.0f);
  const int64_t n = x.dim(0), c = x.dim(1);
  int64_t s = 1;
  for (int d = 2; d < x.rank(); ++d) s *= x.dim(d);
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const C k = C(alpha) / C(size), b = C(bias), be = C(beta);
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (s + kBlock - 1) / kBlock;
    parallel_for(n * blocks, std::max<int64_t>(1, kElementwiseGrain / (c * std::min(s, kBlock) * (size + 4))),
                 [&](int64_t tb, int64_t te) {
      const C kk = k, bb = b, beta_ = be, two_kb = C(2) * k * be;  // locals for the vectorised loops
      std::vector<C> pw(static_cast<size_t>(c * kBlock)), t(static_cast<size_t>(c * kBlock)), acc(static_cast<size_t>(kBlock));
      for (int64_t task = tb; task < te; ++task) {
        const int64_t ni = task / blocks, j0 = (task % blocks) * kBlock, len = std::min(kBlock, s - j0);
        const int64_t base = ni * c * s + j0;
        for (int64_t ch = 0; ch < c; ++ch) {  // d^-beta and t per channel
          std::fill(acc.begin(), acc.begin() + len, C(0));
          for (int64_t cc = std::max<int64_t>(0, ch - lo); cc <= std::min(c - 1, ch + hi); ++cc) {
            const T* xr = px + base + cc * s;
#pragma omp simd
            for (int64_t j = 0; j < len; ++j) { C v = C(xr[j]); acc[size_t(j)] += v * v; }
          }
          const T* xr = px + base + ch * s;
          const T* dr = pdy + base + ch * s;
          C* pwr = pw.data() + ch * kBlock;
          C* tr = t.data() + ch * kBlock;
          for (int64_t j = 0; j < len; ++j) {
            C d = bb + kk * acc[size_t(j)];
            C p = std::pow(d, -beta_);
            pwr[j] = p;
            tr[j] = C(dr[j]) * C(xr[j]) * p / d;
          }
        }
        for (int64_t ch = 0; ch < c; ++ch) {
          std::fill(acc.begin(), acc.begin() + len, C(0));
          for (int64_t cc = std::max<int64_t>(0, ch - hi); cc <= std::min(c - 1, ch + lo); ++cc) {
            const C* tr = t.data() + cc * kBlock;
#pragma omp simd
            for (int64_t j = 0; j < len; ++j) acc[size_t(j)] += tr[j];
          }
          const T* xr = px + base + ch * s;
          const T* dr = pdy + base + ch * s;
          T* out = pdx + base + ch * s;
          const C* pwr = pw.data() + ch * kBlock;
#pragma omp simd
          for (int64_t j = 0; j < len; ++j)
            out[j] = T(C(dr[j]) * pwr[j] - two_kb * C(xr[j]) * acc[size_t(j)]);
        }
      }
    });
  });
}

}  // namespace

// y = x * d^-beta, d = bias + alpha/size * window_sum(x^2).
// dx = dy * d^-beta - 2 * alpha * beta / size * x * window_sum^T(dy * x * d^(-beta-1))
ONNXTRAIN_OP(LRN, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).cpu(lrn_kernel)
    .gradient([](GradientBuilder& g) {
      const Node& n = g.node();
      GraphBuilder::Attrs attrs{{"size", Attribute::of(n.attr_int("size", 1))},
                                {"alpha", Attribute::of(n.attr_float("alpha", 1e-4f))},
                                {"beta", Attribute::of(n.attr_float("beta", 0.75f))},
                                {"bias", Attribute::of(n.attr_float("bias", 1.0f))}};
      g.set(0, g.emit("LRNGrad", {g.dy(0), g.x(0)}, attrs, kOnnxTrainDomain));
    });
// dX = LRNGrad(dY, X); second derivatives are not needed.
ONNXTRAIN_OP(LRNGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1)); })
    .cpu(lrn_grad_kernel).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

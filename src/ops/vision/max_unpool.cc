// MaxUnpool (opset 9, 11): the partial inverse of MaxPool. The inferred shape has
// (in - 1) * stride + kernel - pad_begin - pad_end per spatial axis; I holds MaxPool's indices into
// that whole shape, flattened, and U.flat[I[i]] = X[i] over zeros. Y is U, or with output_shape,
// U placed at the origin of zeros of output_shape (as the ONNX reference and its node test: the
// indices keep addressing the inferred shape).
#include <cstring>

#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// The default output shape from X's shape; dims of -1 stay -1.
Shape default_unpool_shape(const Node& node, const Shape& x) {
  OT_CHECK(x.size() >= 3, node.context(), "X must be [N, C, spatial...], got ", shape_str(x));
  size_t nd = x.size() - 2;
  OT_CHECK(node.has_attr("kernel_shape"), node.context(), "attribute kernel_shape is required");
  auto k = node.attr_ints("kernel_shape");
  auto s = node.attr_ints("strides", std::vector<int64_t>(nd, 1));
  auto p = node.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  if (s.empty()) s.assign(nd, 1);
  if (p.empty()) p.assign(2 * nd, 0);
  OT_CHECK(k.size() == nd && s.size() == nd && p.size() == 2 * nd, node.context(), "kernel_shape, strides and pads ",
           "must have ", nd, ", ", nd, " and ", 2 * nd, " values, got ", k.size(), ", ", s.size(), " and ", p.size());
  Shape out = {x[0], x[1]};
  for (size_t i = 0; i < nd; ++i) {
    int64_t in = x[i + 2];
    out.push_back(in < 0 ? -1 : (in - 1) * s[i] + k[i] - p[i] - p[i + nd]);
  }
  return out;
}

void max_unpool_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  std::optional<Shape> out;
  if (ctx.has_input(2)) {
    if (const Tensor* os = ctx.input_value(2)) out = os->to_int_vector();
    else if (x) out = Shape(x->size(), -1);
  } else if (x) {
    out = default_unpool_shape(ctx.node(), *x);
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
}

// Where each X[i] lands in Y: I[i] addresses the inferred shape, whose coordinates Y keeps
// (output_shape only adds zeros, or trims where no index points). Checked once per run.
struct UnpoolTargets {
  Shape out;
  std::vector<int64_t> flat;  // per element of X, its index into Y
};

UnpoolTargets unpool_targets(const KernelContext& ctx, const Tensor& x, const Tensor& idx,
                             const Tensor* output_shape) {
  const Node& node = ctx.node();
  OT_CHECK(idx.shape() == x.shape() && is_integer(idx.dtype()), node.context(), "I must be integer with X's shape ",
           shape_str(x.shape()), ", got ", dtype_name(idx.dtype()), " ", shape_str(idx.shape()));
  const Shape inferred = default_unpool_shape(node, x.shape());
  UnpoolTargets t{inferred, {}};
  if (output_shape) {
    Shape given = output_shape->to_int_vector();
    OT_CHECK(given.size() == t.out.size() && given[0] == t.out[0] && given[1] == t.out[1], node.context(),
             "output_shape ", shape_str(given), " must have rank ", t.out.size(), " and X's N and C ", t.out[0], ", ",
             t.out[1]);
    for (auto d : given) OT_CHECK(d >= 0, node.context(), "output_shape must be >= 0, got ", shape_str(given));
    t.out = given;
  }
  for (auto d : t.out) OT_CHECK(d >= 0, node.context(), "the output shape ", shape_str(t.out), " is negative");
  const int64_t total = numel(inferred);
  const bool same = t.out == inferred;
  const size_t rank = t.out.size();
  t.flat.resize(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t j = idx.item_as_int(i);
    OT_CHECK(j >= 0 && j < total, node.context(), "index I[", i, "] = ", j, " is outside the inferred output ",
             shape_str(inferred), " (", total, " elements)");
    if (!same) {  // the same coordinates in output_shape
      int64_t rem = j, k = 0, stride = 1;
      for (size_t d = rank; d-- > 0;) {
        int64_t c = rem % inferred[d];
        rem /= inferred[d];
        OT_CHECK(c < t.out[d], node.context(), "index I[", i, "] = ", j, " falls outside output_shape ",
                 shape_str(t.out), " along dim ", d);
        k += c * stride;
        stride *= t.out[d];
      }
      j = k;
    }
    t.flat[size_t(i)] = j;
  }
  return t;
}

void max_unpool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const UnpoolTargets t = unpool_targets(ctx, x, ctx.input(1), ctx.has_input(2) ? &ctx.input(2) : nullptr);
  Tensor& y = ctx.output(0, x.dtype(), t.out);
  if (y.numel()) std::memset(y.data(), 0, y.nbytes());
  dispatch_by_size(x.dtype(), [&]<typename T>() {
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    for (int64_t i = 0; i < x.numel(); ++i) py[t.flat[size_t(i)]] = px[i];  // a repeated index: the last wins
  });
}

// MaxUnpoolGrad(dY, X, I, [output_shape]) -> dX: dY at each element's target; an element a later
// one overwrote (a repeated index) reaches Y nowhere, so its gradient is 0.
void max_unpool_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const UnpoolTargets t = unpool_targets(ctx, x, ctx.input(2), ctx.has_input(3) ? &ctx.input(3) : nullptr);
  OT_CHECK(dy.shape() == t.out && dy.dtype() == x.dtype(), ctx.node().context(), "dY should be ",
           dtype_name(x.dtype()), " ", shape_str(t.out), ", got ", dtype_name(dy.dtype()), " ", shape_str(dy.shape()));
  std::vector<int64_t> last(size_t(dy.numel()), -1);  // the element each target keeps
  for (int64_t i = 0; i < x.numel(); ++i) last[size_t(t.flat[size_t(i)])] = i;
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  dispatch_by_size(x.dtype(), [&]<typename T>() {
    const T* pdy = static_cast<const T*>(dy.data());
    T* pdx = static_cast<T*>(dx.data());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t j = t.flat[size_t(i)];
      pdx[i] = last[size_t(j)] == i ? pdy[j] : T{};
    }
  });
}

void max_unpool_gradient(GradientBuilder& g) {
  std::vector<std::string> ins{g.dy(0), g.x(0), g.x(1)};
  if (g.has_input(2)) ins.push_back(g.x(2));
  if (g.needs(0)) g.set(0, g.emit("MaxUnpoolGrad", ins, g.node().attributes, kOnnxTrainDomain));
}

}  // namespace

// Y.flat[I] = X.  dX = dY.flat[I] (a gather; 0 where a repeated index let a later X win); I and
// output_shape are integers: no gradient
ONNXTRAIN_OP(MaxUnpool, kOnnxDomain, 9).inputs(2, 3).outputs(1).shape(max_unpool_shape)
    .gradient(max_unpool_gradient).cpu(max_unpool_kernel);
// dX = MaxUnpoolGrad(dY, X, I, ...) is linear in dY: second derivatives are not needed.
ONNXTRAIN_OP(MaxUnpoolGrad, kOnnxTrainDomain, 1).inputs(3, 4).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).cpu(max_unpool_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain

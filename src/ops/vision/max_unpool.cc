// MaxUnpool (opset 9, 11): the partial inverse of MaxPool. The inferred shape has
// (in - 1) * stride + kernel - pad_begin - pad_end per spatial axis; I holds MaxPool's indices into
// that whole shape, flattened, and U.flat[I[i]] = X[i] over zeros. Y is U, or with output_shape,
// U placed at the origin of zeros of output_shape (as the ONNX reference and its node test: the
// indices keep addressing the inferred shape).
#include <cstring>

#include "ops/common.h"
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

void max_unpool_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  OT_CHECK(idx.shape() == x.shape() && is_integer(idx.dtype()), node.context(), "I must be integer with X's shape ",
           shape_str(x.shape()), ", got ", dtype_name(idx.dtype()), " ", shape_str(idx.shape()));
  Shape out = default_unpool_shape(node, x.shape());
  if (ctx.has_input(2)) {
    Shape given = ctx.input(2).to_int_vector();
    OT_CHECK(given.size() == out.size() && given[0] == out[0] && given[1] == out[1], node.context(), "output_shape ",
             shape_str(given), " must have rank ", out.size(), " and X's N and C ", out[0], ", ", out[1]);
    for (auto d : given) OT_CHECK(d >= 0, node.context(), "output_shape must be >= 0, got ", shape_str(given));
    out = given;
  }
  for (auto d : out) OT_CHECK(d >= 0, node.context(), "the output shape ", shape_str(out), " is negative");
  const Shape inferred = default_unpool_shape(node, x.shape());
  const int64_t total = numel(inferred);
  const bool same = out == inferred;
  Tensor& y = ctx.output(0, x.dtype(), out);
  if (y.numel()) std::memset(y.data(), 0, y.nbytes());
  const size_t rank = out.size();
  dispatch_by_size(x.dtype(), [&]<typename T>() {
    const T* px = static_cast<const T*>(x.data());
    T* py = static_cast<T*>(y.data());
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t j = idx.item_as_int(i);
      OT_CHECK(j >= 0 && j < total, node.context(), "index I[", i, "] = ", j, " is outside the inferred output ",
               shape_str(inferred), " (", total, " elements)");
      if (!same) {  // the same coordinates in output_shape
        int64_t rem = j, k = 0, stride = 1;
        for (size_t d = rank; d-- > 0;) {
          int64_t c = rem % inferred[d];
          rem /= inferred[d];
          OT_CHECK(c < out[d], node.context(), "index I[", i, "] = ", j, " falls outside output_shape ",
                   shape_str(out), " along dim ", d);
          k += c * stride;
          stride *= out[d];
        }
        j = k;
      }
      py[j] = px[i];
    }
  });
}

}  // namespace

// Y.flat[I] = X.  dX = dY.flat[I] (a gather); I gets no gradient
ONNXTRAIN_OP(MaxUnpool, kOnnxDomain, 9).inputs(2, 3).outputs(1).shape(max_unpool_shape)
    .gradient_not_implemented("no rule yet: dX is GatherElements of the flattened dY at I")
    .cpu(max_unpool_kernel);

}  // namespace onnxtrain

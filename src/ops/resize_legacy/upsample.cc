// Upsample (opset 7: scales attribute; opset 9: scales input; removed in opset 10 in favour of
// Resize). Y's dims are floor(X's dims * scales), scales >= 1. Coordinates are asymmetric,
// x_in = x_out / scale: mode nearest takes X[min(floor(x_in), n - 1)]; mode linear (also spelled
// bilinear) interpolates between floor(x_in) and the next index, clamped to the edge. N-linear
// interpolation is separable: one pass per resized axis.
#include <cmath>

#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

bool read_mode(const Node& node) {  // true: linear
  std::string mode = node.attr_string("mode", "nearest");
  OT_CHECK(mode == "nearest" || mode == "linear" || mode == "bilinear", node.context(),
           "mode must be nearest or linear, got '", mode, "'");
  return mode != "nearest";
}

std::optional<std::vector<double>> scales_of(const Node& node, int64_t opset, const Tensor* input) {
  std::vector<double> s;
  if (opset < 9) {
    OT_CHECK(node.has_attr("scales"), node.context(), "attribute scales is required");
    for (float f : node.attr_floats("scales")) s.push_back(double(f));
  } else {
    if (!input) return std::nullopt;
    for (int64_t i = 0; i < input->numel(); ++i) s.push_back(double(float(input->item_as_double(i))));
  }
  return s;
}

Shape output_shape(const Node& node, const Shape& x, const std::vector<double>& s) {
  OT_CHECK(s.size() == x.size(), node.context(), "scales must have one value per dim of X (", x.size(), "), got ",
           s.size());
  Shape out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    OT_CHECK(s[i] >= 1.0, node.context(), "scales must be >= 1, got ", s[i], " for dim ", i);
    out[i] = x[i] < 0 ? -1 : int64_t(std::floor(double(x[i]) * s[i]));
  }
  return out;
}

void upsample_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  auto s = scales_of(ctx.node(), ctx.opset(), ctx.num_inputs() > 1 ? ctx.input_value(1) : nullptr);
  std::optional<Shape> out;
  if (x) out = s ? output_shape(ctx.node(), *x, *s) : Shape(x->size(), -1);
  ctx.set_output(0, ctx.input_dtype(0), out);
}

void upsample_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  if (ctx.opset() >= 9) OT_CHECK(ctx.has_input(1), node.context(), "input scales is required from opset 9");
  std::vector<double> s = *scales_of(node, ctx.opset(), ctx.opset() >= 9 ? &ctx.input(1) : nullptr);
  const bool linear = read_mode(node);
  const Shape in = x.shape(), out = output_shape(node, in, s);
  Tensor& y = ctx.output(0, x.dtype(), out);
  if (y.numel() == 0) return;
  const size_t rank = in.size();
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    std::vector<double> cur(static_cast<size_t>(x.numel())), next;
    for (int64_t i = 0; i < x.numel(); ++i) cur[size_t(i)] = double(compute_t<T>(px[i]));
    Shape shape = in;
    for (size_t axis = 0; axis < rank; ++axis) {
      if (out[axis] == in[axis]) continue;
      int64_t outer = 1, inner = 1;
      for (size_t i = 0; i < axis; ++i) outer *= shape[i];
      for (size_t i = axis + 1; i < rank; ++i) inner *= shape[i];
      const int64_t n_in = in[axis], n_out = out[axis];
      // Two taps per output index (the second weighted 0 for nearest).
      std::vector<int64_t> i0(static_cast<size_t>(n_out)), i1(static_cast<size_t>(n_out));
      std::vector<double> w1(static_cast<size_t>(n_out));
      for (int64_t o = 0; o < n_out; ++o) {
        double xi = double(o) / s[axis], fl = std::floor(xi);
        i0[size_t(o)] = std::min<int64_t>(int64_t(fl), n_in - 1);
        i1[size_t(o)] = std::min<int64_t>(i0[size_t(o)] + 1, n_in - 1);
        w1[size_t(o)] = linear ? xi - fl : 0.0;
      }
      next.assign(size_t(outer * n_out * inner), 0.0);
      parallel_for(outer * n_out, std::max<int64_t>(1, 8192 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const int64_t ob = r / n_out, o = r % n_out;
          const double* a = cur.data() + (ob * n_in + i0[size_t(o)]) * inner;
          const double* c = cur.data() + (ob * n_in + i1[size_t(o)]) * inner;
          const double w = w1[size_t(o)];
          double* dst = next.data() + r * inner;
          for (int64_t i = 0; i < inner; ++i) dst[i] = w == 0.0 ? a[i] : (1 - w) * a[i] + w * c[i];
        }
      });
      cur.swap(next);
      shape[axis] = n_out;
    }
    for (int64_t i = 0; i < y.numel(); ++i) {
      if constexpr (std::is_floating_point_v<compute_t<T>>) py[i] = T(compute_t<T>(cur[size_t(i)]));
      else py[i] = T(std::nearbyint(cur[size_t(i)]));
    }
  });
}

// Upsample samples as Resize-10 does (asymmetric coordinates, floor for nearest, the same two
// linear taps clamped to the edge), so its transpose is Resize's: ResizeGrad with those settings.
void upsample_gradient(GradientBuilder& g) {
  GraphBuilder::Attrs attrs;
  attrs["mode"] = Attribute::of(std::string(read_mode(g.node()) ? "linear" : "nearest"));
  attrs["coordinate_transformation_mode"] = Attribute::of(std::string("asymmetric"));
  attrs["nearest_mode"] = Attribute::of(std::string("floor"));
  std::string scales;
  if (g.opset() < 9) {
    const std::vector<float> s = g.node().attr_floats("scales");
    scales = g.constant(Tensor::from_vector<float>(s, {int64_t(s.size())}));
  } else {
    scales = g.x(1);
    if (g.needs(1)) g.set(1, g.zeros_like(g.x(1)));  // scales only select sample positions
  }
  if (g.needs(0)) g.set(0, g.emit("ResizeGrad", {g.dy(0), g.x(0), "", scales}, attrs, kOnnxTrainDomain));
}

}  // namespace

// Y = interpolate(X).  dX = ResizeGrad(dY): the transposed interpolation (each output adds
// dY * weight to its taps); scales get no gradient
ONNXTRAIN_OP(Upsample, kOnnxDomain, 7).inputs(1).outputs(1).shape(upsample_shape).gradient(upsample_gradient)
    .cpu(upsample_kernel);
ONNXTRAIN_OP(Upsample, kOnnxDomain, 9).inputs(2).outputs(1).shape(upsample_shape).gradient(upsample_gradient)
    .cpu(upsample_kernel);

}  // namespace onnxtrain

// Resize (opset 10, 11, 13+): nearest (every nearest_mode), linear and cubic (cubic_coeff_a,
// exclude_outside), every coordinate_transformation_mode including tf_crop_and_resize with roi
// and extrapolation_value; output size from scales or sizes. N-linear and N-cubic interpolation
// are separable, so each resized axis is one pass of precomputed (index, weight) taps.
#include <algorithm>
#include <cmath>

#include "ops/gradient_builder.h"
#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

struct ResizeAttrs {
  std::string mode, coord, nearest;
  double cubic_a;
  bool exclude_outside;
  double extrapolation;
};

ResizeAttrs read_attrs(const Node& node, int64_t opset) {
  ResizeAttrs a;
  a.mode = node.attr_string("mode", "nearest");
  a.coord = opset < 11 ? "asymmetric" : node.attr_string("coordinate_transformation_mode", "half_pixel");
  a.nearest = opset < 11 ? "floor" : node.attr_string("nearest_mode", "round_prefer_floor");
  a.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  a.extrapolation = node.attr_float("extrapolation_value", 0.0f);
  OT_CHECK(a.mode == "nearest" || a.mode == "linear" || a.mode == "cubic", node.context(),
           "mode must be nearest, linear or cubic, got '", a.mode, "'");
  static const char* coords[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                 "tf_half_pixel_for_nn", "tf_crop_and_resize"};
  bool ok = false;
  for (const char* c : coords) ok = ok || a.coord == c;
  OT_CHECK(ok, node.context(), "unknown coordinate_transformation_mode '", a.coord, "'");
  OT_CHECK(a.nearest == "round_prefer_floor" || a.nearest == "round_prefer_ceil" || a.nearest == "floor" ||
               a.nearest == "ceil",
           node.context(), "unknown nearest_mode '", a.nearest, "'");
  return a;
}

// Input indices: opset 10 is (X, scales); 11+ is (X, roi, scales, sizes).
struct ResizeInputs {
  const Tensor* roi = nullptr;
  const Tensor* scales = nullptr;
  const Tensor* sizes = nullptr;
};

std::vector<double> float_list(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.item_as_double(i);
  return v;
}

// Output shape and per-axis scales from either scales or sizes.
void output_geometry(const Node& node, const Shape& in, const Tensor* scales, const Tensor* sizes, Shape& out,
                     std::vector<double>& scale) {
  size_t rank = in.size();
  out.assign(rank, 0);
  scale.assign(rank, 1.0);
  if (scales && scales->numel() > 0) {
    OT_CHECK(size_t(scales->numel()) == rank, node.context(), "scales must have ", rank, " values, got ",
             scales->numel());
    for (size_t i = 0; i < rank; ++i) {
      scale[i] = double(float(scales->item_as_double(int64_t(i))));
      OT_CHECK(scale[i] > 0, node.context(), "scales must be positive, got ", scale[i]);
      out[i] = int64_t(std::floor(double(in[i]) * scale[i]));
    }
    return;
  }
  OT_CHECK(sizes && sizes->numel() > 0, node.context(), "one of scales and sizes must be given");
  OT_CHECK(size_t(sizes->numel()) == rank, node.context(), "sizes must have ", rank, " values, got ", sizes->numel());
  for (size_t i = 0; i < rank; ++i) {
    out[i] = sizes->item_as_int(int64_t(i));
    OT_CHECK(out[i] >= 0, node.context(), "sizes must be >= 0, got ", out[i]);
    scale[i] = in[i] > 0 ? double(out[i]) / double(in[i]) : 1.0;
  }
}

struct AxisTaps {
  int width = 1;                 // taps per output index
  std::vector<int64_t> index;    // [out * width]
  std::vector<double> weight;    // [out * width]
  std::vector<char> outside;     // [out]: extrapolation_value
  bool identity = false;
};

AxisTaps axis_taps(const ResizeAttrs& a, int64_t in, int64_t out, double scale, double roi_start,
                   double roi_end) {
  AxisTaps t;
  t.width = a.mode == "nearest" ? 1 : a.mode == "linear" ? 2 : 4;
  t.index.resize(size_t(out * t.width));
  t.weight.resize(size_t(out * t.width));
  t.outside.assign(size_t(out), 0);
  double out_w = scale * double(in);  // as the ONNX reference: the unrounded output length
  bool identity = in == out;
  for (int64_t o = 0; o < out; ++o) {
    double x = double(o), xo = 0;
    if (a.coord == "half_pixel") xo = (x + 0.5) / scale - 0.5;
    else if (a.coord == "pytorch_half_pixel") xo = out_w == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5;
    else if (a.coord == "align_corners") xo = out_w == 1.0 ? 0.0 : x * double(in - 1) / (out_w - 1.0);
    else if (a.coord == "asymmetric") xo = x / scale;
    else if (a.coord == "tf_half_pixel_for_nn") xo = (x + 0.5) / scale;
    else {  // tf_crop_and_resize
      xo = out_w == 1.0 ? (roi_end - roi_start) * double(in - 1) / 2
                        : x * (roi_end - roi_start) * double(in - 1) / (out_w - 1.0);
      xo += roi_start * double(in - 1);
      if (xo < 0 || xo > double(in - 1)) t.outside[size_t(o)] = 1;
    }
    int64_t* idx = &t.index[size_t(o * t.width)];
    double* w = &t.weight[size_t(o * t.width)];
    double fl = std::floor(xo), r = xo - fl;
    int64_t i0 = int64_t(fl);
    auto clamp = [&](int64_t i) { return std::min(std::max<int64_t>(i, 0), in - 1); };
    if (t.width == 1) {
      int64_t i = i0;
      if (r != 0.0) {
        if (a.nearest == "round_prefer_floor") i = r <= 0.5 ? i0 : i0 + 1;
        else if (a.nearest == "round_prefer_ceil") i = r < 0.5 ? i0 : i0 + 1;
        else if (a.nearest == "ceil") i = i0 + 1;
      }
      idx[0] = clamp(i);
      w[0] = 1.0;
    } else if (t.width == 2) {
      idx[0] = clamp(i0);
      idx[1] = clamp(i0 + 1);
      w[0] = 1.0 - r;
      w[1] = r;
    } else {
      double A = a.cubic_a, s = r + 1, u = 1 - r, v = 2 - r;
      double c[4] = {((A * s - 5 * A) * s + 8 * A) * s - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
                     ((A + 2) * u - (A + 3)) * u * u + 1, ((A * v - 5 * A) * v + 8 * A) * v - 4 * A};
      double sum = 0;
      for (int j = 0; j < 4; ++j) {
        int64_t i = i0 - 1 + j;
        if (a.exclude_outside && (i < 0 || i >= in)) c[j] = 0;
        sum += c[j];
        idx[j] = clamp(i);
      }
      for (int j = 0; j < 4; ++j) w[j] = a.exclude_outside && sum != 0 ? c[j] / sum : c[j];
    }
    if (t.outside[size_t(o)]) identity = false;
    for (int j = 0; j < t.width && identity; ++j)
      identity = w[j] == 0.0 || (w[j] == 1.0 && idx[j] == o);
  }
  t.identity = identity;
  return t;
}

ResizeInputs resize_inputs(int64_t opset, const std::vector<const Tensor*>& in) {
  ResizeInputs r;
  auto get = [&](size_t i) { return i < in.size() ? in[i] : nullptr; };
  if (opset < 11) {
    r.scales = get(1);
  } else {
    r.roi = get(1);
    r.scales = get(2);
    r.sizes = get(3);
  }
  return r;
}

void resize_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& x = ctx.input_shape(0);
  std::vector<const Tensor*> vals;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) vals.push_back(ctx.has_input(i) ? ctx.input_value(i) : nullptr);
  ResizeInputs r = resize_inputs(ctx.opset(), vals);
  bool scales_known = r.scales && r.scales->numel() > 0;
  bool sizes_known = r.sizes && r.sizes->numel() > 0;
  bool scales_absent = ctx.opset() >= 11 && (!ctx.has_input(2) || (r.scales && r.scales->numel() == 0));
  if (!x || !(scales_known || (sizes_known && scales_absent))) {
    ctx.set_output(0, dt, x ? std::optional<Shape>(Shape(x->size(), -1)) : std::nullopt);
    return;
  }
  bool any_unknown = false;
  for (auto d : *x) any_unknown = any_unknown || d < 0;
  if (any_unknown && !sizes_known) {
    ctx.set_output(0, dt, Shape(x->size(), -1));
    return;
  }
  Shape out;
  std::vector<double> scale;
  output_geometry(ctx.node(), *x, scales_known ? r.scales : nullptr, r.sizes, out, scale);
  ctx.set_output(0, dt, out);
}

// Nearest resizing with every output inside the input is a gather: each output row (all axes but
// the last fixed) reads one input row through the last axis' index table, in one pass straight into
// y (the separable path below makes a pass and a buffer per resized axis).
template <typename T>
void nearest_gather(const T* x, T* y, const Shape& in, const Shape& out, const std::vector<AxisTaps>& taps) {
  const size_t rank = in.size();
  std::vector<std::vector<int64_t>> source(rank);  // output index -> input index, per axis
  for (size_t i = 0; i < rank; ++i) {
    source[i].resize(size_t(out[i]));
    for (int64_t o = 0; o < out[i]; ++o) source[i][size_t(o)] = taps[i].identity ? o : taps[i].index[size_t(o)];
  }
  std::vector<int64_t> in_stride(rank, 1);
  for (size_t i = rank - 1; i-- > 0;) in_stride[i] = in_stride[i + 1] * in[i + 1];
  const int64_t row = out[rank - 1], rows = numel(out) / row;
  const int64_t* last = source[rank - 1].data();
  parallel_for(rows, std::max<int64_t>(1, 16384 / row), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t offset = 0;
      for (int64_t i = int64_t(rank) - 2, rest = r; i >= 0; --i) {
        offset += source[size_t(i)][size_t(rest % out[size_t(i)])] * in_stride[size_t(i)];
        rest /= out[size_t(i)];
      }
      const T* src = x + offset;
      T* dst = y + r * row;
      for (int64_t w = 0; w < row; ++w) dst[w] = src[last[w]];
    }
  });
}

class ResizeKernel final : public Kernel {
 public:
  explicit ResizeKernel(const Node&) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    ResizeAttrs a = read_attrs(node, ctx.opset());
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) ins.push_back(ctx.has_input(i) ? &ctx.input(i) : nullptr);
    ResizeInputs r = resize_inputs(ctx.opset(), ins);
    Shape in = x.shape(), out;
    std::vector<double> scale;
    output_geometry(node, in, r.scales, r.sizes, out, scale);
    size_t rank = in.size();
    std::vector<double> roi(2 * rank, 0.0);
    for (size_t i = 0; i < rank; ++i) roi[rank + i] = 1.0;
    if (a.coord == "tf_crop_and_resize") {
      OT_CHECK(r.roi && size_t(r.roi->numel()) == 2 * rank, node.context(), "tf_crop_and_resize needs roi with ",
               2 * rank, " values");
      roi = float_list(*r.roi);
    }
    Tensor& y = ctx.output(0, x.dtype(), out);
    if (y.numel() == 0) return;
    OT_CHECK(x.numel() > 0, node.context(), "cannot resize an empty input ", shape_str(in), " to ", shape_str(out));
    std::vector<AxisTaps> taps;
    for (size_t i = 0; i < rank; ++i) taps.push_back(axis_taps(a, in[i], out[i], scale[i], roi[i], roi[rank + i]));
    dispatch_numeric(x.dtype(), [&]<typename T>() {
      using C0 = compute_t<T>;
      using A = std::conditional_t<std::is_floating_point_v<C0>, C0, double>;
      // Pass over each resized axis; the last pass writes y directly.
      std::vector<size_t> todo;
      for (size_t i = 0; i < rank; ++i)
        if (!taps[i].identity) todo.push_back(i);
      const T* px = x.data<T>();
      T* py = y.data<T>();
      if (todo.empty()) {
        std::copy(px, px + x.numel(), py);
        return;
      }
      bool extrapolates = std::any_of(taps.begin(), taps.end(), [](const AxisTaps& t) {
        return std::find(t.outside.begin(), t.outside.end(), char(1)) != t.outside.end();
      });
      if (a.mode == "nearest" && !extrapolates) return nearest_gather(px, py, in, out, taps);
      std::vector<A> cur(static_cast<size_t>(x.numel())), next;
      if constexpr (!std::is_floating_point_v<C0>) {
        for (int64_t i = 0; i < x.numel(); ++i) cur[size_t(i)] = A(C0(px[i]));
      } else {
        for (int64_t i = 0; i < x.numel(); ++i) cur[size_t(i)] = A(px[i]);
      }
      Shape shape = in;
      for (size_t axis : todo) {
        const AxisTaps& t = taps[axis];
        int64_t outer = 1, inner = 1;
        for (size_t i = 0; i < axis; ++i) outer *= shape[i];
        for (size_t i = axis + 1; i < rank; ++i) inner *= shape[i];
        int64_t n_in = shape[axis], n_out = out[axis];
        next.assign(size_t(outer * n_out * inner), A(0));
        A extrap = A(a.extrapolation);
        parallel_for(outer * n_out, std::max<int64_t>(1, 8192 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
          for (int64_t r2 = b; r2 < e; ++r2) {
            int64_t ob = r2 / n_out, o = r2 % n_out;
            A* dst = next.data() + r2 * inner;
            if (t.outside[size_t(o)]) {
              std::fill(dst, dst + inner, extrap);
              continue;
            }
            for (int j = 0; j < t.width; ++j) {
              A w = A(t.weight[size_t(o * t.width + j)]);
              if (w == A(0)) continue;
              const A* src = cur.data() + (ob * n_in + t.index[size_t(o * t.width + j)]) * inner;
              for (int64_t i = 0; i < inner; ++i) dst[i] += w * src[i];
            }
          }
        });
        cur.swap(next);
        shape[axis] = n_out;
      }
      for (int64_t i = 0; i < y.numel(); ++i) {
        if constexpr (std::is_floating_point_v<C0>) py[i] = T(cur[size_t(i)]);
        else py[i] = T(std::nearbyint(cur[size_t(i)]));
      }
    });
  }
};

// onnxtrain.ResizeGrad(dY, X, roi, scales, sizes) with the forward Resize's attributes (inputs in
// the opset-11 order; the rule spells out opset 10's fixed modes): dX = the transpose of the
// separable interpolation. The per-axis passes run in reverse order, each scattering
// dY * weight back to its taps; outputs outside a crop (extrapolation_value) take no gradient.
// Every mode (nearest, linear, cubic, any coordinate mode, exclude_outside) uses the forward's taps.
void resize_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  ResizeAttrs a = read_attrs(node, 11);
  auto opt = [&](size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; };
  const Tensor* roi_t = opt(2);
  Shape in = x.shape(), out;
  std::vector<double> scale;
  output_geometry(node, in, opt(3), opt(4), out, scale);
  OT_CHECK(dy.shape() == out && dy.dtype() == x.dtype(), node.context(), "dY must be ", shape_str(out),
           " of X's dtype, got ", shape_str(dy.shape()));
  size_t rank = in.size();
  std::vector<double> roi(2 * rank, 0.0);
  for (size_t i = 0; i < rank; ++i) roi[rank + i] = 1.0;
  if (a.coord == "tf_crop_and_resize") {
    OT_CHECK(roi_t && size_t(roi_t->numel()) == 2 * rank, node.context(), "tf_crop_and_resize needs roi with ",
             2 * rank, " values");
    roi = float_list(*roi_t);
  }
  Tensor& dx = ctx.output(0, x.dtype(), in);
  if (dx.numel() == 0) return;
  std::vector<size_t> todo;
  std::vector<AxisTaps> taps;
  for (size_t i = 0; i < rank; ++i) {
    taps.push_back(axis_taps(a, in[i], out[i], scale[i], roi[i], roi[rank + i]));
    if (!taps.back().identity) todo.push_back(i);
  }
  dispatch_float(x.dtype(), [&]<typename T>() {
    using A = compute_t<T>;
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    std::vector<A> cur(size_t(dy.numel())), prev;
    for (int64_t i = 0; i < dy.numel(); ++i) cur[size_t(i)] = A(pdy[i]);
    Shape shape = out;
    for (size_t k = todo.size(); k-- > 0;) {
      size_t axis = todo[k];
      const AxisTaps& t = taps[axis];
      int64_t outer = 1, inner = 1;
      for (size_t i = 0; i < axis; ++i) outer *= shape[i];
      for (size_t i = axis + 1; i < rank; ++i) inner *= shape[i];
      int64_t n_in = in[axis], n_out = out[axis];
      prev.assign(size_t(outer * n_in * inner), A(0));
      // Parallel over the outer index: each owns its slice of prev.
      parallel_for(outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(n_out * inner, 1)), [&](int64_t b, int64_t e) {
        for (int64_t ob = b; ob < e; ++ob) {
          for (int64_t o = 0; o < n_out; ++o) {
            if (t.outside[size_t(o)]) continue;
            const A* src = cur.data() + (ob * n_out + o) * inner;
            for (int j = 0; j < t.width; ++j) {
              A w = A(t.weight[size_t(o * t.width + j)]);
              if (w == A(0)) continue;
              A* dst = prev.data() + (ob * n_in + t.index[size_t(o * t.width + j)]) * inner;
              for (int64_t i = 0; i < inner; ++i) dst[i] += w * src[i];
            }
          }
        }
      });
      cur.swap(prev);
      shape[axis] = n_in;
    }
    for (int64_t i = 0; i < dx.numel(); ++i) pdx[i] = T(cur[size_t(i)]);
  });
}

void resize_gradient(GradientBuilder& g) {
  GraphBuilder::Attrs attrs = g.node().attributes;
  std::vector<std::string> ins{g.dy(0), g.x(0), "", "", ""};
  if (g.opset() < 11) {  // opset 10: (X, scales), asymmetric coordinates, floor rounding
    attrs["coordinate_transformation_mode"] = Attribute::of(std::string("asymmetric"));
    attrs["nearest_mode"] = Attribute::of(std::string("floor"));
    if (g.has_input(1)) ins[3] = g.x(1);
  } else {
    for (size_t i = 1; i <= 3; ++i)
      if (g.has_input(i)) ins[i + 1] = g.x(i);
  }
  while (ins.back().empty()) ins.pop_back();
  if (g.needs(0)) g.set(0, g.emit("ResizeGrad", ins, attrs, kOnnxTrainDomain));
  // roi and scales only select sample positions: no gradient flows to them.
  for (size_t i = 1; i < g.num_inputs(); ++i)
    if (g.needs(i)) g.set(i, g.zeros_like(g.x(i)));
}

}  // namespace

// Y = interpolate(X).  dX = the transposed interpolation of dY (each output scatters dY * weight to
// its taps); roi, scales and sizes get no gradient
ONNXTRAIN_OP(Resize, kOnnxDomain, 10).inputs(1, 4).outputs(1).shape(resize_shape).cpu_kernel<ResizeKernel>()
    .work(memory_bound_work)
    .gradient(resize_gradient);
// dX = ResizeGrad(dY, X, ...) is linear in dY: second derivatives are not needed.
ONNXTRAIN_OP(ResizeGrad, kOnnxTrainDomain, 1).inputs(2, 5).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).cpu(resize_grad_kernel).gradient_not_implemented("second derivatives of Resize are not needed");

}  // namespace onnxtrain

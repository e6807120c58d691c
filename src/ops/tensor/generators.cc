// Ops that make tensors: Constant, ConstantOfShape, EyeLike, Range, OneHot.
#include <algorithm>
#include <cmath>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

// ---- Constant ----

Tensor constant_value(const Node& node) {
  if (const Attribute* a = node.attr("value")) {
    OT_CHECK(a->kind == Attribute::Kind::kTensor, node.context(), "attribute 'value' should be a tensor");
    return a->t;
  }
  if (node.has_attr("value_float")) return Tensor::scalar<float>(node.attr_float("value_float", 0));
  if (node.has_attr("value_floats")) {
    auto v = node.attr_floats("value_floats");
    return Tensor::from_vector<float>(v, {int64_t(v.size())});
  }
  if (node.has_attr("value_int")) return Tensor::scalar<int64_t>(node.attr_int("value_int", 0));
  if (node.has_attr("value_ints")) {
    auto v = node.attr_ints("value_ints");
    return Tensor::from_vector<int64_t>(v, {int64_t(v.size())});
  }
  if (node.has_attr("value_string") || node.has_attr("value_strings"))
    OT_THROW(kNotImplemented, node.context(), "string constants are not supported");
  if (node.has_attr("sparse_value"))
    OT_THROW(kNotImplemented, node.context(), "sparse constants are not supported");
  OT_THROW(kInvalidModel, node.context(), "no value attribute (value, value_float(s), value_int(s))");
}

class ConstantKernel final : public Kernel {
 public:
  explicit ConstantKernel(const Node&) {}
  void compute(KernelContext& ctx) override {
    if (!value_.defined()) value_ = constant_value(ctx.node());
    ctx.set_output(0, value_);
  }

 private:
  Tensor value_;
};

void constant_rule(ShapeContext& ctx) {
  Tensor t = constant_value(ctx.node());
  ctx.set_output(0, t.dtype(), t.shape());
}

// ---- ConstantOfShape ----

Tensor fill_value(const Node& node) {
  const Tensor* v = node.attr_tensor("value");
  if (!v) return Tensor::scalar<float>(0.f);
  OT_CHECK(v->numel() == 1, node.context(), "attribute 'value' should hold one element, got shape ",
           shape_str(v->shape()));
  return *v;
}

void fill_bytes(Tensor& out, const Tensor& value) {
  dispatch_by_size(value.dtype(), [&]<typename T>() {
    T v;
    std::memcpy(&v, value.data(), sizeof(T));
    T* p = static_cast<T*>(out.data());
    parallel_for(out.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
  });
}

void constant_of_shape_kernel(KernelContext& ctx) {
  Shape shape = int_list_input(ctx, 0);
  for (int64_t d : shape) OT_CHECK(d >= 0, ctx.node().context(), "shape entries must be >= 0, got ", shape_str(shape));
  Tensor value = fill_value(ctx.node());
  Tensor& out = ctx.output(0, value.dtype(), shape);
  fill_bytes(out, value);
}

void constant_of_shape_rule(ShapeContext& ctx) {
  DType dt = fill_value(ctx.node()).dtype();
  if (const Tensor* s = ctx.input_value(0)) return ctx.set_output(0, dt, s->to_int_vector());
  const auto& ss = ctx.input_shape(0);
  if (ss && ss->size() == 1 && (*ss)[0] >= 0) return ctx.set_output(0, dt, Shape(size_t((*ss)[0]), -1));
  ctx.set_output(0, dt);
}

// ---- EyeLike ----

DType eyelike_dtype(const Node& node, DType in) {
  return node.has_attr("dtype") ? DType(node.attr_int("dtype", 1)) : in;
}

void eyelike_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() == 2, ctx.node().context(), "input should be 2-D, got shape ", shape_str(x.shape()));
  DType dt = eyelike_dtype(ctx.node(), x.dtype());
  Tensor& out = ctx.output(0, dt, x.shape());
  int64_t rows = x.dim(0), cols = x.dim(1), k = ctx.node().attr_int("k", 0);
  std::memset(out.data(), 0, out.nbytes());
  dispatch_all(dt, [&]<typename T>() {
    T* p = out.data<T>();
    T one = cast_value<T>(1);
    for (int64_t i = std::max<int64_t>(0, -k); i < rows; ++i) {
      int64_t j = i + k;
      if (j >= cols) break;
      p[i * cols + j] = one;
    }
  });
}

// ---- Range ----

void range_kernel(KernelContext& ctx) {
  const Tensor& s = ctx.input(0);
  const Tensor& l = ctx.input(1);
  const Tensor& d = ctx.input(2);
  OT_CHECK(s.dtype() == l.dtype() && s.dtype() == d.dtype(), ctx.node().context(),
           "start, limit and delta should share a dtype, got ", dtype_name(s.dtype()), ", ", dtype_name(l.dtype()),
           ", ", dtype_name(d.dtype()));
  OT_CHECK(s.numel() == 1 && l.numel() == 1 && d.numel() == 1, ctx.node().context(),
           "start, limit and delta should be scalars");
  dispatch_numeric(s.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    C start = C(s.data<T>()[0]), limit = C(l.data<T>()[0]), delta = C(d.data<T>()[0]);
    OT_CHECK(delta != C(0), ctx.node().context(), "delta must not be 0");
    double n = std::ceil((double(limit) - double(start)) / double(delta));
    int64_t count = n > 0 ? int64_t(n) : 0;
    Tensor& out = ctx.output(0, s.dtype(), {count});
    T* p = out.data<T>();
    for (int64_t i = 0; i < count; ++i) p[i] = T(C(start + C(i) * delta));
  });
}

void range_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const Tensor *s = ctx.input_value(0), *l = ctx.input_value(1), *d = ctx.input_value(2);
  if (s && l && d && s->numel() == 1 && l->numel() == 1 && d->numel() == 1 && d->item_as_double() != 0) {
    double n = std::ceil((l->item_as_double() - s->item_as_double()) / d->item_as_double());
    return ctx.set_output(0, dt, Shape{n > 0 ? int64_t(n) : 0});
  }
  ctx.set_output(0, dt, Shape{-1});
}

// ---- OneHot ----

int64_t onehot_axis(const Node& node, int64_t in_rank) {
  int64_t axis = node.attr_int("axis", -1);
  int64_t a = axis < 0 ? axis + in_rank + 1 : axis;
  OT_CHECK(a >= 0 && a <= in_rank, node.context(), "axis ", axis, " is out of range for output rank ", in_rank + 1);
  return a;
}

void onehot_kernel(KernelContext& ctx) {
  const Tensor& idx = ctx.input(0);
  const Tensor& dep = ctx.input(1);
  const Tensor& values = ctx.input(2);
  OT_CHECK(dep.numel() == 1, ctx.node().context(), "depth should be a scalar, got shape ", shape_str(dep.shape()));
  OT_CHECK(values.numel() == 2, ctx.node().context(), "values should hold [off, on], got shape ",
           shape_str(values.shape()));
  int64_t depth = int64_t(dep.item_as_double());
  OT_CHECK(depth > 0, ctx.node().context(), "depth should be positive, got ", depth);
  int64_t axis = onehot_axis(ctx.node(), idx.rank());
  Shape out_shape = idx.shape();
  out_shape.insert(out_shape.begin() + axis, depth);
  Tensor& out = ctx.output(0, values.dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < idx.rank(); ++d) (d < axis ? outer : inner) *= idx.dim(int(d));
  dispatch_by_size(values.dtype(), [&]<typename T>() {
    const T* v = static_cast<const T*>(values.data());
    T off = v[0], on = v[1];
    T* p = static_cast<T*>(out.data());
    std::fill(p, p + out.numel(), off);
    dispatch_numeric(idx.dtype(), [&]<typename I>() {
      const I* ip = idx.data<I>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          int64_t k = int64_t(compute_t<I>(ip[o * inner + i]));
          if (k < 0) k += depth;
          if (k < 0 || k >= depth) continue;  // out of range: all off, as the spec says
          p[(o * depth + k) * inner + i] = on;
        }
    });
  });
}

void onehot_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(2);
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, dt);
  int64_t axis = onehot_axis(ctx.node(), int64_t(in->size()));
  Shape out = *in;
  const Tensor* dep = ctx.input_value(1);
  out.insert(out.begin() + axis, dep && dep->numel() == 1 ? int64_t(dep->item_as_double()) : -1);
  ctx.set_output(0, dt, out);
}

}  // namespace

ONNXTRAIN_OP(Constant, kOnnxDomain, 1).inputs(0).outputs(1).shape(constant_rule).not_differentiable()
    .cpu_kernel<ConstantKernel>();
ONNXTRAIN_OP(ConstantOfShape, kOnnxDomain, 9).inputs(1).outputs(1).shape(constant_of_shape_rule)
    .not_differentiable().cpu(constant_of_shape_kernel);
ONNXTRAIN_OP(EyeLike, kOnnxDomain, 9).inputs(1).outputs(1)
    .shape([](ShapeContext& ctx) {
      ctx.set_output(0, eyelike_dtype(ctx.node(), ctx.input_dtype(0)), ctx.input_shape(0));
    })
    .not_differentiable().cpu(eyelike_kernel);
// y_i = start + i * delta (the count is piecewise constant).  dstart = sum(dy),
// ddelta = sum(dy * (y - start) / delta), dlimit = 0
ONNXTRAIN_OP(Range, kOnnxDomain, 11).inputs(3).outputs(1).shape(range_rule).cpu(range_kernel)
    .gradient([](GradientBuilder& g) {
      GraphBuilder::Attrs all{{"keepdims", Attribute::of(int64_t(0))}};
      if (g.needs(0)) g.set(0, reshape_like(g, g.emit("ReduceSum", {g.dy(0)}, all), g.x(0)));
      if (g.needs(1)) g.set(1, g.zeros_like(g.x(1)));
      if (g.needs(2)) {
        std::string steps = g.div(g.sub(g.y(0), g.x(0)), g.x(2));
        g.set(2, reshape_like(g, g.emit("ReduceSum", {g.mul(g.dy(0), steps)}, all), g.x(2)));
      }
    });
// y = off + (on - off) * onehot(idx).  d_on = sum(dy * onehot(idx)), d_off = sum(dy) - d_on
ONNXTRAIN_OP(OneHot, kOnnxDomain, 9).inputs(3).outputs(1).shape(onehot_rule).cpu(onehot_kernel)
    .gradient([](GradientBuilder& g) {
      GraphBuilder::Attrs all{{"keepdims", Attribute::of(int64_t(0))}};
      std::string v = g.x(2), one = g.ints({1});
      std::string off_on = g.emit("Concat", {g.reshape(g.scalar_like(0.0, v), one), g.reshape(g.scalar_like(1.0, v), one)},
                                  {{"axis", Attribute::of(int64_t(0))}});
      std::string hot = g.emit("OneHot", {g.x(0), g.x(1), off_on}, g.node().attributes);
      std::string d_on = g.emit("ReduceSum", {g.mul(g.dy(0), hot)}, all);
      std::string d_off = g.sub(g.emit("ReduceSum", {g.dy(0)}, all), d_on);
      g.set(2, g.emit("Concat", {g.reshape(d_off, one), g.reshape(d_on, one)}, {{"axis", Attribute::of(int64_t(0))}}));
    });

}  // namespace onnxtrain

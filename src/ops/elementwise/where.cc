// Where: out = cond ? x : y with three-way numpy broadcasting. Only moves data, so it dispatches by
// element size.
#include "ops/elementwise/elementwise.h"

namespace onnxtrain {

namespace grad = elementwise::grad;
namespace {

void where_kernel(KernelContext& ctx) {
  const Tensor& c = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  OT_CHECK(c.dtype() == DType::kBool, ctx.node().context(), "condition must be bool, got ", dtype_name(c.dtype()));
  OT_CHECK(x.dtype() == y.dtype(), ctx.node().context(), "X and Y must share a dtype, got ",
           dtype_name(x.dtype()), " and ", dtype_name(y.dtype()));
  Shape shape = broadcast_shapes(ctx.node(), broadcast_shapes(ctx.node(), c.shape(), x.shape()), y.shape());
  Tensor& out = ctx.output(0, x.dtype(), shape);
  if (out.numel() == 0) return;
  dispatch_by_size(x.dtype(), [&]<typename T>() {
    const bool* pc = c.data<bool>();
    const T* px = static_cast<const T*>(x.data());
    const T* py = static_cast<const T*>(y.data());
    T* po = static_cast<T*>(out.data());
    // The fast paths below vectorise: the condition is read as bytes (GCC does not vectorise the
    // bool loads) and both sides are loaded unconditionally (a select, not a masked load). The
    // output may be an input's buffer (in place): each i reads before it writes, so simd holds.
    const uint8_t* cb = reinterpret_cast<const uint8_t*>(pc);
    if (c.shape() == shape && x.shape() == shape && y.shape() == shape) {
      parallel_for(out.numel(), kElementwiseGrain, [=](int64_t b, int64_t e) {  // by value: plain loads
#pragma omp simd
        for (int64_t i = b; i < e; ++i) {
          const T a = px[i], z = py[i];
          po[i] = cb[i] ? a : z;
        }
      });
      return;
    }
    // One side a scalar: Relu's gradient, where(x > 0, dy, 0).
    if (c.shape() == shape && (x.shape() == shape || y.shape() == shape) && (x.numel() == 1 || y.numel() == 1)) {
      const bool scalar_y = y.numel() == 1;
      const T* full = scalar_y ? px : py;
      const T fill = scalar_y ? py[0] : px[0];
      parallel_for(out.numel(), kElementwiseGrain, [=](int64_t b, int64_t e) {
        if (scalar_y) {
#pragma omp simd
          for (int64_t i = b; i < e; ++i) {
            const T v = full[i];
            po[i] = cb[i] ? v : fill;
          }
        } else {
#pragma omp simd
          for (int64_t i = b; i < e; ++i) {
            const T v = full[i];
            po[i] = cb[i] ? fill : v;
          }
        }
      });
      return;
    }
    auto plan = make_broadcast_plan<3>(shape, {&c.shape(), &x.shape(), &y.shape()});
    int64_t sc = plan.inner_stride[0], sx = plan.inner_stride[1], sy = plan.inner_stride[2];
    for_each_broadcast_run(plan, [&](int64_t o, const std::array<int64_t, 3>& off, int64_t n) {
      const bool* cc = pc + off[0];
      const T* xx = px + off[1];
      const T* yy = py + off[2];
      T* z = po + o;
      if (sc == 0) {  // one condition for the whole run: a copy or a fill
        const T* src = cc[0] ? xx : yy;
        if (cc[0] ? sx : sy) { if (src != z) std::copy(src, src + n, z); }  // z may alias x or y
        else std::fill(z, z + n, src[0]);
        return;
      }
      for (int64_t i = 0; i < n; ++i) z[i] = cc[i] ? xx[i * sx] : yy[i * sy];
    });
  });
}

void where_shape(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1),
                 broadcast_static(broadcast_static(ctx.input_shape(0), ctx.input_shape(1)), ctx.input_shape(2)));
}

}  // namespace

// z = c ? x : y.  dx = sum_to(where(c, dz, 0), x), dy = sum_to(where(c, 0, dz), y); c gets none
ONNXTRAIN_OP(Where, kOnnxDomain, 9).inputs(3).outputs(1).shape(where_shape).inplace(0, 1).inplace(0, 2)
    .work(memory_bound_work)
    .cpu(where_kernel).gradient([](GradientBuilder& g) {
      // The condition is bool, so it never needs a gradient.
      if (g.needs(1)) g.set(1, g.sum_to(grad::where_or_zero(g, g.x(0), g.dy(0), g.x(1)), g.x(1)));
      if (g.needs(2))
        g.set(2, g.sum_to(g.emit("Where", {g.x(0), grad::c(g, 0.0, g.x(2)), g.dy(0)}), g.x(2)));
    });

}  // namespace onnxtrain

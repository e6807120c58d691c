// LayerNormalization (opset 17): normalises over the dims [axis, rank) of X, then applies Scale and
// the optional bias B, both broadcast to those dims. Optional outputs Mean and InvStdDev have shape
// X.shape[:axis] + [1] * (rank - axis) and the dtype named by stash_type. The statistics are
// computed in float (double for double inputs): per row one thread makes three vectorised sweeps
// over data in cache (mean, variance about the mean, output); rows are spread with parallel_for.
#include <algorithm>
#include <cmath>

#include "ops/gradient_builder.h"
#include "ops/nn/norm_common.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
namespace {

DType stash_dtype(const Node& node) {
  int64_t s = node.attr_int("stash_type", 1);
  OT_CHECK(s == 1 || s == 11 || s == 16, node.context(),
           "stash_type must be float (1), double (11) or bfloat16 (16), got ", s);
  return DType(int32_t(s));
}

Shape stat_shape(const Shape& x, int64_t axis) {
  Shape s(x.begin(), x.begin() + axis);
  s.resize(x.size(), 1);
  return s;
}

void shape_layer_norm(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  ctx.set_output(0, ctx.input_dtype(0), in);
  DType u = stash_dtype(ctx.node());
  if (!in) {
    ctx.set_output(1, u);
    ctx.set_output(2, u);
    return;
  }
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", -1), int64_t(in->size()));
  ctx.set_output(1, u, stat_shape(*in, axis));
  ctx.set_output(2, u, stat_shape(*in, axis));
}

void layer_norm_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() > 0, node.context(), "expected X of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  float eps = node.attr_float("epsilon", 1e-5f);
  DType u = stash_dtype(node);
  Shape norm_shape(x.shape().begin() + axis, x.shape().end());
  int64_t d = numel(norm_shape), rows = numel(Shape(x.shape().begin(), x.shape().begin() + axis));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  Tensor* mean_out = ctx.output_requested(1) ? &ctx.output(1, u, stat_shape(x.shape(), axis)) : nullptr;
  Tensor* inv_out = ctx.output_requested(2) ? &ctx.output(2, u, stat_shape(x.shape(), axis)) : nullptr;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    OT_CHECK(ctx.input(1).dtype() == x.dtype(), node.context(), "Scale must have X's dtype ",
             dtype_name(x.dtype()), ", got ", dtype_name(ctx.input(1).dtype()));
    std::vector<C> scale = broadcast_param<C>(node, ctx.input(1), norm_shape, "Scale");
    std::vector<C> bias = ctx.has_input(2) ? broadcast_param<C>(node, ctx.input(2), norm_shape, "B")
                                           : std::vector<C>(static_cast<size_t>(d), C(0));
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const C* ps = scale.data();
    const C* pb = bias.data();
    const C inv_d = C(1) / C(std::max<int64_t>(d, 1));
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (4 * std::max<int64_t>(d, 1)));
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * d;
        T* yr = py + r * d;
        C sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < d; ++i) sum += C(xr[i]);
        const C mean = sum * inv_d;
        C sq = 0;
#pragma omp simd reduction(+ : sq)
        for (int64_t i = 0; i < d; ++i) {
          C c = C(xr[i]) - mean;
          sq += c * c;
        }
        const C inv = C(1) / std::sqrt(sq * inv_d + C(eps));
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) yr[i] = T((C(xr[i]) - mean) * inv * ps[i] + pb[i]);
        if (mean_out || inv_out) {
          dispatch_float(u, [&]<typename U>() {
            if (mean_out) mean_out->data<U>()[r] = cast_value<U>(mean);
            if (inv_out) inv_out->data<U>()[r] = cast_value<U>(inv);
          });
        }
      }
    });
  });
}

// One row of LayerNormalizationGrad (pointers by value so every loop vectorises with plain loads).
// Statistics: given (saved) or recomputed; sweeps: [sum(x)], then sum((x - mu)^2), sum(g) and
// sum(g (x - mu)) together, then dX (and the dScale/dBias partials when ds is given).
template <typename T, typename C>
inline void layer_norm_grad_row(const T* xr, const T* dr, T* out, const C* ps, int64_t d, C inv_d, C eps, C mean,
                                C inv, bool saved, C* ds, C* db) {
  if (!saved) {
    C sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < d; ++i) sum += C(xr[i]);
    mean = sum * inv_d;
  }
  C sq = 0, sg = 0, sgc = 0;
#pragma omp simd reduction(+ : sq, sg, sgc)
  for (int64_t i = 0; i < d; ++i) {
    C c = C(xr[i]) - mean;
    C gi = C(dr[i]) * ps[i];
    sq += c * c;
    sg += gi;
    sgc += gi * c;
  }
  if (!saved) inv = C(1) / std::sqrt(sq * inv_d + eps);
  const C mg = sg * inv_d, mgx = sgc * inv * inv_d;
  if (ds) {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) {
      C g = C(dr[i]);
      C xh = (C(xr[i]) - mean) * inv;
      ds[i] += g * xh;
      db[i] += g;
      out[i] = T(inv * (g * ps[i] - mg - xh * mgx));
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) {
      C xh = (C(xr[i]) - mean) * inv;
      out[i] = T(inv * (C(dr[i]) * ps[i] - mg - xh * mgx));
    }
  }
}

// onnxtrain.LayerNormalizationGrad(dY, X, Scale, Mean?, InvStdDev?) -> dX, dScale, dBias, with the
// forward's axis and epsilon. dScale and dBias have the shape X.shape[axis:] (the rule sums them
// down to Scale's and B's shapes when those broadcast). Mean and InvStdDev are the forward's saved
// statistics; they are used when given and at least as precise as the compute type, else each row
// recomputes them (the same sweeps as the forward). Per row: one sweep for sum(g), sum(g * xh), one
// writing dX; dScale and dBias accumulate per thread over its rows and are folded at the end.
// The grad op's dY and X checked against each other; X viewed as rows of the normalised dims.
struct NormRows {
  Shape norm_shape;
  int64_t d = 0, rows = 0;
};
NormRows layer_norm_grad_rows(const KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(x.rank() > 0, node.context(), "expected X of rank >= 1, got a scalar");
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), node.context(), "dY and X must match, got ",
           dtype_name(dy.dtype()), " ", shape_str(dy.shape()), " and ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  const int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  NormRows r;
  r.norm_shape.assign(x.shape().begin() + axis, x.shape().end());
  r.d = numel(r.norm_shape);
  r.rows = numel(Shape(x.shape().begin(), x.shape().begin() + axis));
  return r;
}

void layer_norm_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const NormRows shape_rows = layer_norm_grad_rows(ctx);  // named: clang 14 cannot capture structured bindings
  const Shape& norm_shape = shape_rows.norm_shape;
  const int64_t d = shape_rows.d, rows = shape_rows.rows;
  float eps = node.attr_float("epsilon", 1e-5f);
  const bool saved = ctx.has_input(3) && ctx.has_input(4);
  if (saved)
    for (size_t k = 3; k <= 4; ++k)
      OT_CHECK(ctx.input(k).numel() == rows && is_floating(ctx.input(k).dtype()), node.context(),
               k == 3 ? "Mean" : "InvStdDev", " must hold ", rows, " floating-point values, got ",
               dtype_name(ctx.input(k).dtype()), " ", shape_str(ctx.input(k).shape()));
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  const bool want_ds = ctx.output_requested(1), want_db = ctx.output_requested(2);
  Tensor* ds_out = want_ds ? &ctx.output(1, x.dtype(), norm_shape) : nullptr;
  Tensor* db_out = want_db ? &ctx.output(2, x.dtype(), norm_shape) : nullptr;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::vector<C> scale = broadcast_param<C>(node, ctx.input(2), norm_shape, "Scale");
    // Saved statistics, converted once to C (when precise enough).
    std::vector<C> mean_saved, inv_saved;
    if (saved && dtype_size(ctx.input(3).dtype()) >= sizeof(C) && dtype_size(ctx.input(4).dtype()) >= sizeof(C)) {
      mean_saved.resize(size_t(rows));
      inv_saved.resize(size_t(rows));
      for (size_t k = 3; k <= 4; ++k) {
        std::vector<C>& dst = k == 3 ? mean_saved : inv_saved;
        dispatch_float(ctx.input(k).dtype(), [&]<typename U>() {
          const U* p = ctx.input(k).data<U>();
          for (int64_t r = 0; r < rows; ++r) dst[size_t(r)] = C(compute_t<U>(p[r]));
        });
      }
    }
    const bool use_saved = !mean_saved.empty();
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    T* pdx = dx.data<T>();
    const C* ps = scale.data();
    const C inv_d = C(1) / C(std::max<int64_t>(d, 1));
    const bool params = want_ds || want_db;
    // Row blocks: one per thread (each with its own dScale/dBias partials) when parameters are wanted.
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (4 * std::max<int64_t>(d, 1)));
    int64_t blocks = params ? std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), (rows + grain - 1) / grain))
                            : std::max<int64_t>(1, (rows + grain - 1) / grain);
    if (rows == 0) blocks = 0;
    std::vector<C> partial(params ? size_t(2 * blocks * d) : 0, C(0));
    parallel_for(blocks, 1, [&](int64_t bb, int64_t be) {
      for (int64_t blk = bb; blk < be; ++blk) {
        C* pds = params ? partial.data() + 2 * blk * d : nullptr;
        C* pdb = params ? pds + d : nullptr;
        for (int64_t r = rows * blk / blocks; r < rows * (blk + 1) / blocks; ++r) {
          layer_norm_grad_row<T, C>(px + r * d, pdy + r * d, pdx + r * d, ps, d, inv_d, C(eps),
                                    use_saved ? mean_saved[size_t(r)] : C(0), use_saved ? inv_saved[size_t(r)] : C(0),
                                    use_saved, pds, pdb);
        }
      }
    });
    if (!params) return;
    T* ds = ds_out ? ds_out->data<T>() : nullptr;
    T* db = db_out ? db_out->data<T>() : nullptr;
    parallel_for(d, kElementwiseGrain / std::max<int64_t>(blocks, 1) + 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        C a = 0, c = 0;
        for (int64_t blk = 0; blk < blocks; ++blk) {
          a += partial[size_t(2 * blk * d + i)];
          c += partial[size_t((2 * blk + 1) * d + i)];
        }
        if (ds) ds[i] = T(a);
        if (db) db[i] = T(c);
      }
    });
  });
}

#if ONNXTRAIN_CUDA
// Float32 statistics and Scale/B of the normalised dims' full size run on the device; other
// stash types and broadcast parameters on the host.
void layer_norm_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() > 0, node.context(), "expected X of rank >= 1, got a scalar");
  const int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  const int64_t d = numel(Shape(x.shape().begin() + axis, x.shape().end())), rows = x.numel() / std::max<int64_t>(d, 1);
  const Tensor& scale = ctx.input(1);
  const bool full = scale.numel() == d && (!ctx.has_input(2) || ctx.input(2).numel() == d);
  if (!is_floating(x.dtype()) || x.dtype() == DType::kFloat64 || stash_dtype(node) != DType::kFloat32 || !full || d == 0)
    return run_on_host(ctx, "dtype " + dtype_name(x.dtype()) + ", stash_type, or broadcast Scale/B");
  OT_CHECK(scale.dtype() == x.dtype() && (!ctx.has_input(2) || ctx.input(2).dtype() == x.dtype()), node.context(),
           "Scale and B must have X's dtype ", dtype_name(x.dtype()));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  float* mean = ctx.output_requested(1) ? ctx.output(1, DType::kFloat32, stat_shape(x.shape(), axis)).data<float>() : nullptr;
  float* inv = ctx.output_requested(2) ? ctx.output(2, DType::kFloat32, stat_shape(x.shape(), axis)).data<float>() : nullptr;
  cuda::layer_norm(x.dtype(), x.data(), scale.data(), ctx.has_input(2) ? ctx.input(2).data() : nullptr, y.data(), mean,
                   inv, rows, d, node.attr_float("epsilon", 1e-5f), ctx.stream());
}

void layer_norm_grad_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const auto [norm_shape, d, rows] = layer_norm_grad_rows(ctx);
  const Tensor& scale = ctx.input(2);
  if (!is_floating(x.dtype()) || x.dtype() == DType::kFloat64 || scale.numel() != d || scale.dtype() != x.dtype() || d == 0)
    return run_on_host(ctx, "dtype " + dtype_name(x.dtype()) + " or broadcast Scale");
  // Saved statistics in float32 are used as they are; others are recomputed.
  const bool saved = ctx.has_input(3) && ctx.has_input(4) && ctx.input(3).dtype() == DType::kFloat32 &&
                     ctx.input(4).dtype() == DType::kFloat32;
  if (saved)
    for (size_t k = 3; k <= 4; ++k)
      OT_CHECK(ctx.input(k).numel() == rows, node.context(), k == 3 ? "Mean" : "InvStdDev", " must hold ", rows,
               " values, got ", shape_str(ctx.input(k).shape()));
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  void* ds = ctx.output_requested(1) ? ctx.output(1, x.dtype(), norm_shape).data() : nullptr;
  void* db = ctx.output_requested(2) ? ctx.output(2, x.dtype(), norm_shape).data() : nullptr;
  cuda::layer_norm_grad(x.dtype(), dy.data(), x.data(), scale.data(), saved ? ctx.input(3).data<float>() : nullptr,
                        saved ? ctx.input(4).data<float>() : nullptr, dx.data(), ds, db, rows, d,
                        node.attr_float("epsilon", 1e-5f), ctx.stream());
}
#endif

void shape_layer_norm_grad(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(1);
  DType dt = ctx.input_dtype(1);
  ctx.set_output(0, dt, in);
  std::optional<Shape> p;
  if (in && !in->empty()) {
    int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", -1), int64_t(in->size()));
    p = Shape(in->begin() + axis, in->end());
  }
  for (size_t i = 1; i < ctx.num_outputs(); ++i) ctx.set_output(i, dt, p);
}

// y = (x - mu) * r * scale + b, r = 1/sqrt(var + eps), xh = (x - mu) * r, g = dy * scale.
// dx = r * (g - mean(g) - xh * mean(g * xh)), dscale = sum(dy * xh), db = sum(dy)  (over the rows)
void layer_norm_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  if (g.has_dy(1) || g.has_dy(2))
    OT_THROW(kNotImplemented, g.context(), "no gradient flows through the Mean/InvStdDev outputs");
  std::vector<std::string> ins{g.dy(0), g.x(0), g.x(1)};
  if (n.has_output(1) && n.has_output(2)) {  // reuse the saved statistics
    ins.push_back(g.y(1));
    ins.push_back(g.y(2));
  }
  GraphBuilder::Attrs attrs{{"axis", Attribute::of(n.attr_int("axis", -1))},
                            {"epsilon", Attribute::of(n.attr_float("epsilon", 1e-5f))}};
  size_t nout = g.needs(2) ? 3 : g.needs(1) ? 2 : 1;
  auto outs = g.emit_n("LayerNormalizationGrad", ins, nout, attrs, kOnnxTrainDomain);
  g.set(0, outs[0]);
  // dScale/dB come out in the normalised dims' shape; sum them down where the parameter broadcasts.
  auto fit = [&](const std::string& grad, size_t i) {
    auto xs = g.static_shape(g.x(0)), ps = g.static_shape(g.x(i));
    if (xs && ps && !xs->empty()) {
      int64_t axis = normalize_axis(n, n.attr_int("axis", -1), int64_t(xs->size()));
      Shape norm(xs->begin() + axis, xs->end());
      if (norm == *ps && std::all_of(norm.begin(), norm.end(), [](int64_t v) { return v >= 0; })) return grad;
    }
    return g.sum_to(grad, g.x(i));
  };
  if (g.needs(1)) g.set(1, fit(outs[1], 1));
  if (g.needs(2)) g.set(2, fit(outs[2], 2));
}

}  // namespace

ONNXTRAIN_OP(LayerNormalization, kOnnxDomain, 17).inputs(2, 3).outputs(1, 3).shape(shape_layer_norm)
    .inplace(0, 0).cpu(layer_norm_kernel).cuda(OT_CUDA(layer_norm_cuda)).gradient(layer_norm_gradient);
// (dX, dScale, dBias) = LayerNormalizationGrad(dY, X, Scale, Mean?, InvStdDev?); second derivatives are not needed.
ONNXTRAIN_OP(LayerNormalizationGrad, kOnnxTrainDomain, 1).inputs(3, 5).outputs(1, 3).shape(shape_layer_norm_grad)
    .inplace(0, 0).cpu(layer_norm_grad_kernel).cuda(OT_CUDA(layer_norm_grad_cuda)).gradient_not_implemented("second derivatives are not needed");
// ONNX Runtime's training artifacts: the same inputs, outputs and attributes (its stash_type is
// the float32 statistics this kernel computes in anyway).
ONNXTRAIN_OP(LayerNormalizationGrad, kMsDomain, 1).inputs(3, 5).outputs(1, 3).shape(shape_layer_norm_grad)
    .inplace(0, 0).cpu(layer_norm_grad_kernel).cuda(OT_CUDA(layer_norm_grad_cuda)).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain

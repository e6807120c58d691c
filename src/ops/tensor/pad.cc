// Pad: constant, reflect and edge modes; pads (and the value) as attributes before opset 11 and
// as inputs from 11 (the opset-18 axes input is read when present). Negative pads crop. Each
// output row copies its interior with one memcpy and fills or mirrors the borders.
//
// Its backward op onnxtrain.PadGrad (ONNX Runtime has no reflect/edge gradient) is the adjoint:
// every output position adds its gradient to the input position it was read from.
#include <algorithm>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

enum class PadMode { kConstant, kReflect, kEdge };

PadMode pad_mode(const Node& node) {
  std::string m = node.attr_string("mode", "constant");
  if (m == "constant") return PadMode::kConstant;
  if (m == "reflect") return PadMode::kReflect;
  if (m == "edge") return PadMode::kEdge;
  OT_THROW(kNotImplemented, node.context(), "pad mode '", m, "' is not supported (constant, reflect, edge)");
}

// Full begin/end pads per dim from the pads list (and optional axes).
std::vector<int64_t> full_pads(const Node& node, int64_t rank, const std::vector<int64_t>& pads,
                               const std::optional<std::vector<int64_t>>& axes) {
  std::vector<int64_t> ax;
  if (axes) ax = normalize_axes(node, *axes, rank);
  else for (int64_t d = 0; d < rank; ++d) ax.push_back(d);
  size_t n = ax.size();
  OT_CHECK(pads.size() == 2 * n, node.context(), "pads has ", pads.size(), " entries, expected ", 2 * n);
  std::vector<int64_t> full(size_t(2 * rank), 0);
  for (size_t i = 0; i < n; ++i) {
    full[size_t(ax[i])] = pads[i];
    full[size_t(ax[i] + rank)] = pads[i + n];
  }
  return full;
}

Shape padded_shape(const Node& node, const Shape& in, const std::vector<int64_t>& p) {
  int64_t rank = int64_t(in.size());
  Shape out(in.size());
  for (int64_t d = 0; d < rank; ++d) {
    if (in[size_t(d)] < 0) { out[size_t(d)] = -1; continue; }
    out[size_t(d)] = in[size_t(d)] + p[size_t(d)] + p[size_t(d + rank)];
    OT_CHECK(out[size_t(d)] >= 0, node.context(), "pads ", shape_str(p), " crop input ", shape_str(in),
             " below zero size");
  }
  return out;
}

// The source index of output position o (input coordinate s = o - begin) in a dim of size n, or
// -1 for the constant value.
inline int64_t source_index(int64_t s, int64_t n, PadMode mode) {
  if (s >= 0 && s < n) return s;
  if (mode == PadMode::kConstant) return -1;
  if (mode == PadMode::kEdge) return s < 0 ? 0 : n - 1;
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  s %= period;
  if (s < 0) s += period;
  return s < n ? s : period - s;
}

std::vector<int64_t> kernel_pads(KernelContext& ctx) {
  auto pads = attr_or_input_ints(ctx, "pads", 1);
  if (!pads && ctx.node().has_attr("paddings")) pads = ctx.node().attr_ints("paddings");  // opset 1
  OT_CHECK(pads.has_value(), ctx.node().context(), "pads are required");
  return *pads;
}

void pad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  int64_t rank = x.rank();
  PadMode mode = pad_mode(node);
  auto p = full_pads(node, rank, kernel_pads(ctx), attr_or_input_ints(ctx, nullptr, 3));
  Shape out_shape = padded_shape(node, x.shape(), p);
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  if (rank == 0) {
    copy_bytes(out.data(), x.data(), x.nbytes());
    return;
  }
  if (mode != PadMode::kConstant)
    for (int64_t d = 0; d < rank; ++d)
      OT_CHECK(x.dim(int(d)) > 0 || out_shape[size_t(d)] == 0, node.context(), "cannot ", node.attr_string("mode", ""),
               "-pad an empty dim of input ", shape_str(x.shape()));
  // The constant's bytes: the constant_value input (opset 11+) or the value attribute.
  uint64_t bits = 0;
  size_t es = dtype_size(x.dtype());
  if (ctx.has_input(2) && ctx.input(2).numel() > 0) {
    const Tensor& v = ctx.input(2);
    OT_CHECK(v.dtype() == x.dtype(), node.context(), "constant_value dtype ", dtype_name(v.dtype()),
             " differs from data ", dtype_name(x.dtype()));
    std::memcpy(&bits, v.data(), es);
  } else {
    float v = node.attr_float("value", 0.f);
    dispatch_all(x.dtype(), [&]<typename T>() {
      T t = cast_value<T>(v);
      std::memcpy(&bits, &t, sizeof(T));
    });
  }
  std::vector<int64_t> xs = strides_of(x.shape());
  const int64_t n = x.dim(-1), m = out_shape.back(), pb = p[size_t(rank - 1)];
  const int64_t rows = out.numel() / m;
  const int64_t mid0 = std::clamp<int64_t>(pb, 0, m), mid1 = std::clamp<int64_t>(pb + n, mid0, m);
  dispatch_by_size(x.dtype(), [&]<typename T>() {
    T value;
    std::memcpy(&value, &bits, sizeof(T));
    const T* src = static_cast<const T*>(x.data());
    T* dst = static_cast<T*>(out.data());
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / m);
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        T* o = dst + row * m;
        int64_t off = 0, rem = row;
        bool constant_row = false;
        for (int64_t d = rank - 2; d >= 0; --d) {
          int64_t i = rem % out_shape[size_t(d)];
          rem /= out_shape[size_t(d)];
          int64_t s = source_index(i - p[size_t(d)], x.dim(int(d)), mode);
          if (s < 0) { constant_row = true; break; }
          off += s * xs[size_t(d)];
        }
        if (constant_row) {
          std::fill(o, o + m, value);
          continue;
        }
        const T* in = src + off;
        for (int64_t j = 0; j < mid0; ++j) {
          int64_t s = source_index(j - pb, n, mode);
          o[j] = s < 0 ? value : in[s];
        }
        if (mid1 > mid0) std::memcpy(o + mid0, in + (mid0 - pb), size_t(mid1 - mid0) * sizeof(T));
        for (int64_t j = mid1; j < m; ++j) {
          int64_t s = source_index(j - pb, n, mode);
          o[j] = s < 0 ? value : in[s];
        }
      }
    });
  });
}

void pad_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, dt);
  auto pads = static_ints(ctx, "pads", 1);
  if (!pads.value && pads.known && ctx.node().has_attr("paddings")) pads.value = ctx.node().attr_ints("paddings");
  auto axes = static_ints(ctx, nullptr, 3);
  if (!pads.known || !pads.value || !axes.known) return ctx.set_output(0, dt, Shape(in->size(), -1));
  auto p = full_pads(ctx.node(), int64_t(in->size()), *pads.value, axes.value);
  ctx.set_output(0, dt, padded_shape(ctx.node(), *in, p));
}

// ---- onnxtrain.PadGrad(dY, pads, axes?; mode) ----
// Padding is separable, so its adjoint is one 1-D pass per padded dim: along dim d, output
// position j adds into input position source_index(j - begin) (nothing for the constant border).
// Passes run in the compute type; lines of (outer, inner) positions are split across threads.

void pad_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  int64_t rank = dy.rank();
  PadMode mode = pad_mode(node);
  auto p = full_pads(node, rank, int_list_input(ctx, 1), attr_or_input_ints(ctx, nullptr, 2));
  Shape in_shape(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) {
    int64_t m = dy.dim(int(d)), n = m - p[size_t(d)] - p[size_t(d + rank)];
    OT_CHECK(n >= 0, node.context(), "pads ", shape_str(p), " do not fit dY ", shape_str(dy.shape()));
    OT_CHECK(mode == PadMode::kConstant || n > 0 || m == 0, node.context(), "cannot ", node.attr_string("mode", ""),
             "-pad an empty dim (dY ", shape_str(dy.shape()), ", pads ", shape_str(p), ")");
    in_shape[size_t(d)] = n;
  }
  Tensor& dx = ctx.output(0, dy.dtype(), in_shape);
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) {  // only possible when a constant border covers everything: dX = 0
    std::memset(dx.data(), 0, dx.nbytes());
    return;
  }
  dispatch_float(dy.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::vector<C> cur(static_cast<size_t>(dy.numel()));
    const T* src = dy.data<T>();
    for (size_t i = 0; i < cur.size(); ++i) cur[i] = C(src[i]);
    Shape shape = dy.shape();
    for (int64_t d = 0; d < rank; ++d) {
      const int64_t pb = p[size_t(d)], m = shape[size_t(d)], n = in_shape[size_t(d)];
      if (pb == 0 && m == n) continue;
      int64_t outer = 1, inner = 1;
      for (int64_t e = 0; e < rank; ++e) {
        if (e < d) outer *= shape[size_t(e)];
        else if (e > d) inner *= shape[size_t(e)];
      }
      std::vector<int64_t> source(static_cast<size_t>(m));
      for (int64_t j = 0; j < m; ++j) source[size_t(j)] = source_index(j - pb, n, mode);
      std::vector<C> next(static_cast<size_t>(outer * n * inner), C(0));
      parallel_for(outer * inner, std::max<int64_t>(1, kElementwiseGrain / m), [&](int64_t b, int64_t e) {
        for (int64_t pos = b; pos < e;) {
          int64_t o = pos / inner, i0 = pos % inner, i1 = std::min(inner, i0 + (e - pos));
          for (int64_t j = 0; j < m; ++j) {
            int64_t s = source[size_t(j)];
            if (s < 0) continue;
            C* to = next.data() + (o * n + s) * inner;
            const C* from = cur.data() + (o * m + j) * inner;
            for (int64_t i = i0; i < i1; ++i) to[i] += from[i];
          }
          pos += i1 - i0;
        }
      });
      cur = std::move(next);
      shape[size_t(d)] = n;
    }
    T* out = dx.data<T>();
    for (size_t i = 0; i < cur.size(); ++i) out[i] = T(cur[i]);
  });
}

void pad_grad_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, dt);
  const Tensor* pads = ctx.input_value(1);
  auto axes = static_ints(ctx, nullptr, 2);
  if (!pads || !axes.known) return ctx.set_output(0, dt, Shape(in->size(), -1));
  auto p = full_pads(ctx.node(), int64_t(in->size()), pads->to_int_vector(), axes.value);
  for (auto& v : p) v = -v;  // dX is dY with the pads taken off
  ctx.set_output(0, dt, padded_shape(ctx.node(), *in, p));
}

void pad_gradient(GradientBuilder& g) {
  const Node& node = g.node();
  PadMode mode = pad_mode(node);
  std::string pads = ints_attr_or_input(g, "pads", 1);
  if (pads.empty() && node.has_attr("paddings")) pads = g.ints(node.attr_ints("paddings"));
  std::vector<std::string> in{g.dy(0), pads};
  if (g.has_input(3)) in.push_back(g.x(3));
  std::string dx = g.emit("PadGrad", in, {{"mode", Attribute::of(node.attr_string("mode", "constant"))}},
                          kOnnxTrainDomain);
  g.set(0, dx);
  if (g.needs(2)) {
    // The constant fills every output position not read from x: d(value) = sum(dy) - sum(dx).
    if (mode != PadMode::kConstant) return g.set(2, g.zeros_like(g.x(2)));
    std::string border = g.sub(g.emit("ReduceSum", {g.dy(0)}, {{"keepdims", Attribute::of(int64_t(0))}}),
                               g.emit("ReduceSum", {dx}, {{"keepdims", Attribute::of(int64_t(0))}}));
    g.set(2, reshape_like(g, border, g.x(2)));
  }
}

}  // namespace

// y = pad(x, pads, mode).  dx = pad_grad(dy, pads, mode): each output position's dy added to the x
// position it was read from; d(constant_value) = sum(dy) - sum(dx)
ONNXTRAIN_OP(Pad, kOnnxDomain, 1).inputs(1, 4).outputs(1).shape(pad_rule).cpu(pad_kernel).work(memory_bound_work).gradient(pad_gradient);
// dX = pad_grad(dY, pads, mode), the adjoint of Pad.  d(dY) = pad(d(dX), pads, mode, value 0)
ONNXTRAIN_OP(PadGrad, kOnnxTrainDomain, 1).inputs(2, 3).outputs(1).shape(pad_grad_rule).cpu(pad_grad_kernel)
    .gradient([](GradientBuilder& g) {
      std::vector<std::string> in{g.dy(0), g.x(1)};
      if (g.has_input(2)) in.insert(in.end(), {"", g.x(2)});
      g.set(0, g.emit("Pad", in, {{"mode", Attribute::of(g.node().attr_string("mode", "constant"))}}));
    });

}  // namespace onnxtrain

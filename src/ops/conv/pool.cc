// AveragePool, MaxPool (with Indices), GlobalAveragePool, GlobalMaxPool over N-d spatial dims.
// Pools are memory-bound. fp32 MaxPool (without Indices), AveragePool and their gradients go through
// the backend's pooling (backends/cpu/pool.h) when it can express the geometry; everything else
// (other dtypes, Indices, geometry the backend declines) takes the generic path: a direct loop per (n, c)
// plane with per-axis tap tables, parallel over planes.
#include <limits>
#include <optional>

#include "ops/gradient_builder.h"
#include "backends/cpu/gemm.h"  // matmul_native: whether the CPU has bf16 kernels
#include "backends/cpu/pool.h"
#include "backends/cpu/shape_cache.h"
#include "ops/common.h"
#include "ops/conv/conv_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// For every axis and output index: the valid input indices of the window, and how many taps the
// window has inside input + explicit pads (count_include_pad's divisor).
struct TapTable {
  std::vector<std::vector<std::vector<int64_t>>> taps;  // [axis][out] -> input indices
  std::vector<std::vector<int64_t>> padded_count;        // [axis][out]
};

TapTable make_taps(const std::vector<int64_t>& in, const WindowGeometry& g) {
  TapTable t;
  size_t nd = in.size();
  t.taps.resize(nd);
  t.padded_count.resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    for (int64_t o = 0; o < g.out[d]; ++o) {
      int64_t start = o * g.stride[d] - g.pad_l[d];
      std::vector<int64_t> v;
      int64_t cnt = 0;
      for (int64_t j = 0; j < g.kernel[d]; ++j) {
        int64_t i = start + j * g.dilation[d];
        if (i < in[d] + g.pad_r[d]) ++cnt;
        if (i >= 0 && i < in[d]) v.push_back(i);
      }
      t.taps[d].push_back(std::move(v));
      t.padded_count[d].push_back(cnt);
    }
  }
  return t;
}

struct PoolSetup {
  std::vector<int64_t> in;
  WindowGeometry g;
  Shape out;
};

PoolSetup pool_setup(const Node& node, const Shape& x) {
  OT_CHECK(x.size() >= 3, node.context(), "X must be [N, C, spatial...], got ", shape_str(x));
  PoolSetup s;
  s.in.assign(x.begin() + 2, x.end());
  OT_CHECK(node.has_attr("kernel_shape"), node.context(), "attribute kernel_shape is required");
  s.g = window_geometry(node, s.in, node.attr_ints("kernel_shape"), node.attr_int("ceil_mode", 0) != 0);
  s.out = {x[0], x[1]};
  s.out.insert(s.out.end(), s.g.out.begin(), s.g.out.end());
  return s;
}

void pool_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& x = ctx.input_shape(0);
  std::optional<Shape> out;
  if (x && x->size() >= 3) {
    std::vector<int64_t> in(x->begin() + 2, x->end());
    WindowGeometry g = window_geometry(ctx.node(), in, ctx.node().attr_ints("kernel_shape"),
                                       ctx.node().attr_int("ceil_mode", 0) != 0);
    out = Shape{(*x)[0], (*x)[1]};
    out->insert(out->end(), g.out.begin(), g.out.end());
  }
  ctx.set_output(0, dt, out);
  if (ctx.num_outputs() > 1) ctx.set_output(1, DType::kInt64, out);
}

// Calls fn(plane, out_offset, taps-per-axis) for every output position of every plane.
template <typename F>
void for_each_window(int64_t planes, const PoolSetup& s, const TapTable& t, F&& fn) {
  size_t nd = s.in.size();
  int64_t out_sz = numel(s.g.out);
  parallel_for(planes, std::max<int64_t>(1, 4096 / std::max<int64_t>(out_sz, 1)), [&](int64_t begin, int64_t end) {
    std::vector<int64_t> o(nd);
    std::vector<const std::vector<int64_t>*> w(nd);
    for (int64_t p = begin; p < end; ++p) {
      std::fill(o.begin(), o.end(), 0);
      for (int64_t op = 0; op < out_sz; ++op) {
        for (size_t d = 0; d < nd; ++d) w[d] = &t.taps[d][size_t(o[d])];
        fn(p, op, o, w);
        for (size_t d = nd; d-- > 0;) {
          if (++o[d] < s.g.out[d]) break;
          o[d] = 0;
        }
      }
    }
  });
}

// Visits every input index of the window (the cartesian product of the per-axis taps):
// fn(flat row-major offset, per-axis indices).
template <typename F>
void for_each_tap(const std::vector<const std::vector<int64_t>*>& w, const std::vector<int64_t>& in,
                  std::vector<size_t>& pos, std::vector<int64_t>& idx, F&& fn) {
  size_t nd = w.size();
  for (size_t d = 0; d < nd; ++d)
    if (w[d]->empty()) return;
  std::fill(pos.begin(), pos.end(), 0);
  while (true) {
    int64_t off = 0;
    for (size_t d = 0; d < nd; ++d) {
      idx[d] = (*w[d])[pos[d]];
      off = off * in[d] + idx[d];
    }
    fn(off);
    size_t d = nd;
    while (d-- > 0) {
      if (++pos[d] < w[d]->size()) break;
      pos[d] = 0;
    }
    if (d == size_t(-1)) return;
  }
}

// The oneDNN pooling for fp32 X (and bf16 X where the CPU has bf16 kernels), built once per shape;
// null when the generic loop must run.
class PoolPrimitives {
 public:
  PoolPrimitives(bool max, bool backward) : max_(max), backward_(backward) {}

  // `channels_last`: X and Y stored [N, spatial..., C] (ChannelsLastPool).
  const cpu::PoolPrimitive* find(const Node& node, const Tensor& x, const PoolSetup& s, bool channels_last = false) {
    const bool bf16 = x.dtype() == DType::kBFloat16 && cpu::matmul_native(DType::kBFloat16);
    if ((x.dtype() != DType::kFloat32 && !bf16) || x.numel() == 0) return nullptr;
    cpu::PoolSpec spec;
    spec.dtype = x.dtype();
    spec.max = max_;
    spec.channels_last = channels_last;
    spec.count_include_pad = !max_ && node.attr_int("count_include_pad", 0) != 0;
    spec.x = x.shape();
    spec.kernel = s.g.kernel;
    spec.stride = s.g.stride;
    spec.dilation = s.g.dilation;
    spec.pad_l = s.g.pad_l;
    spec.pad_r = s.g.pad_r;
    spec.out = s.g.out;
    auto key = spec.key();
    std::optional<cpu::PoolPrimitive>* pool = cache_.find(key);
    if (!pool) pool = &cache_.insert(key, cpu::PoolPrimitive::make(spec, backward_, node.context()));
    return *pool ? &**pool : nullptr;
  }

 private:
  bool max_, backward_;
  cpu::ShapeCache<std::optional<cpu::PoolPrimitive>> cache_;
};

void max_pool_generic(KernelContext& ctx, const PoolSetup& s) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  int64_t storage_order = node.attr_int("storage_order", 0);
  Tensor& y = ctx.output(0, x.dtype(), s.out);
  Tensor* ind = ctx.num_outputs() > 1 && ctx.output_requested(1) ? &ctx.output(1, DType::kInt64, s.out) : nullptr;
  if (y.numel() == 0) return;
  TapTable t = make_taps(s.in, s.g);
  int64_t in_sz = numel(s.in), out_sz = numel(s.g.out);
  size_t nd = s.in.size();
  // column-major strides for storage_order = 1
  std::vector<int64_t> cm(nd, 1);
  for (size_t d = 1; d < nd; ++d) cm[d] = cm[d - 1] * s.in[d - 1];
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    int64_t* pi = ind ? ind->data<int64_t>() : nullptr;
    for_each_window(x.dim(0) * x.dim(1), s, t, [&](int64_t p, int64_t op, const std::vector<int64_t>&,
                                                   const std::vector<const std::vector<int64_t>*>& w) {
      thread_local std::vector<size_t> pos;
      thread_local std::vector<int64_t> idx, best_idx;
      pos.resize(nd);
      idx.resize(nd);
      best_idx.assign(nd, 0);
      const T* xp = px + p * in_sz;
      C best = std::numeric_limits<C>::lowest();
      if constexpr (std::numeric_limits<C>::has_infinity) best = -std::numeric_limits<C>::infinity();
      int64_t best_off = -1;
      for_each_tap(w, s.in, pos, idx, [&](int64_t off) {
        C v = C(xp[off]);
        if (best_off < 0 || v > best) {
          best = v;
          best_off = off;
          if (storage_order) best_idx = idx;
        }
      });
      py[p * out_sz + op] = T(best);
      if (pi) {
        int64_t flat = best_off < 0 ? 0 : best_off;
        if (storage_order && best_off >= 0) {
          flat = 0;
          for (size_t d = 0; d < nd; ++d) flat += best_idx[d] * cm[d];
        }
        pi[p * out_sz + op] = p * in_sz + flat;
      }
    });
  });
}

void average_pool_generic(KernelContext& ctx, const PoolSetup& s) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  bool include_pad = node.attr_int("count_include_pad", 0) != 0;
  Tensor& y = ctx.output(0, x.dtype(), s.out);
  if (y.numel() == 0) return;
  TapTable t = make_taps(s.in, s.g);
  int64_t in_sz = numel(s.in), out_sz = numel(s.g.out);
  size_t nd = s.in.size();
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for_each_window(x.dim(0) * x.dim(1), s, t, [&](int64_t p, int64_t op, const std::vector<int64_t>& o,
                                                   const std::vector<const std::vector<int64_t>*>& w) {
      thread_local std::vector<size_t> pos;
      thread_local std::vector<int64_t> idx;
      pos.resize(nd);
      idx.resize(nd);
      const T* xp = px + p * in_sz;
      C sum = C(0);
      int64_t count = 0;
      for_each_tap(w, s.in, pos, idx, [&](int64_t off) {
        sum += C(xp[off]);
        ++count;
      });
      if (include_pad) {
        count = 1;
        for (size_t d = 0; d < nd; ++d) count *= t.padded_count[d][size_t(o[d])];
      }
      py[p * out_sz + op] = count > 0 ? T(sum / C(count)) : T(0);
    });
  });
}

void global_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  std::optional<Shape> out;
  if (x && x->size() >= 2) {
    out = *x;
    for (size_t i = 2; i < out->size(); ++i) (*out)[i] = 1;
  }
  ctx.set_output(0, ctx.input_dtype(0), out);
}

template <bool kMax>
void global_pool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, ctx.node().context(), "X must be [N, C, spatial...], got ", shape_str(x.shape()));
  Shape out = x.shape();
  for (size_t i = 2; i < out.size(); ++i) out[i] = 1;
  Tensor& y = ctx.output(0, x.dtype(), out);
  int64_t planes = x.dim(0) * x.dim(1);
  if (planes == 0) return;
  int64_t sz = x.numel() / planes;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(sz, 1)), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const T* xp = px + p * sz;
        if constexpr (kMax) {
          C m = -std::numeric_limits<C>::infinity();
          for (int64_t i = 0; i < sz; ++i) m = std::max(m, C(xp[i]));
          py[p] = T(m);
        } else {
          C acc = 0;
          for (int64_t i = 0; i < sz; ++i) acc += C(xp[i]);
          py[p] = T(sz ? acc / C(sz) : C(0));
        }
      }
    });
  });
}

// onnxtrain.MaxPoolGrad(dY, X) / AveragePoolGrad(dY, X), with the forward pool's attributes:
// dX of X's shape. The max windows are recomputed (first maximum wins, as in the forward kernel),
// so the Indices output need not exist; each plane is owned by one thread, so the scatter is
// race-free.
template <bool kMax>
void pool_grad_generic(KernelContext& ctx, const PoolSetup& s, Tensor& dx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  bool include_pad = node.attr_int("count_include_pad", 0) != 0;
  size_t nd = s.in.size();
  int64_t in_sz = numel(s.in), out_sz = numel(s.g.out);
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    std::fill(dx.data<T>(), dx.data<T>() + dx.numel(), T(0));
    if (dy.numel() == 0) return;
    TapTable t = make_taps(s.in, s.g);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    for_each_window(x.dim(0) * x.dim(1), s, t, [&](int64_t p, int64_t op, const std::vector<int64_t>& o,
                                                   const std::vector<const std::vector<int64_t>*>& w) {
      thread_local std::vector<size_t> pos;
      thread_local std::vector<int64_t> idx;
      pos.resize(nd);
      idx.resize(nd);
      T* dxp = pdx + p * in_sz;
      C g = C(pdy[p * out_sz + op]);
      if constexpr (kMax) {
        const T* xp = px + p * in_sz;
        C best = C(0);
        int64_t best_off = -1;
        for_each_tap(w, s.in, pos, idx, [&](int64_t off) {
          C v = C(xp[off]);
          if (best_off < 0 || v > best) {
            best = v;
            best_off = off;
          }
        });
        if (best_off >= 0) dxp[best_off] = T(C(dxp[best_off]) + g);
      } else {
        int64_t count = 0;
        for_each_tap(w, s.in, pos, idx, [&](int64_t) { ++count; });
        if (include_pad) {
          count = 1;
          for (size_t d = 0; d < nd; ++d) count *= t.padded_count[d][size_t(o[d])];
        }
        if (count == 0) return;
        C share = g / C(count);
        for_each_tap(w, s.in, pos, idx, [&](int64_t off) { dxp[off] = T(C(dxp[off]) + share); });
      }
    });
  });
}

// onnxtrain.GlobalPoolGrad(dY, X), mode "average" or "max": dX = dY / spatial size everywhere, or
// dY at each plane's first maximum.
void global_pool_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  bool max = ctx.node().attr_string("mode", "average") == "max";
  OT_CHECK(x.rank() >= 2 && dy.rank() == x.rank() && dy.dim(0) == x.dim(0) && dy.dim(1) == x.dim(1) &&
               dy.numel() == x.dim(0) * x.dim(1),
           ctx.node().context(), "dY must be [N, C, 1...] for X ", shape_str(x.shape()), ", got ", shape_str(dy.shape()));
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  int64_t planes = x.dim(0) * x.dim(1);
  if (planes == 0) return;
  int64_t sz = x.numel() / planes;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(planes, std::max<int64_t>(1, 16384 / std::max<int64_t>(sz, 1)), [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const T* xp = px + p * sz;
        T* dxp = pdx + p * sz;
        if (max) {
          std::fill(dxp, dxp + sz, T(0));
          int64_t best = 0;
          for (int64_t i = 1; i < sz; ++i)
            if (C(xp[i]) > C(xp[best])) best = i;
          if (sz > 0) dxp[best] = pdy[p];
        } else {
          T v = T(C(pdy[p]) / C(std::max<int64_t>(sz, 1)));
          std::fill(dxp, dxp + sz, v);
        }
      }
    });
  });
}

// MaxPool / AveragePool: oneDNN for fp32 (MaxPool only when Indices is not requested), else the
// generic loop.
template <bool kMax>
class PoolKernel final : public Kernel {
 public:
  explicit PoolKernel(const Node&) : dnnl_(kMax, false) {}

  void compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    PoolSetup s = pool_setup(ctx.node(), x.shape());
    bool indices = kMax && ctx.num_outputs() > 1 && ctx.output_requested(1);
    const cpu::PoolPrimitive* pool = indices ? nullptr : dnnl_.find(ctx.node(), x, s);
    if (!pool) return kMax ? max_pool_generic(ctx, s) : average_pool_generic(ctx, s);
    Tensor& y = ctx.output(0, x.dtype(), s.out);
    pool->forward(x.data(), y.data());
  }

 private:
  PoolPrimitives dnnl_;
};

template <bool kMax>
class PoolGradKernel final : public Kernel {
 public:
  explicit PoolGradKernel(const Node&) : dnnl_(kMax, true) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    PoolSetup s = pool_setup(node, x.shape());
    OT_CHECK(dy.shape() == s.out && dy.dtype() == x.dtype(), node.context(), "dY must be ", shape_str(s.out),
             " of X's dtype, got ", dtype_name(dy.dtype()), shape_str(dy.shape()));
    Tensor& dx = ctx.output(0, x.dtype(), x.shape());
    const cpu::PoolPrimitive* pool = dy.numel() > 0 ? dnnl_.find(node, x, s) : nullptr;
    if (!pool) return pool_grad_generic<kMax>(ctx, s, dx);
    pool->backward(dy.data(), x.data(), dx.data());
  }

 private:
  PoolPrimitives dnnl_;
};

// [N, C, S] <-> [N, S, C] copies of an fp32 tensor (S: the spatial dims flattened).
void swap_channels(const float* src, float* dst, int64_t n, int64_t rows, int64_t cols) {
  parallel_for(n * rows, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t img = r / rows, row = r % rows;
      const float* in = src + img * rows * cols + row * cols;
      float* out = dst + img * rows * cols + row;
      for (int64_t c = 0; c < cols; ++c) out[c * rows] = in[c];
    }
  });
}

// onnxtrain.ChannelsLastPool(X) -> Y, mode "max" / "average" (MaxPool's / AveragePool's
// attributes) or "global_average" / "global_max": the pool of an fp32 X stored channels last
// ([N, spatial..., C] order for the [N, C, spatial...] value, as keep_channels_last leaves values
// between convolutions); Y is stored channels last too (for the global modes that order is ONNX's).
class ChannelsLastPoolKernel final : public Kernel {
 public:
  explicit ChannelsLastPoolKernel(const Node& node)
      : mode_(node.attr_string("mode", "")), max_(mode_ == "max" || mode_ == "global_max"), dnnl_(max_, false) {
    OT_CHECK(mode_ == "max" || mode_ == "average" || mode_ == "global_average" || mode_ == "global_max",
             node.context(), "mode must be max, average, global_average or global_max, got '", mode_, "'");
  }

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    OT_CHECK(x.dtype() == DType::kFloat32 && x.rank() >= 3, node.context(),
             "X must be float32 [N, C, spatial...], got ", dtype_name(x.dtype()), shape_str(x.shape()));
    const int64_t n = x.dim(0), c = x.dim(1), spatial = x.numel() / std::max<int64_t>(n * c, 1);
    if (mode_ == "global_average" || mode_ == "global_max") {
      Shape out = x.shape();
      for (size_t i = 2; i < out.size(); ++i) out[i] = 1;
      Tensor& y = ctx.output(0, x.dtype(), out);
      if (x.numel() == 0) return;
      return global_pool(x.data<float>(), y.data<float>(), n, spatial, c);
    }
    PoolSetup s = pool_setup(node, x.shape());
    Tensor& y = ctx.output(0, x.dtype(), s.out);
    if (x.numel() == 0 || y.numel() == 0) return;
    if (const cpu::PoolPrimitive* pool = dnnl_.find(node, x, s, true)) return pool->forward(x.data(), y.data());
    // A backend without channels-last pooling: the plain-layout one on reordered copies.
    const cpu::PoolPrimitive* plain = dnnl_.find(node, x, s, false);
    OT_CHECK(plain, node.context(), "no pooling kernel for this geometry in channels-last order");
    const int64_t out_spatial = y.numel() / (n * c);
    Tensor xt = Tensor::empty(x.dtype(), x.shape()), yt = Tensor::empty(y.dtype(), y.shape());
    swap_channels(x.data<float>(), xt.data<float>(), n, spatial, c);
    plain->forward(xt.data(), yt.data());
    swap_channels(yt.data<float>(), y.data<float>(), n, c, out_spatial);
  }

 private:
  // Y[n, c] = max or mean over s of X[n, s, c]: C-wide vector accumulations, one image per task.
  void global_pool(const float* x, float* y, int64_t n, int64_t spatial, int64_t c) const {
    parallel_for(n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(spatial * c, 1)), [&](int64_t b, int64_t e) {
      for (int64_t img = b; img < e; ++img) {
        const float* xi = x + img * spatial * c;
        float* yi = y + img * c;
        std::copy(xi, xi + c, yi);
        for (int64_t p = 1; p < spatial; ++p) {
          const float* row = xi + p * c;
          if (max_)
            for (int64_t k = 0; k < c; ++k) yi[k] = std::max(yi[k], row[k]);
          else
            for (int64_t k = 0; k < c; ++k) yi[k] += row[k];
        }
        if (!max_)
          for (int64_t k = 0; k < c; ++k) yi[k] /= float(spatial);
      }
    });
  }

  std::string mode_;
  bool max_;
  PoolPrimitives dnnl_;
};

void channels_last_pool_shape(ShapeContext& ctx) {
  const std::string mode = ctx.node().attr_string("mode", "");
  if (mode == "global_average" || mode == "global_max") return global_shape(ctx);
  pool_shape(ctx);
}

void pool_grad_shape(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1)); }

// The fused backward ops copy the forward node's attributes.
// A lambda, not a GradientFn: a minimal build drops the rule without instantiating it.
auto pool_gradient(const char* grad_op, std::optional<std::string> global_mode = std::nullopt) {
  return [grad_op, global_mode](GradientBuilder& g) {
    GraphBuilder::Attrs attrs = g.node().attributes;
    if (global_mode) attrs = {{"mode", Attribute::of(*global_mode)}};
    g.set(0, g.emit(grad_op, {g.dy(0), g.x(0)}, attrs, kOnnxTrainDomain));
  };
}

}  // namespace

// Y = window max.  dX = dY scattered to each window's (first) argmax, recomputed from X
ONNXTRAIN_OP(MaxPool, kOnnxDomain, 1).inputs(1).outputs(1, 2).shape(pool_shape).cpu_kernel<PoolKernel<true>>()
    .work(memory_bound_work)    .gradient(pool_gradient("MaxPoolGrad"));
// Y = window mean.  dX = dY / count spread evenly over each window (count per count_include_pad)
ONNXTRAIN_OP(AveragePool, kOnnxDomain, 1).inputs(1).outputs(1).shape(pool_shape).cpu_kernel<PoolKernel<false>>()
    .work(memory_bound_work)    .gradient(pool_gradient("AveragePoolGrad"));
// Y = mean over spatial dims.  dX = broadcast(dY) / spatial size
ONNXTRAIN_OP(GlobalAveragePool, kOnnxDomain, 1).inputs(1).outputs(1).shape(global_shape).work(memory_bound_work)
    .cpu(global_pool_kernel<false>).gradient(pool_gradient("GlobalPoolGrad", "average"));
// Y = max over spatial dims.  dX = dY at the (first) argmax of each plane, 0 elsewhere
ONNXTRAIN_OP(GlobalMaxPool, kOnnxDomain, 1).inputs(1).outputs(1).shape(global_shape).cpu(global_pool_kernel<true>)
    .work(memory_bound_work)    .gradient(pool_gradient("GlobalPoolGrad", "max"));

// An inference-only layout of the pools above (keep_channels_last): the same values, stored
// channels last.
ONNXTRAIN_OP(ChannelsLastPool, kOnnxTrainDomain, 1).inputs(1).outputs(1).shape(channels_last_pool_shape)
    .cpu_kernel<ChannelsLastPoolKernel>().work(memory_bound_work)
    .gradient_not_implemented("an inference-only layout: autodiff differentiates the ONNX pool");

// The fused pool backward ops are linear in dY (MaxPool's given its argmax): second derivatives
// are not needed.
ONNXTRAIN_OP(MaxPoolGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(pool_grad_shape)
    .cpu_kernel<PoolGradKernel<true>>().gradient_not_implemented("second derivatives of MaxPool are not needed");
ONNXTRAIN_OP(AveragePoolGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(pool_grad_shape)
    .cpu_kernel<PoolGradKernel<false>>().gradient_not_implemented("second derivatives of AveragePool are not needed");
ONNXTRAIN_OP(GlobalPoolGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(pool_grad_shape)
    .cpu(global_pool_grad_kernel).gradient_not_implemented("second derivatives of global pools are not needed");

}  // namespace onnxtrain

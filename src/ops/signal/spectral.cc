// DFT and STFT (opset 17). Signals carry a trailing dim of 1 (real) or 2 (real, imaginary);
// outputs are always complex (trailing 2) of the input's dtype.
//
//   DFT:  along `axis` (default 1, never the trailing dim), the signal is cut or zero-padded to
//         dft_length (default: its length n) and transformed, X[k] = sum_j x[j] e^{-2 pi i jk/n};
//         inverse = 1 uses e^{+...} / n; onesided = 1 keeps bins [0, n/2].
//   STFT: signal [batch, length, 1|2]; frames of frame_length (the input, or the window's length)
//         start every frame_step samples, are multiplied by the window when given, and
//         transformed; output [batch, frames, bins, 2] with bins = frame_length / 2 + 1 when
//         onesided (the default) or frame_length.
#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"
#include "ops/signal/signal_common.h"

namespace onnxtrain {
namespace {

using namespace signal;
using cd = std::complex<double>;

int64_t dft_axis(const Node& node, int64_t rank) {
  int64_t axis = node.attr_int("axis", 1);
  if (axis < 0) axis += rank;
  OT_CHECK(axis >= 0 && axis < rank - 1, node.context(), "axis ", node.attr_int("axis", 1),
           " must name a signal dim of the rank-", rank, " input (not the trailing complex dim)");
  return axis;
}

void dft_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  if (!x || x->size() < 2) {
    ctx.set_output(0, ctx.input_dtype(0), std::nullopt);
    return;
  }
  Shape out = *x;
  int64_t axis = dft_axis(ctx.node(), int64_t(x->size()));
  int64_t n = out[size_t(axis)];
  if (ctx.has_input(1)) {
    const Tensor* len = ctx.input_value(1);
    n = len && len->numel() == 1 ? len->item_as_int(0) : -1;
  }
  out[size_t(axis)] = n < 0 ? -1 : ctx.node().attr_int("onesided", 0) ? n / 2 + 1 : n;
  out.back() = 2;
  ctx.set_output(0, ctx.input_dtype(0), out);
}

void dft_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2 && (x.dim(-1) == 1 || x.dim(-1) == 2), node.context(),
           "input must be [batch, signal dims..., 1 or 2], got ", shape_str(x.shape()));
  const int64_t axis = dft_axis(node, x.rank());
  const int64_t len = x.dim(int(axis));
  int64_t n = len;
  if (ctx.has_input(1)) {
    n = scalar_int_input(ctx, 1, "dft_length");
    OT_CHECK(n >= 1, node.context(), "dft_length must be >= 1, got ", n);
  }
  const bool inverse = node.attr_int("inverse", 0) != 0, onesided = node.attr_int("onesided", 0) != 0;
  const int64_t out_len = onesided ? n / 2 + 1 : n;
  const int64_t cin = x.dim(-1);
  Shape out_shape = x.shape();
  out_shape[size_t(axis)] = out_len;
  out_shape.back() = 2;
  Tensor& y = ctx.output(0, x.dtype(), out_shape);
  if (y.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(int(i));
  for (int64_t i = axis + 1; i < x.rank() - 1; ++i) inner *= x.dim(int(i));
  DftPlan plan(n, inverse);
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      std::vector<cd> line(static_cast<size_t>(n)), res(static_cast<size_t>(out_len));
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r / inner, i = r % inner;
        std::fill(line.begin(), line.end(), cd(0));
        for (int64_t j = 0; j < std::min(n, len); ++j) {
          const T* p = px + ((o * len + j) * inner + i) * cin;
          line[size_t(j)] = cd(double(compute_t<T>(p[0])), cin == 2 ? double(compute_t<T>(p[1])) : 0.0);
        }
        plan.run(line, res.data(), out_len);
        for (int64_t k = 0; k < out_len; ++k) {
          T* q = py + ((o * out_len + k) * inner + i) * 2;
          q[0] = T(compute_t<T>(res[size_t(k)].real()));
          q[1] = T(compute_t<T>(res[size_t(k)].imag()));
        }
      }
    });
  });
}

// frame_length from the frame_length input or the window (which must agree when both are given),
// inputs `window_at` and `length_at` of the node (STFT's 2 and 3; its gradient's 3 and 4).
int64_t stft_frame_length_at(const KernelContext& ctx, size_t window_at, size_t length_at) {
  const Node& node = ctx.node();
  int64_t fl = -1;
  if (ctx.has_input(length_at)) fl = scalar_int_input(ctx, length_at, "frame_length");
  if (ctx.has_input(window_at)) {
    const Tensor& w = ctx.input(window_at);
    OT_CHECK(w.rank() == 1, node.context(), "window must be 1-D, got ", shape_str(w.shape()));
    OT_CHECK(fl < 0 || fl == w.dim(0), node.context(), "frame_length ", fl, " disagrees with the window's length ",
             w.dim(0));
    fl = w.dim(0);
  }
  OT_CHECK(fl >= 1, node.context(), "one of window and frame_length must give a frame length >= 1, got ", fl);
  return fl;
}

void stft_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  int64_t batch = x && x->size() == 3 ? (*x)[0] : -1, len = x && x->size() == 3 ? (*x)[1] : -1;
  int64_t fl = -1, step = -1;
  if (ctx.has_input(3)) {
    if (const Tensor* t = ctx.input_value(3); t && t->numel() == 1) fl = t->item_as_int(0);
  } else if (ctx.has_input(2) && ctx.input_shape(2) && ctx.input_shape(2)->size() == 1) {
    fl = (*ctx.input_shape(2))[0];
  }
  if (const Tensor* t = ctx.input_value(1); t && t->numel() == 1) step = t->item_as_int(0);
  int64_t frames = len >= 0 && fl >= 1 && step >= 1 && len >= fl ? (len - fl) / step + 1 : -1;
  int64_t bins = fl < 1 ? -1 : ctx.node().attr_int("onesided", 1) ? fl / 2 + 1 : fl;
  ctx.set_output(0, ctx.input_dtype(0), Shape{batch, frames, bins, 2});
}

void stft_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() == 3 && (x.dim(2) == 1 || x.dim(2) == 2), node.context(),
           "signal must be [batch, length, 1 or 2], got ", shape_str(x.shape()));
  const int64_t step = scalar_int_input(ctx, 1, "frame_step");
  OT_CHECK(step >= 1, node.context(), "frame_step must be >= 1, got ", step);
  const int64_t fl = stft_frame_length_at(ctx, 2, 3);
  const int64_t batch = x.dim(0), len = x.dim(1), cin = x.dim(2);
  OT_CHECK(len >= fl, node.context(), "the signal (length ", len, ") is shorter than one frame (", fl, ")");
  const int64_t frames = (len - fl) / step + 1;
  const int64_t bins = node.attr_int("onesided", 1) ? fl / 2 + 1 : fl;
  std::vector<double> window(static_cast<size_t>(fl), 1.0);
  if (ctx.has_input(2)) {
    const Tensor& w = ctx.input(2);
    OT_CHECK(is_floating(w.dtype()), node.context(), "window must be floating-point, got ", dtype_name(w.dtype()));
    for (int64_t i = 0; i < fl; ++i) window[size_t(i)] = w.item_as_double(i);
  }
  Tensor& y = ctx.output(0, x.dtype(), Shape{batch, frames, bins, 2});
  if (y.numel() == 0) return;
  DftPlan plan(fl, false);
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(batch * frames, std::max<int64_t>(1, 4096 / fl), [&](int64_t b, int64_t e) {
      std::vector<cd> line(static_cast<size_t>(fl)), res(static_cast<size_t>(bins));
      for (int64_t r = b; r < e; ++r) {
        const int64_t n = r / frames, f = r % frames;
        for (int64_t j = 0; j < fl; ++j) {
          const T* p = px + (n * len + f * step + j) * cin;
          double w = window[size_t(j)];
          line[size_t(j)] = cd(w * double(compute_t<T>(p[0])), cin == 2 ? w * double(compute_t<T>(p[1])) : 0.0);
        }
        plan.run(line, res.data(), bins);
        T* q = py + r * bins * 2;
        for (int64_t k = 0; k < bins; ++k) {
          q[2 * k] = T(compute_t<T>(res[size_t(k)].real()));
          q[2 * k + 1] = T(compute_t<T>(res[size_t(k)].imag()));
        }
      }
    });
  });
}

// The adjoint of a forward DFT of size n (scale s = 1, or 1 / n when inverse) restricted to the
// bins it kept: for Y_k = s sum_j x_j w^{jk}, dx_j = s sum_k dY_k conj(w)^{jk}, the sum over the
// kept bins only (the others are zero in `g`). The opposite-direction plan computes the sum, with
// its own 1 / n when that direction is the inverse one, so the scale corrects for it.
class DftAdjoint {
 public:
  DftAdjoint(int64_t n, bool forward_inverse)
      : plan_(n, !forward_inverse), scale_(forward_inverse ? 1.0 / double(n) : double(n)) {}
  // g: n bins (overwritten), out: the first `count` entries of dx.
  void run(std::vector<cd>& g, cd* out, int64_t count) const {
    plan_.run(g, out, count);
    for (int64_t j = 0; j < count; ++j) out[j] *= scale_;
  }

 private:
  DftPlan plan_;
  double scale_;
};

// DFTGrad(dY, X, [dft_length]) -> dX, DFT's attributes: each line's adjoint, 0 where the forward
// cut the signal to dft_length, the real part alone for a real X.
void dft_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const int64_t axis = dft_axis(node, x.rank());
  const int64_t len = x.dim(int(axis)), cin = x.dim(-1);
  const int64_t n = ctx.has_input(2) ? scalar_int_input(ctx, 2, "dft_length") : len;
  const int64_t out_len = node.attr_int("onesided", 0) ? n / 2 + 1 : n;
  Shape y_shape = x.shape();
  y_shape[size_t(axis)] = out_len;
  y_shape.back() = 2;
  OT_CHECK(dy.shape() == y_shape && dy.dtype() == x.dtype(), node.context(), "dY should be ", dtype_name(x.dtype()),
           " ", shape_str(y_shape), ", got ", dtype_name(dy.dtype()), " ", shape_str(dy.shape()));
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  if (dx.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(int(i));
  for (int64_t i = axis + 1; i < x.rank() - 1; ++i) inner *= x.dim(int(i));
  const DftAdjoint adjoint(n, node.attr_int("inverse", 0) != 0);
  const int64_t kept = std::min(n, len);
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(outer * inner, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      std::vector<cd> g(static_cast<size_t>(n)), res(static_cast<size_t>(kept));
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r / inner, i = r % inner;
        std::fill(g.begin(), g.end(), cd(0));
        for (int64_t k = 0; k < out_len; ++k) {
          const T* q = pdy + ((o * out_len + k) * inner + i) * 2;
          g[size_t(k)] = cd(double(compute_t<T>(q[0])), double(compute_t<T>(q[1])));
        }
        adjoint.run(g, res.data(), kept);
        for (int64_t j = 0; j < len; ++j) {
          T* p = pdx + ((o * len + j) * inner + i) * cin;
          const cd v = j < kept ? res[size_t(j)] : cd(0);
          p[0] = T(compute_t<T>(v.real()));
          if (cin == 2) p[1] = T(compute_t<T>(v.imag()));
        }
      }
    });
  });
}

void dft_gradient(GradientBuilder& g) {
  std::vector<std::string> ins{g.dy(0), g.x(0)};
  if (g.has_input(1)) ins.push_back(g.x(1));
  if (g.needs(0)) g.set(0, g.emit("DFTGrad", ins, g.node().attributes, kOnnxTrainDomain));
}

// STFTGrad(dY, signal, frame_step, [window], [frame_length]) -> (dsignal, [dwindow]). With
// u = w * x[frame f] and a_f = the adjoint DFT of dY[f] (a complex gradient of u): dsignal
// overlap-adds w * a_f at each frame's samples, dwindow sums Re(conj(x[frame f]) a_f) over frames.
void stft_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const int64_t step = scalar_int_input(ctx, 2, "frame_step");
  const int64_t fl = stft_frame_length_at(ctx, 3, 4);
  const int64_t batch = x.dim(0), len = x.dim(1), cin = x.dim(2);
  const int64_t frames = (len - fl) / step + 1;
  const int64_t bins = node.attr_int("onesided", 1) ? fl / 2 + 1 : fl;
  OT_CHECK(dy.shape() == Shape({batch, frames, bins, 2}) && dy.dtype() == x.dtype(), node.context(), "dY should be ",
           dtype_name(x.dtype()), " ", shape_str({batch, frames, bins, 2}), ", got ", dtype_name(dy.dtype()), " ",
           shape_str(dy.shape()));
  const bool has_window = ctx.has_input(3);
  std::vector<double> window(static_cast<size_t>(fl), 1.0);
  if (has_window)
    for (int64_t i = 0; i < fl; ++i) window[size_t(i)] = ctx.input(3).item_as_double(i);
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  std::vector<double> dw(static_cast<size_t>(fl), 0.0);
  const DftAdjoint adjoint(fl, false);
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    // One batch entry per task: its frames overlap, so they are summed in order by one thread.
    std::vector<std::vector<double>> dw_of(static_cast<size_t>(batch), std::vector<double>(size_t(fl), 0.0));
    parallel_for(batch, 1, [&](int64_t b, int64_t e) {
      std::vector<cd> g(static_cast<size_t>(fl)), a(static_cast<size_t>(fl)), acc(static_cast<size_t>(len));
      for (int64_t n = b; n < e; ++n) {
        std::fill(acc.begin(), acc.end(), cd(0));
        for (int64_t f = 0; f < frames; ++f) {
          std::fill(g.begin(), g.end(), cd(0));
          const T* q = pdy + ((n * frames + f) * bins) * 2;
          for (int64_t k = 0; k < bins; ++k)
            g[size_t(k)] = cd(double(compute_t<T>(q[2 * k])), double(compute_t<T>(q[2 * k + 1])));
          adjoint.run(g, a.data(), fl);
          for (int64_t j = 0; j < fl; ++j) {
            const int64_t t = f * step + j;
            acc[size_t(t)] += window[size_t(j)] * a[size_t(j)];
            const T* p = px + (n * len + t) * cin;
            const cd xv(double(compute_t<T>(p[0])), cin == 2 ? double(compute_t<T>(p[1])) : 0.0);
            dw_of[size_t(n)][size_t(j)] += (std::conj(xv) * a[size_t(j)]).real();
          }
        }
        for (int64_t t = 0; t < len; ++t) {
          T* p = pdx + (n * len + t) * cin;
          p[0] = T(compute_t<T>(acc[size_t(t)].real()));
          if (cin == 2) p[1] = T(compute_t<T>(acc[size_t(t)].imag()));
        }
      }
    });
    for (const auto& part : dw_of)
      for (int64_t j = 0; j < fl; ++j) dw[size_t(j)] += part[size_t(j)];
  });
  if (ctx.output_requested(1)) {
    OT_CHECK(has_window, node.context(), "a window gradient was asked for without a window");
    const Tensor& w = ctx.input(3);
    Tensor& dwin = ctx.output(1, w.dtype(), w.shape());
    dispatch_float(w.dtype(), [&]<typename T>() {
      for (int64_t j = 0; j < fl; ++j) dwin.data<T>()[j] = T(compute_t<T>(dw[size_t(j)]));
    });
  }
}

void stft_gradient(GradientBuilder& g) {
  std::vector<std::string> ins{g.dy(0), g.x(0), g.x(1), g.has_input(2) ? g.x(2) : "", g.has_input(3) ? g.x(3) : ""};
  while (ins.back().empty()) ins.pop_back();
  const bool window = g.has_input(2) && g.needs(2);
  auto outs = g.emit_n("STFTGrad", ins, window ? 2 : 1, g.node().attributes, kOnnxTrainDomain);
  if (g.needs(0)) g.set(0, outs[0]);
  if (window) g.set(2, outs[1]);
}

}  // namespace

// Y = F x (a linear map).  dx = F^H dY: the opposite-direction DFT of dY over the kept bins, scaled
// as the forward was, cut back to x's length and to its real part for a real x (DFTGrad)
ONNXTRAIN_OP(DFT, kOnnxDomain, 17).inputs(1, 2).outputs(1).shape(dft_shape).gradient(dft_gradient).cpu(dft_kernel);
// DFTGrad is linear in dY: second derivatives are not needed.
ONNXTRAIN_OP(DFTGrad, kOnnxTrainDomain, 1).inputs(2, 3).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).cpu(dft_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

// Y[f] = F (w * x[frame f]).  dx = overlap-add over frames of w * F^H dY[f]; dwindow = sum over
// frames of Re(conj(x[frame f]) F^H dY[f]) (STFTGrad); frame_step and frame_length are integers
ONNXTRAIN_OP(STFT, kOnnxDomain, 17).inputs(2, 4).outputs(1).shape(stft_shape).gradient(stft_gradient)
    .cpu(stft_kernel);
// STFTGrad is linear in dY: second derivatives are not needed.
ONNXTRAIN_OP(STFTGrad, kOnnxTrainDomain, 1).inputs(3, 5).outputs(1, 2).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
  if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.input_dtype(3), ctx.input_shape(3));
}).cpu(stft_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain

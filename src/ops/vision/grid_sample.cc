// GridSample (opset 16): Y[n, c, h, w] = X[n, c] sampled at grid[n, h, w] = (x, y) in [-1, 1]
// (x across the width, y across the height), as PyTorch's grid_sample. mode: bilinear, nearest
// (round half to even) or bicubic (A = -0.75, 4x4 taps); padding_mode: zeros, border or reflection;
// align_corners: -1 and 1 are the centres of the corner pixels (1) or their outer edges (0).
#include <algorithm>
#include <cmath>

#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

enum class Mode { kBilinear, kNearest, kBicubic };
enum class Pad { kZeros, kBorder, kReflection };

// [-1, 1] to pixel coordinates.
double unnormalize(double v, int64_t size, bool align) {
  return align ? (v + 1) / 2 * double(size - 1) : ((v + 1) * double(size) - 1) / 2;
}

// Reflects v into [lo2 / 2, hi2 / 2] (bounds given doubled, so half-pixel edges stay integral).
double reflect(double v, int64_t lo2, int64_t hi2) {
  if (lo2 == hi2) return 0;
  double lo = double(lo2) / 2, span = double(hi2 - lo2) / 2;
  v = std::fabs(v - lo);
  double extra = std::fmod(v, span);
  int64_t flips = int64_t(std::floor(v / span));
  return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

double apply_padding(double v, int64_t size, Pad pad, bool align) {
  if (pad == Pad::kBorder) return std::clamp(v, 0.0, double(size - 1));
  if (pad == Pad::kReflection) {
    v = align ? reflect(v, 0, 2 * (size - 1)) : reflect(v, -1, 2 * size - 1);
    return std::clamp(v, 0.0, double(size - 1));
  }
  return v;
}

// d apply_padding(v) / dv, as torch's grid_sample backward takes it: 1 inside, 0 where the border
// clamps (at the edge too), and the sign of each reflection.
double padding_slope(double v, int64_t size, Pad pad, bool align) {
  auto clamp_slope = [&](double u) { return u <= 0.0 || u >= double(size - 1) ? 0.0 : 1.0; };
  if (pad == Pad::kBorder) return clamp_slope(v);
  if (pad != Pad::kReflection) return 1.0;
  const int64_t lo2 = align ? 0 : -1, hi2 = align ? 2 * (size - 1) : 2 * size - 1;
  if (lo2 == hi2) return 0.0;
  const double lo = double(lo2) / 2, span = double(hi2 - lo2) / 2;
  const double sign = v < lo ? -1.0 : 1.0;  // |v - lo|
  const int64_t flips = int64_t(std::floor(std::fabs(v - lo) / span));
  return sign * (flips % 2 == 0 ? 1.0 : -1.0) * clamp_slope(apply_padding(v, size, pad, align));
}

// A pixel index from a coordinate; NaN and huge values map outside the image (-1).
int64_t to_index(double v) { return std::isfinite(v) && std::fabs(v) < 1e15 ? int64_t(v) : -1; }

double cubic1(double x, double a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }            // |x| <= 1
double cubic2(double x, double a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }      // 1 < |x| < 2
double cubic1_slope(double x, double a) { return (3 * (a + 2) * x - 2 * (a + 3)) * x; }
double cubic2_slope(double x, double a) { return (3 * a * x - 10 * a) * x + 8 * a; }

void grid_sample_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  const auto& g = ctx.input_shape(1);
  std::optional<Shape> out;
  if (x && g && x->size() == 4 && g->size() == 4) out = Shape{(*x)[0], (*x)[1], (*g)[1], (*g)[2]};
  else if (x) out = Shape(x->size(), -1);
  ctx.set_output(0, ctx.input_dtype(0), out);
}

struct Settings {
  Mode mode = Mode::kBilinear;
  Pad pad = Pad::kZeros;
  bool align = false;
};

// Checks X [N, C, H, W] and grid [N, H_out, W_out, 2] and reads the attributes.
Settings read_settings(const Node& node, const Tensor& x, const Tensor& grid) {
  OT_CHECK(x.rank() == 4, node.context(), "X must be [N, C, H, W], got ", shape_str(x.shape()));
  OT_CHECK(grid.rank() == 4 && grid.dim(3) == 2 && grid.dim(0) == x.dim(0), node.context(),
           "grid must be [N, H_out, W_out, 2] with N = ", x.dim(0), ", got ", shape_str(grid.shape()));
  OT_CHECK(is_floating(grid.dtype()), node.context(), "grid must be floating-point, got ", dtype_name(grid.dtype()));
  std::string ms = node.attr_string("mode", "bilinear"), ps = node.attr_string("padding_mode", "zeros");
  Settings st;
  if (ms == "nearest") st.mode = Mode::kNearest;
  else if (ms == "bicubic" || ms == "cubic") st.mode = Mode::kBicubic;
  else OT_CHECK(ms == "bilinear" || ms == "linear", node.context(), "mode must be bilinear, nearest or bicubic, got '", ms, "'");
  if (ps == "border") st.pad = Pad::kBorder;
  else if (ps == "reflection") st.pad = Pad::kReflection;
  else OT_CHECK(ps == "zeros", node.context(), "padding_mode must be zeros, border or reflection, got '", ps, "'");
  st.align = node.attr_int("align_corners", 0) != 0;
  return st;
}

void grid_sample_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& grid = ctx.input(1);
  const Settings settings = read_settings(ctx.node(), x, grid);  // no structured binding: lambdas below capture these (clang 14)
  const Mode mode = settings.mode;
  const Pad pad = settings.pad;
  const bool align = settings.align;

  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), Ho = grid.dim(1), Wo = grid.dim(2);
  Tensor& y = ctx.output(0, x.dtype(), Shape{N, C, Ho, Wo});
  if (y.numel() == 0) return;
  std::vector<double> gv(size_t(grid.numel()));
  for (int64_t i = 0; i < grid.numel(); ++i) gv[size_t(i)] = grid.item_as_double(i);

  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    // Value at integer pixel (ix, iy) of plane p, 0 outside.
    auto at = [&](const T* p, int64_t ix, int64_t iy) -> double {
      return ix >= 0 && ix < W && iy >= 0 && iy < H ? double(compute_t<T>(p[iy * W + ix])) : 0.0;
    };
    parallel_for(N * C, std::max<int64_t>(1, 4096 / std::max<int64_t>(Ho * Wo, 1)), [&](int64_t b, int64_t e) {
      for (int64_t nc = b; nc < e; ++nc) {
        const int64_t n = nc / C;
        const T* plane = px + nc * H * W;
        T* out = py + nc * Ho * Wo;
        for (int64_t o = 0; o < Ho * Wo; ++o) {
          const double gx = gv[size_t((n * Ho * Wo + o) * 2)], gy = gv[size_t((n * Ho * Wo + o) * 2 + 1)];
          double fx = unnormalize(gx, W, align), fy = unnormalize(gy, H, align);
          double v = 0;
          if (mode == Mode::kBicubic) {
            double x0 = std::floor(fx), y0 = std::floor(fy), tx = fx - x0, ty = fy - y0;
            const double a = -0.75;
            double cx[4] = {cubic2(tx + 1, a), cubic1(tx, a), cubic1(1 - tx, a), cubic2(2 - tx, a)};
            double cy[4] = {cubic2(ty + 1, a), cubic1(ty, a), cubic1(1 - ty, a), cubic2(2 - ty, a)};
            for (int j = 0; j < 4; ++j) {
              double row = 0;
              for (int i = 0; i < 4; ++i) {
                // Each tap is padded on its own; coordinates still outside read 0.
                double tx2 = apply_padding(x0 - 1 + i, W, pad, align);
                double ty2 = apply_padding(y0 - 1 + j, H, pad, align);
                row += cx[i] * at(plane, to_index(tx2), to_index(ty2));
              }
              v += cy[j] * row;
            }
          } else {
            fx = apply_padding(fx, W, pad, align);
            fy = apply_padding(fy, H, pad, align);
            if (mode == Mode::kNearest) {
              v = at(plane, to_index(std::nearbyint(fx)), to_index(std::nearbyint(fy)));
            } else {
              double x0 = std::floor(fx), y0 = std::floor(fy), lx = fx - x0, ly = fy - y0;
              int64_t ix = to_index(x0), iy = to_index(y0);
              if (ix < 0 && x0 != -1.0) ix = -2;  // keep both taps outside
              if (iy < 0 && y0 != -1.0) iy = -2;
              v = (1 - ly) * ((1 - lx) * at(plane, ix, iy) + lx * at(plane, ix + 1, iy)) +
                  ly * ((1 - lx) * at(plane, ix, iy + 1) + lx * at(plane, ix + 1, iy + 1));
            }
          }
          out[o] = T(compute_t<T>(v));
        }
      }
    });
  });
}

// GridSampleGrad(dY, X, grid) -> (dX, dgrid). Each output value is sum_t w_t(fx, fy) X[tap t], with
// (fx, fy) the grid point in pixels: dX[tap t] += dY w_t, and dgrid = dY sum_t X[tap t] dw_t/df
// times df/dgrid (the unnormalising scale, and for bilinear and nearest the padding's slope).
// Nearest's weights are piecewise constant: no gradient reaches the grid.
void grid_sample_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& grid = ctx.input(2);
  const Settings settings = read_settings(node, x, grid);  // no structured binding: lambdas below capture these (clang 14)
  const Mode mode = settings.mode;
  const Pad pad = settings.pad;
  const bool align = settings.align;
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), Ho = grid.dim(1), Wo = grid.dim(2);
  OT_CHECK(dy.shape() == Shape({N, C, Ho, Wo}) && dy.dtype() == x.dtype(), node.context(), "dY should be ",
           dtype_name(x.dtype()), " ", shape_str({N, C, Ho, Wo}), ", got ", dtype_name(dy.dtype()), " ",
           shape_str(dy.shape()));
  const double scale_x = align ? double(W - 1) / 2 : double(W) / 2;  // d fx / d gx before padding
  const double scale_y = align ? double(H - 1) / 2 : double(H) / 2;
  std::vector<double> gv(size_t(grid.numel())), dx_acc(size_t(x.numel()), 0.0), dg(size_t(grid.numel()), 0.0);
  for (int64_t i = 0; i < grid.numel(); ++i) gv[size_t(i)] = grid.item_as_double(i);

  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    // Images are independent: one task per n owns its dX planes and its grid points.
    parallel_for(N, 1, [&](int64_t b, int64_t e) {
      for (int64_t n = b; n < e; ++n) {
        for (int64_t c = 0; c < C; ++c) {
          const T* plane = px + (n * C + c) * H * W;
          double* dplane = dx_acc.data() + (n * C + c) * H * W;
          auto at = [&](int64_t ix, int64_t iy) -> double {
            return ix >= 0 && ix < W && iy >= 0 && iy < H ? double(compute_t<T>(plane[iy * W + ix])) : 0.0;
          };
          auto scatter = [&](int64_t ix, int64_t iy, double v) {
            if (ix >= 0 && ix < W && iy >= 0 && iy < H) dplane[iy * W + ix] += v;
          };
          for (int64_t o = 0; o < Ho * Wo; ++o) {
            const double g = double(compute_t<T>(pdy[(n * C + c) * Ho * Wo + o]));
            const size_t gi = size_t((n * Ho * Wo + o) * 2);
            double fx = unnormalize(gv[gi], W, align), fy = unnormalize(gv[gi + 1], H, align);
            if (mode == Mode::kBicubic) {
              const double x0 = std::floor(fx), y0 = std::floor(fy), tx = fx - x0, ty = fy - y0, a = -0.75;
              const double cx[4] = {cubic2(tx + 1, a), cubic1(tx, a), cubic1(1 - tx, a), cubic2(2 - tx, a)};
              const double cy[4] = {cubic2(ty + 1, a), cubic1(ty, a), cubic1(1 - ty, a), cubic2(2 - ty, a)};
              const double sx[4] = {cubic2_slope(tx + 1, a), cubic1_slope(tx, a), -cubic1_slope(1 - tx, a),
                                    -cubic2_slope(2 - tx, a)};
              const double sy[4] = {cubic2_slope(ty + 1, a), cubic1_slope(ty, a), -cubic1_slope(1 - ty, a),
                                    -cubic2_slope(2 - ty, a)};
              for (int j = 0; j < 4; ++j) {
                for (int i = 0; i < 4; ++i) {
                  const int64_t ix = to_index(apply_padding(x0 - 1 + i, W, pad, align));
                  const int64_t iy = to_index(apply_padding(y0 - 1 + j, H, pad, align));
                  scatter(ix, iy, g * cx[i] * cy[j]);
                  const double v = at(ix, iy);
                  dg[gi] += g * v * sx[i] * cy[j] * scale_x;
                  dg[gi + 1] += g * v * cx[i] * sy[j] * scale_y;
                }
              }
              continue;
            }
            const double slope_x = padding_slope(fx, W, pad, align), slope_y = padding_slope(fy, H, pad, align);
            fx = apply_padding(fx, W, pad, align);
            fy = apply_padding(fy, H, pad, align);
            if (mode == Mode::kNearest) {
              scatter(to_index(std::nearbyint(fx)), to_index(std::nearbyint(fy)), g);
              continue;
            }
            const double x0 = std::floor(fx), y0 = std::floor(fy), lx = fx - x0, ly = fy - y0;
            int64_t ix = to_index(x0), iy = to_index(y0);
            if (ix < 0 && x0 != -1.0) ix = -2;  // keep both taps outside, as the forward does
            if (iy < 0 && y0 != -1.0) iy = -2;
            const double v00 = at(ix, iy), v10 = at(ix + 1, iy), v01 = at(ix, iy + 1), v11 = at(ix + 1, iy + 1);
            scatter(ix, iy, g * (1 - lx) * (1 - ly));
            scatter(ix + 1, iy, g * lx * (1 - ly));
            scatter(ix, iy + 1, g * (1 - lx) * ly);
            scatter(ix + 1, iy + 1, g * lx * ly);
            dg[gi] += g * ((v10 - v00) * (1 - ly) + (v11 - v01) * ly) * scale_x * slope_x;
            dg[gi + 1] += g * ((v01 - v00) * (1 - lx) + (v11 - v10) * lx) * scale_y * slope_y;
          }
        }
      }
    });
    if (ctx.output_requested(0)) {
      T* pdx = ctx.output(0, x.dtype(), x.shape()).data<T>();
      for (int64_t i = 0; i < x.numel(); ++i) pdx[i] = T(compute_t<T>(dx_acc[size_t(i)]));
    }
  });
  if (ctx.output_requested(1)) {
    Tensor& dgrid = ctx.output(1, grid.dtype(), grid.shape());
    dispatch_float(grid.dtype(), [&]<typename G>() {
      G* p = dgrid.data<G>();
      for (int64_t i = 0; i < grid.numel(); ++i) p[i] = G(compute_t<G>(dg[size_t(i)]));
    });
  }
}

void grid_sample_gradient(GradientBuilder& g) {
  auto outs = g.emit_n("GridSampleGrad", {g.dy(0), g.x(0), g.x(1)}, 2, g.node().attributes, kOnnxTrainDomain);
  if (g.needs(0)) g.set(0, outs[0]);
  if (g.needs(1)) g.set(1, outs[1]);
}

}  // namespace

// Y = sample(X, grid).  dX scatters dY * tap weight to each tap; dgrid = dY * d(weights)/d(coords) *
// d(coords)/d(grid) (size / 2 or (size - 1) / 2, times the padding's slope) (GridSampleGrad)
ONNXTRAIN_OP(GridSample, kOnnxDomain, 16).inputs(2).outputs(1).shape(grid_sample_shape)
    .gradient(grid_sample_gradient).cpu(grid_sample_kernel);
// GridSampleGrad is linear in dY: second derivatives are not needed.
ONNXTRAIN_OP(GridSampleGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1, 2).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
  if (ctx.num_outputs() > 1) ctx.set_output(1, ctx.input_dtype(2), ctx.input_shape(2));
}).cpu(grid_sample_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain

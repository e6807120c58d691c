// RoiAlign (opset 10, 16): for each roi [x1, y1, x2, y2] (times spatial_scale) of image
// batch_indices[r], each of output_height x output_width bins averages (mode avg) or takes the max
// of (mode max) sampling_ratio^2 bilinear samples (adaptive ceil(roi_size / bins) when 0).
// coordinate_transformation_mode half_pixel (opset 16's default) shifts the roi by -0.5 pixel;
// output_half_pixel (opset 10's only behaviour) does not and makes rois at least 1 pixel wide.
#include <cmath>

#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

struct Sample {
  int64_t o[4] = {0, 0, 0, 0};  // plane offsets of the 4 taps
  double w[4] = {0, 0, 0, 0};
};

// The bilinear taps of point (y, x) in an H x W plane; points more than a pixel outside read 0.
Sample bilinear_sample(double y, double x, int64_t H, int64_t W) {
  Sample s;
  if (!(y >= -1.0 && y <= double(H) && x >= -1.0 && x <= double(W))) return s;  // also NaN
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  int64_t y0 = int64_t(y), x0 = int64_t(x), y1, x1;
  if (y0 >= H - 1) { y0 = y1 = H - 1; y = double(y0); } else { y1 = y0 + 1; }
  if (x0 >= W - 1) { x0 = x1 = W - 1; x = double(x0); } else { x1 = x0 + 1; }
  double ly = y - double(y0), lx = x - double(x0), hy = 1 - ly, hx = 1 - lx;
  s.o[0] = y0 * W + x0; s.o[1] = y0 * W + x1; s.o[2] = y1 * W + x0; s.o[3] = y1 * W + x1;
  s.w[0] = hy * hx; s.w[1] = hy * lx; s.w[2] = ly * hx; s.w[3] = ly * lx;
  return s;
}

void roi_align_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  const auto& rois = ctx.input_shape(1);
  int64_t r = rois && rois->size() == 2 ? (*rois)[0] : -1;
  int64_t c = x && x->size() == 4 ? (*x)[1] : -1;
  ctx.set_output(0, ctx.input_dtype(0),
                 Shape{r, c, ctx.node().attr_int("output_height", 1), ctx.node().attr_int("output_width", 1)});
}

struct RoiSettings {
  bool is_max = false, half = true;
  int64_t ph = 1, pw = 1, ratio = 0;
  double scale = 1.0;
};

// Checks X, rois and batch_indices (inputs `at`, `at` + 1, `at` + 2) and reads the attributes.
RoiSettings read_roi_settings(const KernelContext& ctx, size_t at) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(at);
  const Tensor& rois = ctx.input(at + 1);
  const Tensor& bi = ctx.input(at + 2);
  OT_CHECK(x.rank() == 4, node.context(), "X must be [N, C, H, W], got ", shape_str(x.shape()));
  OT_CHECK(rois.rank() == 2 && rois.dim(1) == 4, node.context(), "rois must be [num_rois, 4], got ",
           shape_str(rois.shape()));
  OT_CHECK(bi.rank() == 1 && bi.dim(0) == rois.dim(0) && is_integer(bi.dtype()), node.context(),
           "batch_indices must be integer [", rois.dim(0), "], got ", dtype_name(bi.dtype()), " ", shape_str(bi.shape()));
  const std::string mode = node.attr_string("mode", "avg");
  OT_CHECK(mode == "avg" || mode == "max", node.context(), "mode must be avg or max, got '", mode, "'");
  // RoiAlignGrad (at 1) is given the mode its forward used; opset 10 had only output_half_pixel.
  const std::string ctm = at == 1 || ctx.opset() >= 16
                              ? node.attr_string("coordinate_transformation_mode", "half_pixel")
                              : "output_half_pixel";
  OT_CHECK(ctm == "half_pixel" || ctm == "output_half_pixel", node.context(),
           "coordinate_transformation_mode must be half_pixel or output_half_pixel, got '", ctm, "'");
  RoiSettings st;
  st.ph = node.attr_int("output_height", 1);
  st.pw = node.attr_int("output_width", 1);
  st.ratio = node.attr_int("sampling_ratio", 0);
  st.scale = node.attr_float("spatial_scale", 1.0f);
  OT_CHECK(st.ph >= 1 && st.pw >= 1 && st.ratio >= 0, node.context(), "output_height and output_width must be >= 1 ",
           "and sampling_ratio >= 0, got ", st.ph, ", ", st.pw, ", ", st.ratio);
  st.half = ctm == "half_pixel";
  st.is_max = mode == "max";
  for (int64_t r = 0; r < rois.dim(0); ++r) {
    int64_t b = bi.item_as_int(r);
    OT_CHECK(b >= 0 && b < x.dim(0), node.context(), "batch_indices[", r, "] = ", b, " is outside [0, ", x.dim(0), ")");
  }
  return st;
}

// The bilinear samples of roi `box` ([x1, y1, x2, y2]), bin by bin (per_bin of them each).
std::vector<Sample> roi_samples(const RoiSettings& st, const double* box, int64_t H, int64_t W, int64_t& per_bin) {
  const double off = st.half ? 0.5 : 0.0;
  const double x1 = box[0] * st.scale - off, y1 = box[1] * st.scale - off;
  const double x2 = box[2] * st.scale - off, y2 = box[3] * st.scale - off;
  double rw = x2 - x1, rh = y2 - y1;
  if (!st.half) { rw = std::max(rw, 1.0); rh = std::max(rh, 1.0); }
  const double bh = rh / double(st.ph), bw = rw / double(st.pw);
  const int64_t gh = st.ratio > 0 ? st.ratio : std::max<int64_t>(1, int64_t(std::ceil(rh / double(st.ph))));
  const int64_t gw = st.ratio > 0 ? st.ratio : std::max<int64_t>(1, int64_t(std::ceil(rw / double(st.pw))));
  per_bin = gh * gw;
  std::vector<Sample> samples;
  samples.reserve(size_t(st.ph * st.pw * per_bin));
  for (int64_t i = 0; i < st.ph; ++i)
    for (int64_t j = 0; j < st.pw; ++j)
      for (int64_t iy = 0; iy < gh; ++iy)
        for (int64_t ix = 0; ix < gw; ++ix)
          samples.push_back(bilinear_sample(y1 + double(i) * bh + (double(iy) + 0.5) * bh / double(gh),
                                            x1 + double(j) * bw + (double(ix) + 0.5) * bw / double(gw), H, W));
  return samples;
}

std::vector<double> read_rois(const Tensor& rois) {
  std::vector<double> rv(size_t(rois.numel()));
  for (int64_t i = 0; i < rois.numel(); ++i) rv[size_t(i)] = rois.item_as_double(i);
  return rv;
}

void roi_align_kernel(KernelContext& ctx) {
  const RoiSettings st = read_roi_settings(ctx, 0);
  const Tensor& x = ctx.input(0);
  const Tensor& bi = ctx.input(2);
  const int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3), R = ctx.input(1).dim(0);
  Tensor& y = ctx.output(0, x.dtype(), Shape{R, C, st.ph, st.pw});
  if (y.numel() == 0) return;
  const std::vector<double> rv = read_rois(ctx.input(1));
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(R, 1, [&](int64_t rb, int64_t re) {
      for (int64_t r = rb; r < re; ++r) {
        int64_t per_bin = 0;
        const std::vector<Sample> samples = roi_samples(st, rv.data() + r * 4, H, W, per_bin);  // for every channel
        const double count = double(std::max<int64_t>(per_bin, 1));
        const int64_t b = bi.item_as_int(r);
        for (int64_t c = 0; c < C; ++c) {
          const T* plane = px + (b * C + c) * H * W;
          T* out = py + ((r * C + c) * st.ph) * st.pw;
          const Sample* s = samples.data();
          for (int64_t bin = 0; bin < st.ph * st.pw; ++bin) {
            double acc = 0;
            for (int64_t k = 0; k < per_bin; ++k, ++s) {
              if (st.is_max) {
                double v = s->w[0] * double(compute_t<T>(plane[s->o[0]]));
                for (int t = 1; t < 4; ++t) v = std::max(v, s->w[t] * double(compute_t<T>(plane[s->o[t]])));
                acc = k == 0 ? v : std::max(acc, v);
              } else {
                for (int t = 0; t < 4; ++t) acc += s->w[t] * double(compute_t<T>(plane[s->o[t]]));
              }
            }
            out[bin] = T(compute_t<T>(st.is_max ? acc : acc / count));
          }
        }
      }
    });
  });
}

// RoiAlignGrad(dY, X, rois, batch_indices) -> dX: avg scatters dY / count * weight to the 4 taps
// of every sample of the bin; max gives dY * weight to the one tap the forward took (the first of
// equal ones, as its max keeps).
void roi_align_grad_kernel(KernelContext& ctx) {
  const RoiSettings st = read_roi_settings(ctx, 1);
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& bi = ctx.input(3);
  const int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3), R = ctx.input(2).dim(0);
  OT_CHECK(dy.shape() == Shape({R, C, st.ph, st.pw}) && dy.dtype() == x.dtype(), ctx.node().context(),
           "dY should be ", dtype_name(x.dtype()), " ", shape_str({R, C, st.ph, st.pw}), ", got ",
           dtype_name(dy.dtype()), " ", shape_str(dy.shape()));
  const std::vector<double> rv = read_rois(ctx.input(2));
  std::vector<std::vector<Sample>> samples(static_cast<size_t>(R));
  std::vector<int64_t> per_bin(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) samples[size_t(r)] = roi_samples(st, rv.data() + r * 4, H, W, per_bin[size_t(r)]);
  std::vector<double> acc(size_t(x.numel()), 0.0);
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    // Rois may share an image, channels never share a plane: one task per channel.
    parallel_for(C, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        for (int64_t r = 0; r < R; ++r) {
          const int64_t b = bi.item_as_int(r), n = per_bin[size_t(r)];
          const T* plane = px + (b * C + c) * H * W;
          double* dplane = acc.data() + (b * C + c) * H * W;
          const Sample* s = samples[size_t(r)].data();
          for (int64_t bin = 0; bin < st.ph * st.pw; ++bin, s += n) {
            const double g = double(compute_t<T>(pdy[(r * C + c) * st.ph * st.pw + bin]));
            if (!st.is_max) {
              const double share = g / double(std::max<int64_t>(n, 1));
              for (int64_t k = 0; k < n; ++k)
                for (int t = 0; t < 4; ++t) dplane[s[k].o[t]] += share * s[k].w[t];
              continue;
            }
            int64_t best_k = 0;
            int best_t = 0;
            double best = 0;
            for (int64_t k = 0; k < n; ++k) {
              for (int t = 0; t < 4; ++t) {
                const double v = s[k].w[t] * double(compute_t<T>(plane[s[k].o[t]]));
                if ((k == 0 && t == 0) || v > best) {
                  best = v;
                  best_k = k;
                  best_t = t;
                }
              }
            }
            if (n > 0) dplane[s[best_k].o[best_t]] += g * s[best_k].w[best_t];
          }
        }
      }
    });
    T* pdx = ctx.output(0, x.dtype(), x.shape()).data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) pdx[i] = T(compute_t<T>(acc[size_t(i)]));
  });
}

void roi_align_gradient(GradientBuilder& g) {
  if (g.needs(1))
    OT_THROW(kNotImplemented, g.context(), "the gradient with respect to rois (the sample positions) has no rule; "
             "only X is differentiated");
  GraphBuilder::Attrs attrs = g.node().attributes;
  if (g.opset() < 16) attrs["coordinate_transformation_mode"] = Attribute::of(std::string("output_half_pixel"));
  if (g.needs(0)) g.set(0, g.emit("RoiAlignGrad", {g.dy(0), g.x(0), g.x(1), g.x(2)}, attrs, kOnnxTrainDomain));
}

}  // namespace

// Y = pool(bilinear samples of X in each roi).  dX scatters dY / count * tap weight to the 4 taps
// of every sample (avg) or dY * weight to the arg-max tap (max) (RoiAlignGrad); rois have no rule
// (asking for their gradient is an error), batch_indices are integers.
ONNXTRAIN_OP(RoiAlign, kOnnxDomain, 10).inputs(3).outputs(1).shape(roi_align_shape).gradient(roi_align_gradient)
    .cpu(roi_align_kernel);
ONNXTRAIN_OP(RoiAlign, kOnnxDomain, 16).inputs(3).outputs(1).shape(roi_align_shape).gradient(roi_align_gradient)
    .cpu(roi_align_kernel);
// RoiAlignGrad is linear in dY: second derivatives are not needed.
ONNXTRAIN_OP(RoiAlignGrad, kOnnxTrainDomain, 1).inputs(4).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).cpu(roi_align_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain

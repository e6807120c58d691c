// RoiAlign (opset 10, 16): for each roi [x1, y1, x2, y2] (times spatial_scale) of image
// batch_indices[r], each of output_height x output_width bins averages (mode avg) or takes the max
// of (mode max) sampling_ratio^2 bilinear samples (adaptive ceil(roi_size / bins) when 0).
// coordinate_transformation_mode half_pixel (opset 16's default) shifts the roi by -0.5 pixel;
// output_half_pixel (opset 10's only behaviour) does not and makes rois at least 1 pixel wide.
#include <cmath>

#include "ops/common.h"
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

void roi_align_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& rois = ctx.input(1);
  const Tensor& bi = ctx.input(2);
  OT_CHECK(x.rank() == 4, node.context(), "X must be [N, C, H, W], got ", shape_str(x.shape()));
  OT_CHECK(rois.rank() == 2 && rois.dim(1) == 4, node.context(), "rois must be [num_rois, 4], got ",
           shape_str(rois.shape()));
  OT_CHECK(bi.rank() == 1 && bi.dim(0) == rois.dim(0) && is_integer(bi.dtype()), node.context(),
           "batch_indices must be integer [", rois.dim(0), "], got ", dtype_name(bi.dtype()), " ", shape_str(bi.shape()));
  const std::string mode = node.attr_string("mode", "avg");
  OT_CHECK(mode == "avg" || mode == "max", node.context(), "mode must be avg or max, got '", mode, "'");
  const std::string ctm =
      ctx.opset() >= 16 ? node.attr_string("coordinate_transformation_mode", "half_pixel") : "output_half_pixel";
  OT_CHECK(ctm == "half_pixel" || ctm == "output_half_pixel", node.context(),
           "coordinate_transformation_mode must be half_pixel or output_half_pixel, got '", ctm, "'");
  const int64_t ph = node.attr_int("output_height", 1), pw = node.attr_int("output_width", 1);
  const int64_t ratio = node.attr_int("sampling_ratio", 0);
  const double scale = node.attr_float("spatial_scale", 1.0f);
  OT_CHECK(ph >= 1 && pw >= 1 && ratio >= 0, node.context(), "output_height and output_width must be >= 1 and ",
           "sampling_ratio >= 0, got ", ph, ", ", pw, ", ", ratio);
  const bool half = ctm == "half_pixel";
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), R = rois.dim(0);
  for (int64_t r = 0; r < R; ++r) {
    int64_t b = bi.item_as_int(r);
    OT_CHECK(b >= 0 && b < N, node.context(), "batch_indices[", r, "] = ", b, " is outside [0, ", N, ")");
  }
  Tensor& y = ctx.output(0, x.dtype(), Shape{R, C, ph, pw});
  if (y.numel() == 0) return;
  std::vector<double> rv(size_t(rois.numel()));
  for (int64_t i = 0; i < rois.numel(); ++i) rv[size_t(i)] = rois.item_as_double(i);
  const bool is_max = mode == "max";
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(R, 1, [&](int64_t rb, int64_t re) {
      std::vector<Sample> samples;
      for (int64_t r = rb; r < re; ++r) {
        const double off = half ? 0.5 : 0.0;
        const double x1 = rv[size_t(r * 4)] * scale - off, y1 = rv[size_t(r * 4 + 1)] * scale - off;
        const double x2 = rv[size_t(r * 4 + 2)] * scale - off, y2 = rv[size_t(r * 4 + 3)] * scale - off;
        double rw = x2 - x1, rh = y2 - y1;
        if (!half) { rw = std::max(rw, 1.0); rh = std::max(rh, 1.0); }
        const double bh = rh / double(ph), bw = rw / double(pw);
        const int64_t gh = ratio > 0 ? ratio : std::max<int64_t>(1, int64_t(std::ceil(rh / double(ph))));
        const int64_t gw = ratio > 0 ? ratio : std::max<int64_t>(1, int64_t(std::ceil(rw / double(pw))));
        const double count = double(std::max<int64_t>(gh * gw, 1));
        // The samples of every bin, shared by all channels.
        samples.clear();
        for (int64_t i = 0; i < ph; ++i)
          for (int64_t j = 0; j < pw; ++j)
            for (int64_t iy = 0; iy < gh; ++iy)
              for (int64_t ix = 0; ix < gw; ++ix)
                samples.push_back(bilinear_sample(y1 + double(i) * bh + (double(iy) + 0.5) * bh / double(gh),
                                                  x1 + double(j) * bw + (double(ix) + 0.5) * bw / double(gw), H, W));
        const int64_t b = bi.item_as_int(r);
        for (int64_t c = 0; c < C; ++c) {
          const T* plane = px + (b * C + c) * H * W;
          T* out = py + ((r * C + c) * ph) * pw;
          const Sample* s = samples.data();
          for (int64_t bin = 0; bin < ph * pw; ++bin) {
            double acc = 0;
            for (int64_t k = 0; k < gh * gw; ++k, ++s) {
              if (is_max) {
                double v = s->w[0] * double(compute_t<T>(plane[s->o[0]]));
                for (int t = 1; t < 4; ++t) v = std::max(v, s->w[t] * double(compute_t<T>(plane[s->o[t]])));
                acc = k == 0 ? v : std::max(acc, v);
              } else {
                for (int t = 0; t < 4; ++t) acc += s->w[t] * double(compute_t<T>(plane[s->o[t]]));
              }
            }
            out[bin] = T(compute_t<T>(is_max ? acc : acc / count));
          }
        }
      }
    });
  });
}

}  // namespace

// Y = pool(bilinear samples of X in each roi).  dX scatters dY / count * tap weight to the 4 taps
// of every sample (avg) or dY * weight to the arg-max tap (max); rois get no gradient here.
ONNXTRAIN_OP(RoiAlign, kOnnxDomain, 10).inputs(3).outputs(1).shape(roi_align_shape)
    .gradient_not_implemented("no rule yet: needs a RoiAlignGrad scatter kernel")
    .cpu(roi_align_kernel);
ONNXTRAIN_OP(RoiAlign, kOnnxDomain, 16).inputs(3).outputs(1).shape(roi_align_shape)
    .gradient_not_implemented("no rule yet: needs a RoiAlignGrad scatter kernel")
    .cpu(roi_align_kernel);

}  // namespace onnxtrain

// ConvTranspose (1-d/2-d/3-d; group, strides, dilations, pads, output_padding, output_shape,
// auto_pad, bias). fp32 through the backend's transposed convolution (backends/cpu/conv.h) when the
// pads are non-negative, or through a matmul and a scatter when the windows tile the output (a
// learned upsampling: kernel == stride); otherwise, and for other float dtypes, the direct
// reference loop.
#include <exception>
#include <vector>

#include "ops/gradient_builder.h"
#include "backends/cpu/conv.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/shape_cache.h"
#include "core/omp_threads.h"
#include "ops/common.h"
#include "ops/conv/conv_reference.h"
#include "ops/conv/conv_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void conv_transpose_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& x = ctx.input_shape(0);
  const auto& w = ctx.input_shape(1);
  if (!x || !w || x->size() < 3 || w->size() != x->size()) {
    ctx.set_output(0, dt);
    return;
  }
  std::vector<int64_t> in(x->begin() + 2, x->end()), kernel(w->begin() + 2, w->end());
  WindowGeometry g = transpose_geometry(ctx.node(), in, kernel);
  int64_t group = ctx.node().attr_int("group", 1);
  Shape out{(*x)[0], (*w)[1] < 0 ? -1 : (*w)[1] * group};
  out.insert(out.end(), g.out.begin(), g.out.end());
  ctx.set_output(0, dt, out);
}

class ConvTransposeKernel final : public Kernel {
 public:
  explicit ConvTransposeKernel(const Node& node) : group_(node.attr_int("group", 1)) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    OT_CHECK(x.rank() >= 3 && w.rank() == x.rank(), node.context(),
             "X must be [N, C, spatial...] and W [C, M/group, k...] of the same rank, got ", shape_str(x.shape()),
             " and ", shape_str(w.shape()));
    OT_CHECK(w.dtype() == x.dtype() && (!b || b->dtype() == x.dtype()), node.context(), "X, W and B must share a dtype");
    int64_t n = x.dim(0), c = x.dim(1), m = w.dim(1) * group_;
    OT_CHECK(group_ >= 1 && c == w.dim(0) && c % group_ == 0, node.context(), "channels do not match: X has ", c,
             ", W is ", shape_str(w.shape()), " with group ", group_);
    OT_CHECK(!b || (b->rank() == 1 && b->dim(0) == m), node.context(), "B must be [", m, "], got ", shape_str(b->shape()));
    std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
    WindowGeometry g = transpose_geometry(node, in, kernel);
    Shape out{n, m};
    out.insert(out.end(), g.out.begin(), g.out.end());
    Tensor& y = ctx.output(0, x.dtype(), out);
    if (y.numel() == 0) return;
    bool pads_ok = true;
    for (size_t i = 0; i < in.size(); ++i) pads_ok = pads_ok && g.pad_l[i] >= 0 && g.pad_r[i] >= 0;
    if (x.dtype() == DType::kFloat32 && x.numel() > 0 && group_ == 1 && tiles_output(g, in))
      return run_tiled(node, x, w, b, y, g);
    if (x.dtype() == DType::kFloat32 && pads_ok && x.numel() > 0) {
      cpu::ConvSpec s = conv_spec(x, m, group_, b != nullptr, g);
      s.transposed = true;
      auto key = s.key();
      cpu::ConvPrimitive* conv = cache_.find(key);
      if (!conv) conv = &cache_.insert(key, cpu::ConvPrimitive(s, node.context()));
      conv->run(x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr, y.data<float>());
      return;
    }
    dispatch_float(x.dtype(), [&]<typename T>() {
      conv_transpose_reference<T>(x.data<T>(), w.data<T>(), b ? b->data<T>() : nullptr, y.data<T>(), n, c, m, group_,
                                  in, g);
    });
  }

 private:
  // Whether every output position lies under exactly one window tap: kernel == stride, no
  // dilation, no pads and no output padding (out = in * stride).
  static bool tiles_output(const WindowGeometry& g, const std::vector<int64_t>& in) {
    for (size_t d = 0; d < in.size(); ++d)
      if (g.kernel[d] != g.stride[d] || g.dilation[d] != 1 || g.pad_l[d] != 0 || g.pad_r[d] != 0 ||
          g.out[d] != in[d] * g.stride[d])
        return false;
    return true;
  }

  // Windows that tile the output make the transposed convolution a matmul and a scatter: per
  // image, T = W^T X ([M * taps, positions]: W [C, M, k...] read as [C, M * taps] transposed, X as
  // [C, positions]), then Y[m, i * s + a] = T[(m, a), i] + B[m] over every spatial dim. With as
  // many images as threads each thread takes whole images (its T stays in its L2 for the scatter);
  // otherwise the pool shares each image's product and scatter. oneDNN's deconvolution ran PP-OCR
  // det's 2x2 stride-2 upsamplings at batch 16 (24 -> 24 and 24 -> 1 channels, 59 and 10 M
  // multiply-adds) in 9.3 and 3.9-10.5 ms on two threads (2026-11-27, a loaded machine).
  void run_tiled(const Node& node, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y,
                 const WindowGeometry& g) {
    const size_t nd = g.kernel.size();
    const int64_t images = x.dim(0), c = x.dim(1), m = y.dim(1);
    int64_t taps = 1, positions = 1;
    for (size_t d = 0; d < nd; ++d) taps *= g.kernel[d], positions *= x.dim(2 + int(d));
    const int64_t out_positions = positions * taps;
    cpu::MatmulDims dims;
    dims.a_batch = {1};
    dims.b_batch = {1};
    dims.m = m * taps;
    dims.n = positions;
    dims.k = c;
    dims.trans_a = true;
    const Tiling tiling{x, y, g, b ? b->data<float>() : nullptr};
    const float* x_data = x.data<float>();
    const int threads = omp_get_max_threads();
    if (threads > 1 && images >= threads && !omp_in_parallel()) {
      const cpu::Matmul* product;
      {
        OmpThreadsScope one_thread(1);  // oneDNN sizes its partition when it makes the primitive
        product = &serial_matmuls_.get(dims, node.context());
      }
      buffers_.resize(size_t(threads));
      for (auto& buffer : buffers_) buffer.resize(size_t(dims.m * positions));
      std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
      parallel_for(images, 1, [&](int64_t begin, int64_t end) {
        const int thread = omp_get_thread_num();
        try {
          for (int64_t image = begin; image < end; ++image) {
            product->run(w.data<float>(), x_data + image * c * positions, buffers_[size_t(thread)].data());
            tiling.scatter(buffers_[size_t(thread)].data(), image, 0, m);
          }
        } catch (...) {
          errors[size_t(thread)] = std::current_exception();
        }
      });
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      return;
    }
    const cpu::Matmul& product = matmuls_.get(dims, node.context());
    buffers_.resize(1);
    buffers_[0].resize(size_t(dims.m * positions));
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(out_positions, 1));
    for (int64_t image = 0; image < images; ++image) {
      product.run(w.data<float>(), x_data + image * c * positions, buffers_[0].data());
      parallel_for(m, grain, [&](int64_t begin, int64_t end) { tiling.scatter(buffers_[0].data(), image, begin, end); });
    }
  }

  // Y's channels [m_begin, m_end) of one image from its T.
  struct Tiling {
    const Tensor& x;
    Tensor& y;
    const WindowGeometry& g;
    const float* bias;

    void scatter(const float* t_image, int64_t image, int64_t m_begin, int64_t m_end) const {
      const size_t nd = g.kernel.size();
      const int64_t m = y.dim(1), in_last = x.dim(x.rank() - 1), k_last = g.kernel[nd - 1];
      int64_t taps = 1, positions = 1;
      for (size_t d = 0; d < nd; ++d) taps *= g.kernel[d], positions *= x.dim(2 + int(d));
      const int64_t out_positions = positions * taps, outer_positions = positions / in_last, outer_taps = taps / k_last;
      // The last spatial dim is written a row at a time (contiguous); the dims before it ("outer")
      // are walked through their row-major coordinates.
      for (int64_t channel = m_begin; channel < m_end; ++channel) {
        const float shift = bias ? bias[channel] : 0.0f;
        const float* t_channel = t_image + channel * taps * positions;
        float* y_channel = y.data<float>() + (image * m + channel) * out_positions;
        for (int64_t po = 0; po < outer_positions; ++po) {
          for (int64_t ko = 0; ko < outer_taps; ++ko) {
            // Output row of outer input position po under outer tap ko: the sum over the outer
            // dims of (i_d * s_d + a_d) times that dim's stride in rows.
            int64_t row = 0, stride = 1, p = po, k = ko;
            for (size_t d = nd - 1; d-- > 0;) {
              const int64_t i = p % x.dim(2 + int(d)), a = k % g.kernel[d];
              p /= x.dim(2 + int(d)), k /= g.kernel[d];
              row += (i * g.kernel[d] + a) * stride;
              stride *= y.dim(2 + int(d));
            }
            float* out = y_channel + row * in_last * k_last;
            const float* t = t_channel + ko * k_last * positions + po * in_last;
            switch (k_last) {  // interleaves k_last rows of T; fixed widths vectorise
              case 1: interleave<1>(t, positions, in_last, shift, out); break;
              case 2: interleave<2>(t, positions, in_last, shift, out); break;
              case 3: interleave<3>(t, positions, in_last, shift, out); break;
              case 4: interleave<4>(t, positions, in_last, shift, out); break;
              default:
                for (int64_t j = 0; j < in_last; ++j)
                  for (int64_t a = 0; a < k_last; ++a) out[j * k_last + a] = t[a * positions + j] + shift;
            }
          }
        }
      }
    }

    // out[j * K + a] = t[a * t_stride + j] + shift for j < n, a < K.
    template <int K>
    static void interleave(const float* t, int64_t t_stride, int64_t n, float shift, float* out) {
      for (int64_t j = 0; j < n; ++j)
        for (int a = 0; a < K; ++a) out[j * K + a] = t[a * t_stride + j] + shift;
    }
  };

  int64_t group_;
  cpu::ShapeCache<cpu::ConvPrimitive> cache_;
  cpu::MatmulCache matmuls_, serial_matmuls_;  // on the pool; made for one thread
  std::vector<std::vector<float>> buffers_;     // T of an image per thread, kept between calls
};

// ConvTranspose is the adjoint of a Conv from Y's space to X's (same W, strides, dilations, group;
// pads (pl, pr) with output_padding added back to pr): its gradients are that Conv's forward and
// backward-weights.
void conv_transpose_gradient(GradientBuilder& g) {
  const Node& node = g.node();
  auto sx = g.static_shape(g.x(0)), sw = g.static_shape(g.x(1));
  if (!sx || sx->size() < 3)
    OT_THROW(kNotImplemented, g.context(), "the gradient needs X's rank from shape inference");
  size_t nd = sx->size() - 2;
  std::vector<int64_t> in(sx->begin() + 2, sx->end()), kernel(nd, -1);
  if (sw && sw->size() == sx->size()) kernel.assign(sw->begin() + 2, sw->end());
  WindowGeometry geo = transpose_geometry(node, in, kernel);
  std::vector<int64_t> op = node.attr_ints("output_padding", std::vector<int64_t>(nd, 0));
  if (op.size() != nd) op.assign(nd, 0);
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  bool derived = node.has_attr("output_shape") || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  std::vector<int64_t> pads(2 * nd);
  for (size_t i = 0; i < nd; ++i) {
    if (derived && (in[i] < 0 || kernel[i] < 0))
      OT_THROW(kNotImplemented, g.context(), "the gradient needs static spatial shapes with auto_pad/output_shape");
    pads[i] = geo.pad_l[i];
    pads[nd + i] = geo.pad_r[i] + op[i];
    if (pads[i] < 0 || pads[nd + i] < 0 || op[i] >= geo.stride[i])
      OT_THROW(kNotImplemented, g.context(), "no gradient for negative pads (output_shape larger than the input "
               "implies) or output_padding >= stride");
  }
  GraphBuilder::Attrs conv{{"strides", Attribute::of(geo.stride)}, {"dilations", Attribute::of(geo.dilation)},
                           {"group", Attribute::of(node.attr_int("group", 1))}, {"pads", Attribute::of(pads)}};
  if (g.needs(0)) g.set(0, g.emit("Conv", {g.dy(0), g.x(1)}, conv));
  if (g.needs(1)) {
    GraphBuilder::Attrs a = conv;
    a["compute_dx"] = Attribute::of(int64_t(0));
    g.set(1, g.emit_n("ConvGrad", {g.x(0), g.dy(0), g.x(1)}, 2, a, kOnnxTrainDomain)[1]);
  }
  if (g.has_input(2) && g.needs(2)) {
    std::vector<int64_t> axes{0};
    for (size_t i = 0; i < nd; ++i) axes.push_back(int64_t(i) + 2);
    g.set(2, g.reduce_sum(g.dy(0), axes, false));
  }
}

}  // namespace

// Y = conv_transpose(X, W) + B.  dX = conv(dY, W) (same strides/dilations/group, pads with
// output_padding restored), dW = ConvGrad's weight gradient with dY as input and X as output
// gradient, dB = sum of dY over N and spatial dims
ONNXTRAIN_OP(ConvTranspose, kOnnxDomain, 1).inputs(2, 3).outputs(1).shape(conv_transpose_shape)
    .cpu_kernel<ConvTransposeKernel>().gradient(conv_transpose_gradient);

}  // namespace onnxtrain

#include "backends/cpu/conv.h"

#include <omp.h>

#include <bit>
#include <cstring>
#include <exception>
#include <optional>
#include <unordered_map>

#include "backends/cpu/conv_portable.h"
#include "backends/cpu/dnnl_utils.h"
#include "backends/cpu/portable.h"
#include "core/omp_threads.h"

namespace onnxtrain::cpu {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

dt data_type(const ConvSpec& s, const std::string& context) {
  OT_CHECK(s.dtype == DType::kFloat32 || s.dtype == DType::kBFloat16, context, "oneDNN convolution takes float32 ",
           "or bfloat16, got ", dtype_name(s.dtype));
  return s.dtype == DType::kBFloat16 ? dt::bf16 : dt::f32;
}

}  // namespace

struct ConvPrimitive::Impl {
  std::optional<PortableConv> portable;  // small shapes (portable.h): instead of oneDNN
  std::string context;
  bool bias = false, sum = false, serial = false;
  size_t y_bytes = 0;
  dnnl::memory::desc bias_md;
  dnnl::primitive conv;
  Relayout src, wei, dst;  // plain ONNX layouts <-> the primitive's
  Relayout bias_at;        // the bias, read where it is (never relaid)
  dnnl::primitive activation;  // when set: applied to Y in place after `conv` (not a post-op)
  Relayout dst_in;         // sum: Z into the primitive's dst layout
};

ConvPrimitive::ConvPrimitive(const ConvSpec& s, const std::string& context) : impl_(std::make_shared<Impl>()) {
  Impl& p = *impl_;
  p.context = context;
  p.bias = s.bias;
  p.sum = s.sum;
  p.serial = s.serial;
  OT_CHECK(!s.sum || !s.transposed, context, "a summand is for convolutions only");
  if (portable_conv(s)) {
    p.portable.emplace(s, context);
    return;
  }
  const dt f = data_type(s, context);
  std::optional<OmpThreadsScope> one_thread;
  if (s.serial) one_thread.emplace(1);
  dnnl_guard(context, "create a convolution primitive", [&] {
    auto& eng = dnnl_engine();
    size_t nd = s.kernel.size();
    int64_t n = s.x[0], c = s.x[1], m = s.out_channels, g = s.group;
    dnnl::memory::dims src_dims = to_dims(s.x);
    dnnl::memory::dims dst_dims{n, m};
    dst_dims.insert(dst_dims.end(), s.out.begin(), s.out.end());
    int64_t ksz = 1;
    for (auto v : s.kernel) ksz *= v;
    // oneDNN weights: [G, M/G, C/G, k...] (or [M, C, k...] for one group).
    dnnl::memory::dims wdims, wstrides;
    if (g > 1) wdims = {g, m / g, c / g};
    else wdims = {m, c};
    wdims.insert(wdims.end(), s.kernel.begin(), s.kernel.end());
    wstrides.assign(wdims.size(), 1);
    for (size_t i = wdims.size(); i-- > wdims.size() - nd;)
      wstrides[i] = i + 1 < wdims.size() ? wstrides[i + 1] * wdims[i + 1] : 1;
    size_t o = wdims.size() - nd - 2;  // index of the output-channel dim
    if (!s.transposed) {             // ONNX [M, C/G, k]: plain in this order
      wstrides[o + 1] = ksz;
      wstrides[o] = (c / g) * ksz;
      if (g > 1) wstrides[0] = m / g * (c / g) * ksz;
    } else {                         // ONNX [C, M/G, k] = [G, C/G, M/G, k]
      wstrides[o] = ksz;
      wstrides[o + 1] = (m / g) * ksz;
      if (g > 1) wstrides[0] = (c / g) * (m / g) * ksz;
    }
    auto user_src = s.x_channels_last ? channels_last_md(src_dims, f) : plain_md(src_dims, f);
    auto user_dst = s.y_channels_last ? channels_last_md(dst_dims, f) : plain_md(dst_dims, f);
    auto user_wei = strided_md(wdims, f, wstrides);
    p.bias_md = plain_md({m}, f);
    p.bias_at = Relayout(p.bias_md, p.bias_md, true, true);
    // Output planes of a few positions (a ResNet's last stage: 2x2) over a batch: oneDNN picks its
    // brgemm kernel for any layout, which runs them 1.4-1.6x slower than its direct kernel on
    // nChw16c blocks (16x256x2x2, 3x3: 0.55 vs 0.36 ms on one thread, 2026-11-24); the reorders
    // into and out of the blocks are small next to that.
    int64_t out_positions = 1;
    for (auto v : s.out) out_positions *= v;
    const bool tiny_planes = !s.transposed && nd == 2 && g == 1 && f == dt::f32 && out_positions <= 4 && n >= 4 &&
                             c % 16 == 0 && m % 16 == 0;
    // A depthwise convolution between values in ONNX order (a training graph's, a model with
    // dynamic spatial dims): left to choose, oneDNN reorders to channels last for its brdgmm
    // kernel, which ran MobileNetV2's 17 depthwise layers at batch 16 in 10.1 ms against 4.7 ms
    // for its nChw16c kernel (one thread, 2026-11-27); both reorder in and out.
    const bool depthwise_in_onnx_order = !s.transposed && nd == 2 && g > 1 && g == c && g == m && f == dt::f32 &&
                                         !s.x_channels_last && !s.y_channels_last && c % 16 == 0;
    const tag act_tag = tiny_planes || depthwise_in_onnx_order ? tag::aBcd16b : tag::any;
    auto any_src = dnnl::memory::desc(src_dims, f, act_tag);
    auto any_dst = dnnl::memory::desc(dst_dims, f, act_tag);
    auto any_wei = dnnl::memory::desc(wdims, f, tag::any);
    dnnl::memory::dims strides(s.stride.begin(), s.stride.end()), dil(nd), pl(s.pad_l.begin(), s.pad_l.end()),
        pr(s.pad_r.begin(), s.pad_r.end());
    for (size_t i = 0; i < nd; ++i) dil[i] = s.dilation[i] - 1;
    auto pk = dnnl::prop_kind::forward_inference;
    dnnl::algorithm activation = dnnl::algorithm::eltwise_relu;  // LeakyRelu is relu with a slope
    if (s.activation == ConvActivation::kSigmoid) activation = dnnl::algorithm::eltwise_logistic;
    if (s.activation == ConvActivation::kTanh) activation = dnnl::algorithm::eltwise_tanh;
    if (s.activation == ConvActivation::kClip) activation = dnnl::algorithm::eltwise_clip;
    if (s.activation == ConvActivation::kHardSwish) activation = dnnl::algorithm::eltwise_hardswish;
    // Post-ops: the sum before the activation, act(conv + Z); the activation unless it runs after.
    auto attr_with = [&](bool with_activation) {
      dnnl::primitive_attr attr;
      dnnl::post_ops ops;
      if (s.sum) ops.append_sum(1.0f);
      if (with_activation && s.activation != ConvActivation::kNone)
        ops.append_eltwise(1.0f, activation, s.act_alpha, s.act_beta);
      attr.set_post_ops(ops);
      return attr;
    };
    // A pointwise convolution between values in ONNX order (all of them in models with dynamic
    // spatial dims, PaddleOCR's) is one GEMM per image in that order: oneDNN's GEMM-based kernel
    // runs it there 1.1-2.7x faster than its blocked kernels plus a reorder in and one out
    // (1x48x12x48 -> 24 channels: 9.0 vs 21.0 us; batch 16: 129 vs 346 us, one thread, 2026-11-24).
    // Its activation runs after it as oneDNN's (vectorised) eltwise primitive in place: that kernel
    // applies eltwise post-ops in a scalar pass (1x16x80x80 -> 32 channels: 50 us bare, 131 us with
    // a Relu, 1058 us with a hard-swish), and the blocked kernel with the activation fused ran PP-OCR
    // rec's 16x240x12x40 -> 240 in 6.9 ms against 4.4 ms bare in ONNX order (2026-11-27).
    bool pointwise = !s.transposed && g == 1 && f == dt::f32 && !s.x_channels_last && !s.y_channels_last;
    for (size_t i = 0; i < nd; ++i)
      pointwise = pointwise && s.kernel[i] == 1 && s.stride[i] == 1 && s.dilation[i] == 1 && s.pad_l[i] == 0 &&
                  s.pad_r[i] == 0;
    auto conv_pd = [&](const dnnl::memory::desc& src, const dnnl::memory::desc& dst, const dnnl::primitive_attr& attr) {
      auto d = s.bias ? dnnl::convolution_forward::desc(pk, dnnl::algorithm::convolution_direct, src, any_wei,
                                                        p.bias_md, dst, strides, dil, pl, pr)
                      : dnnl::convolution_forward::desc(pk, dnnl::algorithm::convolution_direct, src, any_wei, dst,
                                                        strides, dil, pl, pr);
      return dnnl::convolution_forward::primitive_desc(d, attr, eng);
    };
    const dnnl::primitive_attr attr = attr_with(true);
    if (!s.transposed) {
      std::optional<dnnl::convolution_forward::primitive_desc> plain;
      if (pointwise) {
        try {
          plain = conv_pd(user_src, user_dst, attr_with(false));
          if (s.activation != ConvActivation::kNone)
            p.activation = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(
                dnnl::eltwise_forward::desc(pk, activation, user_dst, s.act_alpha, s.act_beta), eng));
        } catch (const dnnl::error&) {  // no kernel for these post-ops in ONNX order: the usual path
          plain.reset();
          p.activation = dnnl::primitive();
        }
      }
      dnnl::convolution_forward::primitive_desc pd = plain ? *plain : conv_pd(any_src, any_dst, attr);
      p.src = Relayout(user_src, pd.src_desc(), true, true);
      p.wei = Relayout(user_wei, pd.weights_desc(), true, true);
      p.dst = Relayout(user_dst, pd.dst_desc(), false, true);
      p.y_bytes = user_dst.get_size();
      if (s.sum) p.dst_in = Relayout(user_dst, pd.dst_desc(), true, true);
      p.conv = dnnl::convolution_forward(pd);
    } else {
      auto d = s.bias ? dnnl::deconvolution_forward::desc(pk, dnnl::algorithm::deconvolution_direct, any_src,
                                                          any_wei, p.bias_md, any_dst, strides, dil, pl, pr)
                      : dnnl::deconvolution_forward::desc(pk, dnnl::algorithm::deconvolution_direct, any_src,
                                                          any_wei, any_dst, strides, dil, pl, pr);
      dnnl::deconvolution_forward::primitive_desc pd(d, attr, eng);
      p.src = Relayout(user_src, pd.src_desc(), true, true);
      p.wei = Relayout(user_wei, pd.weights_desc(), true, true);
      p.dst = Relayout(user_dst, pd.dst_desc(), false, true);
      p.conv = dnnl::deconvolution_forward(pd);
    }
  });
}

void ConvPrimitive::run(const void* x, const void* w, const void* bias, void* y, bool w_constant,
                        const void* z) const {
  const Impl& p = *impl_;
  if (p.portable) return p.portable->run(x, w, bias, y, z);
  std::optional<OmpThreadsScope> one_thread;
  if (p.serial) one_thread.emplace(1);  // reorders size their parallel loops when they run
  dnnl_guard(p.context, "run a convolution", [&] {
    auto& strm = dnnl_stream();
    const dnnl::memory dst = p.dst.write(y);
    if (p.sum) {  // the sum post-op adds what dst holds: Z, in the primitive's layout
      OT_CHECK(z != nullptr, p.context, "the convolution's summand is missing");
      if (p.dst_in.needed) {
        execute(p.dst_in.reorder, strm, {{DNNL_ARG_FROM, p.dst_in.user_memory(z).get()}, {DNNL_ARG_TO, dst.get()}});
      } else if (z != y) {
        std::memcpy(y, z, p.y_bytes);
      }
    }
    const dnnl::memory src = p.src.read(x, strm);
    const dnnl::memory wei = w_constant ? p.wei.read_constant(w, strm) : p.wei.read(w, strm);
    if (p.bias) {
      execute(p.conv, strm, {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()},
                             {DNNL_ARG_BIAS, p.bias_at.user_memory(bias).get()}, {DNNL_ARG_DST, dst.get()}});
    } else {
      execute(p.conv, strm, {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_WEIGHTS, wei.get()}, {DNNL_ARG_DST, dst.get()}});
    }
    if (p.activation) execute(p.activation, strm, {{DNNL_ARG_SRC, dst.get()}, {DNNL_ARG_DST, dst.get()}});
    p.dst.finish_write(y, strm);
    strm.wait();
  });
}

namespace {

// Runs a() and b() on two threads at once (or one after the other when only one thread is
// available); an exception from either is rethrown here.
template <typename A, typename B>
void run_pair(A&& a, B&& b) {
  if (omp_get_max_threads() < 2 || omp_in_parallel()) {
    a();
    b();
    return;
  }
  std::exception_ptr errors[2];
#pragma omp parallel num_threads(2)
  {
    int t = omp_get_thread_num();
    try {
      if (t == 0) a();
      else b();
    } catch (...) {
      errors[t] = std::current_exception();
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Whether a convolution's backward-data (`weights` false) or backward-weights pass asks oneDNN
// for Winograd F(4x4, 3x3) instead of its direct kernels: 3x3 windows, stride 1, no dilation, one
// group, fp32, input and output channels multiples of 16 (oneDNN's vector width: 3 -> 32 channels
// on 32x32, backward-weights 0.25 ms direct, 0.74 Winograd), output planes of at least 8x8
// positions for backward-data (4x4 for backward-weights). Training only: inference keeps the direct kernels, and its results ORT's.
// Measured on the ResNet's shapes (batch 16, one thread, Zen 4, 2026-11-27; ms direct / Winograd,
// backward-data and backward-weights): 32 channels on 16x16 0.59 / 0.34 and 0.66 / 0.33; 64 on 8x8
// 0.54 / 0.31 and 0.62 / 0.30; 128 on 4x4 0.46 / 0.50 and 0.67 / 0.33; 256 on 2x2 0.50 / 1.86 and
// 0.82 / 1.38 (a 4x4 tile for 2x2 outputs). Rounding: against float64, relative L2 errors of
// 0.5-1.2e-6 for backward-data (direct: 0.2e-6), 0.4-0.5e-6 for backward-weights (direct
// 0.2-0.8e-6), on those shapes with 32-256 channels.
bool winograd_backward(const ConvSpec& s, bool weights) {
  if (s.transposed || s.group != 1 || s.dtype != DType::kFloat32 || s.kernel.size() != 2 || s.x[1] % 16 != 0 ||
      s.out_channels % 16 != 0)
    return false;
  for (size_t i = 0; i < 2; ++i)
    if (s.kernel[i] != 3 || s.stride[i] != 1 || s.dilation[i] != 1 || s.out[i] < (weights ? 4 : 8)) return false;
  return true;
}

}  // namespace

struct ConvBackwardPrimitive::Impl {
  std::optional<PortableConvBackward> portable;  // small shapes (portable.h): instead of oneDNN
  std::string context;
  bool need_dx = false, need_dw = false, bias = false;
  dnnl::memory::desc bias_md;
  dnnl::primitive bwd_data, bwd_weights;
  // Plain ONNX layouts <-> the layouts each primitive chose. dY is read by both primitives, which
  // usually agree on its layout (then the weights pass reuses the data pass's copy).
  Relayout data_dy, data_w, data_dx, weights_dy, weights_x, weights_dw;
  bool shared_dy = false;
  // On two threads the two primitives are single-threaded and run side by side when both
  // gradients are wanted. oneDNN's multi-threaded backward-weights kernels reduce across threads
  // through spin barriers, which stall for a whole scheduler tick (about 4 ms) whenever the partner thread is descheduled
  // (OMP_WAIT_POLICY=passive on a shared machine); backward-data and backward-weights cost about
  // the same, so running them concurrently keeps both cores busy without any barrier.
  bool concurrent = false;
  // Each primitive's own scratchpad: oneDNN's default (library) scratchpad is one buffer per
  // creating thread, shared by every primitive made there, so two primitives running at once
  // would overwrite each other's.
  dnnl::memory data_scratch, weights_scratch;
};

ConvBackwardPrimitive::ConvBackwardPrimitive(const ConvSpec& s, bool need_dx, bool need_dw, const std::string& context)
    : impl_(std::make_shared<Impl>()) {
  Impl& p = *impl_;
  p.context = context;
  p.need_dx = need_dx;
  p.need_dw = need_dw;
  p.bias = s.bias;
  OT_CHECK(!s.transposed, context, "ConvBackwardPrimitive handles convolutions only");
  if (portable_conv(s)) {
    p.portable.emplace(s, need_dx, need_dw, context);
    return;
  }
  const dt f = data_type(s, context);
  dnnl_guard(context, "create convolution backward primitives", [&] {
    auto& eng = dnnl_engine();
    size_t nd = s.kernel.size();
    int64_t n = s.x[0], c = s.x[1], m = s.out_channels, g = s.group;
    dnnl::memory::dims src_dims = to_dims(s.x), dst_dims{n, m};
    dst_dims.insert(dst_dims.end(), s.out.begin(), s.out.end());
    // ONNX [M, C/G, k...] is plain [G, M/G, C/G, k...] (or [M, C, k...] for one group).
    dnnl::memory::dims wdims = g > 1 ? dnnl::memory::dims{g, m / g, c / g} : dnnl::memory::dims{m, c};
    wdims.insert(wdims.end(), s.kernel.begin(), s.kernel.end());
    auto user_src = plain_md(src_dims, f), user_dst = plain_md(dst_dims, f), user_wei = plain_md(wdims, f);
    auto any_src = dnnl::memory::desc(src_dims, f, tag::any), any_dst = dnnl::memory::desc(dst_dims, f, tag::any),
         any_wei = dnnl::memory::desc(wdims, f, tag::any);
    p.bias_md = plain_md({m}, f);
    dnnl::memory::dims strides(s.stride.begin(), s.stride.end()), dil(nd), pl(s.pad_l.begin(), s.pad_l.end()),
        pr(s.pad_r.begin(), s.pad_r.end());
    for (size_t i = 0; i < nd; ++i) dil[i] = s.dilation[i] - 1;
    // Winograd where it was measured faster (winograd_backward); oneDNN refuses it without
    // AVX-512, and then the direct kernels run.
    const bool wino_data = winograd_backward(s, false), wino_weights = winograd_backward(s, true);
    // Two threads (the machines this is tuned on): backward-weights single-threaded, next to
    // backward-data when both run. More threads: the usual multi-threaded primitives, one after
    // the other (a side-by-side split would leave all but two threads idle).
    int threads = omp_get_max_threads();
    p.concurrent = need_dx && need_dw && threads == 2;
    int weights_threads = threads <= 2 ? 1 : threads;
    auto hint = [&](dnnl::algorithm alg) {
      auto fwd = s.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any_src, any_wei,
                                                          p.bias_md, any_dst, strides, dil, pl, pr)
                        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, any_src, any_wei,
                                                          any_dst, strides, dil, pl, pr);
      return dnnl::convolution_forward::primitive_desc(fwd, eng);
    };
    dnnl::primitive_attr own_scratchpad;
    own_scratchpad.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // The primitive_desc of `make(alg)`: Winograd's when `winograd` and oneDNN has a kernel for
    // it, else the direct one.
    auto with_algorithm = [](bool winograd, auto make) {
      if (winograd) {
        try {
          return make(dnnl::algorithm::convolution_winograd);
        } catch (const dnnl::error&) {  // no Winograd kernel for this CPU or shape
        }
      }
      return make(dnnl::algorithm::convolution_direct);
    };
    if (need_dx) {
      auto pd = [&] {  // single-threaded when it runs next to backward-weights
        OmpThreadsScope scope(p.concurrent ? 1 : threads);
        auto pd = with_algorithm(wino_data, [&](dnnl::algorithm alg) {
          dnnl::convolution_backward_data::desc d(alg, any_src, any_wei, any_dst, strides, dil, pl, pr);
          return dnnl::convolution_backward_data::primitive_desc(d, own_scratchpad, eng, hint(alg));
        });
        p.bwd_data = dnnl::convolution_backward_data(pd);
        p.data_scratch = dnnl::memory(pd.scratchpad_desc(), eng);
        return pd;
      }();
      p.data_dy = Relayout(user_dst, pd.diff_dst_desc(), true);
      p.data_w = Relayout(user_wei, pd.weights_desc(), true);
      p.data_dx = Relayout(user_src, pd.diff_src_desc(), false);
    }
    if (need_dw) {
      auto pd = [&] {
        OmpThreadsScope scope(weights_threads);
        auto pd = with_algorithm(wino_weights, [&](dnnl::algorithm alg) {
          auto d = s.bias ? dnnl::convolution_backward_weights::desc(alg, any_src, any_wei, p.bias_md, any_dst,
                                                                     strides, dil, pl, pr)
                          : dnnl::convolution_backward_weights::desc(alg, any_src, any_wei, any_dst, strides, dil,
                                                                     pl, pr);
          return dnnl::convolution_backward_weights::primitive_desc(d, own_scratchpad, eng, hint(alg));
        });
        p.bwd_weights = dnnl::convolution_backward_weights(pd);
        p.weights_scratch = dnnl::memory(pd.scratchpad_desc(), eng);
        return pd;
      }();
      p.shared_dy = need_dx && pd.diff_dst_desc() == p.data_dy.prim;
      if (!p.shared_dy) p.weights_dy = Relayout(user_dst, pd.diff_dst_desc(), true);
      p.weights_x = Relayout(user_src, pd.src_desc(), true);
      p.weights_dw = Relayout(user_wei, pd.diff_weights_desc(), false);
    }
  });
}

void ConvBackwardPrimitive::run(const void* dy, const void* x, const void* w, void* dx, void* dw, void* db) const {
  const Impl& p = *impl_;
  if (p.portable) return p.portable->run(dy, x, w, dx, dw, db);
  dnnl_guard(p.context, "run a convolution backward", [&] {
    // Reorders into the primitives' layouts on all threads first, then the primitives (side by
    // side when both run), then the reorders out.
    auto& strm = dnnl_stream();
    std::unordered_map<int, dnnl::memory> data_args, weights_args;
    if (p.need_dx) {
      data_args = {{DNNL_ARG_DIFF_DST, p.data_dy.read(dy, strm)},
                   {DNNL_ARG_WEIGHTS, p.data_w.read(w, strm)},
                   {DNNL_ARG_DIFF_SRC, p.data_dx.write(dx)},
                   {DNNL_ARG_SCRATCHPAD, p.data_scratch}};
    }
    if (p.need_dw) {
      weights_args = {{DNNL_ARG_SRC, p.weights_x.read(x, strm)},
                      {DNNL_ARG_DIFF_DST, p.shared_dy ? data_args.at(DNNL_ARG_DIFF_DST) : p.weights_dy.read(dy, strm)},
                      {DNNL_ARG_DIFF_WEIGHTS, p.weights_dw.write(dw)},
                      {DNNL_ARG_SCRATCHPAD, p.weights_scratch}};
      if (p.bias) weights_args.emplace(DNNL_ARG_DIFF_BIAS, dnnl::memory(p.bias_md, dnnl_engine(), db));
    }
    strm.wait();
    auto backward_data = [&] {
      if (!p.need_dx) return;
      auto& s = dnnl_stream();
      p.bwd_data.execute(s, data_args);
      s.wait();
    };
    auto backward_weights = [&] {
      if (!p.need_dw) return;
      auto& s = dnnl_stream();
      p.bwd_weights.execute(s, weights_args);
      s.wait();
    };
    if (p.concurrent) run_pair(backward_data, backward_weights);
    else backward_data(), backward_weights();
    if (p.need_dx) p.data_dx.finish_write(dx, strm);
    if (p.need_dw) p.weights_dw.finish_write(dw, strm);
    strm.wait();
  });
}

}  // namespace onnxtrain::cpu

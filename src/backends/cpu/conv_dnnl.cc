#include "backends/cpu/conv_dnnl.h"

#include <unordered_map>

#include "backends/cpu/dnnl_utils.h"

namespace onnxtrain::cpu {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

std::vector<int64_t> ConvSpec::key() const {
  std::vector<int64_t> k{transposed, out_channels, group, bias, int64_t(x.size())};
  for (const auto* v : {&x, &kernel, &stride, &dilation, &pad_l, &pad_r, &out}) k.insert(k.end(), v->begin(), v->end());
  return k;
}

struct DnnlConv::Impl {
  std::string context;
  bool bias = false;
  dnnl::memory::desc user_src, user_wei, user_dst, bias_md;
  dnnl::memory::desc src_md, wei_md, dst_md;
  dnnl::primitive conv;
  // Reorders between the plain ONNX layouts and the primitive's, with their buffers.
  bool src_reorder = false, wei_reorder = false, dst_reorder = false;
  dnnl::reorder r_src, r_wei, r_dst;
  mutable dnnl::memory m_src, m_wei, m_dst;
};

DnnlConv::DnnlConv(const ConvSpec& s, const std::string& context) : impl_(std::make_shared<Impl>()) {
  Impl& p = *impl_;
  p.context = context;
  p.bias = s.bias;
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
    p.user_src = plain_md(src_dims, dt::f32);
    p.user_dst = plain_md(dst_dims, dt::f32);
    p.user_wei = strided_md(wdims, dt::f32, wstrides);
    p.bias_md = plain_md({m}, dt::f32);
    auto any_src = dnnl::memory::desc(src_dims, dt::f32, tag::any);
    auto any_dst = dnnl::memory::desc(dst_dims, dt::f32, tag::any);
    auto any_wei = dnnl::memory::desc(wdims, dt::f32, tag::any);
    dnnl::memory::dims strides(s.stride.begin(), s.stride.end()), dil(nd), pl(s.pad_l.begin(), s.pad_l.end()),
        pr(s.pad_r.begin(), s.pad_r.end());
    for (size_t i = 0; i < nd; ++i) dil[i] = s.dilation[i] - 1;
    auto pk = dnnl::prop_kind::forward_inference;
    if (!s.transposed) {
      auto d = s.bias ? dnnl::convolution_forward::desc(pk, dnnl::algorithm::convolution_direct, any_src, any_wei,
                                                        p.bias_md, any_dst, strides, dil, pl, pr)
                      : dnnl::convolution_forward::desc(pk, dnnl::algorithm::convolution_direct, any_src, any_wei,
                                                        any_dst, strides, dil, pl, pr);
      dnnl::convolution_forward::primitive_desc pd(d, eng);
      p.src_md = pd.src_desc();
      p.wei_md = pd.weights_desc();
      p.dst_md = pd.dst_desc();
      p.conv = dnnl::convolution_forward(pd);
    } else {
      auto d = s.bias ? dnnl::deconvolution_forward::desc(pk, dnnl::algorithm::deconvolution_direct, any_src,
                                                          any_wei, p.bias_md, any_dst, strides, dil, pl, pr)
                      : dnnl::deconvolution_forward::desc(pk, dnnl::algorithm::deconvolution_direct, any_src,
                                                          any_wei, any_dst, strides, dil, pl, pr);
      dnnl::deconvolution_forward::primitive_desc pd(d, eng);
      p.src_md = pd.src_desc();
      p.wei_md = pd.weights_desc();
      p.dst_md = pd.dst_desc();
      p.conv = dnnl::deconvolution_forward(pd);
    }
    if (p.src_md != p.user_src) {
      p.src_reorder = true;
      p.m_src = dnnl::memory(p.src_md, eng);
      p.r_src = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p.user_src, eng, p.src_md));
    }
    if (p.wei_md != p.user_wei) {
      p.wei_reorder = true;
      p.m_wei = dnnl::memory(p.wei_md, eng);
      p.r_wei = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p.user_wei, eng, p.wei_md));
    }
    if (p.dst_md != p.user_dst) {
      p.dst_reorder = true;
      p.m_dst = dnnl::memory(p.dst_md, eng);
      p.r_dst = dnnl::reorder(dnnl::reorder::primitive_desc(eng, p.dst_md, eng, p.user_dst));
    }
  });
}

void DnnlConv::run(const float* x, const float* w, const float* bias, float* y) const {
  const Impl& p = *impl_;
  dnnl_guard(p.context, "run a convolution", [&] {
    auto& eng = dnnl_engine();
    auto& strm = dnnl_stream();
    dnnl::memory ux(p.user_src, eng, const_cast<float*>(x));
    dnnl::memory uw(p.user_wei, eng, const_cast<float*>(w));
    dnnl::memory uy(p.user_dst, eng, y);
    if (p.src_reorder) p.r_src.execute(strm, ux, p.m_src);
    if (p.wei_reorder) p.r_wei.execute(strm, uw, p.m_wei);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, p.src_reorder ? p.m_src : ux},
                                               {DNNL_ARG_WEIGHTS, p.wei_reorder ? p.m_wei : uw},
                                               {DNNL_ARG_DST, p.dst_reorder ? p.m_dst : uy}};
    if (p.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias_md, eng, const_cast<float*>(bias)));
    p.conv.execute(strm, args);
    if (p.dst_reorder) p.r_dst.execute(strm, p.m_dst, uy);
    strm.wait();
  });
}

struct DnnlConvBackward::Impl {
  std::string context;
  bool need_dx = false, need_dw = false, bias = false;
  dnnl::memory::desc src, wei, dst, bias_md;
  dnnl::primitive bwd_data, bwd_weights;
};

DnnlConvBackward::DnnlConvBackward(const ConvSpec& s, bool need_dx, bool need_dw, const std::string& context)
    : impl_(std::make_shared<Impl>()) {
  Impl& p = *impl_;
  p.context = context;
  p.need_dx = need_dx;
  p.need_dw = need_dw;
  p.bias = s.bias;
  OT_CHECK(!s.transposed, context, "DnnlConvBackward handles convolutions only");
  dnnl_guard(context, "create convolution backward primitives", [&] {
    auto& eng = dnnl_engine();
    size_t nd = s.kernel.size();
    int64_t n = s.x[0], c = s.x[1], m = s.out_channels, g = s.group;
    dnnl::memory::dims dst_dims{n, m};
    dst_dims.insert(dst_dims.end(), s.out.begin(), s.out.end());
    // ONNX [M, C/G, k...] is plain [G, M/G, C/G, k...] (or [M, C, k...] for one group).
    dnnl::memory::dims wdims = g > 1 ? dnnl::memory::dims{g, m / g, c / g} : dnnl::memory::dims{m, c};
    wdims.insert(wdims.end(), s.kernel.begin(), s.kernel.end());
    p.src = plain_md(to_dims(s.x), dt::f32);
    p.dst = plain_md(dst_dims, dt::f32);
    p.wei = plain_md(wdims, dt::f32);
    p.bias_md = plain_md({m}, dt::f32);
    dnnl::memory::dims strides(s.stride.begin(), s.stride.end()), dil(nd), pl(s.pad_l.begin(), s.pad_l.end()),
        pr(s.pad_r.begin(), s.pad_r.end());
    for (size_t i = 0; i < nd; ++i) dil[i] = s.dilation[i] - 1;
    auto alg = dnnl::algorithm::convolution_direct;
    auto fwd = s.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, p.src, p.wei,
                                                        p.bias_md, p.dst, strides, dil, pl, pr)
                      : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, p.src, p.wei, p.dst,
                                                        strides, dil, pl, pr);
    dnnl::convolution_forward::primitive_desc hint(fwd, eng);
    if (need_dx) {
      dnnl::convolution_backward_data::desc d(alg, p.src, p.wei, p.dst, strides, dil, pl, pr);
      p.bwd_data = dnnl::convolution_backward_data(dnnl::convolution_backward_data::primitive_desc(d, eng, hint));
    }
    if (need_dw) {
      auto d = s.bias ? dnnl::convolution_backward_weights::desc(alg, p.src, p.wei, p.bias_md, p.dst, strides, dil,
                                                                 pl, pr)
                      : dnnl::convolution_backward_weights::desc(alg, p.src, p.wei, p.dst, strides, dil, pl, pr);
      p.bwd_weights =
          dnnl::convolution_backward_weights(dnnl::convolution_backward_weights::primitive_desc(d, eng, hint));
    }
  });
}

void DnnlConvBackward::run(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db) const {
  const Impl& p = *impl_;
  dnnl_guard(p.context, "run a convolution backward", [&] {
    auto& eng = dnnl_engine();
    auto& strm = dnnl_stream();
    dnnl::memory mdy(p.dst, eng, const_cast<float*>(dy));
    if (p.need_dx) {
      p.bwd_data.execute(strm, {{DNNL_ARG_DIFF_DST, mdy},
                                {DNNL_ARG_WEIGHTS, dnnl::memory(p.wei, eng, const_cast<float*>(w))},
                                {DNNL_ARG_DIFF_SRC, dnnl::memory(p.src, eng, dx)}});
    }
    if (p.need_dw) {
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(p.src, eng, const_cast<float*>(x))},
                                                 {DNNL_ARG_DIFF_DST, mdy},
                                                 {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(p.wei, eng, dw)}};
      if (p.bias) args.emplace(DNNL_ARG_DIFF_BIAS, dnnl::memory(p.bias_md, eng, db));
      p.bwd_weights.execute(strm, args);
    }
    strm.wait();
  });
}

}  // namespace onnxtrain::cpu

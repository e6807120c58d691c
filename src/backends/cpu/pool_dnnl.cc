#include "backends/cpu/pool.h"

#include <algorithm>
#include <unordered_map>

#include "backends/cpu/dnnl_utils.h"
#include "backends/cpu/pool_loops.h"
#include "backends/cpu/portable.h"

namespace onnxtrain::cpu {

using dt = dnnl::memory::data_type;

struct PoolPrimitive::Impl {
  std::optional<LoopPool> portable;  // small pools (portable.h): instead of oneDNN
  std::string context;
  dnnl::memory::desc src_md, dst_md;
  dnnl::pooling_v2_forward forward;            // forward_inference
  // Backward only: dX from dY; max pooling also reruns the forward in training mode for its
  // workspace (the argmax of every window), into `y_scratch`.
  dnnl::pooling_v2_forward forward_training;
  dnnl::pooling_v2_backward backward;
  dnnl::memory workspace, y_scratch;
};

std::optional<PoolPrimitive> PoolPrimitive::make(const PoolSpec& s, bool backward, const std::string& context) {
  if (portable_pool(s)) {
    if (std::optional<LoopPool> loops = LoopPool::make(s)) {
      PoolPrimitive pool;
      pool.impl_ = std::make_shared<Impl>();
      pool.impl_->portable = std::move(loops);
      return pool;
    }
  }
  size_t nd = s.kernel.size();
  if (nd < 1 || nd > 3 || s.x.size() != nd + 2) return std::nullopt;
  // oneDNN derives out = floor((in + pl + pr - ek) / s) + 1, so ceil mode becomes extra right pad.
  dnnl::memory::dims kernel(s.kernel.begin(), s.kernel.end()), strides(s.stride.begin(), s.stride.end()),
      dil(nd), pl(s.pad_l.begin(), s.pad_l.end()), pr(nd);
  for (size_t i = 0; i < nd; ++i) {
    int64_t in = s.x[i + 2], ek = (s.kernel[i] - 1) * s.dilation[i] + 1;
    int64_t reach = (s.out[i] - 1) * s.stride[i] + ek - in - s.pad_l[i];  // pad the last window needs
    if (in < 1 || s.out[i] < 1 || s.pad_l[i] >= ek || reach >= ek) return std::nullopt;  // an all-pad window
    if (!s.max && s.count_include_pad && reach > s.pad_r[i]) return std::nullopt;  // ONNX counts fewer taps
    dil[i] = s.dilation[i] - 1;
    pr[i] = std::max<int64_t>(reach, 0);
  }
  PoolPrimitive pool;
  pool.impl_ = std::make_shared<Impl>();
  Impl& p = *pool.impl_;
  p.context = context;
  dnnl::memory::dims dst_dims{s.x[0], s.x[1]};
  dst_dims.insert(dst_dims.end(), s.out.begin(), s.out.end());
  OT_CHECK(s.dtype == DType::kFloat32 || s.dtype == DType::kBFloat16, context, "oneDNN pooling takes float32 or ",
           "bfloat16, got ", dtype_name(s.dtype));
  const dt data = s.dtype == DType::kBFloat16 ? dt::bf16 : dt::f32;
  p.src_md = s.channels_last ? channels_last_md(to_dims(s.x), data) : plain_md(to_dims(s.x), data);
  p.dst_md = s.channels_last ? channels_last_md(dst_dims, data) : plain_md(dst_dims, data);
  auto alg = s.max ? dnnl::algorithm::pooling_max
                   : s.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                         : dnnl::algorithm::pooling_avg_exclude_padding;
  auto& eng = dnnl_engine();
  try {
    auto fwd_desc = [&](dnnl::prop_kind pk) {
      return dnnl::pooling_v2_forward::desc(pk, alg, p.src_md, p.dst_md, strides, kernel, dil, pl, pr);
    };
    if (!backward) {
      p.forward = dnnl::pooling_v2_forward({fwd_desc(dnnl::prop_kind::forward_inference), eng});
      return pool;
    }
    dnnl::pooling_v2_forward::primitive_desc hint(fwd_desc(dnnl::prop_kind::forward_training), eng);
    dnnl::pooling_v2_backward::primitive_desc bpd({alg, p.src_md, p.dst_md, strides, kernel, dil, pl, pr}, eng, hint);
    p.backward = dnnl::pooling_v2_backward(bpd);
    if (s.max) {
      p.forward_training = dnnl::pooling_v2_forward(hint);
      p.workspace = dnnl::memory(hint.workspace_desc(), eng);
      p.y_scratch = dnnl::memory(p.dst_md, eng);
    }
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return std::nullopt;  // the generic loop handles it
    throw_dnnl_error(e, context, "create a pooling primitive");
  }
  return pool;
}

void PoolPrimitive::forward(const void* x, void* y) const {
  const Impl& p = *impl_;
  if (p.portable) return p.portable->forward(static_cast<const float*>(x), static_cast<float*>(y));
  dnnl_guard(p.context, "run a pooling", [&] {
    auto& strm = dnnl_stream();
    auto& eng = dnnl_engine();
    p.forward.execute(strm, {{DNNL_ARG_SRC, dnnl::memory(p.src_md, eng, const_cast<void*>(x))},
                             {DNNL_ARG_DST, dnnl::memory(p.dst_md, eng, y)}});
    strm.wait();
  });
}

void PoolPrimitive::backward(const void* dy, const void* x, void* dx) const {
  const Impl& p = *impl_;
  if (p.portable)
    return p.portable->backward(static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<float*>(dx));
  dnnl_guard(p.context, "run a pooling backward", [&] {
    auto& strm = dnnl_stream();
    auto& eng = dnnl_engine();
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, dnnl::memory(p.dst_md, eng, const_cast<void*>(dy))},
                                               {DNNL_ARG_DIFF_SRC, dnnl::memory(p.src_md, eng, dx)}};
    if (p.workspace) {
      p.forward_training.execute(strm, {{DNNL_ARG_SRC, dnnl::memory(p.src_md, eng, const_cast<void*>(x))},
                                        {DNNL_ARG_DST, p.y_scratch},
                                        {DNNL_ARG_WORKSPACE, p.workspace}});
      args.emplace(DNNL_ARG_WORKSPACE, p.workspace);
    }
    p.backward.execute(strm, args);
    strm.wait();
  });
}

}  // namespace onnxtrain::cpu

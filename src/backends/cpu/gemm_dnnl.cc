// Matmul through oneDNN's matmul primitive (the full build).
#include "backends/cpu/gemm.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <unordered_map>

#include "backends/cpu/dnnl_utils.h"
#include "backends/cpu/gemm_blocked.h"
#include "backends/cpu/portable.h"

namespace onnxtrain::cpu {

using dt = dnnl::memory::data_type;

struct Matmul::Impl {
  std::optional<BlockedMatmul> portable;  // small products (portable.h): instead of oneDNN
  MatmulDims dims;
  // What the primitive computes: the batch may be folded into M, or looped over.
  dnnl::memory::desc a_md, b_md, c_md, bias_md;
  dnnl::matmul prim;
  Relayout packed_b;  // constant B in the primitive's layout (needed only when b_constant)
  dnnl::memory::desc scratch_md;  // what the primitive needs as scratchpad (user mode: see run)
  // Batch loop when oneDNN cannot broadcast these batch dims itself: offsets per call.
  std::vector<int64_t> a_off, b_off, c_off;
  std::string context;
};

namespace {

// Strides of a [batch..., r, c] operand stored row-major as [batch..., r, c] or, transposed,
// as [batch..., c, r]; broadcast (size-1) batch dims get stride 0.
dnnl::memory::dims operand_strides(const Shape& batch, int64_t r, int64_t c, bool trans) {
  size_t rank = batch.size();
  dnnl::memory::dims s(rank + 2);
  s[rank] = trans ? 1 : c;
  s[rank + 1] = trans ? r : 1;
  int64_t acc = r * c;
  for (size_t i = rank; i-- > 0;) {
    s[i] = acc;
    acc *= batch[i];
  }
  return s;
}

dt dnnl_type(DType d) {
  switch (d) {
    case DType::kFloat32: return dt::f32;
    case DType::kBFloat16: return dt::bf16;
    case DType::kFloat16: return dt::f16;
    default: OT_THROW(kNotImplemented, "oneDNN matmul: no kernel for ", dtype_name(d));
  }
}

dnnl::memory::dims cat(const Shape& batch, int64_t r, int64_t c) {
  dnnl::memory::dims d(batch.begin(), batch.end());
  d.push_back(r);
  d.push_back(c);
  return d;
}

}  // namespace

Matmul::Matmul(const MatmulDims& dims, const std::string& context) : impl_(std::make_shared<Impl>()) {
  Impl& p = *impl_;
  p.dims = dims;
  p.context = context;
  if (portable_matmul(dims)) {
    p.portable.emplace(dims, context);
    return;
  }
  Shape ab = dims.a_batch, bb = dims.b_batch;
  int64_t m = dims.m;
  bool b_broadcast = true;
  for (auto v : bb) b_broadcast = b_broadcast && v == 1;
  // [..., M, K] x [K, N]: one big GEMM with M' = batch * M (A and C are contiguous over it).
  if (b_broadcast && !dims.trans_a && !ab.empty()) {
    m *= numel(ab);
    ab.clear();
    bb.clear();
  }
  Shape ob(ab.size());
  for (size_t i = 0; i < ob.size(); ++i) ob[i] = ab[i] == 1 ? bb[i] : ab[i];

  dnnl::primitive_attr attr;
  // Debian's oneDNN is built with concurrent execution, where every primitive owns its scratchpad
  // for life: a cache of 64 matmuls held about 80 MB (LoRA training of examples/tiny_llm.py). Each
  // calling thread lends one buffer instead (run()).
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (dims.alpha != 1.0f) attr.set_output_scales(0, {dims.alpha});
  if (dims.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(dims.beta);
    attr.set_post_ops(po);
  }
  const dt type = dnnl_type(dims.dtype);
  auto build = [&](const Shape& a_b, const Shape& b_b, const Shape& o_b) {
    p.a_md = strided_md(cat(a_b, m, dims.k), type, operand_strides(a_b, m, dims.k, dims.trans_a));
    p.b_md = strided_md(cat(b_b, dims.k, dims.n), type, operand_strides(b_b, dims.k, dims.n, dims.trans_b));
    p.c_md = plain_md(cat(o_b, m, dims.n), dnnl_type(dims.c_dtype()));
    if (dims.bias) p.bias_md = plain_md(cat(Shape(o_b.size(), 1), 1, dims.n), type);
    // A constant B may take whatever layout the primitive prefers: it is packed once.
    dnnl::memory::desc b_prim =
        dims.b_constant ? dnnl::memory::desc(cat(b_b, dims.k, dims.n), type, dnnl::memory::format_tag::any) : p.b_md;
    auto desc = dims.bias ? dnnl::matmul::desc(p.a_md, b_prim, p.bias_md, p.c_md)
                          : dnnl::matmul::desc(p.a_md, b_prim, p.c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, dnnl_engine());
    p.prim = dnnl::matmul(pd);
    p.scratch_md = pd.scratchpad_desc();
    p.packed_b = Relayout(p.b_md, pd.weights_desc(), true);
  };
  try {
    build(ab, bb, ob);
    return;
  } catch (const dnnl::error&) {
    // fall through: some batch broadcasts are not implemented; loop over the batch instead
  }
  dnnl_guard(context, "create a matmul primitive", [&] { build({}, {}, {}); });
  BatchOffsets offsets = batch_offsets(ab, bb, m, dims.n, dims.k);
  p.a_off = std::move(offsets.a);
  p.b_off = std::move(offsets.b);
  p.c_off = std::move(offsets.c);
}

const MatmulDims& Matmul::dims() const { return impl_->dims; }

void Matmul::run(const void* a, const void* b, void* c, const void* bias) const {
  const Impl& p = *impl_;
  if (p.portable) return p.portable->run(a, b, c, bias);
  dnnl_guard(p.context, "run a matmul", [&] {
    auto& eng = dnnl_engine();
    auto& strm = dnnl_stream();
    const size_t es = dtype_size(p.dims.dtype), c_es = dtype_size(p.dims.c_dtype());
    // The calling thread's scratchpad, grown to the largest primitive it has run (kept: reused).
    thread_local std::unique_ptr<char, decltype(&std::free)> scratch(nullptr, &std::free);
    thread_local size_t scratch_bytes = 0;
    const size_t need = p.scratch_md.get_size();
    if (need > scratch_bytes) {
      const size_t bytes = (need + 4095) / 4096 * 4096;
      scratch.reset(static_cast<char*>(std::aligned_alloc(64, bytes)));
      OT_CHECK(scratch, p.context, "out of memory allocating a ", bytes, "-byte matmul scratchpad");
      scratch_bytes = bytes;
    }
    auto exec = [&](const char* ap, const char* bp, char* cp) {
      std::unordered_map<int, dnnl::memory> args{
          {DNNL_ARG_SRC, dnnl::memory(p.a_md, eng, const_cast<char*>(ap))},
          {DNNL_ARG_WEIGHTS, p.dims.b_constant ? p.packed_b.read_constant(bp, strm) : p.packed_b.read(bp, strm)},
          {DNNL_ARG_DST, dnnl::memory(p.c_md, eng, cp)}};
      if (p.dims.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p.bias_md, eng, const_cast<void*>(bias)));
      if (need) args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratch_md, eng, scratch.get()));
      p.prim.execute(strm, args);
    };
    const char* ab = static_cast<const char*>(a);
    const char* bb = static_cast<const char*>(b);
    char* cb = static_cast<char*>(c);
    if (p.a_off.empty()) {
      exec(ab, bb, cb);
    } else {
      for (size_t i = 0; i < p.a_off.size(); ++i)
        exec(ab + p.a_off[i] * es, bb + p.b_off[i] * es, cb + p.c_off[i] * c_es);
    }
    strm.wait();
  });
}

bool matmul_native(DType dtype) {
  auto probe = [](dt type) {
    try {
      dnnl::memory::desc md({16, 16}, type, dnnl::memory::format_tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), dnnl_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  };
  switch (dtype) {
    case DType::kFloat32: return true;
    case DType::kBFloat16: { static const bool ok = probe(dt::bf16); return ok; }
    case DType::kFloat16: { static const bool ok = probe(dt::f16); return ok; }
    default: return false;
  }
}

namespace {

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other (" + std::to_string(int(isa)) + ")";
  }
}

}  // namespace

std::string matmul_isa() { return isa_name(dnnl::get_effective_cpu_isa()); }

}  // namespace onnxtrain::cpu

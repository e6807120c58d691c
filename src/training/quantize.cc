#include "training/quantize.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "onnx/model_io.h"
#include "ops/contrib/nbits_layout.h"

namespace onnxtrain {

namespace {

void check_options(const QuantizeOptions& o) {
  OT_CHECK(o.bits == 2 || o.bits == 4 || o.bits == 8, "quantize: bits must be 2, 4 or 8, got ", o.bits);
  OT_CHECK(o.block_size >= 16 && (o.block_size & (o.block_size - 1)) == 0,
           "quantize: block_size must be a power of 2 and >= 16, got ", o.block_size);
}

}  // namespace

// Per block of W's row n: asymmetric maps [min(w, 0), max(w, 0)] onto [0, 2^bits - 1] with an
// integer zero point; symmetric maps the value of largest magnitude m to q = 0 with scale
// m / -2^(bits-1) and the implied zero point 2^(bits-1) (as ONNX Runtime's quantizer does).
QuantizedWeight quantize_weight(const float* w, int64_t n, int64_t k, const QuantizeOptions& o) {
  check_options(o);
  nbits::Layout l{k, n, o.bits, o.block_size};
  const int64_t kb = l.k_blocks(), bs = l.block_size, qmax = l.max_q();
  QuantizedWeight out;
  out.blob = Tensor::zeros(DType::kUint8, {n, kb, l.blob_bytes()});
  out.scales = Tensor::zeros(DType::kFloat32, {n, kb});
  if (!o.symmetric) out.zero_points = Tensor::zeros(DType::kUint8, {n * l.zp_row_bytes()});
  uint8_t* pb = out.blob.data<uint8_t>();
  float* ps = out.scales.data<float>();
  uint8_t* pz = o.symmetric ? nullptr : out.zero_points.data<uint8_t>();
  double err2 = 0, norm2 = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const float* src = w + r * k + b * bs;
      const int64_t cnt = std::min(bs, k - b * bs);
      float scale, zp;
      if (o.symmetric) {
        float m = 0;
        for (int64_t i = 0; i < cnt; ++i)
          if (std::fabs(src[i]) > std::fabs(m)) m = src[i];
        scale = m / -float(l.default_zero_point());
        zp = float(l.default_zero_point());
      } else {
        float lo = 0, hi = 0;
        for (int64_t i = 0; i < cnt; ++i) lo = std::min(lo, src[i]), hi = std::max(hi, src[i]);
        scale = (hi - lo) / float(qmax);
        zp = scale != 0 ? std::clamp(std::round(-lo / scale), 0.0f, float(qmax)) : 0.0f;
        nbits::put(pz + r * l.zp_row_bytes(), b, o.bits, int64_t(zp));
      }
      if (scale == 0) scale = 1;  // an all-zero block: q = zp reproduces it exactly
      ps[r * kb + b] = scale;
      uint8_t* blob = pb + (r * kb + b) * l.blob_bytes();
      for (int64_t i = 0; i < cnt; ++i) {
        int64_t q = int64_t(std::clamp(std::round(src[i] / scale + zp), 0.0f, float(qmax)));
        nbits::put(blob, i, o.bits, q);
        double d = (double(q) - zp) * scale - src[i];
        err2 += d * d;
        norm2 += double(src[i]) * src[i];
      }
      for (int64_t i = cnt; i < bs; ++i) nbits::put(blob, i, o.bits, int64_t(zp));  // padding dequantizes to 0
    }
  out.relative_error = norm2 > 0 ? std::sqrt(err2 / norm2) : 0.0;
  return out;
}

QuantizeReport quantize_model(Model& model, const QuantizeOptions& o) {
  check_options(o);
  Graph& g = model.graph;
  QuantizeReport report;
  auto uses = g.use_counts();
  std::set<std::string> replaced;
  auto skip = [&](const Node& n, const std::string& why) { report.skipped.push_back(n.name + ": " + why); };
  auto producers = g.producers();
  std::set<std::string> dead_transposes;
  for (Node& node : g.nodes) {
    bool gemm = node.op_type == "Gemm" && node.domain.empty();
    if (!(node.op_type == "MatMul" && node.domain.empty()) && !gemm) continue;
    if (node.inputs.size() < 2) continue;
    // MatMul(x, Transpose(W)) is how exporters write a Linear without bias: W is [N, K] then.
    std::string through;
    if (!gemm && !g.is_initializer(node.inputs[1])) {
      auto it = producers.find(node.inputs[1]);
      if (it == producers.end()) continue;
      const Node& t = g.nodes[it->second];
      if (t.op_type != "Transpose" || !t.domain.empty() || t.attr_ints("perm", {1, 0}) != std::vector<int64_t>{1, 0} ||
          !g.is_initializer(t.inputs[0]) || g.initializers.at(t.inputs[0]).rank() != 2)
        continue;
      through = node.inputs[1];
    }
    if (through.empty() && !g.is_initializer(node.inputs[1])) continue;  // activation x activation
    const std::string wname = through.empty() ? node.inputs[1] : g.nodes[producers.at(through)].inputs[0];
    const Tensor& w = g.initializers.at(wname);
    bool excluded = false;
    for (const auto& p : o.exclude) excluded = excluded || name_matches(node.name, p) || name_matches(wname, p);
    if (excluded) { skip(node, "excluded"); continue; }
    if (w.dtype() != DType::kFloat32 || w.rank() != 2) { skip(node, "weight is not a 2-D float32 initializer"); continue; }
    bool trans_b = !through.empty();
    std::string bias;
    if (gemm) {
      if (node.attr_int("transA", 0) != 0 || node.attr_float("alpha", 1.0f) != 1.0f ||
          (node.has_input(2) && node.attr_float("beta", 1.0f) != 1.0f)) { skip(node, "Gemm with transA/alpha/beta"); continue; }
      trans_b = node.attr_int("transB", 0) != 0;
      if (node.has_input(2)) {
        auto it = g.initializers.find(node.inputs[2]);
        int64_t nn = trans_b ? w.dim(0) : w.dim(1);
        if (it == g.initializers.end() || it->second.numel() != nn || it->second.rank() != 1 ||
            it->second.dtype() != DType::kFloat32) { skip(node, "Gemm bias is not a [N] float32 initializer"); continue; }
        bias = node.inputs[2];
      }
    }
    const int64_t k = trans_b ? w.dim(1) : w.dim(0), n = trans_b ? w.dim(0) : w.dim(1);
    std::vector<float> wt(size_t(n * k));  // W as [N, K]
    const float* pw = w.data<float>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) wt[size_t(r * k + c)] = trans_b ? pw[r * k + c] : pw[c * n + r];
    QuantizedWeight q = quantize_weight(wt.data(), n, k, o);
    std::string base = wname + "_Q" + std::to_string(o.bits);
    std::string bn = g.unique_name(base), sn = g.unique_name(base + "_scales");
    g.initializers[bn] = q.blob;
    g.initializers[sn] = q.scales;
    std::vector<std::string> ins{node.inputs[0], bn, sn};
    if (!o.symmetric) {
      std::string zn = g.unique_name(base + "_zero_points");
      g.initializers[zn] = q.zero_points;
      ins.push_back(zn);
    }
    if (!bias.empty()) {
      ins.resize(5);  // zero_points may be empty, g_idx always is
      ins.push_back(bias);
    }
    report.weight_bytes_before += int64_t(w.nbytes());
    report.weight_bytes_after += int64_t(q.blob.nbytes() + q.scales.nbytes() + (q.zero_points.defined() ? q.zero_points.nbytes() : 0));
    report.layers.push_back({node.name, wname, k, n, q.relative_error});
    if (!through.empty()) {
      if (--uses[through] == 0) {
        dead_transposes.insert(through);
        if (--uses[wname] == 0) replaced.insert(wname);
      }
    } else if (--uses[wname] == 0) {
      replaced.insert(wname);
    }
    node.op_type = "MatMulNBits";
    node.domain = "com.microsoft";
    node.inputs = ins;
    node.attributes = {{"K", Attribute::of(k)}, {"N", Attribute::of(n)}, {"bits", Attribute::of(int64_t(o.bits))},
                       {"block_size", Attribute::of(int64_t(o.block_size))}};
  }
  for (const auto& name : replaced) g.initializers.erase(name);
  std::vector<Node> kept;
  for (auto& n : g.nodes)
    if (!(n.op_type == "Transpose" && n.outputs.size() == 1 && dead_transposes.count(n.outputs[0]))) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
  if (!report.layers.empty()) model.opsets["com.microsoft"] = std::max<int64_t>(model.opsets["com.microsoft"], 1);
  return report;
}

std::string QuantizeReport::table() const {
  std::ostringstream s;
  s << "layer                                              K      N   rel.error\n";
  double worst = 0;
  for (const auto& l : layers) {
    std::string name = l.node.empty() ? l.weight : l.node;
    if (name.size() > 46) name = "..." + name.substr(name.size() - 43);
    char line[160];
    std::snprintf(line, sizeof line, "%-46s %6lld %6lld   %.5f\n", name.c_str(), (long long)l.k, (long long)l.n,
                  l.relative_error);
    s << line;
    worst = std::max(worst, l.relative_error);
  }
  for (const auto& why : skipped) s << "kept fp32: " << why << "\n";
  char tail[200];
  std::snprintf(tail, sizeof tail, "%zu layers quantized, weights %.2f MB -> %.2f MB, worst relative error %.5f\n",
                layers.size(), weight_bytes_before / 1e6, weight_bytes_after / 1e6, worst);
  s << tail;
  return s.str();
}

QuantizeReport quantize(const std::string& input, const std::string& output, const QuantizeOptions& options) {
  check_options(options);
  Model m = load_model(input);
  QuantizeReport r = quantize_model(m, options);
  save_model(m, output);
  return r;
}

}  // namespace onnxtrain

// Adding LoRA adapters to a model: artifact generation's half of LoRA (generate_artifacts). It is
// apart from lora.cc's runtime half (reading, merging and exporting adapters) so that the minimal
// runtime, which runs prepared artifacts, leaves it out.
#include "training/lora.h"

#include <cmath>
#include <random>

#include "onnxtrain/training.h"
#include "ops/contrib/nbits_layout.h"
#include "training/json.h"
#include "training/quantize.h"

namespace onnxtrain {
namespace {

constexpr const char* kWhere = "LoRA: ";

struct Candidate {
  size_t node;
  std::string module, weight;
  int64_t in, out;
};

// "/model/layers.0/attn/q_proj/MatMul" -> "model.layers.0.attn.q_proj"; "fc1.weight" -> "fc1".
// Exporters' node paths ("/a/b/MatMul") win over weight names, which quantization renames.
std::string module_path(const Node& n, const std::string& weight) {
  const std::string suffix = ".weight";
  if ((n.name.empty() || n.name[0] != '/') && weight.size() > suffix.size() &&
      weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight.substr(0, weight.size() - suffix.size());
  std::string s = n.name.empty() ? weight : n.name;
  while (!s.empty() && s[0] == '/') s.erase(0, 1);
  if (auto slash = s.rfind('/'); slash != std::string::npos) {
    std::string last = s.substr(slash + 1);
    if (last.rfind("MatMul", 0) == 0 || last.rfind("Gemm", 0) == 0) s = s.substr(0, slash);
  }
  for (char& c : s)
    if (c == '/') c = '.';
  return s;
}

std::vector<Candidate> candidates(const Model& model) {
  const Graph& g = model.graph;
  std::vector<Candidate> out;
  auto producers = g.producers();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.inputs.size() < 2) continue;
    if (!g.is_initializer(n.inputs[1])) {
      // MatMul(x, Transpose(W)): how exporters write a Linear without bias (W [N, K]).
      auto it = producers.find(n.inputs[1]);
      if (n.domain.empty() && n.op_type == "MatMul" && it != producers.end()) {
        const Node& t = g.nodes[it->second];
        auto perm = t.attr_ints("perm", {1, 0});
        if (t.op_type == "Transpose" && t.domain.empty() && perm == std::vector<int64_t>{1, 0} &&
            g.is_initializer(t.inputs[0])) {
          const Tensor& w = g.initializers.at(t.inputs[0]);
          if (w.rank() == 2 && is_floating(w.dtype()))
            out.push_back({i, module_path(n, t.inputs[0]), t.inputs[0], w.dim(1), w.dim(0)});
        }
      }
      continue;
    }
    const Tensor& w = g.initializers.at(n.inputs[1]);
    int64_t in = 0, out_dim = 0;
    if (n.domain.empty() && n.op_type == "MatMul" && w.rank() == 2 && is_floating(w.dtype())) {
      in = w.dim(0), out_dim = w.dim(1);
    } else if (n.domain.empty() && n.op_type == "Gemm" && w.rank() == 2 && n.attr_int("transA", 0) == 0) {
      bool tb = n.attr_int("transB", 0) != 0;
      in = tb ? w.dim(1) : w.dim(0), out_dim = tb ? w.dim(0) : w.dim(1);
    } else if (n.domain == "com.microsoft" && n.op_type == "MatMulNBits") {
      in = n.attr_int("K", 0), out_dim = n.attr_int("N", 0);
      // The blobs must agree with K, N, bits and block_size before anything is built on them.
      nbits::Layout l{in, out_dim, n.attr_int("bits", 4), n.attr_int("block_size", 0)};
      OT_CHECK(in > 0 && out_dim > 0 && l.block_size >= 16 && (l.bits == 2 || l.bits == 4 || l.bits == 8), n.context(),
               "expected K, N > 0, bits 2/4/8 and block_size >= 16, got K=", in, " N=", out_dim, " bits=", l.bits,
               " block_size=", l.block_size);
      OT_CHECK(w.dtype() == DType::kUint8 && w.numel() == l.n * l.row_bytes(), n.context(),
               "expected B of uint8 [N, k_blocks, blob_size] = [", l.n, ", ", l.k_blocks(), ", ", l.blob_bytes(),
               "], got ", dtype_name(w.dtype()), " ", shape_str(w.shape()));
      if (n.inputs.size() > 2 && g.is_initializer(n.inputs[2]))
        OT_CHECK(g.initializers.at(n.inputs[2]).numel() == l.n * l.k_blocks(), n.context(), "expected ",
                 l.n * l.k_blocks(), " scales (N x k_blocks), got shape ",
                 shape_str(g.initializers.at(n.inputs[2]).shape()));
    } else {
      continue;
    }
    out.push_back({i, module_path(n, n.inputs[1]), n.inputs[1], in, out_dim});
  }
  return out;
}

// PEFT's target_modules rule: a layer whose module path is `p`, or ends in "." + p ("fc" adapts
// "fc" and "block.fc", never "fc2" or "fc_out"). A pattern with * ? [ is a glob over the module path.
bool matches(const Candidate& c, const std::string& p) {
  if (p.find_first_of("*?[") != std::string::npos) return name_matches(c.module, p);
  const std::string& m = c.module;
  return m == p || (m.size() > p.size() && m.compare(m.size() - p.size(), p.size(), p) == 0 &&
                    m[m.size() - p.size() - 1] == '.');
}

json::Value to_json(const std::vector<LoraAdapter>& adapters, const LoraConfig& cfg, const std::string& hash) {
  json::Value v = json::Value::object();
  v.set("rank", json::Value::integer(cfg.rank));
  v.set("alpha", json::Value::number(cfg.alpha));
  v.set("dropout", json::Value::number(cfg.dropout));
  v.set("base_hash", json::Value::string(hash));
  json::Value list = json::Value::array();
  for (const auto& a : adapters) {
    json::Value e = json::Value::object();
    e.set("node", json::Value::string(a.node));
    e.set("module", json::Value::string(a.module));
    e.set("weight", json::Value::string(a.weight));
    e.set("A", json::Value::string(a.a));
    e.set("B", json::Value::string(a.b));
    e.set("in", json::Value::integer(a.in));
    e.set("out", json::Value::integer(a.out));
    list.push_back(std::move(e));
  }
  v.set("adapters", std::move(list));
  return v;
}

}  // namespace

std::vector<LoraAdapter> apply_lora(Model& model, const LoraConfig& cfg) {
  OT_CHECK(cfg.rank >= 1, kWhere, "rank must be >= 1, got ", cfg.rank);
  OT_CHECK(cfg.alpha > 0 && std::isfinite(cfg.alpha), kWhere, "alpha must be > 0, got ", cfg.alpha);
  OT_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, kWhere, "dropout must be in [0, 1), got ", cfg.dropout);
  OT_CHECK(!model.metadata.count(kMetaLora), kWhere, "the model already has LoRA adapters");
  Graph& g = model.graph;
  const std::vector<Candidate> cands = candidates(model);
  auto candidate_list = [&] {
    std::string s;
    for (size_t i = 0; i < cands.size() && i < 40; ++i) s += (i ? ", " : "") + cands[i].module;
    if (cands.size() > 40) s += ", ... (" + std::to_string(cands.size()) + " in all)";
    return s.empty() ? std::string("(none: the model has no MatMul/Gemm/MatMulNBits with a weight initializer)") : s;
  };
  OT_CHECK(!cfg.target.empty(), kWhere, "target is empty: name the layers to adapt; candidates: ", candidate_list());
  std::vector<bool> chosen(cands.size(), false);
  for (const auto& p : cfg.target) {
    bool any = false;
    for (size_t i = 0; i < cands.size(); ++i)
      if (matches(cands[i], p)) chosen[i] = any = true;
    OT_CHECK(any, kWhere, "target '", p, "' matches no layer; candidates: ", candidate_list());
  }
  if (cfg.dropout > 0) {
    auto it = model.opsets.find("");
    OT_CHECK(it != model.opsets.end() && it->second >= 12, kWhere, "dropout needs ai.onnx opset >= 12");
  }
  const std::string hash = model_base_hash(model);
  std::mt19937_64 rng(cfg.seed);
  std::vector<LoraAdapter> adapters;
  std::map<size_t, std::vector<Node>> after;  // nodes to insert after each target
  const float scale = float(cfg.alpha / double(cfg.rank));
  for (size_t i = 0; i < cands.size(); ++i) {
    if (!chosen[i]) continue;
    const Candidate& c = cands[i];
    Node& n = g.nodes[c.node];
    OT_CHECK(cfg.rank <= std::min(c.in, c.out), kWhere, "rank ", cfg.rank, " exceeds min(K=", c.in, ", N=", c.out,
             ") of layer '", c.module, "' (node '", n.name, "')");
    LoraAdapter a{n.name, c.module, c.weight, c.module + ".lora_A.weight", c.module + ".lora_B.weight", c.in, c.out};
    OT_CHECK(!g.is_initializer(a.a) && !g.is_initializer(a.b), kWhere, "two target layers map to module '", c.module,
             "'; rename one of their weights");
    // A: kaiming_uniform_(a=sqrt(5)) as PEFT, i.e. U(-1/sqrt(K), 1/sqrt(K)); B: zeros.
    Tensor ta = Tensor::empty(DType::kFloat32, {cfg.rank, c.in});
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(float(c.in)), 1.0f / std::sqrt(float(c.in)));
    for (int64_t k = 0; k < ta.numel(); ++k) ta.data<float>()[k] = u(rng);
    g.initializers[a.a] = ta;
    g.initializers[a.b] = Tensor::zeros(DType::kFloat32, {c.out, cfg.rank});
    // y = base(x) + scale (x A^T) B^T
    const std::string x = n.inputs[0], y = n.outputs[0], base = g.unique_name(y + "/lora_base");
    n.outputs[0] = base;
    std::vector<Node>& nodes = after[c.node];
    std::string xin = x;
    if (cfg.dropout > 0) {
      std::string ratio = g.unique_name(c.module + ".lora_dropout_ratio"), mode = g.unique_name(c.module + ".lora_training");
      g.initializers[ratio] = Tensor::scalar<float>(float(cfg.dropout));
      g.initializers[mode] = Tensor::scalar<bool>(true);
      xin = g.unique_name(y + "/lora_dropout");
      nodes.push_back(Node{n.name + "/lora_dropout", "Dropout", "", {x, ratio, mode}, {xin}, {}});
    }
    std::string t = g.unique_name(y + "/lora_xa"), ub = g.unique_name(y + "/lora_xab");
    nodes.push_back(Node{n.name + "/lora_A", "FusedMatMul", kOnnxTrainDomain, {xin, a.a}, {t},
                         {{"transB", Attribute::of(int64_t(1))}}});
    nodes.push_back(Node{n.name + "/lora_B", "FusedMatMul", kOnnxTrainDomain, {t, a.b}, {ub},
                         {{"transB", Attribute::of(int64_t(1))}, {"alpha", Attribute::of(scale)}}});
    nodes.push_back(Node{n.name + "/lora_add", "Add", "", {base, ub}, {y}, {}});
    adapters.push_back(a);
  }
  std::vector<Node> out;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    out.push_back(std::move(g.nodes[i]));
    if (auto it = after.find(i); it != after.end())
      for (auto& n : it->second) out.push_back(std::move(n));
  }
  g.nodes = std::move(out);
  model.opsets[kOnnxTrainDomain] = std::max<int64_t>(model.opsets[kOnnxTrainDomain], 1);
  model.metadata[kMetaLora] = json::dump(to_json(adapters, cfg, hash));
  return adapters;
}

}  // namespace onnxtrain

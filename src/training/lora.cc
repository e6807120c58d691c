#include "training/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <filesystem>
#include <set>

#include "onnx/model_io.h"
#include "onnxtrain/training.h"
#include "training/json.h"
#include "training/safetensors.h"

namespace onnxtrain {
namespace {

constexpr const char* kWhere = "LoRA: ";
const std::string kPeftPrefix = "base_model.model.";  // PEFT's key prefix in adapter_model.safetensors

}  // namespace

std::string model_base_hash(const Model& model) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bit
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& [name, t] : model.graph.initializers) {  // std::map: sorted by name
    mix(name.data(), name.size());
    int32_t dt = int32_t(t.dtype());
    mix(&dt, sizeof dt);
    for (int64_t d : t.shape()) mix(&d, sizeof d);
    if (t.dtype() != DType::kString) mix(t.data(), t.nbytes());
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

LoraInfo lora_info(const Model& model) {
  LoraInfo info;
  auto it = model.metadata.find(kMetaLora);
  if (it == model.metadata.end()) return info;
  // The record comes from a file: every key is checked, and an error names the metadata key.
  auto field = [](const json::Value& object, const char* key) -> const json::Value& {
    const json::Value* v = object.is_object() ? object.find(key) : nullptr;
    OT_CHECK(v, object.is_object() ? "missing key '" : "expected an object with key '", key, "'");
    return *v;
  };
  try {
    json::Value v = json::parse(it->second);
    info.rank = field(v, "rank").as_int();
    info.alpha = field(v, "alpha").as_double();
    info.base_hash = field(v, "base_hash").as_string();
    if (const json::Value* d = v.find("dropout")) info.dropout = d->as_double();
    OT_CHECK(info.rank > 0 && std::isfinite(info.alpha), "rank ", info.rank, " and alpha ", info.alpha,
             " should be a positive integer and a finite number");
    for (const auto& e : field(v, "adapters").as_array()) {
      LoraAdapter a{field(e, "node").as_string(), field(e, "module").as_string(), field(e, "weight").as_string(),
                    field(e, "A").as_string(), field(e, "B").as_string(), field(e, "in").as_int(),
                    field(e, "out").as_int()};
      OT_CHECK(a.in > 0 && a.out > 0, "adapter '", a.module, "' has in ", a.in, " and out ", a.out,
               "; both should be positive");
      info.adapters.push_back(std::move(a));
    }
  } catch (const Error& e) {
    OT_THROW(kInvalidModel, kWhere, "metadata '", kMetaLora, "' is malformed: ", e.what());
  }
  return info;
}

int merge_lora(Model& model) {
  LoraInfo info = lora_info(model);
  OT_CHECK(!info.adapters.empty(), kWhere, "merge: the model has no LoRA adapters");
  Graph& g = model.graph;
  const double scale = info.alpha / double(info.rank);
  int merged = 0;
  std::set<std::string> drop_nodes;
  for (const auto& a : info.adapters) {
    // The branch ends in "<node>/lora_add"; its first input is the base layer's output, whatever
    // the passes made of that node (a MatMul reading Transpose(W) becomes FusedMatMul(transB)).
    const Node* add = nullptr;
    for (const auto& m : g.nodes)
      if (m.name == a.node + "/lora_add") add = &m;
    OT_CHECK(add && !add->inputs.empty() && !add->outputs.empty(), kWhere, "merge: the adapter branch of '", a.module,
             "' is missing");
    auto producers = g.producers();
    auto pit = producers.find(add->inputs[0]);
    OT_CHECK(pit != producers.end(), kWhere, "merge: no node computes the base output of '", a.module, "'");
    Node& n = g.nodes[pit->second];
    if (n.op_type == "MatMulNBits") continue;  // int4 base: kept as base + adapter branch
    OT_CHECK(g.is_initializer(a.a) && g.is_initializer(a.b) && g.is_initializer(a.weight), kWhere,
             "merge: adapter '", a.module, "' needs its weights as initializers");
    const Tensor &ta = g.initializers.at(a.a), &tb = g.initializers.at(a.b);
    Tensor w = g.initializers.at(a.weight).clone();
    OT_CHECK(w.dtype() == DType::kFloat32 && ta.dtype() == DType::kFloat32, kWhere, "merge: '", a.module,
             "' is not float32");
    OT_CHECK(n.inputs.size() >= 2, kWhere, "merge: ", n.op_type, " node '", n.name, "' has no weight input");
    bool nk;  // W stored [N, K]
    if (n.op_type == "Gemm" || n.op_type == "FusedMatMul") {
      OT_CHECK(n.attr_int("transA", 0) == 0 && n.attr_float("alpha", 1.0f) == 1.0f && n.inputs[1] == a.weight,
               kWhere, "merge: cannot fold into ", n.op_type, " node '", n.name, "' (transA/alpha)");
      nk = n.attr_int("transB", 0) != 0;
    } else {
      OT_CHECK(n.op_type == "MatMul", kWhere, "merge: cannot fold into ", n.op_type, " node '", n.name, "'");
      nk = n.inputs[1] != a.weight;  // through Transpose(W)
    }
    // The recorded sizes must be the tensors' own: A [r, K], B [N, r], W [K, N] (or [N, K]).
    const int64_t r = info.rank, K = a.in, N = a.out;
    const Shape w_shape = nk ? Shape{N, K} : Shape{K, N};
    OT_CHECK(tb.dtype() == DType::kFloat32 && ta.shape() == Shape({r, K}) && tb.shape() == Shape({N, r}) &&
                 w.shape() == w_shape,
             kWhere, "merge: adapter '", a.module, "' records rank ", r, ", in ", K, " and out ", N, ", but A is ",
             shape_str(ta.shape()), ", B ", shape_str(tb.shape()), " and the weight ", shape_str(w.shape()));
    const float *pa = ta.data<float>(), *pb = tb.data<float>();
    float* pw = w.data<float>();
    for (int64_t k = 0; k < K; ++k)
      for (int64_t o = 0; o < N; ++o) {
        double d = 0;
        for (int64_t j = 0; j < r; ++j) d += double(pb[o * r + j]) * pa[j * K + k];
        pw[nk ? o * K + k : k * N + o] += float(scale * d);
      }
    g.initializers[a.weight] = w;
    // Rewire: the base node writes the adapted output again; the branch nodes go.
    n.outputs[0] = add->outputs[0];
    for (const char* s : {"/lora_dropout", "/lora_A", "/lora_B", "/lora_add"}) drop_nodes.insert(a.node + s);
    g.initializers.erase(a.a);
    g.initializers.erase(a.b);
    ++merged;
  }
  std::vector<Node> kept;
  for (auto& n : g.nodes)
    if (!drop_nodes.count(n.name)) kept.push_back(std::move(n));
  g.nodes = std::move(kept);
  if (merged == int(info.adapters.size())) model.metadata.erase(kMetaLora);
  return merged;
}

void export_lora_adapters(const std::string& model_path, const CheckpointState& state, const std::string& path) {
  const LoraInfo info = lora_info(load_model(model_path));
  OT_CHECK(!info.adapters.empty(), "export_lora_adapters: '", model_path, "' has no LoRA adapters");
  safetensors::NamedTensors tensors;  // PEFT's key names
  for (const auto& a : info.adapters)
    for (const std::string& name : {a.a, a.b}) {
      OT_CHECK(state.has_parameter(name), "export_lora_adapters: the checkpoint has no adapter '", name, "'");
      tensors.emplace_back(kPeftPrefix + name, state.parameter(name).data());
    }
  safetensors::write(path, {{"format", "pt"}, {"onnxtrain.lora.base_hash", info.base_hash}}, tensors);
}

namespace {

// A PEFT adapter tensor as float32 (PEFT saves the dtype the model trained in).
Tensor adapter_as_float(const Tensor& t, const std::string& where) {
  Tensor out = Tensor::empty(DType::kFloat32, t.shape());
  float* o = out.data<float>();
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kFloat32: std::copy_n(t.data<float>(), n, o); break;
    case DType::kFloat64: for (int64_t i = 0; i < n; ++i) o[i] = float(t.data<double>()[i]); break;
    case DType::kFloat16: for (int64_t i = 0; i < n; ++i) o[i] = float(t.data<float16>()[i]); break;
    case DType::kBFloat16: for (int64_t i = 0; i < n; ++i) o[i] = float(t.data<bfloat16>()[i]); break;
    default: OT_THROW(kInvalidModel, where, ": expected a floating-point tensor, got ", dtype_name(t.dtype()));
  }
  return out;
}

}  // namespace

void import_lora_adapters(const std::string& model_path, CheckpointState& state, const std::string& path) {
  const LoraInfo info = lora_info(load_model(model_path));
  OT_CHECK(!info.adapters.empty(), "import_lora_adapters: '", model_path, "' has no LoRA adapters");
  safetensors::Contents file;
  try {
    file = safetensors::read(path);
  } catch (const Error& e) {
    throw Error(e.code(), "import_lora_adapters: '" + path + "': " + e.what());
  }
  std::map<std::string, const Tensor*> in_file;
  for (const auto& [key, t] : file.tensors) in_file[key] = &t;
  // Everything is checked before any parameter changes: a bad file leaves the state as it was.
  std::vector<std::pair<std::string, Tensor>> values;
  for (const auto& a : info.adapters)
    for (const std::string& name : {a.a, a.b}) {
      const std::string key = kPeftPrefix + name, where = "import_lora_adapters: '" + path + "' tensor '" + key + "'";
      auto it = in_file.find(key);
      OT_CHECK(it != in_file.end(), "import_lora_adapters: '", path, "' has no '", key, "' (the adapter of module '",
               a.module, "' in these artifacts); PEFT's target_modules must select the same layers");
      OT_CHECK(state.has_parameter(name), "import_lora_adapters: the checkpoint has no adapter '", name, "'");
      const Shape& want = state.parameter(name).shape();
      OT_CHECK(it->second->shape() == want, where, ": expected shape ", shape_str(want), " (rank ", info.rank,
               "), got ", shape_str(it->second->shape()));
      values.emplace_back(name, adapter_as_float(*it->second, where));
      in_file.erase(it);
    }
  if (!in_file.empty()) {
    std::string extra;
    for (const auto& [key, t] : in_file) extra += (extra.empty() ? "'" : ", '") + key + "'";
    OT_THROW(kInvalidArgument, "import_lora_adapters: '", path, "' holds tensors these artifacts have no adapter for: ",
             extra);
  }
  for (const auto& [name, value] : values) state.set_parameter(name, value);
}

}  // namespace onnxtrain

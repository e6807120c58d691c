// `onnxtrain inspect` (checkpoints, models, .npz/.npy data) and `onnxtrain ops`.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <map>

#include "commands.h"
#include "onnxtrain/npz.h"
#include "onnx/model_io.h"
#include "onnxtrain/training.h"
#include "ops/registry.h"
#include "passes/memory_optimizer.h"

namespace onnxtrain::cli {

const Command kOpsCommand{
    "ops", "list every op with its CPU kernel, shape rule and gradient status", {}, {}, ""};

const Command kInspectCommand{
    "inspect",
    "describe a checkpoint (parameters, optimizer state, properties), a model (inputs, outputs, opsets, op "
    "counts) or an .npz/.npy data file (arrays)",
    {"FILE"},
    {{"--graph", "", "for a model, also print every node"},
     {"--dims", "NAME=N,...", "for a training model's plan table: values of its symbolic dims"}},
    "example:\n  onnxtrain inspect out/checkpoint\n"};

int run_ops(const Args&) {
  std::printf("%-34s %-6s %-5s %-6s %s\n", "op (domain.type)", "since", "cpu", "shape", "gradient");
  for (const OpSchema* s : OpRegistry::global().all()) {
    std::string name = (s->domain.empty() ? "" : s->domain + ".") + s->op_type;
    std::printf("%-34s %-6d %-5s %-6s %s%s%s\n", name.c_str(), s->since_version, s->cpu ? "yes" : "no",
                s->shape ? "yes" : "no", gradient_status_name(s->gradient_status),
                s->gradient_note.empty() ? "" : ": ", s->gradient_note.c_str());
  }
  return 0;
}

namespace {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > (s[0] == '-' ? 1 : 0); i -= 3) s.insert(size_t(i), ",");
  return s;
}

std::string bytes_text(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::string value_shape(const ValueInfo& info) {
  if (!info.shape) return "?";
  std::string s = "[";
  for (size_t i = 0; i < info.shape->size(); ++i) {
    const int64_t d = (*info.shape)[i];
    std::string param = i < info.dim_params.size() ? info.dim_params[i] : "";
    s += (i ? ", " : "") + (d >= 0 ? std::to_string(d) : param.empty() ? "?" : param);
  }
  return s + "]";
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  for (const auto& r : rows) {
    std::string line = " ";
    for (size_t i = 0; i < r.size(); ++i)
      line += " " + r[i] + (i + 1 < r.size() ? std::string(width[i] - r[i].size(), ' ') : "");
    std::printf("%s\n", line.c_str());
  }
}

void inspect_checkpoint(const std::string& path) {
  CheckpointState state = CheckpointState::load(path);
  int64_t elements = 0, trainable = 0;
  std::vector<std::vector<std::string>> rows{{"name", "dtype", "shape", "requires_grad"}};
  for (const Parameter& p : state.parameters()) {
    elements += p.numel();
    trainable += p.requires_grad();
    rows.push_back({p.name(), dtype_name(p.dtype()), shape_str(p.shape()),
                    std::string(p.requires_grad() ? "yes" : "no") + (p.has_data() ? "" : " (nominal: no data)")});
  }
  std::printf("checkpoint '%s'\nparameters: %zu (%s elements), %lld trainable\n", path.c_str(), state.num_parameters(),
              with_commas(elements).c_str(), (long long)trainable);
  print_table(rows);
  if (state.has_optimizer_state()) {
    const SavedOptimizerState& o = state.optimizer_state();
    std::printf("optimizer state: step %lld", (long long)o.step);
    if (o.learning_rate) std::printf(", learning rate %g", *o.learning_rate);
    std::map<std::string, std::pair<int, int64_t>> per_name;  // state name -> (parameters, elements)
    for (const auto& [param, states] : o.param_states)
      for (const auto& [name, t] : states) {
        per_name[name].first++;
        per_name[name].second += t.numel();
      }
    std::printf("\n");
    for (const auto& [name, count] : per_name)
      std::printf("  %s: %d parameters, %s elements\n", name.c_str(), count.first, with_commas(count.second).c_str());
  } else {
    std::printf("optimizer state: none\n");
  }
  std::printf("properties:%s\n", state.properties().empty() ? " none" : "");
  for (const auto& [name, value] : state.properties()) {
    std::string text;
    if (auto* i = std::get_if<int64_t>(&value)) text = std::to_string(*i);
    else if (auto* d = std::get_if<double>(&value)) {
      char buf[40];
      text.assign(buf, std::to_chars(buf, buf + sizeof buf, *d).ptr);  // shortest exact form
    } else text = "\"" + std::get<std::string>(value) + "\"";
    std::printf("  %s = %s (%s)\n", name.c_str(), text.c_str(), property_type_name(value));
  }
}

// A training model (outputs "<input>_grad"): the memory optimizer's clusters and the applied plan.
void print_memory_plan(const Model& model, const std::map<std::string, int64_t>& dims) {
  const std::vector<std::string> forward = default_forward_outputs(model.graph);
  if (forward.size() == model.graph.outputs.size()) return;  // no gradients: not a training model
  if (auto it = model.metadata.find(kMetaMemoryPlan); it != model.metadata.end())
    std::printf("applied memory plan:\n%s", it->second.c_str());
  std::printf("memory optimizer opportunities (recompute the stashed activations of a cluster with\n"
              "  --memory-opt-config CLUSTER:1:-1, or 2 for the compromised plan):\n%s",
              plan_table(analyze_memory(model, forward, {}, dims)).c_str());
}

void inspect_model(const std::string& path, bool graph, const std::map<std::string, int64_t>& dims) {
  Model model = load_model(path);
  const Graph& g = model.graph;
  std::printf("model '%s' (producer %s%s%s, ir_version %lld)\nopsets:", path.c_str(),
              model.producer_name.empty() ? "unknown" : model.producer_name.c_str(),
              model.producer_version.empty() ? "" : " ", model.producer_version.c_str(), (long long)model.ir_version);
  for (const auto& [domain, version] : model.opsets)
    std::printf(" %s %lld", domain.empty() ? "ai.onnx" : domain.c_str(), (long long)version);
  std::printf("\n");
  for (const auto& [title, values] : {std::pair{"inputs", &g.inputs}, std::pair{"outputs", &g.outputs}}) {
    std::printf("%s: %zu\n", title, values->size());
    std::vector<std::vector<std::string>> rows;
    for (const auto& v : *values)
      rows.push_back({v.name, v.info.dtype == DType::kUndefined ? "?" : dtype_name(v.info.dtype), value_shape(v.info)});
    print_table(rows);
  }
  int64_t elements = 0;
  uint64_t bytes = 0;
  for (const auto& [name, t] : g.initializers) {
    elements += t.numel();
    bytes += t.dtype() == DType::kString ? 0 : t.nbytes();
  }
  std::printf("initializers: %zu (%s elements, %s)\n", g.initializers.size(), with_commas(elements).c_str(),
              bytes_text(bytes).c_str());
  std::map<std::string, int> counts;
  for (const auto& n : g.nodes) counts[(n.domain.empty() ? "" : n.domain + ".") + n.op_type]++;
  std::vector<std::pair<std::string, int>> ops(counts.begin(), counts.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::printf("nodes: %zu\n", g.nodes.size());
  std::vector<std::vector<std::string>> rows;
  for (const auto& [op, count] : ops) rows.push_back({op, std::to_string(count)});
  print_table(rows);
  if (!model.metadata.empty()) {
    std::printf("metadata:\n");
    for (const auto& [k, v] : model.metadata)
      if (k != kMetaMemoryPlan) std::printf("  %s = %s\n", k.c_str(), v.c_str());
  }
  print_memory_plan(model, dims);
  if (graph) std::printf("graph:\n%s", to_string(g).c_str());
}

void inspect_npz(const std::string& path) {
  std::vector<NpzEntry> entries = list_npz(path);
  std::printf("npz '%s': %zu arrays\n", path.c_str(), entries.size());
  std::vector<std::vector<std::string>> rows;
  for (const auto& e : entries)
    rows.push_back({e.name, dtype_name(e.dtype), shape_str(e.shape),
                    std::string(e.compressed ? "deflated" : "stored") + ", " + bytes_text(e.stored_bytes)});
  print_table(rows);
}

}  // namespace

int run_inspect(const Args& args) {
  const std::string path = args.positional(0);
  std::ifstream f(path, std::ios::binary);
  if (!f) OT_THROW(kRuntime, "cannot open '", path, "'");
  char head[9] = {};
  f.read(head, sizeof head);
  const std::streamsize got = f.gcount();
  if (got >= 4 && std::memcmp(head, "PK", 2) == 0) {
    inspect_npz(path);
  } else if (got >= 6 && std::memcmp(head, "\x93NUMPY", 6) == 0) {
    Tensor t = load_npy(path);
    std::printf("npy '%s': %s %s\n", path.c_str(), dtype_name(t.dtype()).c_str(), shape_str(t.shape()).c_str());
  } else if (got == 9 && head[8] == '{') {  // safetensors: 8-byte header length, then JSON
    inspect_checkpoint(path);
  } else {
    std::map<std::string, int64_t> dims;
    for (const auto& item : args.get_list("--dims")) {
      size_t eq = item.find('=');
      int64_t value = 0;
      if (eq == std::string::npos ||
          std::from_chars(item.data() + eq + 1, item.data() + item.size(), value).ec != std::errc() || value <= 0)
        throw UsageError("--dims takes NAME=N,... with N > 0, got '" + item + "'");
      dims[item.substr(0, eq)] = value;
    }
    inspect_model(path, args.flag("--graph"), dims);
  }
  return 0;
}

}  // namespace onnxtrain::cli

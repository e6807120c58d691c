#include "training/generate_artifacts.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <random>

#include "core/file_io.h"
#include "onnx/model_io.h"
#include "onnxtrain/training.h"
#include "ops/optimizer/optimizer_ops.h"
#include "optim/loss_scaler.h"
#include "passes/memory_optimizer.h"
#include "training/lora.h"
#include "training/ort_export.h"

namespace onnxtrain {

Model build_optimizer_model(const TrainingGraphs& graphs, const optim::OptimizerConfig& config) {
  config.validate();
  Model m;
  m.opsets[""] = 17;
  m.opsets[kOnnxTrainDomain] = 1;
  m.description = "'optimizer_model'";
  Graph& g = m.graph;
  g.name = "optimizer";
  g.initializers["learning_rate"] = Tensor::scalar<float>(float(config.lr));
  g.inputs.push_back({"step", ValueInfo{DType::kInt64, Shape{}, {}}});
  auto info_of = [&](const std::string& p) {
    for (const auto& in : graphs.training.graph.inputs)
      if (in.name == p) return in.info;
    return ValueInfo{};
  };
  Node update;
  update.op_type = optim::update_op_type(config.type);
  update.domain = kOnnxTrainDomain;
  update.name = "update";
  update.attributes = optim::update_op_attributes(config);
  update.inputs = {"learning_rate", "step"};
  for (const auto& p : graphs.trainable) update.inputs.push_back(p);
  for (const auto& p : graphs.trainable) update.inputs.push_back(p + "_grad");
  for (const auto& s : config.state_names())
    for (const auto& p : graphs.trainable) update.inputs.push_back(p + "." + s);
  for (size_t i = 2; i < update.inputs.size(); ++i) g.inputs.push_back({update.inputs[i], info_of(graphs.trainable[(i - 2) % graphs.trainable.size()])});
  for (const auto& p : graphs.trainable) {
    update.outputs.push_back(p + "_new");
    g.outputs.push_back({p + "_new", info_of(p)});
  }
  g.nodes.push_back(update);
  return m;
}

ArtifactPaths artifact_paths(const std::string& directory, const std::string& prefix) {
  auto path = [&](const char* name) { return (std::filesystem::path(directory) / (prefix + name)).string(); };
  return {path("training_model.onnx"), path("eval_model.onnx"), path("optimizer_model.onnx"), path("checkpoint")};
}

namespace {

// LoRA: the frozen base goes back into the graphs as initializers, so the checkpoint holds only
// the adapters (BatchNorm-style buffers, updated by training, stay parameters).
void keep_base_in_graphs(TrainingGraphs& graphs, const Model& source) {
  std::set<std::string> buffers(graphs.buffers.begin(), graphs.buffers.end()), inlined;
  for (Model* m : {&graphs.training, &graphs.eval}) {
    std::vector<NamedValue> inputs;
    for (auto& in : m->graph.inputs) {
      bool frozen = std::find(graphs.frozen.begin(), graphs.frozen.end(), in.name) != graphs.frozen.end();
      if (frozen && !buffers.count(in.name)) {
        m->graph.initializers[in.name] = source.graph.initializers.at(in.name);
        inlined.insert(in.name);
      } else {
        inputs.push_back(in);
      }
    }
    m->graph.inputs = std::move(inputs);
    m->metadata[kMetaLora] = source.metadata.at(kMetaLora);
  }
  std::vector<std::string> frozen;
  for (const auto& p : graphs.frozen)
    if (!inlined.count(p)) frozen.push_back(p);
  graphs.frozen = std::move(frozen);
}

}  // namespace

namespace {

void collect_op_types(const Graph& graph, std::set<std::string>& ops) {
  for (const auto& node : graph.nodes) {
    ops.insert(node.op_type);
    for (const auto& [name, a] : node.attributes)
      if (a.kind == Attribute::Kind::kGraph && a.g) collect_op_types(*a.g, ops);
  }
}

// The op types the artifacts run (subgraphs included), one a line: what a minimal runtime built
// with -DONNXTRAIN_OPS_FILE=<this file> must keep (cmake/minimal.cmake).
void write_ops_file(const std::filesystem::path& path, std::initializer_list<const Model*> models) {
  std::set<std::string> ops;
  for (const Model* m : models) collect_op_types(m->graph, ops);
  std::string text = "# op types of these training artifacts: a minimal runtime built with\n"
                     "# -DONNXTRAIN_OPS_FILE=<this file> runs them (make minimal ONNXTRAIN_OPS_FILE=...)\n";
  for (const auto& op : ops) text += op + "\n";
  file_io::write_file_atomically(path.string(), [&](int fd, const std::string& what) {
    file_io::write_all(fd, text.data(), text.size(), what);
  });
}

}  // namespace

ArtifactPaths generate_artifacts(const Model& original, const ArtifactOptions& input_options) {
  namespace fs = std::filesystem;
  ArtifactOptions options = input_options;
  const bool for_ort = options.graphs.ort_compatible;
  if (for_ort) check_ort_compatible(options);
  std::vector<std::string> named = options.graphs.requires_grad;
  named.insert(named.end(), options.graphs.frozen_params.begin(), options.graphs.frozen_params.end());
  Model model = promote_constant_parameters(original, named);  // Constant-node weights
  const bool adapted = options.lora.has_value();
  if (adapted)
    for (const auto& a : apply_lora(model, *options.lora)) {
      options.graphs.requires_grad.push_back(a.a);
      options.graphs.requires_grad.push_back(a.b);
    }
  TrainingGraphs graphs = build_training_graphs(model, options.graphs);
  if (adapted) keep_base_in_graphs(graphs, model);
  if (for_ort) to_ort_training_graphs(graphs);
  Model optimizer = for_ort ? ort_optimizer_model(options.optimizer) : build_optimizer_model(graphs, options.optimizer);
  if (options.memory.level != 0 || !options.memory.config.empty()) {
    std::vector<std::string> forward_outputs;  // the loss, additional outputs and buffer updates
    for (const auto& out : graphs.training.graph.outputs)
      if (std::find(graphs.gradient_outputs.begin(), graphs.gradient_outputs.end(), out.name) == graphs.gradient_outputs.end())
        forward_outputs.push_back(out.name);
    optimize_memory(graphs.training, forward_outputs, options.memory);  // records its table in the metadata
  }

  // The checkpoint holds every parameter the graphs take as inputs.
  Graph params;
  for (const auto& name : graphs.trainable) params.initializers[name] = model.graph.initializers.at(name);
  for (const auto& name : graphs.frozen) params.initializers[name] = model.graph.initializers.at(name);
  CheckpointState state = CheckpointState::from_initializers(params, graphs.trainable, options.nominal_checkpoint,
                                                             /*share_data=*/true);

  std::error_code ec;
  fs::create_directories(options.directory, ec);
  OT_CHECK(!ec, "generate_artifacts: cannot create directory '", options.directory, "': ", ec.message());
  ArtifactPaths out = artifact_paths(options.directory, options.prefix);
  graphs.training.producer_name = graphs.eval.producer_name = optimizer.producer_name = "onnxtrain";
  save_model(graphs.training, out.training_model);
  save_model(graphs.eval, out.eval_model);
  save_model(optimizer, out.optimizer_model);
  // Every training run from these artifacts draws its Dropout masks from this seed (Module).
  std::random_device device;
  state.add_property(CheckpointState::kRandomSeedProperty, int64_t((uint64_t(device()) << 32) | device()));
  if (!options.graphs.mixed_precision.empty())  // Module checks it against the graphs' mode
    state.add_property(kMetaMixedPrecision, graphs.training.metadata.count(kMetaMixedPrecision)
                                                ? graphs.training.metadata.at(kMetaMixedPrecision) : std::string());
  if (graphs.training.metadata.count(kMetaLossScaleInput)) {  // the scaler starts at 2^16
    state.add_property(CheckpointState::kLossScaleProperty, optim::LossScaler::kInitialScale);
    state.add_property(CheckpointState::kLossScaleGoodStepsProperty, int64_t{0});
    state.add_property(CheckpointState::kSkippedStepsProperty, int64_t{0});
  }
  if (adapted) state.add_property(kLoraBaseHashProperty, lora_info(model).base_hash);
  state.save(out.checkpoint, false, for_ort ? CheckpointFormat::kOrt : CheckpointFormat::kOnnxtrain);
  write_ops_file(fs::path(options.directory) / (options.prefix + "ops.txt"), {&graphs.training, &graphs.eval, &optimizer});
  return out;
}

ArtifactPaths generate_artifacts(const std::string& model_path, const ArtifactOptions& options) {
  return generate_artifacts(load_model(model_path), options);
}

}  // namespace onnxtrain

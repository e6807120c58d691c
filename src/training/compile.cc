// compile_artifacts (onnxtrain/module.h): the pre-compiled form of on-device training artifacts.
//
// The plans are the executor's own: a Module is built from the ONNX files and the checkpoint, and
// one train step and one eval step run on zero-filled inputs of the given shapes (on a copy of the
// checkpoint that is never saved). Their recording runs leave exactly the plans the runtime would
// record on the first step with real data of those shapes, which the .otc files then carry.
#include <filesystem>

#include "onnx/model_io.h"
#include "runtime/compiled_model.h"
#include "runtime/executor.h"
#include "training/module.h"

namespace onnxtrain {

namespace fs = std::filesystem;

namespace {

// Zero-filled inputs for the graph's user inputs: each of the given shape, or of its declared
// shape when that is static.
std::vector<Tensor> zero_inputs(const Module& module, const Executor& executor, bool training,
                                const std::map<std::string, Shape>& shapes) {
  std::vector<Tensor> inputs;
  for (const auto& name : module.input_names(training)) {
    const Graph& g = executor.model().graph;
    const ValueInfo* info = nullptr;
    for (const auto& in : g.inputs) if (in.name == name) info = &in.info;
    OT_CHECK(info && info->is_tensor() && info->dtype != DType::kUndefined, "compile: input '", name,
             "' of the ", training ? "training" : "eval", " model is not a tensor of a known dtype");
    auto given = shapes.find(name);
    Shape shape;
    if (given != shapes.end()) {
      shape = given->second;
      for (int64_t d : shape) OT_CHECK(d >= 0, "compile: --shape ", name, " has a negative dim: ", shape_str(shape));
      if (info->shape) {
        const Shape& want = *info->shape;
        bool fits = want.size() == shape.size();
        for (size_t d = 0; fits && d < want.size(); ++d) fits = want[d] < 0 || want[d] == shape[d];
        OT_CHECK(fits, "compile: input '", name, "' is declared ", shape_str(want), " (-1: any), given ",
                 shape_str(shape));
      }
    } else {
      OT_CHECK(info->has_static_shape(), "compile: input '", name, "' has the shape ",
               info->shape ? shape_str(*info->shape) : std::string("(unknown rank)"),
               "; give its dims (--shape ", name, "=d0,d1,...)");
      shape = *info->shape;
    }
    inputs.push_back(Tensor::zeros(info->dtype, shape));
  }
  return inputs;
}

CompiledModel compiled_from(const Executor& executor) {
  CompiledModel c;
  c.model = executor.model();
  c.kernel_versions = executor.kernel_versions();
  c.plans = executor.recorded_plans();
  return c;
}

}  // namespace

std::vector<std::string> compile_artifacts(const std::string& dir, const std::map<std::string, Shape>& shapes) {
  const std::string training_path = (fs::path(dir) / "training_model.onnx").string();
  const std::string eval_path = (fs::path(dir) / "eval_model.onnx").string();
  const std::string optimizer_path = (fs::path(dir) / "optimizer_model.onnx").string();
  const std::string checkpoint_path = (fs::path(dir) / "checkpoint").string();
  OT_CHECK(fs::exists(training_path), "compile: '", dir, "' has no training_model.onnx");
  OT_CHECK(fs::exists(checkpoint_path), "compile: '", dir, "' has no checkpoint");
  const bool has_eval = fs::exists(eval_path);

  CheckpointState state = CheckpointState::load(checkpoint_path);
  Module module(load_model(training_path), state,
                has_eval ? std::optional<Model>(load_model(eval_path)) : std::nullopt);
  const Executor& training = CompileAccess::executor(module, true);
  for (const auto& [name, shape] : shapes) {
    bool known = false;
    for (const auto& n : module.input_names(true)) known = known || n == name;
    if (has_eval)
      for (const auto& n : module.input_names(false)) known = known || n == name;
    if (!known) {
      std::string names;
      for (const auto& n : module.input_names(true)) names += (names.empty() ? "" : ", ") + n;
      OT_THROW(kInvalidArgument, "compile: --shape ", name, ": not an input of the models (inputs: ", names, ")");
    }
  }
  module.train_step(zero_inputs(module, training, true, shapes));
  std::vector<std::string> written;
  auto write = [&](const CompiledModel& c, const std::string& source) {
    const std::string path = compiled_path_for(source);
    write_compiled_model(path, c, source);
    written.push_back(path);
  };
  write(compiled_from(training), training_path);
  if (has_eval) {
    const Executor& eval = CompileAccess::executor(module, false);
    module.eval_step(zero_inputs(module, eval, false, shapes));
    write(compiled_from(eval), eval_path);
  }
  if (fs::exists(optimizer_path)) {  // Optimizer reads its update rule from it; nothing runs it
    CompiledModel c;
    c.model = load_model(optimizer_path);
    write(c, optimizer_path);
  }
  return written;
}

}  // namespace onnxtrain

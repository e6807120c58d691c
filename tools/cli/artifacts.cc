// `onnxtrain artifacts`: generate_artifacts from the command line.
#include <cstdio>
#include <set>

#include "commands.h"
#include "onnx/model_io.h"
#include "onnxtrain/training.h"
#include "training/generate_artifacts.h"

namespace onnxtrain::cli {

namespace {

const std::vector<std::pair<std::string, std::string>> kLosses = {
    {"mse", "MSELoss"},         {"cross_entropy", "CrossEntropyLoss"}, {"bce_with_logits", "BCEWithLogitsLoss"},
    {"l1", "L1Loss"},           {"nll", "NLLLoss"},                    {"smooth_l1", "SmoothL1Loss"},
    {"kl_div", "KLDivLoss"},    {"huber", "HuberLoss"},                {"bce", "BCELoss"},
};

std::string loss_names() {
  std::string s;
  for (const auto& [cli, name] : kLosses) s += (s.empty() ? "" : ", ") + cli;
  return s;
}

bool is_adam_like(optim::OptimizerType t) {
  return t == optim::OptimizerType::kAdamW || t == optim::OptimizerType::kAdam ||
         t == optim::OptimizerType::kHFAdamW || t == optim::OptimizerType::kLamb;
}

// The optimizer's torch.optim defaults, with the options given; options that do not apply to
// the chosen rule are errors rather than silently ignored.
optim::OptimizerConfig optimizer_config(const Args& a) {
  const std::string name = a.get_choice("--optimizer", {"adamw", "adam", "sgd", "lamb", "adagrad"}, "adamw");
  const optim::OptimizerType type = optim::parse_optimizer_type(name);
  optim::OptimizerConfig c = optim::OptimizerConfig::defaults(type);
  auto only_for = [&](const char* option, bool applies, const char* which) {
    if (a.has(option) && !applies) throw UsageError(std::string(option) + " applies to " + which + " only, not " + name);
  };
  only_for("--momentum", type == optim::OptimizerType::kSGD, "sgd");
  only_for("--nesterov", type == optim::OptimizerType::kSGD, "sgd");
  only_for("--betas", is_adam_like(type), "adamw, adam and lamb");
  only_for("--eps", type != optim::OptimizerType::kSGD, "adamw, adam, lamb and adagrad");
  c.lr = a.get_double("--lr", c.lr);
  c.momentum = a.get_double("--momentum", c.momentum);
  c.nesterov = a.flag("--nesterov");
  c.weight_decay = a.get_double("--weight-decay", c.weight_decay);
  c.eps = a.get_double("--eps", c.eps);
  c.max_grad_norm = a.get_double("--max-grad-norm", c.max_grad_norm);
  if (a.has("--betas")) {
    std::vector<std::string> b = a.get_list("--betas");
    if (b.size() != 2) throw UsageError("--betas expects two numbers, BETA1,BETA2");
    for (size_t i = 0; i < 2; ++i) {
      char* end = nullptr;
      c.betas[i] = std::strtod(b[i].c_str(), &end);
      if (*end != '\0') throw UsageError("--betas expects two numbers, got '" + a.get("--betas") + "'");
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return c;
}

}  // namespace

const Command kArtifactsCommand{
    "artifacts",
    "generate training artifacts (training, eval and optimizer models and a checkpoint) from an ONNX model",
    {"MODEL"},
    {
        {"--out", "DIR", "artifact directory (created when missing; required)"},
        {"--requires-grad", "NAMES", "initializers to train, comma-separated"},
        {"--all", "", "train every floating-point initializer and Constant-node weight (not BatchNorm statistics, scalars or shape-like values)"},
        {"--frozen", "NAMES", "initializers kept fixed"},
        {"--loss", "LOSS", "mse, cross_entropy, bce_with_logits, l1, nll, smooth_l1, kl_div, huber, bce, or a "
                           "loss model FILE.onnx (inputs: predictions, then targets; output: the loss) (required)"},
        {"--loss-input-names", "NAMES", "model values the loss takes (default: the first output)"},
        {"--additional-outputs", "NAMES", "model values the training and eval models also return"},
        {"--optimizer", "NAME", "adamw (default), adam, sgd, lamb, adagrad; torch.optim defaults"},
        {"--lr", "LR", "learning rate"},
        {"--weight-decay", "WD", "weight decay"},
        {"--betas", "B1,B2", "Adam/Lamb moment decay rates"},
        {"--eps", "EPS", "Adam/Lamb/Adagrad epsilon"},
        {"--momentum", "M", "SGD momentum"},
        {"--nesterov", "", "SGD Nesterov momentum"},
        {"--max-grad-norm", "NORM", "clip the global gradient norm to NORM first"},
        {"--prefix", "PREFIX", "prefix of the file names"},
        {"--nominal", "", "checkpoint with shapes and dtypes only (fill the parameters later)"},
        {"--mixed-precision", "MODE", "bf16: GEMMs in bfloat16, the rest and the checkpoint in fp32; fp16: the same in float16 with a dynamic loss scaler (default: fp32)"},
        {"--lora-target", "PATTERNS", "train LoRA adapters on these layers only (PEFT's target_modules: "
                                      "a module named X or ending in .X; or a glob over module paths), instead of "
                                      "--all/--requires-grad"},
        {"--lora-rank", "R", "LoRA rank (default 8)"},
        {"--lora-alpha", "A", "LoRA alpha: the update is scaled by alpha/rank (default 16)"},
        {"--lora-dropout", "P", "dropout on the adapters' input while training (default 0)"},
        {"--memory-opt-level", "N", "memory optimizer: 0 (default), 1 layer-wise recompute, 2 plus compromised plans"},
        {"--memory-opt-config", "CFG", "recompute plans cluster:strategy:count,... (clusters: onnxtrain inspect)"},
        {"--no-compute-optimizer", "", "compute every row (default: a Gather/Slice of a few positions moves upstream "
                                       "past elementwise ops, LayerNorm, Softmax and MatMul)"},
        {"--label-sparsity", "", "a cross-entropy/NLL loss with ignore_index computes the LM head on the kept labels' "
                                 "rows only (same loss and gradients; pays when many labels are ignored)"},
        {"--ort-compatible", "", "artifacts ONNX Runtime training 1.16-1.19 (onnxruntime.training.api) also trains: "
                                 "its graph conventions, optimizer graph and checkpoint format (adamw or sgd, fp32)"},
    },
    "example:\n  onnxtrain artifacts mlp.onnx --out out --all --loss cross_entropy --optimizer adamw --lr 1e-3\n"};

int run_artifacts(const Args& a) {
  ArtifactOptions o;
  o.directory = a.require("--out");
  const bool lora = a.has("--lora-target");
  if (!lora && a.flag("--all") == a.has("--requires-grad"))
    throw UsageError("give either --requires-grad NAMES, --all or --lora-target PATTERNS");
  if (lora && a.flag("--all")) throw UsageError("--lora-target trains adapters only: drop --all");
  if (!lora && (a.has("--lora-rank") || a.has("--lora-alpha") || a.has("--lora-dropout")))
    throw UsageError("--lora-rank/--lora-alpha/--lora-dropout need --lora-target");
  if (lora) {
    LoraConfig c;
    c.target = a.get_list("--lora-target");
    c.rank = a.get_int("--lora-rank", 8, 1);
    c.alpha = a.get_double("--lora-alpha", 16.0);
    c.dropout = a.get_double("--lora-dropout", 0.0);
    o.lora = c;
  }
  const std::string loss = a.require("--loss");
  bool known = false;
  for (const auto& [cli, name] : kLosses)
    if (loss == cli) {
      o.graphs.loss = loss_type_from_name(name);
      known = true;
    }
  const bool custom = loss.size() > 5 && loss.compare(loss.size() - 5, 5, ".onnx") == 0;
  if (!known && !custom) throw UsageError("--loss must be one of " + loss_names() + ", or a loss model FILE.onnx");
  o.optimizer = optimizer_config(a);
  o.graphs.frozen_params = a.get_list("--frozen");
  o.graphs.loss_input_names = a.get_list("--loss-input-names");
  o.graphs.additional_output_names = a.get_list("--additional-outputs");
  o.prefix = a.get("--prefix");
  o.nominal_checkpoint = a.flag("--nominal");
  if (a.has("--mixed-precision")) o.graphs.mixed_precision = a.get("--mixed-precision");
  if (a.has("--memory-opt-level")) {
    const std::string level = a.get("--memory-opt-level");
    if (level != "0" && level != "1" && level != "2") throw UsageError("--memory-opt-level must be 0, 1 or 2, got " + level);
    o.memory.level = std::stoi(level);
  }
  o.memory.config = a.get("--memory-opt-config");
  o.graphs.compute_optimizer = !a.flag("--no-compute-optimizer");
  o.graphs.label_sparsity = a.flag("--label-sparsity");
  o.graphs.ort_compatible = a.flag("--ort-compatible");

  Model model = load_model(a.positional(0));
  if (custom) o.graphs.custom_loss = std::make_shared<const Model>(load_model(loss));
  if (a.flag("--all")) {
    std::set<std::string> frozen(o.graphs.frozen_params.begin(), o.graphs.frozen_params.end());
    for (const auto& name : all_parameters(model))
      if (!frozen.count(name)) o.graphs.requires_grad.push_back(name);
  } else if (a.has("--requires-grad")) {
    o.graphs.requires_grad = a.get_list("--requires-grad");
  }
  ArtifactPaths p = generate_artifacts(model, o);
  if (lora) {  // the adapters are the checkpoint's parameters
    CheckpointState st = CheckpointState::load(p.checkpoint);
    int64_t n = 0, count = 0;
    for (const auto& name : st.parameter_names()) n += st.parameter(name).data().numel(), ++count;
    std::printf("LoRA: %lld adapter tensors (%lld elements), rank %lld, alpha %g\n", (long long)count, (long long)n,
                (long long)o.lora->rank, o.lora->alpha);
  } else {
    const Model promoted = promote_constant_parameters(model, o.graphs.requires_grad);
    int64_t elements = 0;
    for (const auto& name : o.graphs.requires_grad) elements += promoted.graph.initializers.at(name).numel();
    std::printf("trainable: %zu parameters (%lld elements)\n", o.graphs.requires_grad.size(), (long long)elements);
  }
  std::printf("optimizer: %s, lr %g\n", optim::optimizer_type_name(o.optimizer.type), o.optimizer.lr);
  for (const auto& f : {p.training_model, p.eval_model, p.optimizer_model, p.checkpoint})
    std::printf("wrote %s\n", f.c_str());
  return 0;
}

}  // namespace onnxtrain::cli

// Registration of the multi-tensor update rules as onnxtrain-domain ops (optimizer_ops.h).
#include "ops/optimizer/optimizer_ops.h"

#include <climits>
#include <cstring>

#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#include "core/device.h"
#endif

namespace onnxtrain::optim {

std::string update_op_type(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdamW:
    case OptimizerType::kHFAdamW: return "AdamW";
    case OptimizerType::kAdam: return "Adam";
    case OptimizerType::kSGD: return "SGD";
    case OptimizerType::kLamb: return "Lamb";
    case OptimizerType::kAdagrad: return "Adagrad";
  }
  return "?";
}

std::map<std::string, Attribute> update_op_attributes(const OptimizerConfig& c, bool in_place) {
  std::map<std::string, Attribute> a;
  auto f = [&](const char* k, double v) { a[k] = Attribute::of(float(v)); };
  auto i = [&](const char* k, bool v) { a[k] = Attribute::of(int64_t(v ? 1 : 0)); };
  i("in_place", in_place);
  f("max_grad_norm", c.max_grad_norm);
  f("weight_decay", c.weight_decay);
  switch (c.type) {
    case OptimizerType::kAdamW:
    case OptimizerType::kHFAdamW:
    case OptimizerType::kAdam:
      f("beta1", c.betas[0]);
      f("beta2", c.betas[1]);
      f("epsilon", c.eps);
      if (c.type == OptimizerType::kHFAdamW) {
        a["mode"] = Attribute::of(std::string("hf"));
        i("correct_bias", c.correct_bias);
      } else {
        if (c.type == OptimizerType::kAdamW) a["mode"] = Attribute::of(std::string("adamw"));
        i("amsgrad", c.amsgrad);
        i("maximize", c.maximize);
      }
      break;
    case OptimizerType::kSGD:
      f("momentum", c.momentum);
      f("dampening", c.dampening);
      i("nesterov", c.nesterov);
      i("maximize", c.maximize);
      break;
    case OptimizerType::kLamb:
      f("beta1", c.betas[0]);
      f("beta2", c.betas[1]);
      f("epsilon", c.eps);
      i("bias_correction", c.correct_bias);
      i("adam_w_mode", c.adam_w_mode);
      i("grad_averaging", c.grad_averaging);
      i("use_nvlamb", c.use_nvlamb);
      break;
    case OptimizerType::kAdagrad:
      f("epsilon", c.eps);
      f("lr_decay", c.lr_decay);
      i("maximize", c.maximize);
      break;
  }
  return a;
}

OptimizerConfig config_from_update_node(const Node& node) {
  OptimizerType type;
  if (node.op_type == "AdamW") {
    std::string mode = node.attr_string("mode", "adamw");
    OT_CHECK(mode == "adamw" || mode == "hf", node.context(), "attribute mode must be 'adamw' or 'hf', got '", mode, "'");
    type = mode == "hf" ? OptimizerType::kHFAdamW : OptimizerType::kAdamW;
  } else if (node.op_type == "Adam") {
    type = OptimizerType::kAdam;
  } else if (node.op_type == "SGD") {
    type = OptimizerType::kSGD;
  } else if (node.op_type == "Lamb") {
    type = OptimizerType::kLamb;
  } else if (node.op_type == "Adagrad") {
    type = OptimizerType::kAdagrad;
  } else {
    OT_THROW(kInvalidArgument, node.context(), "not an optimizer update op");
  }
  OptimizerConfig c = OptimizerConfig::defaults(type);
  auto f = [&](const char* k, double& v) { v = node.attr_float(k, float(v)); };
  auto b = [&](const char* k, bool& v) { v = node.attr_int(k, v ? 1 : 0) != 0; };
  f("max_grad_norm", c.max_grad_norm);
  f("weight_decay", c.weight_decay);
  f("beta1", c.betas[0]);
  f("beta2", c.betas[1]);
  f("epsilon", c.eps);
  b("amsgrad", c.amsgrad);
  b("maximize", c.maximize);
  b("correct_bias", c.correct_bias);
  if (type == OptimizerType::kLamb) b("bias_correction", c.correct_bias);
  f("momentum", c.momentum);
  f("dampening", c.dampening);
  b("nesterov", c.nesterov);
  b("adam_w_mode", c.adam_w_mode);
  b("grad_averaging", c.grad_averaging);
  b("use_nvlamb", c.use_nvlamb);
  f("lr_decay", c.lr_decay);
  try {
    c.validate();
  } catch (const Error& e) {
    OT_THROW(kInvalidArgument, node.context(), e.what());
  }
  return c;
}

namespace {

// n, the number of parameters, from the input count and the number of state lists.
int64_t param_count(const Node& node, size_t num_inputs, size_t num_states) {
  int64_t rest = int64_t(num_inputs) - 2, groups = 2 + int64_t(num_states);
  OT_CHECK(rest > 0 && rest % groups == 0, node.context(), "expected lr, step and ", groups,
           " equally long lists (params, grads and ", num_states, " state lists), got ", num_inputs, " inputs");
  return rest / groups;
}

// Output j holds the new value of input 2 + j (parameters) or 2 + n + j (state).
size_t source_input(int64_t n, size_t j) { return size_t(int64_t(j) < n ? 2 + int64_t(j) : 2 + n + int64_t(j)); }

void update_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  OptimizerConfig cfg = config_from_update_node(node);
  const size_t k = cfg.state_names().size();
  const int64_t n = param_count(node, ctx.num_inputs(), k);
  OT_CHECK(int64_t(ctx.num_outputs()) <= n * int64_t(1 + k), node.context(), "expected at most ", n * int64_t(1 + k),
           " outputs (", n, " parameters and ", k, " state lists), got ", ctx.num_outputs());
  const Tensor& lr = ctx.input(0);
  OT_CHECK(is_floating(lr.dtype()) && lr.numel() == 1, node.context(), "input 0 (lr) must be a floating-point scalar, got ",
           dtype_name(lr.dtype()), " ", shape_str(lr.shape()));
  const Tensor& step = ctx.input(1);
  OT_CHECK(is_integer(step.dtype()) && step.numel() == 1, node.context(),
           "input 1 (step) must be an integer scalar, got ", dtype_name(step.dtype()), " ", shape_str(step.shape()));
  cfg.lr = lr.item_as_double(0);
  const bool in_place = node.attr_int("in_place", 1) != 0;

  // The tensors the update writes: the inputs themselves (in place) or output buffers holding a
  // copy of them.
  auto target = [&](size_t j) -> Tensor {
    const Tensor& in = ctx.input(source_input(n, j));
    bool requested = j < ctx.num_outputs() && ctx.output_requested(j);
    if (in_place) {
      Tensor t = in;  // shares the input's storage
      if (requested) ctx.set_output(j, t);
      return t;
    }
    OT_CHECK(is_floating(in.dtype()), node.context(), "input ", source_input(n, j), " must be float32 or float64, got ",
             dtype_name(in.dtype()));
    Tensor t = requested ? ctx.output(j, in.dtype(), in.shape()) : Tensor::empty(in.dtype(), in.shape());
    if (in.nbytes()) std::memcpy(t.data(), in.data(), in.nbytes());
    return t;
  };
  std::vector<Tensor> params, grads;
  std::vector<std::vector<Tensor>> state(k);
  for (int64_t i = 0; i < n; ++i) {
    params.push_back(target(size_t(i)));
    grads.push_back(ctx.input(size_t(2 + n + i)));
  }
  for (size_t s = 0; s < k; ++s)
    for (int64_t i = 0; i < n; ++i) state[s].push_back(target(size_t(n + int64_t(s) * n + i)));
  try {
    apply_update(cfg, step.item_as_int(0), params, grads, state);
  } catch (const Error& e) {
    throw Error(e.code(), node.context() + e.what());
  }
}

#if ONNXTRAIN_CUDA
// AdamW (torch's and transformers' modes, float32, no amsgrad) as one multi-tensor update on the
// device (backends/cuda/adamw.cu); the other rules and cases run on the host.
void adamw_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  OptimizerConfig cfg = config_from_update_node(node);
  const int64_t n = param_count(node, ctx.num_inputs(), cfg.state_names().size());
  bool device_case = (cfg.type == OptimizerType::kAdamW || cfg.type == OptimizerType::kHFAdamW) && !cfg.amsgrad;
  for (size_t i = 2; device_case && i < ctx.num_inputs(); ++i)
    device_case = ctx.input(i).dtype() == DType::kFloat32 && ctx.input(i).shape() == ctx.input(2 + size_t(i - 2) % size_t(n)).shape();
  if (!device_case) return run_on_host(ctx, "amsgrad, or tensors other than float32 of matching shapes");
  OT_CHECK(int64_t(ctx.num_outputs()) <= 3 * n, node.context(), "expected at most ", 3 * n, " outputs (", n,
           " parameters and 2 state lists), got ", ctx.num_outputs());
  const Tensor& lr = ctx.input(0);
  const Tensor& step = ctx.input(1);
  OT_CHECK(is_floating(lr.dtype()) && lr.numel() == 1, node.context(), "input 0 (lr) must be a floating-point scalar, got ",
           dtype_name(lr.dtype()), " ", shape_str(lr.shape()));
  OT_CHECK(is_integer(step.dtype()) && step.numel() == 1, node.context(),
           "input 1 (step) must be an integer scalar, got ", dtype_name(step.dtype()), " ", shape_str(step.shape()));
  cuda::AdamWConfig c;
  c.lr = lr.item_as_double(0);
  c.step = step.item_as_int(0);
  OT_CHECK(c.step >= 1, node.context(), "input 1 (step) must be >= 1, got ", c.step);
  c.beta1 = cfg.betas[0];
  c.beta2 = cfg.betas[1];
  c.eps = cfg.eps;
  c.weight_decay = cfg.weight_decay;
  c.max_grad_norm = cfg.max_grad_norm;
  c.hf = cfg.type == OptimizerType::kHFAdamW;
  c.correct_bias = cfg.correct_bias;
  c.maximize = cfg.maximize;
  const bool in_place = node.attr_int("in_place", 1) != 0;
  std::vector<Tensor> keep;  // fresh targets of outputs not requested (in_place = 0)
  auto target = [&](size_t j) -> float* {
    const Tensor& in = ctx.input(source_input(n, j));
    const bool requested = j < ctx.num_outputs() && ctx.output_requested(j);
    if (in_place) {
      if (requested) ctx.set_output(j, in);
      return static_cast<float*>(const_cast<void*>(in.data()));
    }
    Tensor t = requested ? ctx.output(j, in.dtype(), in.shape()) : empty_on(ctx.device(), in.dtype(), in.shape());
    cuda::unary(cuda::Unary::kCopy, in.dtype(), in.data(), in.shape(), t.data(), t.shape(), ctx.stream());
    keep.push_back(t);
    return t.data<float>();
  };
  std::vector<float*> params, m, v;
  std::vector<const float*> grads;
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < n; ++i) {
    params.push_back(target(size_t(i)));
    grads.push_back(ctx.input(size_t(2 + n + i)).data<float>());
    sizes.push_back(ctx.input(size_t(2 + i)).numel());
  }
  for (int64_t i = 0; i < n; ++i) m.push_back(target(size_t(n + i)));
  for (int64_t i = 0; i < n; ++i) v.push_back(target(size_t(2 * n + i)));
  cuda::adamw(c, params, grads, m, v, sizes, ctx.stream());
}
#endif

// With in_place = 1 (the default) the kernels write the parameters and the state lists: every
// input an output stands for.
std::vector<size_t> update_written_inputs(const Node& node, size_t num_inputs) {
  if (node.attr_int("in_place", 1) == 0) return {};
  size_t k = 0;
  try {
    k = config_from_update_node(node).state_names().size();
  } catch (const Error&) {
    return {};  // the kernel reports bad attributes before it writes anything
  }
  const int64_t rest = int64_t(num_inputs) - 2, groups = 2 + int64_t(k);
  if (rest <= 0 || rest % groups != 0) return {};  // the kernel reports the bad arity
  const int64_t n = rest / groups;
  std::vector<size_t> written;
  for (size_t j = 0; j < size_t(n * int64_t(1 + k)); ++j) written.push_back(source_input(n, j));
  return written;
}

void update_shape(ShapeContext& ctx) {
  OptimizerConfig cfg;
  try {
    cfg = config_from_update_node(ctx.node());
  } catch (const Error&) {
    return;  // the kernel reports bad attributes
  }
  int64_t rest = int64_t(ctx.num_inputs()) - 2, groups = 2 + int64_t(cfg.state_names().size());
  if (rest <= 0 || rest % groups != 0) return;  // the kernel reports the bad arity
  int64_t n = rest / groups;
  for (size_t j = 0; j < ctx.num_outputs(); ++j) {
    size_t in = source_input(n, j);
    if (in >= ctx.num_inputs()) break;
    ctx.set_output(j, ctx.input_dtype(in), ctx.input_shape(in));
  }
}

}  // namespace

// Updates run after the gradient graph and produce no gradient of their own.
ONNXTRAIN_OP(AdamW, kOnnxTrainDomain, 1).inputs(6, INT_MAX).outputs(1, INT_MAX).shape(update_shape)
    .not_differentiable().cpu(update_kernel).cuda(OT_CUDA(adamw_cuda)).host_inputs(std::vector<int>{0, 1})
    .written_inputs(update_written_inputs);
ONNXTRAIN_OP(Adam, kOnnxTrainDomain, 1).inputs(6, INT_MAX).outputs(1, INT_MAX).shape(update_shape)
    .not_differentiable().cpu(update_kernel).written_inputs(update_written_inputs);
ONNXTRAIN_OP(SGD, kOnnxTrainDomain, 1).inputs(4, INT_MAX).outputs(1, INT_MAX).shape(update_shape)
    .not_differentiable().cpu(update_kernel).written_inputs(update_written_inputs);
ONNXTRAIN_OP(Lamb, kOnnxTrainDomain, 1).inputs(6, INT_MAX).outputs(1, INT_MAX).shape(update_shape)
    .not_differentiable().cpu(update_kernel).written_inputs(update_written_inputs);
ONNXTRAIN_OP(Adagrad, kOnnxTrainDomain, 1).inputs(5, INT_MAX).outputs(1, INT_MAX).shape(update_shape)
    .not_differentiable().cpu(update_kernel).written_inputs(update_written_inputs);

}  // namespace onnxtrain::optim

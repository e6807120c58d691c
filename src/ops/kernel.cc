#include "ops/kernel.h"

#include <iostream>
#include <mutex>
#include <set>

#include "core/device.h"
#include "ops/registry.h"

namespace onnxtrain {

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i)) {
    Value::Kind kind = input_kind(i);
    if (kind == Value::Kind::kSequence || (kind == Value::Kind::kNone && i < input_values_.size() && input_values_[i]))
      OT_THROW(kInvalidArgument, node_->context(), "input ", i, " should be a tensor, got ", value_kind_name(kind));
    OT_THROW(kInvalidArgument, node_->context(), "input ", i, " is required but missing");
  }
  return *inputs_[i];
}

Value::Kind KernelContext::input_kind(size_t i) const {
  if (i < input_values_.size() && input_values_[i]) return input_values_[i]->kind;
  return has_input(i) ? Value::Kind::kTensor : Value::Kind::kNone;
}

const std::vector<Tensor>& KernelContext::input_sequence(size_t i) const {
  Value::Kind kind = input_kind(i);
  OT_CHECK(kind == Value::Kind::kSequence, node_->context(), "input ", i, " should be a sequence, got ",
           value_kind_name(kind));
  return input_values_[i]->sequence;
}

Value KernelContext::input_value(size_t i) const {
  switch (input_kind(i)) {
    case Value::Kind::kTensor: return Value(*inputs_[i]);
    case Value::Kind::kSequence: return *input_values_[i];
    case Value::Kind::kNone: break;
  }
  return Value::none();
}

void KernelContext::set_output_value(size_t i, Value value) {
  OT_CHECK(value.is_tensor(), node_->context(), "output ", i, " is ", value_kind_name(value.kind),
           ", which only an executor holds (it cannot be computed standalone)");
  set_output(i, std::move(value.tensor));
}

namespace {
// Allocates every output; used where no plan exists.
class StandaloneContext final : public KernelContext {
 public:
  StandaloneContext(const Node& node, int64_t opset, const std::vector<Tensor>& inputs) {
    node_ = &node;
    opset_ = opset;
    for (const auto& t : inputs) inputs_.push_back(&t);
    num_outputs_ = node.outputs.size();
    outputs.resize(num_outputs_);
  }
  Tensor& output(size_t i, DType dtype, const Shape& shape) override {
    if (i >= outputs.size()) outputs.resize(i + 1);
    outputs[i] = Tensor::empty(dtype, shape);
    return outputs[i];
  }
  void set_output(size_t i, Tensor tensor) override {
    if (i >= outputs.size()) outputs.resize(i + 1);
    outputs[i] = std::move(tensor);
  }
  std::vector<Tensor> outputs;
};
}  // namespace

std::vector<Tensor> run_node_once(const Node& node, int64_t opset, const std::vector<Tensor>& inputs) {
  const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, opset);
  if (!schema || !schema->cpu)
    OT_THROW(kNotImplemented, node.context(), "no CPU kernel for opset ", opset);
  auto kernel = schema->cpu(node);
  StandaloneContext ctx(node, opset, inputs);
  kernel->compute(ctx);
  ctx.outputs.resize(node.outputs.size());
  return std::move(ctx.outputs);
}

void run_on_host(KernelContext& ctx, const std::string& why) {
  const Node& node = ctx.node();
  {
    static std::mutex mutex;
    static std::set<std::string> reported;
    std::lock_guard<std::mutex> lock(mutex);
    if (reported.insert(node.domain + "." + node.op_type + ": " + why).second)
      std::cerr << "onnxtrain: " << device_name(ctx.device()) << " " << node.op_type << " (" << why
                << "): runs on the CPU, with its inputs and outputs copied\n";
  }
  const Stream stream(std::shared_ptr<void>(), ctx.stream());  // the step's stream, not owned
  std::vector<Tensor> inputs(ctx.num_inputs());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (ctx.has_input(i)) inputs[i] = to_device(ctx.input(i), Device::kCpu, stream);
  std::vector<Tensor> outputs = run_node_once(node, ctx.opset(), inputs);
  // An op that writes inputs in place wrote the host copies: the device inputs take their bytes.
  const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, ctx.opset());
  if (schema && schema->written_inputs)
    for (size_t i : schema->written_inputs(node, inputs.size()))
      if (i < inputs.size() && inputs[i].defined()) {
        Tensor device_input = ctx.input(i);  // shares the input's storage
        copy_into(device_input, inputs[i], stream);
      }
  for (size_t i = 0; i < outputs.size() && i < ctx.num_outputs(); ++i) {
    if (!ctx.output_requested(i) || !outputs[i].defined()) continue;
    Tensor& out = ctx.output(i, outputs[i].dtype(), outputs[i].shape());
    if (out.nbytes())
      device_backend(ctx.device()).copy(out.data(), ctx.device(), outputs[i].data(), Device::kCpu, out.nbytes(), stream);
  }
}

}  // namespace onnxtrain

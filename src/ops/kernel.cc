#include "ops/kernel.h"

#include "ops/registry.h"

namespace onnxtrain {

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i))
    OT_THROW(kInvalidArgument, node_->context(), "input ", i, " is required but missing");
  return *inputs_[i];
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

}  // namespace onnxtrain

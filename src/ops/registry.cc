#include "ops/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace onnxtrain {

const char* gradient_status_name(GradientStatus s) {
  switch (s) {
    case GradientStatus::kUnstated: return "unstated";
    case GradientStatus::kDifferentiable: return "differentiable";
    case GradientStatus::kNotDifferentiable: return "not differentiable";
    case GradientStatus::kNotImplemented: return "not implemented";
  }
  return "?";
}

OpRegistry& OpRegistry::global() {
  static OpRegistry registry;
  return registry;
}

void OpRegistry::add(OpSchema schema) {
  for (const auto& s : schemas_) {
    if (s->domain == schema.domain && s->op_type == schema.op_type && s->since_version == schema.since_version) {
      // Two registrations of one key is a build mistake; fail loudly at load time.
      std::fprintf(stderr, "onnxtrain: op %s (domain '%s', since %d) registered twice: %s and %s\n",
                   schema.op_type.c_str(), schema.domain.c_str(), schema.since_version,
                   s->source_file.c_str(), schema.source_file.c_str());
      std::abort();
    }
  }
  schemas_.push_back(std::make_unique<OpSchema>(std::move(schema)));
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op_type, int64_t opset) const {
  const OpSchema* best = nullptr;
  for (const auto& s : schemas_) {
    if (s->domain != domain || s->op_type != op_type || s->since_version > opset) continue;
    if (!best || s->since_version > best->since_version) best = s.get();
  }
  return best;
}

std::vector<const OpSchema*> OpRegistry::versions(const std::string& domain, const std::string& op_type) const {
  std::vector<const OpSchema*> out;
  for (const auto& s : schemas_)
    if (s->domain == domain && s->op_type == op_type) out.push_back(s.get());
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->since_version < b->since_version; });
  return out;
}

std::vector<const OpSchema*> OpRegistry::all() const {
  std::vector<const OpSchema*> out;
  for (const auto& s : schemas_) out.push_back(s.get());
  std::sort(out.begin(), out.end(), [](auto* a, auto* b) {
    return std::tie(a->domain, a->op_type, a->since_version) < std::tie(b->domain, b->op_type, b->since_version);
  });
  return out;
}

OpBuilder::OpBuilder(const char* op_type, const std::string& domain, int since_version, const char* file) {
  schema_.op_type = op_type;
  schema_.domain = domain;
  schema_.since_version = since_version;
  schema_.source_file = file;
}

OpBuilder& OpBuilder::inputs(int min, int max) {
  schema_.min_inputs = min;
  schema_.max_inputs = max;
  return *this;
}
OpBuilder& OpBuilder::outputs(int min, int max) {
  schema_.min_outputs = min;
  schema_.max_outputs = max;
  return *this;
}
OpBuilder& OpBuilder::shape(ShapeFn fn) {
  schema_.shape = std::move(fn);
  return *this;
}
namespace {
KernelFactory function_kernel(KernelFn fn) {
  return [fn](const Node&) -> std::unique_ptr<Kernel> { return std::make_unique<FunctionKernel>(fn); };
}
}  // namespace

OpBuilder& OpBuilder::cpu(KernelFn fn) { return cpu(function_kernel(fn)); }
OpBuilder& OpBuilder::cpu(KernelFactory factory) {
  schema_.cpu = std::move(factory);
  return *this;
}
OpBuilder& OpBuilder::cuda(KernelFn fn) { return cuda(function_kernel(fn)); }
OpBuilder& OpBuilder::cuda(KernelFactory factory) {
  schema_.cuda = std::move(factory);
  return *this;
}
OpBuilder& OpBuilder::host_inputs(std::vector<int> inputs) {
  schema_.host_inputs = std::move(inputs);
  return *this;
}
OpBuilder& OpBuilder::written_inputs(WrittenInputsFn fn) {
  schema_.written_inputs = std::move(fn);
  return *this;
}
OpBuilder& OpBuilder::gradient(GradientFn fn) {
  schema_.gradient = std::move(fn);
  schema_.gradient_status = GradientStatus::kDifferentiable;
  return *this;
}
OpBuilder& OpBuilder::gradient_rule_left_out() {
  schema_.gradient_status = GradientStatus::kDifferentiable;
  schema_.gradient_note = "the minimal runtime has no gradient rules (generate artifacts with the full build)";
  return *this;
}
OpBuilder& OpBuilder::not_differentiable() {
  schema_.gradient_status = GradientStatus::kNotDifferentiable;
  return *this;
}
OpBuilder& OpBuilder::gradient_not_implemented(std::string reason) {
  schema_.gradient_status = GradientStatus::kNotImplemented;
  schema_.gradient_note = std::move(reason);
  return *this;
}
OpBuilder& OpBuilder::inplace(int output, int input) {
  schema_.inplace.emplace_back(output, input);
  return *this;
}

OpBuilder& OpBuilder::state_inputs(std::vector<int> inputs) {
  schema_.state_inputs = std::move(inputs);
  return *this;
}

OpBuilder& OpBuilder::state_updates(StateUpdatesFn fn) {
  schema_.state_updates = std::move(fn);
  return *this;
}

OpBuilder& OpBuilder::inference_form(InferenceFormFn fn) {
  schema_.inference_form = std::move(fn);
  return *this;
}

OpBuilder& OpBuilder::work(WorkFn fn) {
  schema_.work = std::move(fn);
  return *this;
}

int64_t memory_bound_work(const std::vector<const Shape*>& inputs, const std::vector<const Shape*>& outputs) {
  int64_t elements = 0;
  for (const auto* list : {&inputs, &outputs})
    for (const Shape* s : *list)
      if (s) elements += numel(*s);
  return elements * kMemoryBoundElementWork;
}

int64_t matmul_work(const std::vector<const Shape*>& inputs, const std::vector<const Shape*>& outputs) {
  if (inputs.size() < 2 || !inputs[0] || !inputs[1] || outputs.empty() || !outputs[0]) return kSerialWork;
  double product = double(numel(*inputs[0])) * double(numel(*inputs[1])) * double(numel(*outputs[0]));
  return product >= double(kSerialWork) * double(kSerialWork) ? kSerialWork : int64_t(std::sqrt(product));
}

OpRegistration::OpRegistration(const OpBuilder& builder) { OpRegistry::global().add(builder.schema()); }

}  // namespace onnxtrain

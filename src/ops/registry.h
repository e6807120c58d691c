// The op registry: every op is declared once, keyed by (domain, op type, since-version), with its
// arity, shape rule, gradient status and rule, CPU kernel and, where it has one, CUDA kernel
// (DESIGN.md, "One op, one place").
//
//   ONNXTRAIN_OP(Relu, kOnnxDomain, 14)
//       .inputs(1).outputs(1)
//       .shape(same_shape_as_input)
//       .inplace(0, 0)
//       .cpu(relu_kernel)
//       .cuda(OT_CUDA(relu_cuda));   // nothing in a build without CUDA: see OT_CUDA below
//
// A lookup for a model of opset N finds the registration with the greatest since-version <= N.
#pragma once

#include <climits>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/parallel.h"
#include "ir/graph.h"
#include "ops/kernel.h"
#include "ops/shape_context.h"

namespace onnxtrain {

class GradientBuilder;  // ops/gradient_builder.h: the graph builder gradient rules are written with

enum class GradientStatus {
  kUnstated,          // the op has not said yet; autodiff treats it as "no gradient rule"
  kDifferentiable,    // has a rule
  kNotDifferentiable, // outputs are integers/bools or pure shape data: no gradient flows
  kNotImplemented,    // differentiable in principle; the note says why there is no rule yet
};
const char* gradient_status_name(GradientStatus s);

using ShapeFn = std::function<void(ShapeContext&)>;
using GradientFn = std::function<void(GradientBuilder&)>;

// An output that is, in training mode, the op's new value of one of its inputs (BatchNorm's
// running mean and variance). Artifacts bind it back to the checkpoint buffer, TrainModule to the
// torch buffer; `running_variance` marks a biased variance, which torch keeps unbiased.
struct StateUpdate {
  int input = 0;
  int output = 0;
  bool running_variance = false;
};
// The state updates a node makes (none when it runs in inference mode).
using StateUpdatesFn = std::function<std::vector<StateUpdate>(const Node&, int64_t opset)>;
// Rewrites a node into its inference form (Dropout without training_mode, BatchNorm with running
// statistics): the eval graph of a training model.
using InferenceFormFn = std::function<void(Node&, int64_t opset)>;
// The work of one call in multiply-add equivalents (kSerialWork, core/parallel.h), from the shapes
// of its inputs (null: omitted) and outputs. The executor runs a step whose work is below
// kSerialWork on the calling thread alone (no OpenMP region; see Executor). Unset: the op's kernel
// keeps the session's threads whatever the shapes.
using WorkFn = std::function<int64_t(const std::vector<const Shape*>& inputs, const std::vector<const Shape*>& outputs)>;
// A memory-bound op (elementwise, pooling, copies, normalisation): the elements it reads and
// writes, at kMemoryBoundElementWork each.
int64_t memory_bound_work(const std::vector<const Shape*>& inputs, const std::vector<const Shape*>& outputs);
// A product of A [..., M, K] and B [..., K, N] into Y [..., M, N] (transposed or not): its
// multiply-adds are sqrt(|A| |B| |Y|) when the batch is broadcast, at most sqrt(batch) times more
// otherwise (an overestimate errs towards threads).
int64_t matmul_work(const std::vector<const Shape*>& inputs, const std::vector<const Shape*>& outputs);

using WrittenInputsFn = std::function<std::vector<size_t>(const Node& node, size_t num_inputs)>;

struct OpSchema {
  std::string domain;
  std::string op_type;
  int since_version = 1;
  int min_inputs = 0, max_inputs = INT_MAX;
  int min_outputs = 1, max_outputs = 1;
  ShapeFn shape;
  KernelFactory cpu;
  // The kernel on CUDA tensors (src/backends/cuda does the work); unset: on a CUDA executor the
  // op runs its CPU kernel on host copies of its inputs, reported once by name.
  KernelFactory cuda;
  // Inputs a device kernel reads on the host (shapes, axes, sizes): the executor hands them over
  // as host tensors whatever device the step runs on.
  std::vector<int> host_inputs;
  // The inputs this node's kernel writes in place (update ops with in_place = 1); unset: none. A
  // device executor copies those it handed the kernel as copies back into their values.
  WrittenInputsFn written_inputs;
  GradientStatus gradient_status = GradientStatus::kUnstated;
  GradientFn gradient;
  std::string gradient_note;
  std::vector<std::pair<int, int>> inplace;  // (output, input) pairs that may share one buffer
  std::vector<int> state_inputs;             // inputs that are state, not parameters (running statistics)
  StateUpdatesFn state_updates;              // unset: the op updates no state
  InferenceFormFn inference_form;            // unset: the op runs the same in training and inference
  WorkFn work;                               // unset: never made serial by the executor
  std::string source_file;
};

class OpRegistry {
 public:
  static OpRegistry& global();
  void add(OpSchema schema);
  // The schema for a node of this model's opset, or nullptr.
  const OpSchema* find(const std::string& domain, const std::string& op_type, int64_t opset) const;
  // Any version, for listing and for "unknown op" vs "op too old/new" messages.
  std::vector<const OpSchema*> versions(const std::string& domain, const std::string& op_type) const;
  std::vector<const OpSchema*> all() const;

 private:
  std::vector<std::unique_ptr<OpSchema>> schemas_;
};

// Fluent declaration; the OpRegistration it converts to adds the schema to the global registry.
class OpBuilder {
 public:
  OpBuilder(const char* op_type, const std::string& domain, int since_version, const char* file);
  OpBuilder& inputs(int n) { return inputs(n, n); }
  OpBuilder& inputs(int min, int max);
  OpBuilder& outputs(int n) { return outputs(n, n); }
  OpBuilder& outputs(int min, int max);
  OpBuilder& shape(ShapeFn fn);
  OpBuilder& cpu(KernelFn fn);
  OpBuilder& cpu(KernelFactory factory);
  template <typename K>
  OpBuilder& cpu_kernel() {  // a stateful kernel class constructed once per node: K(const Node&)
    return cpu(KernelFactory([](const Node& n) -> std::unique_ptr<Kernel> { return std::make_unique<K>(n); }));
  }
  OpBuilder& cuda(KernelFn fn);
  OpBuilder& cuda(KernelFactory factory);
  OpBuilder& cuda(std::nullptr_t) { return *this; }  // OT_CUDA(...) in a build without CUDA
  template <typename K>
  OpBuilder& cuda_kernel() {
    return cuda(KernelFactory([](const Node& n) -> std::unique_ptr<Kernel> { return std::make_unique<K>(n); }));
  }
  OpBuilder& host_inputs(std::vector<int> inputs);
  OpBuilder& written_inputs(WrittenInputsFn fn);
  OpBuilder& gradient(GradientFn fn);
  // Differentiable, but this build has no gradient rules (the minimal runtime: RuntimeOpBuilder).
  OpBuilder& gradient_rule_left_out();
  OpBuilder& not_differentiable();
  OpBuilder& gradient_not_implemented(std::string reason);
  OpBuilder& inplace(int output, int input);
  OpBuilder& state_inputs(std::vector<int> inputs);
  OpBuilder& state_updates(StateUpdatesFn fn);
  OpBuilder& inference_form(InferenceFormFn fn);
  OpBuilder& work(WorkFn fn);
  const OpSchema& schema() const { return schema_; }

 private:
  OpSchema schema_;
};

// What ONNXTRAIN_OP declares in the op files of a minimal build (cmake/minimal.cmake): the minimal
// runtime runs prepared artifacts, so it keeps an op's schema, shape rule and kernel but not its
// gradient rule (artifact generation's), whose lambda is then never instantiated.
class RuntimeOpBuilder {
 public:
  RuntimeOpBuilder(const char* op_type, const std::string& domain, int since_version, const char* file)
      : builder_(op_type, domain, since_version, file) {}
  RuntimeOpBuilder& inputs(int n) { return inputs(n, n); }
  RuntimeOpBuilder& inputs(int min, int max) { builder_.inputs(min, max); return *this; }
  RuntimeOpBuilder& outputs(int n) { return outputs(n, n); }
  RuntimeOpBuilder& outputs(int min, int max) { builder_.outputs(min, max); return *this; }
  RuntimeOpBuilder& shape(ShapeFn fn) { builder_.shape(std::move(fn)); return *this; }
  RuntimeOpBuilder& cpu(KernelFn fn) { builder_.cpu(fn); return *this; }
  RuntimeOpBuilder& cpu(KernelFactory factory) { builder_.cpu(std::move(factory)); return *this; }
  template <typename K>
  RuntimeOpBuilder& cpu_kernel() { builder_.cpu_kernel<K>(); return *this; }
  RuntimeOpBuilder& cuda(KernelFn fn) { builder_.cuda(fn); return *this; }
  RuntimeOpBuilder& cuda(KernelFactory factory) { builder_.cuda(std::move(factory)); return *this; }
  RuntimeOpBuilder& cuda(std::nullptr_t) { return *this; }
  template <typename K>
  RuntimeOpBuilder& cuda_kernel() { builder_.cuda_kernel<K>(); return *this; }
  RuntimeOpBuilder& host_inputs(std::vector<int> inputs) { builder_.host_inputs(std::move(inputs)); return *this; }
  RuntimeOpBuilder& written_inputs(WrittenInputsFn fn) { builder_.written_inputs(std::move(fn)); return *this; }
  template <typename Rule>
  RuntimeOpBuilder& gradient(const Rule&) { builder_.gradient_rule_left_out(); return *this; }
  RuntimeOpBuilder& not_differentiable() { builder_.not_differentiable(); return *this; }
  RuntimeOpBuilder& gradient_not_implemented(std::string reason) {
    builder_.gradient_not_implemented(std::move(reason));
    return *this;
  }
  RuntimeOpBuilder& inplace(int output, int input) { builder_.inplace(output, input); return *this; }
  RuntimeOpBuilder& state_inputs(std::vector<int> inputs) { builder_.state_inputs(std::move(inputs)); return *this; }
  RuntimeOpBuilder& state_updates(StateUpdatesFn fn) { builder_.state_updates(std::move(fn)); return *this; }
  RuntimeOpBuilder& inference_form(InferenceFormFn fn) { builder_.inference_form(std::move(fn)); return *this; }
  RuntimeOpBuilder& work(WorkFn fn) { builder_.work(std::move(fn)); return *this; }
  const OpBuilder& builder() const { return builder_; }

 private:
  OpBuilder builder_;
};

// What ONNXTRAIN_OP declares for an op the minimal build's ONNXTRAIN_OPS left out: nothing. Every
// call takes its argument and drops it, so the kernel, shape rule and helpers only this op uses
// are never referenced and the compiler leaves them out of the library.
class LeftOutOp {
 public:
  template <typename Domain>
  constexpr LeftOutOp(const char*, const Domain&, int, const char*) {}
  constexpr LeftOutOp& inputs(int) { return *this; }
  constexpr LeftOutOp& inputs(int, int) { return *this; }
  constexpr LeftOutOp& outputs(int) { return *this; }
  constexpr LeftOutOp& outputs(int, int) { return *this; }
  constexpr LeftOutOp& inplace(int, int) { return *this; }
  constexpr LeftOutOp& not_differentiable() { return *this; }
  constexpr LeftOutOp& cpu(KernelFn) { return *this; }  // not a template: overloaded kernel names resolve
  template <typename K>
  constexpr LeftOutOp& cpu_kernel() { return *this; }
  template <typename Any>
  constexpr LeftOutOp& cpu(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& shape(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& cuda(const Any&) { return *this; }
  template <typename K>
  constexpr LeftOutOp& cuda_kernel() { return *this; }
  template <typename Any>
  constexpr LeftOutOp& host_inputs(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& written_inputs(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& gradient(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& gradient_not_implemented(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& state_inputs(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& state_updates(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& inference_form(const Any&) { return *this; }
  template <typename Any>
  constexpr LeftOutOp& work(const Any&) { return *this; }
};

struct OpRegistration {
  OpRegistration(const OpBuilder& builder);  // NOLINT: implicit, so the macro reads as a chain
  OpRegistration(const RuntimeOpBuilder& b) : OpRegistration(b.builder()) {}  // NOLINT: as above
  constexpr OpRegistration(const LeftOutOp&) {}                                // NOLINT: as above
};

}  // namespace onnxtrain

// An op's CUDA kernel, named where the op is declared (`.cuda(OT_CUDA(softmax_cuda))`): the kernel
// in a build with CUDA (-DONNXTRAIN_CUDA=ON), nullptr without, so such a build references nothing
// of src/backends/cuda. The kernel itself sits in the op's file inside `#if ONNXTRAIN_CUDA`.
#if ONNXTRAIN_CUDA
#define OT_CUDA(kernel) kernel
#else
#define OT_CUDA(kernel) nullptr
#endif

#define OT_CONCAT_INNER(a, b) a##b
#define OT_CONCAT(a, b) OT_CONCAT_INNER(a, b)
// 0 in a minimal build's op files, which have no gradient rules: helpers that only gradient rules
// call are compiled `#if ONNXTRAIN_GRADIENT_RULES` (the rules themselves go with RuntimeOpBuilder).
#ifdef ONNXTRAIN_MINIMAL_OPS
#define ONNXTRAIN_GRADIENT_RULES 0
#else
#define ONNXTRAIN_GRADIENT_RULES 1
#endif
#ifdef ONNXTRAIN_MINIMAL_OPS
// A minimal build's op files: the generated ops_in_build.h (cmake/minimal.cmake) says which ops
// ONNXTRAIN_OPS / ONNXTRAIN_OPS_FILE selected; the others register nothing.
#include "ops_in_build.h"
#define OT_OP_BUILDER(OP)                                                              \
  std::conditional_t<::onnxtrain::op_in_build(#OP), ::onnxtrain::RuntimeOpBuilder, \
                     ::onnxtrain::LeftOutOp>
#else
#define OT_OP_BUILDER(OP) ::onnxtrain::OpBuilder
#endif
#define ONNXTRAIN_OP(OP, DOMAIN, SINCE)                                              \
  [[maybe_unused]] static const ::onnxtrain::OpRegistration OT_CONCAT(ot_op_reg_, __COUNTER__) = \
      OT_OP_BUILDER(OP)(#OP, DOMAIN, SINCE, __FILE__)

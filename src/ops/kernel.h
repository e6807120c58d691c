// The kernel interface. A kernel reads its inputs from a KernelContext and asks it for outputs by
// dtype and shape; the executor hands back the buffer the memory planner reserved for that output
// when the shape is the planned one, so kernels never manage memory themselves.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/value.h"

namespace onnxtrain {

class KernelContext {
 public:
  virtual ~KernelContext() = default;
  const Node& node() const { return *node_; }
  int64_t opset() const { return opset_; }

  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] && inputs_[i]->defined(); }
  // Input i as a tensor; throws naming the node when it is missing, a sequence or an empty optional.
  const Tensor& input(size_t i) const;
  // Sequence and optional inputs (ONNX sequence(T), optional(T)). An input the node omits, or one
  // given no value, is kNone; a present tensor is kTensor.
  Value::Kind input_kind(size_t i) const;
  const std::vector<Tensor>& input_sequence(size_t i) const;  // throws unless a sequence
  Value input_value(size_t i) const;                           // any kind (tensors share storage)
  // True when input i is an initializer of the graph being run: its contents never change, so a
  // kernel may cache work derived from them (reordered weights) across runs.
  virtual bool input_is_constant(size_t) const { return false; }
  // Random ops without a `seed` attribute draw from stream_key(random_seed(), <node>, run_index())
  // (core/random.h): the executor's seed and the index of the current run.
  uint64_t random_seed() const { return random_seed_; }
  // The device the kernel runs on and, off the host, the stream it queues its work on (a
  // cudaStream_t for kCuda): every step of a run goes to this one stream, in order.
  Device device() const { return device_; }
  void* stream() const { return stream_; }
  uint64_t run_index() const { return run_index_; }

  size_t num_outputs() const { return num_outputs_; }
  // False for an omitted optional output: the kernel may skip computing it.
  bool output_requested(size_t i) const { return node_->has_output(i); }
  // A buffer for output i of the given dtype and shape.
  virtual Tensor& output(size_t i, DType dtype, const Shape& shape) = 0;
  // Sets output i to an existing tensor: a view of an input (Reshape, Identity) or a constant.
  virtual void set_output(size_t i, Tensor tensor) = 0;
  // Sets output i to a value of any kind. Only an executor holds sequences and empty optionals;
  // elsewhere (constant folding) a non-tensor output throws.
  virtual void set_output_value(size_t i, Value value);

 protected:
  const Node* node_ = nullptr;
  int64_t opset_ = 0;
  std::vector<const Tensor*> inputs_;
  std::vector<const Value*> input_values_;  // per input, where it is a sequence or an empty optional
  size_t num_outputs_ = 0;
  uint64_t random_seed_ = 0, run_index_ = 0;
  Device device_ = Device::kCpu;
  void* stream_ = nullptr;
};

// A kernel instance lives as long as the plan for one node and may cache per-shape state
// (oneDNN primitives, parsed attributes) across runs.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void compute(KernelContext& ctx) = 0;
};

using KernelFn = void (*)(KernelContext&);
using KernelFactory = std::function<std::unique_ptr<Kernel>(const Node&)>;

class FunctionKernel final : public Kernel {
 public:
  explicit FunctionKernel(KernelFn fn) : fn_(fn) {}
  void compute(KernelContext& ctx) override { fn_(ctx); }

 private:
  KernelFn fn_;
};

// Runs a node's kernel once over the given inputs, allocating every output (constant folding,
// tests and the recording run of the planner use this).
std::vector<Tensor> run_node_once(const Node& node, int64_t opset, const std::vector<Tensor>& inputs);

// A device kernel's way out for a case it does not cover (a dtype, class weights, an axis
// layout): the op's CPU kernel on host copies of the inputs, its requested outputs copied back to
// the device. `why` names the case; each (op, why) is reported once per process on stderr.
void run_on_host(KernelContext& ctx, const std::string& why);

}  // namespace onnxtrain

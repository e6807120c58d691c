#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <set>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__)
#include <sys/mman.h>
#endif

#include "core/crc32c.h"
#include "core/memory.h"
#include "core/omp_threads.h"
#include "core/parallel.h"
#include "ir/subgraph.h"
#include "ops/build_ops.h"
#include "ops/subgraph.h"
#include "passes/shape_inference.h"
#include "runtime/memory_planner.h"

namespace onnxtrain {

namespace {
// The recording run allocates every intermediate separately; glibc keeps most of those freed
// blocks in its heap (its mmap threshold rises as large blocks are freed), so without this the
// process would hold them beside the arena that replaces them for the rest of its life.
void release_freed_heap() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}
// An output of the recording run. Large ones are mapped pages of their own, unmapped when the
// value dies: the recording run then holds no more than its live values, as the arena will. From
// the heap, freed blocks stay in it (glibc raises its mmap threshold as large blocks are freed),
// and the first step's peak was the heap's high-water mark: 25-34 MiB above the arena that
// replaces it in LoRA training at batch 4 (the peak of a short fine-tuning run).
Tensor recording_output(DType dtype, const Shape& shape) {
#if defined(ONNXTRAIN_MAPPED_STORAGE)
  constexpr size_t kMappedFrom = size_t(1) << 16;  // below this, the heap is cheaper than a syscall
  const size_t bytes = checked_tensor_bytes(dtype, shape);
  if (bytes >= kMappedFrom) {
    charge_storage(bytes);  // the memory limit (include/onnxtrain/limits.h)
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
      return Tensor::borrow(dtype, shape, p, std::shared_ptr<void>(p, [bytes](void* q) {
                              munmap(q, bytes);
                              release_storage(bytes);
                            }));
    release_storage(bytes);
  }
#endif
  return Tensor::empty(dtype, shape);
}
}  // namespace

struct Executor::Plan {
  std::vector<std::unique_ptr<Kernel>> kernels;  // one per step
  std::vector<Tensor> values;                    // per value id: the live tensor
  // Per value id: a sequence or an empty optional, when the value holds one (kind kTensor: the
  // value is values[id]). Sequences are never planned: their elements are tensors of their own.
  std::vector<Value> others;
  std::vector<Tensor> planned;                   // per value id: its arena view, if planned
  // Device executors, per value id: the value's copy on the other side (host or device), made
  // when a step first needs it there; a constant's copy is kept across runs, others die with it.
  std::vector<Tensor> mirrors;
  size_t device_copies = 0;
  bool recorded = false;
  // What the recording run saw, per value id.
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  std::vector<int> alias_of;      // the input value a view aliases, or -1
  std::vector<char> external;     // storage not from this run: feeds, initializers, constants
  std::vector<char> from_set_output;
  std::shared_ptr<void> arena;
  // During a run with output buffers: per value id, the caller's storage for that output.
  const std::vector<Tensor>* output_buffers = nullptr;
  MemoryReport report;
  size_t dynamic_allocations = 0;
  std::vector<char> is_graph_output_root;
  // Every step runs on the calling thread alone (decide_serial).
  bool serial = false, serial_decided = false;
  // Per step, when the plan is not serial: runs on the calling thread alone (the pool sleeps
  // between regions and the step is below serial_step_work()).
  std::vector<char> step_serial;
};

namespace {

using SubgraphRunFn = std::function<std::vector<Value>(const std::string&, const std::vector<Value>&)>;

// Hands kernels their inputs and outputs for one step (and, to control-flow kernels, their subgraphs).
class StepContext final : public KernelContext, public SubgraphHost {
 public:
  StepContext(const Node& node, int64_t opset, std::vector<Tensor>& values, std::vector<Value>& others,
              std::vector<Tensor>& planned, const std::vector<int>& in_ids, const std::vector<int>& out_ids,
              size_t& dynamic_allocations, std::vector<char>* set_output_flags, const std::vector<char>& is_constant,
              uint64_t random_seed, uint64_t run_index, const SubgraphRunFn* subgraphs,
              const std::shared_ptr<void>& arena, const std::vector<Tensor>* output_buffers,
              Device device = Device::kCpu, void* stream = nullptr)
      : values_(values), others_(others), planned_(planned), in_ids_(in_ids), out_ids_(out_ids),
        dynamic_(dynamic_allocations), arena_(arena), output_buffers_(output_buffers),
        set_output_flags_(set_output_flags), is_constant_(is_constant), subgraphs_(subgraphs) {
    node_ = &node;
    opset_ = opset;
    random_seed_ = random_seed;
    run_index_ = run_index;
    device_ = device;
    stream_ = stream;
    // Kernels see the node's own inputs; outer-scope reads of subgraphs are bound by run_subgraph.
    size_t formal = std::min(in_ids.size(), node.inputs.size());
    inputs_.reserve(formal);
    for (size_t i = 0; i < formal; ++i) inputs_.push_back(in_ids[i] >= 0 ? &values[size_t(in_ids[i])] : nullptr);
    for (size_t i = 0; i < formal; ++i)
      if (in_ids[i] >= 0 && !others[size_t(in_ids[i])].is_tensor()) {
        input_values_.resize(formal, nullptr);
        input_values_[i] = &others[size_t(in_ids[i])];
      }
    num_outputs_ = out_ids.size();
  }

  // Input i as another tensor than the value's own (its copy on the device the step runs on).
  void bind_input(size_t i, const Tensor* t) { inputs_[i] = t; }

  std::vector<Value> run_subgraph(const std::string& attribute, const std::vector<Value>& inputs) override {
    OT_CHECK(subgraphs_, node_->context(), "has no subgraph '", attribute, "'");
    return (*subgraphs_)(attribute, inputs);
  }

  Tensor& output(size_t i, DType dtype, const Shape& shape) override {
    Tensor* slot = slot_for(i);
    mark_tensor(i);
    int id = i < out_ids_.size() ? out_ids_[i] : -1;
    if (id >= 0 && output_buffers_) {
      const Tensor& given = (*output_buffers_)[size_t(id)];
      if (given.defined() && given.device() == device_ && given.dtype() == dtype && given.shape() == shape)
        return *slot = given;
    }
    if (id >= 0) {
      Tensor& view = planned_[size_t(id)];
      if (view.defined() && view.device() == device_ && view.dtype() == dtype && view.shape() == shape) {
        if (slot->data() != view.data() || slot->shape() != shape) *slot = view;
        return *slot;
      }
      // A data-dependent shape (rows kept by NonZero) no larger than the recorded one fits in the
      // value's own arena range, which nothing else uses while the value lives.
      if (view.defined() && view.device() == device_ && view.dtype() == dtype && numel(shape) <= view.numel()) {
        if (slot->data() != view.data() || slot->shape() != shape)
          *slot = Tensor::borrow(dtype, shape, view.data(), arena_, device_);
        return *slot;
      }
      if (view.defined()) ++dynamic_;  // larger than planned: fall back to a fresh buffer
    }
    if (device_ != Device::kCpu) return *slot = empty_on(device_, dtype, shape);
    *slot = recording() ? recording_output(dtype, shape) : Tensor::empty(dtype, shape);
    return *slot;
  }

  bool input_is_constant(size_t i) const override {
    return i < in_ids_.size() && in_ids_[i] >= 0 && is_constant_[size_t(in_ids_[i])];
  }

  void set_output(size_t i, Tensor tensor) override {
    *slot_for(i) = std::move(tensor);
    mark_tensor(i);
    int id = i < out_ids_.size() ? out_ids_[i] : -1;
    if (id >= 0 && set_output_flags_) (*set_output_flags_)[size_t(id)] = 1;
  }

  void set_output_value(size_t i, Value value) override {
    if (value.is_tensor()) return set_output(i, std::move(value.tensor));
    int id = i < out_ids_.size() ? out_ids_[i] : -1;
    if (id < 0) return;
    values_[size_t(id)] = Tensor();
    others_[size_t(id)] = std::move(value);
  }

 private:
  bool recording() const { return set_output_flags_ != nullptr; }  // the flags are kept while recording
  void mark_tensor(size_t i) {  // an optional output may hold a tensor in one run and none in the next
    int id = i < out_ids_.size() ? out_ids_[i] : -1;
    if (id >= 0 && !others_[size_t(id)].is_tensor()) others_[size_t(id)] = Value();
  }
  Tensor* slot_for(size_t i) {
    int id = i < out_ids_.size() ? out_ids_[i] : -1;
    if (id >= 0) return &values_[size_t(id)];
    if (scratch_.size() <= i) scratch_.resize(i + 1);  // an output the graph does not use
    return &scratch_[i];
  }
  std::vector<Tensor>& values_;
  std::vector<Value>& others_;
  std::vector<Tensor>& planned_;
  const std::vector<int>& in_ids_;
  const std::vector<int>& out_ids_;
  size_t& dynamic_;
  const std::shared_ptr<void>& arena_;  // the plan's, which its views borrow from
  const std::vector<Tensor>* output_buffers_;  // per value id, or null: the run's output buffers
  std::vector<char>* set_output_flags_;
  const std::vector<char>& is_constant_;
  const SubgraphRunFn* subgraphs_;
  std::vector<Tensor> scratch_;
};

struct UnionFind {
  std::vector<int> parent;
  explicit UnionFind(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int x) { return parent[size_t(x)] == x ? x : parent[size_t(x)] = find(parent[size_t(x)]); }
  void unite(int child, int root) { parent[size_t(find(child))] = find(root); }
};

}  // namespace

Executor::Executor(Model model, ExecutorOptions options) : model_(std::move(model)), options_(options) {
  if (options_.random_seed) {
    random_seed_ = *options_.random_seed;
  } else {
    std::random_device device;
    random_seed_ = (uint64_t(device()) << 32) | device();
  }
  compile();
}

void Executor::set_random_state(uint64_t seed, uint64_t next_run_index) {
  std::lock_guard<std::mutex> lock(mutex_);
  random_seed_ = seed;
  next_run_index_ = next_run_index;
}

Executor::~Executor() = default;

void Executor::compile() {
  Graph& g = model_.graph;
  g.topological_sort();
  auto id_of = [&](const std::string& name) {
    auto [it, inserted] = value_ids_.emplace(name, int(value_names_.size()));
    if (inserted) value_names_.push_back(name);
    return it->second;
  };
  for (const auto& in : g.inputs) input_ids_.push_back(id_of(in.name));
  for (const auto& [name, t] : g.initializers) constants_.emplace_back(id_of(name), &t);

  for (const auto& node : g.nodes) {
    const std::string& domain = node.domain;
    int64_t opset = model_.opset(domain);
    Step step;
    step.node = &node;
    step.schema = OpRegistry::global().find(domain, node.op_type, opset);
    if (!step.schema) {
      auto versions = OpRegistry::global().versions(domain, node.op_type);
      if (versions.empty() && op_left_out_of_build(node.op_type))
        OT_THROW(kNotImplemented, "model ", model_.description, ": ", node.context(), "op '",
                 (domain.empty() ? "" : domain + "."), node.op_type, "' is not in this minimal build: ", kAddOpHint);
      if (versions.empty())
        OT_THROW(kNotImplemented, "model ", model_.description, ": ", node.context(), "unknown op '",
                 (domain.empty() ? "" : domain + "."), node.op_type, "' (no kernel is registered)");
      OT_THROW(kNotImplemented, "model ", model_.description, ": ", node.context(), "opset ", opset,
               " of domain '", domain, "' is older than the first supported version ",
               versions.front()->since_version);
    }
    if (!step.schema->cpu && !(options_.device != Device::kCpu && step.schema->cuda))
      OT_THROW(kNotImplemented, "model ", model_.description, ": ", node.context(), "has no CPU kernel");
    int n_in = int(node.inputs.size()), n_out = int(node.outputs.size());
    if (n_in < step.schema->min_inputs || n_in > step.schema->max_inputs)
      OT_THROW(kInvalidModel, "model ", model_.description, ": ", node.context(), "takes ",
               step.schema->min_inputs, " to ", step.schema->max_inputs, " inputs, got ", n_in);
    if (n_out < step.schema->min_outputs || n_out > step.schema->max_outputs)
      OT_THROW(kInvalidModel, "model ", model_.description, ": ", node.context(), "produces ",
               step.schema->min_outputs, " to ", step.schema->max_outputs, " outputs, got ", n_out);
    for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : id_of(in));
    for (const auto& out : node.outputs) step.outputs.push_back(out.empty() ? -1 : id_of(out));
    if (has_subgraphs(node)) compile_subgraphs(step, id_of);
    steps_.push_back(std::move(step));
    if (options_.profile) profile_.push_back({node.name, node.op_type, 0, 0.0});
  }
  if (options_.device != Device::kCpu) {
    backend_ = &device_backend(options_.device);  // "no CUDA device: ..." where there is none
    stream_ = backend_->create_stream();
    // Ops without a kernel for the device, once per process by name: they run on the CPU with copies.
    static std::mutex reported_mutex;
    static std::set<std::string> reported;
    std::string fallbacks;
    for (const Step& step : steps_) {
      on_device_.push_back(step.schema->cuda ? 1 : 0);
      if (on_device_.back()) continue;
      std::string name = (step.node->domain.empty() ? "" : step.node->domain + ".") + step.node->op_type;
      std::lock_guard<std::mutex> lock(reported_mutex);
      if (reported.insert(name).second) fallbacks += (fallbacks.empty() ? "" : ", ") + name;
    }
    if (!fallbacks.empty())
      std::cerr << "onnxtrain: no " << device_name(options_.device) << " kernel for " << fallbacks
                << ": these ops run on the CPU, with their inputs and outputs copied\n";
  }
  device_output_.assign(value_names_.size(), 0);
  for (const auto& name : options_.device_outputs) {
    auto it = value_ids_.find(name);
    OT_CHECK(it != value_ids_.end() && g.is_output(name), "model ", model_.description, ": device output '", name,
             "' is not an output of the model");
    device_output_[size_t(it->second)] = backend_ ? 1 : 0;
  }
  is_constant_.assign(value_names_.size(), 0);
  for (auto& [id, t] : constants_) is_constant_[size_t(id)] = 1;
  for (int id : input_ids_) is_constant_[size_t(id)] = 0;  // an initializer a feed may override
  for (const auto& out : g.outputs) {
    auto it = value_ids_.find(out.name);
    if (it == value_ids_.end())
      OT_THROW(kInvalidModel, "model ", model_.description, ": graph output '", out.name,
               "' is not produced by any node, input or initializer");
    output_ids_.push_back(it->second);
  }
  // A training graph: the steps its non-gradient outputs depend on are the forward.
  if (std::vector<std::string> fwd = default_forward_outputs(g); fwd.size() < g.outputs.size()) {
    forward_step_.assign(steps_.size(), 0);
    std::vector<char> wanted(value_names_.size(), 0);
    for (const auto& name : fwd) wanted[size_t(value_ids_.at(name))] = 1;
    for (size_t s = steps_.size(); s-- > 0;) {
      bool needed = false;
      for (int id : steps_[s].outputs) needed = needed || (id >= 0 && wanted[size_t(id)]);
      if (!needed) continue;
      forward_step_[s] = 1;
      for (int id : steps_[s].inputs) if (id >= 0) wanted[size_t(id)] = 1;
    }
  }
  produced_at_.assign(value_names_.size(), -1);
  last_read_.assign(value_names_.size(), -1);
  for (size_t s = 0; s < steps_.size(); ++s) {
    for (int id : steps_[s].outputs) if (id >= 0) produced_at_[size_t(id)] = int(s);
    for (int id : steps_[s].inputs) if (id >= 0) last_read_[size_t(id)] = int(s);
  }
  // Release dynamic values after their last reader (graph outputs are kept).
  const std::vector<int>& last_use = last_read_;
  std::vector<char> keep(value_names_.size(), 0);
  for (int id : output_ids_) keep[size_t(id)] = 1;
  for (int id : input_ids_) keep[size_t(id)] = 1;
  for (auto& [id, t] : constants_) keep[size_t(id)] = 1;
  for (size_t id = 0; id < last_use.size(); ++id)
    if (last_use[id] >= 0 && !keep[id]) steps_[size_t(last_use[id])].release.push_back(int(id));
}

void Executor::compile_subgraphs(Step& step, const std::function<int(const std::string&)>& id_of) {
  const Node& node = *step.node;
  for (const auto& [attribute, a] : node.attributes) {
    if (a.kind != Attribute::Kind::kGraph || !a.g) continue;
    Subgraph sub;
    sub.attribute = attribute;
    Model child;
    child.graph = *a.g;
    child.opsets = model_.opsets;
    child.ir_version = model_.ir_version;
    child.description = model_.description + ", " + node.context() + "subgraph '" + attribute + "'";
    sub.formal_inputs = child.graph.inputs.size();
    for (auto& in : child.graph.inputs) {
      in.info.shape.reset();  // declared subgraph shapes are often loose (loop-carried values grow)
      in.info.dim_params.clear();
      sub.input_names.push_back(in.name);
    }
    for (const auto& name : free_values(child.graph)) {  // read from this graph by name
      child.graph.inputs.push_back({name, ValueInfo{}});
      sub.input_names.push_back(name);
      int id = id_of(name);
      sub.outer_ids.push_back(id);
      step.inputs.push_back(id);  // keeps the value alive until the node has run
    }
    ExecutorOptions options = options_;
    options.random_seed = random_seed_;
    options.profile = false;
    options.device = Device::kCpu;  // control flow runs on the host: its subgraphs take host values
    sub.executor = std::make_shared<Executor>(child, options);
    step.subgraphs.push_back(std::move(sub));
  }
}

bool profile_requested_by_environment() {
  const char* profile = std::getenv("ONNXTRAIN_PROFILE");
  return profile && *profile && std::string(profile) != "0";
}

std::vector<Value> Executor::run_subgraph(const Step& step, Plan& plan, const std::string& attribute,
                                          const std::vector<Value>& inputs) {
  for (const auto& sub : step.subgraphs) {
    if (sub.attribute != attribute) continue;
    OT_CHECK(inputs.size() == sub.formal_inputs, step.node->context(), "subgraph '", attribute, "' takes ",
             sub.formal_inputs, " inputs, given ", inputs.size());
    std::map<std::string, Value> feeds;
    for (size_t i = 0; i < inputs.size(); ++i) feeds[sub.input_names[i]] = inputs[i];
    for (size_t i = 0; i < sub.outer_ids.size(); ++i) {
      size_t id = size_t(sub.outer_ids[i]);
      // Subgraphs run on the host: a device executor hands them host copies of outer values.
      feeds[sub.input_names[sub.formal_inputs + i]] =
          plan.others[id].is_tensor() ? Value(value_on(plan, int(id), Device::kCpu)) : plan.others[id];
    }
    return sub.executor->run_values(feeds);
  }
  OT_THROW(kInvalidModel, step.node->context(), "has no graph attribute '", attribute, "'");
}

void Executor::validate_feeds(const std::map<std::string, Value>& feeds) const {
  const std::string where = "model " + model_.description + ": ";
  for (const auto& [name, t] : feeds)
    if (!model_.graph.is_input(name)) {
      std::string expected;
      for (const auto& in : model_.graph.inputs) expected += (expected.empty() ? "'" : ", '") + in.name + "'";
      OT_THROW(kInvalidArgument, where, "feed '", name, "' is not an input of the model (inputs: ", expected, ")");
    }
  for (const auto& in : model_.graph.inputs) {
    auto it = feeds.find(in.name);
    OT_CHECK(it != feeds.end(), where, "input '", in.name, "' is missing from the feeds");
    const Value& v = it->second;
    const ValueKind k = in.info.kind;
    const bool optional = k == ValueKind::kOptionalTensor || k == ValueKind::kOptionalSequence;
    const bool sequence = k == ValueKind::kSequence || k == ValueKind::kOptionalSequence;
    // A subgraph's declared types are loose; only the top level's are checked.
    if (v.is_none()) {
      OT_CHECK(optional || in.info.dtype == DType::kUndefined, where, "input '", in.name, "' is not optional, got no value");
      continue;
    }
    if (v.is_sequence()) {
      OT_CHECK(sequence || in.info.dtype == DType::kUndefined, where, "input '", in.name,
               "' should be a tensor, got a sequence");
      for (const auto& item : v.sequence)
        OT_CHECK(in.info.dtype == DType::kUndefined || item.dtype() == in.info.dtype, where, "input '", in.name,
                 "' should be a sequence of ", dtype_name(in.info.dtype), ", got an element of ",
                 dtype_name(item.dtype()));
      continue;
    }
    OT_CHECK(!sequence || in.info.dtype == DType::kUndefined, where, "input '", in.name,
             "' should be a sequence, got a tensor");
    const Tensor& t = v.tensor;
    OT_CHECK(t.device() == Device::kCpu || t.device() == options_.device, where, "input '", in.name, "' is a ",
             device_name(t.device()), " tensor; this executor runs on the ", device_name(options_.device));
    if (in.info.dtype != DType::kUndefined)
      OT_CHECK(t.dtype() == in.info.dtype, where, "input '", in.name, "' should be ", dtype_name(in.info.dtype),
               ", got ", dtype_name(t.dtype()));
    if (in.info.shape) {
      const Shape& want = *in.info.shape;
      OT_CHECK(size_t(t.rank()) == want.size(), where, "input '", in.name, "' should have rank ", want.size(),
               " (shape ", shape_str(want), "), got shape ", shape_str(t.shape()));
      for (size_t d = 0; d < want.size(); ++d)
        OT_CHECK(want[d] < 0 || want[d] == t.shape()[d], where, "input '", in.name, "' should have shape ",
                 shape_str(want), " (-1: any), got ", shape_str(t.shape()));
    }
  }
}

std::string Executor::signature(const std::map<std::string, Value>& feeds) const {
  std::string sig;
  auto add = [&](const Tensor& t) { sig += std::to_string(int(t.dtype())) + shape_str(t.shape()) + ";"; };
  for (const auto& in : model_.graph.inputs) {
    const Value& v = feeds.at(in.name);
    if (v.is_tensor()) { add(v.tensor); continue; }
    sig += v.is_none() ? "none;" : "seq(";
    for (const auto& item : v.sequence) add(item);
    if (v.is_sequence()) sig += ");";
  }
  return sig;
}

std::unique_ptr<Executor::Plan> Executor::new_plan() {
  auto plan = std::make_unique<Plan>();
  size_t n = value_names_.size();
  plan->values.resize(n);
  plan->others.resize(n);
  plan->planned.resize(n);
  plan->dtypes.assign(n, DType::kUndefined);
  plan->shapes.resize(n);
  plan->alias_of.assign(n, -1);
  plan->external.assign(n, 0);
  plan->from_set_output.assign(n, 0);
  plan->mirrors.resize(n);
  for (size_t s = 0; s < steps_.size(); ++s) plan->kernels.push_back(make_kernel(s));
  for (auto& [id, t] : constants_) {
    plan->values[size_t(id)] = *t;
    plan->external[size_t(id)] = 1;
  }
  for (int id : input_ids_) plan->external[size_t(id)] = 1;
  return plan;
}

Value Executor::result_of(const Plan& plan, int id) const {
  if (!plan.others[size_t(id)].is_tensor()) return plan.others[size_t(id)];  // sequence elements are never arena views
  const Tensor& t = plan.values[size_t(id)];
  if (device_output_[size_t(id)]) return device_result(plan, id);
  if (t.device() != Device::kCpu) {  // the graph's edge: outputs come back to the host
    Tensor host;
    if (plan.output_buffers) {
      const Tensor& given = (*plan.output_buffers)[size_t(id)];
      if (given.defined() && given.device() == Device::kCpu && given.dtype() == t.dtype() && given.shape() == t.shape())
        host = given;
    }
    if (!host.defined()) host = Tensor::empty(t.dtype(), t.shape());
    if (t.nbytes()) backend_->copy(host.data(), Device::kCpu, t.data(), t.device(), t.nbytes(), stream_);
    return host;
  }
  int root = id;
  while (plan.alias_of[size_t(root)] >= 0) root = plan.alias_of[size_t(root)];
  // Feeds, initializers and constants are not the caller's to keep: hand over a copy (into the
  // output's buffer when the caller gave one).
  const bool external = plan.external[size_t(root)] || plan.planned[size_t(root)].defined();
  if (!external) return t;
  if (plan.output_buffers) {
    const Tensor& given = (*plan.output_buffers)[size_t(id)];
    if (given.defined() && given.dtype() == t.dtype() && given.shape() == t.shape() && given.data() != t.data()) {
      Tensor into = given;
      if (t.nbytes()) std::memcpy(into.data(), t.data(), t.nbytes());
      return into;
    }
  }
  return t.clone();
}

Tensor Executor::device_result(const Plan& plan, int id) const {
  const Tensor& t = plan.values[size_t(id)];
  Tensor into;  // the caller's device buffer for this output, when it fits
  if (plan.output_buffers) {
    const Tensor& given = (*plan.output_buffers)[size_t(id)];
    if (given.defined() && given.device() == options_.device && given.dtype() == t.dtype() && given.shape() == t.shape())
      into = given;
  }
  if (t.device() != options_.device) {  // made by a host step: the one copy to the device
    if (!into.defined()) return to_device(t, options_.device, stream_);
    copy_into(into, t, stream_);
    return into;
  }
  int root = id;
  while (plan.alias_of[size_t(root)] >= 0) root = plan.alias_of[size_t(root)];
  // Arena views, feeds and constants are not the caller's to keep: a copy on the device.
  const bool external = plan.external[size_t(root)] || plan.planned[size_t(root)].defined();
  if (!external || (into.defined() && into.data() == t.data())) return t;
  if (!into.defined()) into = empty_on(options_.device, t.dtype(), t.shape());
  copy_into(into, t, stream_);
  return into;
}

void Executor::hand_over(Plan& plan, Handover& h, const std::vector<std::pair<size_t, int>>& ready, size_t step) {
  for (auto [index, id] : ready) {
    Value value = result_of(plan, id);
    if (!value.is_tensor() || !(*h.on_ready)(index, value.tensor)) {
      (*h.results)[index] = std::move(value);
      continue;
    }
    const int last = last_read_[size_t(id)];
    if (last <= int(step) || produced_at_[size_t(id)] < 0) {
      if (produced_at_[size_t(id)] >= 0) plan.values[size_t(id)] = Tensor();
    } else {
      h.drop_after_step[size_t(last)].push_back(id);
    }
  }
}

// An op that states no work (it may compute far more per element than it touches: attention,
// recurrences) counts as small only below this: 64 Ki elements touched.
constexpr int64_t kUnstatedSerialWork = kMemoryBoundElementWork * 65536;

void Executor::decide_serial(Plan& plan) {
  plan.serial_decided = true;
  plan.serial = false;
  plan.step_serial.assign(steps_.size(), 0);
  if (omp_get_max_threads() <= 1 || backend_) return;
  auto shape_of = [&](int id) -> const Shape* {
    if (id < 0 || !plan.others[size_t(id)].is_tensor()) return nullptr;
    if (plan.values[size_t(id)].defined()) return &plan.values[size_t(id)].shape();
    return plan.dtypes[size_t(id)] == DType::kUndefined ? nullptr : &plan.shapes[size_t(id)];
  };
  const int64_t step_bar = serial_step_work();  // 0 while the pool spins between regions
  bool all_small = true;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& step = steps_[s];
    if (!step.subgraphs.empty()) {  // control flow: its bodies decide for themselves
      all_small = false;
      continue;
    }
    std::vector<const Shape*> inputs, outputs;
    for (size_t i = 0; i < step.node->inputs.size() && i < step.inputs.size(); ++i) inputs.push_back(shape_of(step.inputs[i]));
    bool views = true, seen = true;
    for (int id : step.outputs) {
      outputs.push_back(shape_of(id));
      if (id >= 0 && !outputs.back()) seen = false;  // not seen: no judgement
      views = views && (id < 0 || plan.alias_of[size_t(id)] >= 0);
    }
    if (!seen) {
      all_small = false;
      continue;
    }
    if (step.schema->work) {
      const int64_t work = step.schema->work(inputs, outputs);
      all_small = all_small && work < serial_work();
      plan.step_serial[s] = work < step_bar;
    } else if (!views) {
      // an op that does not state its work may compute far more than it touches
      const bool small = memory_bound_work(inputs, outputs) < kUnstatedSerialWork;
      all_small = all_small && small;
      plan.step_serial[s] = step_bar > 0 && small;
    }
  }
  plan.serial = all_small;
  // Kernels with stated work are made afresh for their thread count (oneDNN sizes a primitive's
  // thread partition when it creates it).
  for (size_t s = 0; s < steps_.size(); ++s)
    if (steps_[s].schema->work && (plan.serial || plan.step_serial[s])) plan.kernels[s] = make_kernel(s);
}

std::unique_ptr<Kernel> Executor::make_kernel(size_t s) const {
  const Step& step = steps_[s];
  return backend_ && on_device_[s] ? step.schema->cuda(*step.node) : step.schema->cpu(*step.node);
}

void Executor::stage_inputs(Plan& plan, size_t s, std::vector<Tensor>& staged) const {
  const Step& step = steps_[s];
  const size_t formal = std::min(step.inputs.size(), step.node->inputs.size());
  staged.assign(formal, Tensor());
  for (size_t i = 0; i < formal; ++i) {
    const int id = step.inputs[i];
    if (id < 0 || !plan.others[size_t(id)].is_tensor()) continue;
    const Tensor& value = plan.values[size_t(id)];
    if (!value.defined()) continue;
    const auto& host = step.schema->host_inputs;
    const bool on_host = !on_device_[s] || std::find(host.begin(), host.end(), int(i)) != host.end();
    const Device want = on_host ? Device::kCpu : options_.device;
    if (value.device() != want) staged[i] = value_on(plan, id, want);
  }
}

const Tensor& Executor::value_on(Plan& plan, int id, Device device) const {
  const Tensor& value = plan.values[size_t(id)];
  if (!backend_ || !value.defined() || value.device() == device) return value;
  Tensor& mirror = plan.mirrors[size_t(id)];
  if (!mirror.defined() || mirror.device() != device || mirror.shape() != value.shape()) {
    mirror = to_device(value, device, stream_);
    ++plan.device_copies;
  }
  return mirror;
}

void Executor::copy_back_written_inputs(Plan& plan, size_t s, std::vector<Tensor>& staged) const {
  const Step& step = steps_[s];
  if (!step.schema->written_inputs) return;
  for (size_t i : step.schema->written_inputs(*step.node, step.node->inputs.size()))
    if (i < staged.size() && staged[i].defined()) copy_into(plan.values[size_t(step.inputs[i])], staged[i], stream_);
}

std::shared_ptr<void> Executor::allocate_arena(size_t bytes) const {
  return backend_ ? backend_->allocate(bytes) : allocate_storage(bytes, Fill::kUninitialized);
}

void Executor::execute(Plan& plan, bool recording, uint64_t run_index, Handover* handover) {
  plan.dynamic_allocations = 0;
  plan.device_copies = 0;
  std::vector<Tensor> staged;
  if (backend_)  // last run's copies of feeds and intermediates are stale; constants' stay
    for (size_t id = 0; id < plan.mirrors.size(); ++id)
      if (!is_constant_[id]) plan.mirrors[id] = Tensor();
  std::optional<OmpThreadsScope> one_thread;
  if (plan.serial) one_thread.emplace(1);
  if (handover) hand_over(plan, *handover, handover->after_step.back(), 0);  // feeds and initializers
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& step = steps_[s];
    const Node& node = *step.node;
    SubgraphRunFn subgraphs;
    if (!step.subgraphs.empty())
      subgraphs = [&](const std::string& attribute, const std::vector<Value>& inputs) {
        return run_subgraph(step, plan, attribute, inputs);
      };
    StepContext ctx(node, model_.opset(node.domain), plan.values, plan.others, plan.planned, step.inputs,
                    step.outputs, plan.dynamic_allocations, recording ? &plan.from_set_output : nullptr, is_constant_,
                    random_seed_, run_index, step.subgraphs.empty() ? nullptr : &subgraphs, plan.arena,
                    plan.output_buffers, backend_ && on_device_[s] ? options_.device : Device::kCpu, stream_.get());
    std::optional<OmpThreadsScope> step_thread;  // a small step while the pool sleeps between regions
    if (!plan.serial && !plan.step_serial.empty() && plan.step_serial[s]) step_thread.emplace(1);
    try {
      if (backend_) {
        stage_inputs(plan, s, staged);
        for (size_t i = 0; i < staged.size(); ++i)
          if (staged[i].defined()) ctx.bind_input(i, &staged[i]);
      }
      if (options_.profile) {
        auto start = std::chrono::steady_clock::now();
        plan.kernels[s]->compute(ctx);
        profile_[s].total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
        ++profile_[s].calls;
      } else {
        plan.kernels[s]->compute(ctx);
      }
      if (backend_) copy_back_written_inputs(plan, s, staged);
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.rfind("[", 0) != 0) msg = node.context() + msg;
      throw Error(e.code(), "model " + model_.description + ": " + msg);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kRuntime, "model " + model_.description + ": " + node.context() + e.what());
    }
    for (size_t i = 0; i < step.outputs.size(); ++i) {
      int id = step.outputs[i];
      if (id < 0) continue;
      const Tensor& out = plan.values[size_t(id)];
      if (!plan.others[size_t(id)].is_tensor()) continue;  // a sequence or an empty optional
      if (!out.defined())
        OT_THROW(kRuntime, "model ", model_.description, ": ", node.context(), "kernel did not produce output ", i);
      if (!recording) continue;
      plan.dtypes[size_t(id)] = out.dtype();
      plan.shapes[size_t(id)] = out.shape();
      for (int in : step.inputs)
        if (in >= 0 && out.shares_storage_with(plan.values[size_t(in)])) { plan.alias_of[size_t(id)] = in; break; }
      if (plan.alias_of[size_t(id)] < 0 && plan.from_set_output[size_t(id)]) plan.external[size_t(id)] = 1;
    }
    for (int id : step.release) {
      if (backend_) plan.mirrors[size_t(id)] = Tensor();
      if (!plan.planned[size_t(id)].defined()) plan.values[size_t(id)] = Tensor();
      if (!plan.others[size_t(id)].is_tensor()) plan.others[size_t(id)] = Value();
    }
    if (handover) {
      for (int id : handover->drop_after_step[s]) plan.values[size_t(id)] = Tensor();
      if (!handover->after_step[s].empty()) hand_over(plan, *handover, handover->after_step[s], s);
    }
  }
  if (backend_) backend_->synchronize(stream_);  // a kernel's asynchronous error belongs to this run
}

int Executor::output_ready_step(const std::string& name) const {
  auto it = value_ids_.find(name);
  OT_CHECK(it != value_ids_.end() && model_.graph.is_output(name), "model ", model_.description, ": '", name,
           "' is not an output of the model");
  return produced_at_[size_t(it->second)];
}

Executor::StorageTimeline Executor::storage_timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StorageTimeline t;
  if (!last_plan_) return t;
  const Plan& plan = *last_plan_;
  t.steps = int(steps_.size());
  auto root_of = [&](int id) {
    while (plan.alias_of[size_t(id)] >= 0) id = plan.alias_of[size_t(id)];
    return id;
  };
  std::vector<int> last(value_names_.size(), -1);  // per alias root: its group's last read
  for (size_t id = 0; id < value_names_.size(); ++id) {
    int& l = last[size_t(root_of(int(id)))];
    l = std::max(l, last_read_[id]);
  }
  for (int id : output_ids_) last[size_t(root_of(id))] = t.steps;  // handed out: alive after the run
  for (int id : input_ids_) t.input_last_read[value_names_[size_t(id)]] = last[size_t(id)];
  std::vector<char> is_input(value_names_.size(), 0);
  for (int id : input_ids_) is_input[size_t(id)] = 1;
  for (int id : output_ids_) {
    const int root = root_of(id), s = produced_at_[size_t(root)];
    t.output_first_write[value_names_[size_t(id)]] = s;
    if (s < 0) continue;
    const Step& step = steps_[size_t(s)];
    for (auto [o, i] : step.schema->inplace) {
      if (size_t(o) >= step.outputs.size() || size_t(i) >= step.inputs.size() || step.outputs[size_t(o)] != root) continue;
      const int in = step.inputs[size_t(i)];
      if (in < 0 || !is_input[size_t(in)] || last[size_t(in)] != s) continue;
      if (std::count(step.inputs.begin(), step.inputs.end(), in) != 1) continue;
      t.output_over_inputs[value_names_[size_t(id)]].push_back(value_names_[size_t(in)]);
    }
  }
  return t;
}

void Executor::build_arena(Plan& plan) {
  size_t n = value_names_.size();
  UnionFind groups(n);
  for (size_t id = 0; id < n; ++id)
    if (plan.alias_of[id] >= 0) groups.unite(int(id), plan.alias_of[id]);

  // A group is planned when its storage is made in this run and no graph output lives in it.
  auto root_external = [&](int id) {
    while (plan.alias_of[size_t(id)] >= 0) id = plan.alias_of[size_t(id)];
    return plan.external[size_t(id)] != 0;
  };
  const std::vector<int>& produced_at = produced_at_;
  const std::vector<int>& last_read = last_read_;
  std::vector<char> blocked(n, 0);  // per group root
  for (int id : output_ids_) blocked[size_t(groups.find(id))] = 1;
  for (size_t id = 0; id < n; ++id)
    if (produced_at[id] < 0 || root_external(int(id))) blocked[size_t(groups.find(int(id)))] = 1;

  std::vector<int> first(n, INT32_MAX), last(n, -1);
  auto refresh = [&](int id) {
    int r = groups.find(id);
    first[size_t(r)] = std::min(first[size_t(r)], produced_at[size_t(id)]);
    last[size_t(r)] = std::max({last[size_t(r)], last_read[size_t(id)], produced_at[size_t(id)]});
  };
  for (size_t id = 0; id < n; ++id) if (produced_at[id] >= 0) refresh(int(id));

  // In-place: an output takes over the buffer of an input that dies at this step.
  MemoryReport report;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const Step& step = steps_[s];
    std::vector<char> taken(step.outputs.size(), 0);  // an output takes over at most one input's buffer
    for (auto [o, i] : step.schema->inplace) {
      if (size_t(o) >= step.outputs.size() || size_t(i) >= step.inputs.size() || taken[size_t(o)]) continue;
      int out = step.outputs[size_t(o)], in = step.inputs[size_t(i)];
      if (out < 0 || in < 0 || plan.alias_of[size_t(out)] >= 0) continue;
      int gin = groups.find(in), gout = groups.find(out);
      if (gin == gout || blocked[size_t(gin)] || blocked[size_t(gout)] || last[size_t(gin)] != int(s)) continue;
      // The output's buffer must be born here: once it has taken over one input's buffer (born
      // earlier), taking over a second input's too would merge two buffers live at once.
      if (first[size_t(gout)] != int(s)) continue;
      if (plan.dtypes[size_t(in)] != plan.dtypes[size_t(out)] || plan.shapes[size_t(in)] != plan.shapes[size_t(out)]) continue;
      if (plan.alias_of[size_t(in)] >= 0) continue;  // only over the buffer's own value
      bool shared = false;
      for (size_t j = 0; j < step.inputs.size(); ++j)
        if (j != size_t(i) && step.inputs[j] >= 0 && groups.find(step.inputs[j]) == gin) shared = true;
      if (shared) continue;
      groups.unite(out, in);
      taken[size_t(o)] = 1;
      int r = groups.find(in);
      first[size_t(r)] = std::min(first[size_t(gin)], first[size_t(gout)]);
      last[size_t(r)] = std::max(last[size_t(gin)], last[size_t(gout)]);
      ++report.inplace_reuses;
    }
  }

  // One buffer per planned group, sized by its largest fresh member.
  std::vector<int> buffer_of(n, -1);
  std::vector<Buffer> buffers;
  for (size_t id = 0; id < n; ++id) {
    if (produced_at[id] < 0 || plan.alias_of[id] >= 0) continue;
    int r = groups.find(int(id));
    if (blocked[size_t(r)] || plan.dtypes[id] == DType::kUndefined) continue;
    if (backend_ && !on_device_[size_t(produced_at[id])]) continue;  // a host step's output: host memory
    size_t bytes = size_t(numel(plan.shapes[id])) * dtype_size(plan.dtypes[id]);
    if (buffer_of[size_t(r)] < 0) {
      buffer_of[size_t(r)] = int(buffers.size());
      buffers.push_back({bytes, first[size_t(r)], last[size_t(r)]});
    } else {
      auto& b = buffers[size_t(buffer_of[size_t(r)])];
      b.bytes = std::max(b.bytes, bytes);
    }
  }
  for (size_t id = 0; id < n; ++id) if (plan.alias_of[id] >= 0) ++report.views;
  ArenaLayout layout = plan_arena(buffers);
  if (layout.arena_bytes) plan.arena = allocate_arena(layout.arena_bytes);
  char* base = static_cast<char*>(plan.arena.get());
  for (size_t id = 0; id < n; ++id) {
    if (produced_at[id] < 0 || plan.alias_of[id] >= 0) continue;
    int b = buffer_of[size_t(groups.find(int(id)))];
    if (b < 0) continue;
    plan.planned[id] = Tensor::borrow(plan.dtypes[id], plan.shapes[id], base + layout.offsets[size_t(b)], plan.arena,
                                      backend_ ? options_.device : Device::kCpu);
  }
  // Live bytes per step, and the stashed part: buffers a forward step writes and a backward step
  // after the forward reads (a backward step inside the forward, such as the Shape of a value that
  // autodiff places beside its producer, keeps nothing alive across it).
  std::vector<char> stashed(buffers.size(), 0);
  size_t forward_end = 0;
  for (size_t s = 0; s < forward_step_.size(); ++s) if (forward_step_[s]) forward_end = s + 1;
  if (!forward_step_.empty())
    for (size_t s = forward_end; s < steps_.size(); ++s) {
      if (forward_step_[s]) continue;
      for (int id : steps_[s].inputs) {
        if (id < 0 || produced_at[size_t(id)] < 0 || !forward_step_[size_t(produced_at[size_t(id)])]) continue;
        int b = buffer_of[size_t(groups.find(id))];
        if (b >= 0) stashed[size_t(b)] = 1;
      }
    }
  std::vector<int64_t> live(steps_.size() + 1, 0), live_stashed(steps_.size() + 1, 0);
  for (size_t b = 0; b < buffers.size(); ++b) {
    const int64_t bytes = int64_t((buffers[b].bytes + 63) / 64 * 64);
    live[size_t(buffers[b].first_step)] += bytes;
    live[size_t(buffers[b].last_step) + 1] -= bytes;
    if (stashed[b]) {
      report.stashed_bytes += size_t(bytes);
      live_stashed[size_t(buffers[b].first_step)] += bytes;
      live_stashed[size_t(buffers[b].last_step) + 1] -= bytes;
    }
  }
  for (size_t s = 0, now = 0, now_stashed = 0; s < steps_.size(); ++s) {
    now = size_t(int64_t(now) + live[s]);
    now_stashed = size_t(int64_t(now_stashed) + live_stashed[s]);
    if (now > report.peak_live_bytes) {
      report.peak_live_bytes = now;
      report.stashed_at_peak_bytes = now_stashed;
    }
  }
  report.planned_arena_bytes = layout.arena_bytes;
  report.naive_bytes = layout.naive_bytes;
  plan.report = report;
}

void Executor::check_shape_rules(const Plan& plan) const {
  Graph g = model_.graph;
  for (auto& in : g.inputs) {
    int id = value_ids_.at(in.name);
    if (!plan.others[size_t(id)].is_tensor()) continue;  // sequences and optionals keep their declared types
    in.info.dtype = plan.values[size_t(id)].dtype();
    in.info.shape = plan.values[size_t(id)].shape();
  }
  g.value_info.clear();
  infer_shapes(g, model_.opsets);
  for (const auto& [name, info] : g.value_info) {
    auto it = value_ids_.find(name);
    if (it == value_ids_.end()) continue;
    size_t id = size_t(it->second);
    if (plan.dtypes[id] == DType::kUndefined) continue;
    std::string producer;
    for (const auto& node : g.nodes)
      for (const auto& o : node.outputs) if (o == name) producer = node.context();
    if (info.dtype != DType::kUndefined && info.dtype != plan.dtypes[id])
      OT_THROW(kRuntime, producer, "shape rule gives dtype ", dtype_name(info.dtype), " for '", name,
               "', the kernel produced ", dtype_name(plan.dtypes[id]));
    if (!info.shape) continue;
    const Shape& got = plan.shapes[id];
    bool ok = info.shape->size() == got.size();
    for (size_t d = 0; ok && d < got.size(); ++d) ok = (*info.shape)[d] < 0 || (*info.shape)[d] == got[d];
    if (!ok)
      OT_THROW(kRuntime, producer, "shape rule gives ", shape_str(*info.shape), " for '", name,
               "', the kernel produced ", shape_str(got));
  }
}

std::vector<Tensor> Executor::run(const std::map<std::string, Tensor>& feeds,
                                  const std::vector<std::string>& output_names, const OutputReadyFn& on_ready,
                                  const std::vector<Tensor>& output_buffers) {
  std::map<std::string, Value> values(feeds.begin(), feeds.end());
  std::vector<Value> outs = run_values(values, output_names, on_ready, output_buffers);
  values.clear();
  std::vector<Tensor> results;
  for (size_t i = 0; i < outs.size(); ++i) {
    OT_CHECK(outs[i].is_tensor(), "model ", model_.description, ": output ", i, " is ", value_kind_name(outs[i].kind),
             ", not a tensor (run it with run_values)");
    results.push_back(std::move(outs[i].tensor));
  }
  return results;
}

std::vector<Value> Executor::run_values(const std::map<std::string, Value>& feeds,
                                        const std::vector<std::string>& output_names, const OutputReadyFn& on_ready,
                                        const std::vector<Tensor>& output_buffers) {
  std::lock_guard<std::mutex> lock(mutex_);
  validate_feeds(feeds);
  std::vector<int> wanted;
  if (output_names.empty()) {
    wanted = output_ids_;
  } else {
    for (const auto& name : output_names) {
      auto it = value_ids_.find(name);
      OT_CHECK(it != value_ids_.end() && model_.graph.is_output(name), "model ", model_.description,
               ": '", name, "' is not an output of the model");
      wanted.push_back(it->second);
    }
  }
  auto& slot = plans_[signature(feeds)];
  if (!slot) slot = new_plan();
  Plan& plan = *slot;
  bool recording = !plan.recorded;
  for (int id : input_ids_) {
    const Value& v = feeds.at(value_names_[size_t(id)]);
    plan.values[size_t(id)] = v.tensor;
    plan.others[size_t(id)] = v.is_tensor() ? Value() : v;
  }
  if (!recording && !plan.serial_decided) decide_serial(plan);
  std::vector<Tensor> buffer_of_value;
  if (!output_buffers.empty()) {
    OT_CHECK(output_buffers.size() == wanted.size(), "model ", model_.description, ": ", output_buffers.size(),
             " output buffers for ", wanted.size(), " outputs");
    buffer_of_value.resize(value_names_.size());
    for (size_t k = 0; k < wanted.size(); ++k)
      if (output_buffers[k].defined()) buffer_of_value[size_t(wanted[k])] = output_buffers[k];
    // An output that a planned run knows to be a view (a gradient is often an Identity of a
    // backward value) gets its buffer through the value it views, which the kernel then writes
    // straight into the buffer; unless another output's buffer is already that value's.
    std::vector<char> via_view(value_names_.size(), 0);
    for (size_t k = 0; k < wanted.size(); ++k) {
      const Tensor& given = output_buffers[k];
      int root = wanted[k];
      while (plan.alias_of[size_t(root)] >= 0) root = plan.alias_of[size_t(root)];
      if (!given.defined() || root == wanted[k] || produced_at_[size_t(root)] < 0 || plan.external[size_t(root)] ||
          plan.dtypes[size_t(root)] != given.dtype() || numel(plan.shapes[size_t(root)]) != given.numel())
        continue;
      Tensor& slot = buffer_of_value[size_t(root)];
      if (via_view[size_t(root)] == 2) continue;
      if (!slot.defined()) {
        slot = given.reshaped(plan.shapes[size_t(root)]);
        via_view[size_t(root)] = 1;
      } else if (via_view[size_t(root)]) {  // two outputs view one value: it keeps fresh storage
        slot = Tensor();
        via_view[size_t(root)] = 2;
      }
    }
    plan.output_buffers = &buffer_of_value;
  }
  struct ClearFeeds {  // do not keep the caller's buffers alive past the run
    Plan& p; const std::vector<int>& ids;
    ~ClearFeeds() {
      for (int id : ids) { p.values[size_t(id)] = Tensor(); p.others[size_t(id)] = Value(); }
      p.output_buffers = nullptr;
    }
  } clear{plan, input_ids_};

  std::vector<Value> results(wanted.size());
  std::optional<Handover> handover;
  if (on_ready) {
    handover.emplace();
    handover->on_ready = &on_ready;
    handover->results = &results;
    handover->after_step.resize(steps_.size() + 1);  // the last slot: before the first step
    handover->drop_after_step.resize(steps_.size());
    for (size_t k = 0; k < wanted.size(); ++k) {
      const int step = produced_at_[size_t(wanted[k])];
      handover->after_step[step < 0 ? steps_.size() : size_t(step)].emplace_back(k, wanted[k]);
    }
  }
  execute(plan, recording, next_run_index_, handover ? &*handover : nullptr);
  ++next_run_index_;  // a failed run draws nothing
  if (recording) {
    if (options_.check_shape_rules) check_shape_rules(plan);
    build_arena(plan);
    plan.recorded = true;
    release_freed_heap();
  }
  if (!on_ready)
    for (size_t k = 0; k < wanted.size(); ++k) results[k] = result_of(plan, wanted[k]);
  // Outputs handed over must not be written by the next run.
  for (int id : output_ids_) {
    if (!plan.external[size_t(id)] || plan.alias_of[size_t(id)] >= 0 || plan.from_set_output[size_t(id)])
      plan.values[size_t(id)] = Tensor();
    plan.others[size_t(id)] = Value();
  }
  for (auto& [id, t] : constants_) plan.values[size_t(id)] = *t;  // an output may be a constant
  last_report_ = plan.report;
  last_plan_ = &plan;
  last_report_.dynamic_allocations = recording ? 0 : plan.dynamic_allocations;
  last_report_.device_copies = plan.device_copies;
  last_report_.host_steps = backend_ ? size_t(std::count(on_device_.begin(), on_device_.end(), 0)) : 0;
  last_report_.plans = plans_.size();
  return results;
}

uint32_t Executor::value_names_crc() const {
  uint32_t crc = 0;
  for (const auto& name : value_names_) crc = crc32c(crc, name.data(), name.size() + 1);  // with the NUL
  // Which values are feeds and outputs decides what a plan may place in the arena.
  for (const auto* ids : {&input_ids_, &output_ids_}) {
    const uint64_t count = ids->size();
    crc = crc32c(crc, &count, sizeof count);
    crc = crc32c(crc, ids->data(), ids->size() * sizeof(int));
  }
  return crc;
}

std::vector<int64_t> Executor::kernel_versions() const {
  std::vector<int64_t> versions;
  for (const auto& step : steps_) versions.push_back(step.schema->since_version);
  return versions;
}

std::vector<PlanRecord> Executor::recorded_plans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PlanRecord> records;
  const uint32_t crc = value_names_crc();
  for (const auto& [signature, plan] : plans_) {
    if (!plan->recorded) continue;
    PlanRecord r;
    r.signature = signature;
    r.value_names_crc = crc;
    r.dtypes = plan->dtypes;
    r.shapes = plan->shapes;
    r.alias_of.assign(plan->alias_of.begin(), plan->alias_of.end());
    const char* base = static_cast<const char*>(plan->arena.get());
    for (size_t id = 0; id < value_names_.size(); ++id) {
      r.flags.push_back(uint8_t((plan->external[id] ? PlanRecord::kExternal : 0) |
                                (plan->from_set_output[id] ? PlanRecord::kFromSetOutput : 0)));
      const Tensor& view = plan->planned[id];
      r.offsets.push_back(view.defined() ? int64_t(static_cast<const char*>(view.data()) - base) : -1);
    }
    r.arena_bytes = plan->report.planned_arena_bytes;
    r.report = plan->report;
    records.push_back(std::move(r));
  }
  return records;
}

void Executor::adopt_plan(const PlanRecord& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t n = value_names_.size();
  const std::string where = "model " + model_.description + ": pre-compiled plan: ";
  OT_CHECK(r.dtypes.size() == n && r.shapes.size() == n && r.alias_of.size() == n && r.flags.size() == n &&
               r.offsets.size() == n, where, "has ", r.dtypes.size(), " values, the graph ", n);
  if (r.value_names_crc != value_names_crc())
    OT_THROW(kInvalidModel, where, "numbers the values of another graph");
  auto plan = new_plan();
  for (size_t id = 0; id < n; ++id) {
    const int32_t alias = r.alias_of[id];
    OT_CHECK(alias >= -1 && alias < int32_t(n) && alias != int32_t(id), where, "value ", id, " aliases ", alias);
    for (int64_t d : r.shapes[id]) OT_CHECK(d >= 0, where, "value ", id, " has a negative dim");
    plan->dtypes[id] = r.dtypes[id];
    plan->shapes[id] = r.shapes[id];
    plan->alias_of[id] = alias;
    plan->external[id] = plan->external[id] || (r.flags[id] & PlanRecord::kExternal);
    plan->from_set_output[id] = (r.flags[id] & PlanRecord::kFromSetOutput) != 0;
  }
  for (size_t id = 0; id < n; ++id) {  // views alias values that are not views in the end
    size_t hops = 0;
    for (int32_t at = r.alias_of[id]; at >= 0; at = r.alias_of[size_t(at)])
      OT_CHECK(++hops <= n, where, "value ", id, " aliases a cycle of views");
  }
  if (r.arena_bytes) plan->arena = allocate_arena(size_t(r.arena_bytes));
  char* base = static_cast<char*>(plan->arena.get());
  for (size_t id = 0; id < n; ++id) {
    if (r.offsets[id] < 0) continue;
    OT_CHECK(dtype_supported(r.dtypes[id]), where, "value ", id, " is planned with dtype ", int(r.dtypes[id]));
    uint64_t bytes = dtype_size(r.dtypes[id]);
    for (int64_t d : r.shapes[id])  // saturating: a product past the arena is refused below
      bytes = d != 0 && bytes > r.arena_bytes / uint64_t(d) ? r.arena_bytes + 1 : bytes * uint64_t(d);
    OT_CHECK(uint64_t(r.offsets[id]) <= r.arena_bytes && bytes <= r.arena_bytes - uint64_t(r.offsets[id]), where,
             "value ", id, " (", bytes, " bytes at ", r.offsets[id], ") is outside the ", r.arena_bytes, "-byte arena");
    plan->planned[id] = Tensor::borrow(r.dtypes[id], r.shapes[id], base + r.offsets[id], plan->arena,
                                       backend_ ? options_.device : Device::kCpu);
  }
  plan->report = r.report;
  plan->recorded = true;
  if (auto it = plans_.find(r.signature); it != plans_.end() && it->second.get() == last_plan_)
    last_plan_ = nullptr;  // the plan it replaces dies here
  plans_[r.signature] = std::move(plan);
}

MemoryReport Executor::memory_report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_report_;
}

std::vector<NodeProfile> Executor::profile() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return profile_;
}

}  // namespace onnxtrain

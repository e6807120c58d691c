// The executor: compiles a Model once (op lookup, value numbering, liveness), then runs it with
// a Plan per input-shape signature.
//
// The first run of a new signature is a recording run: outputs are allocated as kernels ask for
// them, and the executor notes every value's dtype, shape and whether a kernel returned a view of
// one of its inputs. From that record the memory planner lays all intermediates into one arena
// (with in-place reuse where an op allows it), and later runs of the signature hand kernels
// pre-made views into the arena: no tensor allocation inside a step. Graph outputs get fresh
// buffers each run, since they are handed to the caller.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "ir/graph.h"
#include "onnxtrain/session.h"
#include "ops/registry.h"

namespace onnxtrain {

struct MemoryReport {
  size_t planned_arena_bytes = 0;   // the arena of the last plan
  size_t naive_bytes = 0;           // every intermediate in its own buffer
  size_t inplace_reuses = 0;        // outputs computed over a dying input's buffer
  size_t views = 0;                 // outputs that alias an input (Reshape, Identity, ...)
  size_t dynamic_allocations = 0;   // allocations in the last run besides graph outputs
  size_t plans = 0;                 // cached shape signatures
  // Training graphs (outputs "<input>_grad"): the forward is what the other outputs depend on.
  size_t peak_live_bytes = 0;       // the most planned bytes live at one step (the arena's lower bound)
  size_t stashed_bytes = 0;         // planned buffers the forward writes and the backward reads
  size_t stashed_at_peak_bytes = 0; // the part of peak_live_bytes they hold
  // Device executors: tensors copied between host and device in the last run to hand steps their
  // inputs (feeds, constants on the first run, and the values that cross to and from ops that run
  // on the CPU for want of a device kernel); outputs' copies back to the host come on top.
  size_t device_copies = 0;
  size_t host_steps = 0;  // device executors: steps that run their CPU kernel for want of a device one
};

// Called once per requested output as soon as its value is final: right after the step that
// produces it (no later step writes it), before the first step for an output that is a feed or
// an initializer. `index` is the output's position in run()'s result; `value` is what run() would
// return there. Returning true takes the value: run() returns an undefined tensor in its place,
// and the executor drops its own reference after the value's last reader in the graph (a
// gradient handed over mid-backward is then freed as soon as its new owner is done with it).
using OutputReadyFn = std::function<bool(size_t index, const Tensor& value)>;

struct ExecutorOptions {
  bool check_shape_rules = false;   // compare every static shape rule with what kernels produce
  bool profile = false;             // time every kernel call (see Executor::profile)
  // Seed of the random ops without a `seed` attribute (Dropout); drawn from std::random_device
  // when unset. Run i draws from stream_key(seed, node, i): see set_random_state.
  std::optional<uint64_t> random_seed;
  // Where the steps run. Off the host (kCuda): every op with a kernel for the device runs there,
  // queued on one stream; intermediates live in a device arena planned as the host one is; feeds
  // are copied in and outputs out (the graph's edges); an op without a device kernel runs its CPU
  // kernel on host copies, reported once by name. Throws "no CUDA device" where there is none.
  Device device = Device::kCpu;
  // Device executors: graph outputs returned as device tensors instead of host copies (a device
  // Module's gradients and updated buffers, which stay there for the optimizer); an output
  // buffer given for one is device storage. The other outputs come back to the host.
  std::vector<std::string> device_outputs = {};
};

// ONNXTRAIN_PROFILE set and not "0": the training front ends (Module, TrainModule) then profile
// their executors.
bool profile_requested_by_environment();

// A recorded plan (one shape signature) in a form a file can hold: what the recording run saw per
// value id and where the arena places each planned value (runtime/compiled_model writes it into
// pre-compiled models; adopt_plan makes it the executor's plan without a recording run).
struct PlanRecord {
  std::string signature;            // Executor's signature of the feeds
  uint32_t value_names_crc = 0;     // CRC-32C of the value names in id order (the numbering below)
                                    // and of the input and output ids
  std::vector<DType> dtypes;        // per value id (kUndefined: never produced)
  std::vector<Shape> shapes;
  std::vector<int32_t> alias_of;    // the value a view aliases, or -1
  std::vector<uint8_t> flags;       // kExternal | kFromSetOutput
  std::vector<int64_t> offsets;     // the planned view's arena offset, or -1
  uint64_t arena_bytes = 0;
  MemoryReport report;
  static constexpr uint8_t kExternal = 1, kFromSetOutput = 2;
};

class Executor {
 public:
  // Takes the model by value: move it in when the caller has no further use for its own copy.
  Executor(Model model, ExecutorOptions options = {});
  ~Executor();

  const Model& model() const { return model_; }
  // Runs the graph. `feeds` by graph input name; returns the named outputs (all when empty).
  // run() is for graphs whose inputs and outputs are tensors; run_values() takes and gives
  // sequences and optionals too. With on_ready, each tensor output is also handed to it as soon
  // as it is final (OutputReadyFn). output_buffers, when given, has one tensor per returned
  // output: storage that output is written into (and returned as) when it has that tensor's
  // dtype and shape, instead of fresh storage (an undefined tensor: none). The caller must
  // not read or write those bytes during the run.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds,
                          const std::vector<std::string>& output_names = {},
                          const OutputReadyFn& on_ready = {}, const std::vector<Tensor>& output_buffers = {});
  std::vector<Value> run_values(const std::map<std::string, Value>& feeds,
                                const std::vector<std::string>& output_names = {},
                                const OutputReadyFn& on_ready = {}, const std::vector<Tensor>& output_buffers = {});
  // The index of the step that produces graph output `name` (steps run in increasing order), or
  // -1 when no step does (a feed or an initializer): the order outputs become final in.
  int output_ready_step(const std::string& name) const;
  MemoryReport memory_report() const;
  // When the last run touched each graph input's and output's storage, for a caller that lays out
  // storage spanning runs (TrainModule puts a backward's gradients over the saved values it has
  // finished with): per graph input, the last step that reads it or a view of it (`steps` when a
  // graph output is a view of it: it lives on; -1 when nothing reads it); per graph output, the
  // step that first writes its storage (the producer of the value it views, which the run routes
  // its buffer through; -1 for a feed or an initializer). Steps of the plan of the last run's
  // input shapes (views are recorded per plan); empty before any run. `output_over_input`: per
  // graph output whose writing step may write it over graph inputs read there for the last time
  // (the op's in-place pairs, each input read by no other operand of the step): those inputs'
  // names. In place only over one with the output's dtype and shape, which the caller checks (the
  // plan records no dtypes for feeds).
  struct StorageTimeline {
    int steps = 0;
    std::map<std::string, int> input_last_read, output_first_write;
    std::map<std::string, std::vector<std::string>> output_over_inputs;
  };
  StorageTimeline storage_timeline() const;
  // Per-node kernel times in execution order (empty unless ExecutorOptions::profile).
  std::vector<NodeProfile> profile() const;
  // The random state: the seed and the index the next run draws with (incremented per run).
  // Restoring both (from a checkpoint) reproduces the random draws of an uninterrupted sequence.
  void set_random_state(uint64_t seed, uint64_t next_run_index);
  uint64_t random_seed() const { return random_seed_; }
  uint64_t next_run_index() const { return next_run_index_; }
  // A device executor's stream (null on the host): work queued on it after a run follows the
  // run's steps, and the next run's steps follow it.
  const Stream& stream() const { return stream_; }
  // The recorded plans (pre-compiled models store them) and the checksum of the value numbering
  // and the input and output ids they are valid for.
  std::vector<PlanRecord> recorded_plans() const;
  uint32_t value_names_crc() const;
  // Makes a recorded plan this executor's plan for its signature: the first run of that signature
  // then runs planned, with no recording run. Throws an Error when the record does not fit this
  // graph (another value numbering, an offset outside the arena, an alias out of range or in a cycle).
  void adopt_plan(const PlanRecord& record);
  // The since-version of each step's resolved kernel, in step order.
  std::vector<int64_t> kernel_versions() const;

 private:
  // A graph attribute of a node (If's branches, Loop's and Scan's body), compiled once into an
  // executor of its own whose inputs are its formal inputs followed by the values it reads from
  // this graph (bound from `outer_ids` at each call).
  struct Subgraph {
    std::string attribute;
    std::shared_ptr<Executor> executor;
    std::vector<std::string> input_names;  // formal inputs, then outer-scope reads
    std::vector<int> outer_ids;
    size_t formal_inputs = 0;
  };
  struct Step {
    const Node* node = nullptr;
    const OpSchema* schema = nullptr;
    std::vector<int> inputs;   // value ids, -1 for omitted; then the subgraphs' outer-scope reads
    std::vector<int> outputs;  // value ids, -1 for omitted
    std::vector<int> release;  // dynamic values whose last reader is this step
    std::vector<Subgraph> subgraphs;
  };
  struct Plan;
  void compile_subgraphs(Step& step, const std::function<int(const std::string&)>& id_of);
  std::vector<Value> run_subgraph(const Step& step, Plan& plan, const std::string& attribute,
                                  const std::vector<Value>& inputs);

  void compile();
  void validate_feeds(const std::map<std::string, Value>& feeds) const;
  std::string signature(const std::map<std::string, Value>& feeds) const;
  std::unique_ptr<Plan> new_plan();
  // Runs a recorded plan on the calling thread alone (no OpenMP region) when every step is small:
  // its op states its work (OpSchema::work) and that is below kSerialWork at the plan's shapes, or
  // it states none and touches few elements (kUnstatedSerialWork) or only makes views. A plan with
  // any larger step keeps the session's threads throughout: serial steps between parallel ones
  // let the pool's threads fall asleep, and on a loaded machine each wake-up costs a scheduler
  // time slice (a batch-1 MaxPool after serial convolutions: 13 ms, 0.04 ms on one thread). The
  // kernels with stated work are made afresh, since oneDNN sizes a primitive's thread partition
  // when it creates it. Where the pool sleeps between regions anyway (OMP_WAIT_POLICY=passive),
  // that argument does not hold: each step below serial_step_work() runs on the calling thread
  // (Plan::step_serial), the larger ones on the pool.
  void decide_serial(Plan& plan);
  // Outputs handed to an OutputReadyFn during one run: which become final after each step.
  struct Handover {
    const OutputReadyFn* on_ready = nullptr;
    std::vector<std::vector<std::pair<size_t, int>>> after_step;  // per step: (result index, value id)
    std::vector<std::vector<int>> drop_after_step;                // taken values, at their last reader
    std::vector<Value>* results = nullptr;
  };
  void execute(Plan& plan, bool recording, uint64_t run_index, Handover* handover = nullptr);
  void hand_over(Plan& plan, Handover& h, const std::vector<std::pair<size_t, int>>& ready, size_t step);
  Value result_of(const Plan& plan, int id) const;
  // An output named in options_.device_outputs, as a device tensor the caller may keep.
  Tensor device_result(const Plan& plan, int id) const;
  void build_arena(Plan& plan);
  std::shared_ptr<void> allocate_arena(size_t bytes) const;
  // A device executor's step: hands the kernel its inputs on the device it runs on (host_inputs
  // and host steps: the host), copying each value at most once per run (constants once).
  void stage_inputs(Plan& plan, size_t s, std::vector<Tensor>& staged) const;
  // Value id on `device`: itself when it is there, else its copy there, made at most once per run.
  const Tensor& value_on(Plan& plan, int id, Device device) const;
  // After a step whose kernel writes inputs in place (OpSchema::written_inputs): the copies it
  // was handed and wrote go back into their values (a constant's copy stays, equal to it again).
  void copy_back_written_inputs(Plan& plan, size_t s, std::vector<Tensor>& staged) const;
  std::unique_ptr<Kernel> make_kernel(size_t s) const;
  void check_shape_rules(const Plan& plan) const;

  Model model_;
  ExecutorOptions options_;
  std::unordered_map<std::string, int> value_ids_;
  std::vector<std::string> value_names_;
  std::vector<Step> steps_;
  std::vector<int> input_ids_, output_ids_;
  std::vector<std::pair<int, const Tensor*>> constants_;  // initializers by id
  std::vector<char> is_constant_;                          // per value id: an initializer
  std::vector<char> forward_step_;                         // per step, for training graphs; else empty
  std::vector<int> produced_at_, last_read_;               // per value id: its producing / last reading step, or -1
  std::map<std::string, std::unique_ptr<Plan>> plans_;
  const Plan* last_plan_ = nullptr;  // the plan of the last run (storage_timeline)
  mutable std::mutex mutex_;
  MemoryReport last_report_;
  std::vector<NodeProfile> profile_;  // per step, when profiling
  uint64_t random_seed_ = 0, next_run_index_ = 0;
  // Device executors (options_.device off the host): the backend, the run's stream, and per step
  // whether it runs on the device (its op has a kernel there) or on the host.
  DeviceBackend* backend_ = nullptr;
  Stream stream_;
  std::vector<char> on_device_;
  std::vector<char> device_output_;  // per value id: returned on the device (options_.device_outputs)
};

}  // namespace onnxtrain

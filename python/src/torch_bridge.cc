// The native side of onnxtrain.torch.TrainModule: DLPack exchange with torch (no copies either
// way: inputs and parameters are read in place, outputs are handed over) and the runner of one
// exported module's forward and backward graphs (src/training/forward_backward.h).
#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>

#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "bindings.h"
#include "core/memory.h"
#include "ir/program_difference.h"
#include "onnx/model_io.h"
#include "passes/shape_inference.h"
#include "passes/sparsity.h"
#include "runtime/executor.h"
#include "runtime/memory_planner.h"
#include "training/forward_backward.h"

namespace py = pybind11;
using namespace onnxtrain;

namespace {

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";

DType dtype_from_dlpack(DLDataType t, const std::string& what) {
  OT_CHECK(t.lanes == 1, what, ": vector dtypes (", int(t.lanes), " lanes) are not supported");
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return DType::kFloat16;
      if (t.bits == 32) return DType::kFloat32;
      if (t.bits == 64) return DType::kFloat64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::kBFloat16;
      break;
    case kDLInt:
      if (t.bits == 8) return DType::kInt8;
      if (t.bits == 16) return DType::kInt16;
      if (t.bits == 32) return DType::kInt32;
      if (t.bits == 64) return DType::kInt64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::kUint8;
      if (t.bits == 16) return DType::kUint16;
      if (t.bits == 32) return DType::kUint32;
      if (t.bits == 64) return DType::kUint64;
      break;
    default: break;
  }
  OT_THROW(kInvalidArgument, what, ": DLPack dtype (code ", int(t.code), ", ", int(t.bits), " bits) is not supported");
}

DLDataType dlpack_dtype(DType dt) {
  auto of = [](uint8_t code, DType d) { return DLDataType{code, uint8_t(dtype_size(d) * 8), 1}; };
  if (dt == DType::kBool) return DLDataType{kDLUInt, 8, 1};  // torch 1.13's DLPack has no bool
  if (dt == DType::kBFloat16) return of(kDLBfloat, dt);
  if (is_floating(dt)) return of(kDLFloat, dt);
  if (dt == DType::kUint8 || dt == DType::kUint16 || dt == DType::kUint32 || dt == DType::kUint64) return of(kDLUInt, dt);
  if (is_integer(dt)) return of(kDLInt, dt);
  OT_THROW(kNotImplemented, "dtype ", dtype_name(dt), " cannot cross by DLPack");
}

// Borrows a DLPack capsule's memory (or an object's __dlpack__()). `expected` lets uint8 bytes be
// read as bool, the way bool crosses.
Tensor tensor_from_dlpack(py::handle obj, DType expected, const std::string& what) {
  py::object capsule = py::reinterpret_borrow<py::object>(obj);
  if (!PyCapsule_CheckExact(obj.ptr())) {
    OT_CHECK(py::hasattr(obj, "__dlpack__"), what, ": expected a DLPack capsule or tensor, got ",
             std::string(py::str(obj.get_type())));
    capsule = obj.attr("__dlpack__")();
  }
  OT_CHECK(PyCapsule_IsValid(capsule.ptr(), kCapsule), what, ": the DLPack capsule was already consumed");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsule));
  PyCapsule_SetName(capsule.ptr(), kUsedCapsule);  // ours now: the capsule will not free it
  std::shared_ptr<void> holder(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (!m->deleter) return;
    py::gil_scoped_acquire gil;  // the producer's deleter may touch Python objects
    m->deleter(m);
  });
  const DLTensor& t = managed->dl_tensor;
  OT_CHECK(t.device.device_type == kDLCPU, what, ": the tensor is on DLPack device type ", int(t.device.device_type),
           "; onnxtrain runs on the CPU");
  DType dt = dtype_from_dlpack(t.dtype, what);
  Shape shape(t.shape, t.shape + t.ndim);
  if (t.strides) {
    int64_t stride = 1;
    for (int d = t.ndim; d-- > 0;) {
      OT_CHECK(shape[size_t(d)] == 1 || t.strides[d] == stride, what, ": the tensor of shape ", shape_str(shape),
               " is not contiguous (call .contiguous() first)");
      stride *= shape[size_t(d)];
    }
  }
  Tensor result = Tensor::borrow(dt, shape, static_cast<char*>(t.data) + t.byte_offset, holder);
  if (expected == DType::kBool && dt == DType::kUint8) return result.view_as(DType::kBool);
  return result;
}

struct DLPackOwner {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

// Hands a tensor over: the capsule (then torch) keeps the runtime's buffer alive.
py::capsule tensor_to_dlpack(const Tensor& t) {
  auto* owner = new DLPackOwner{t, t.shape(), std::vector<int64_t>(t.shape().size()), {}};
  int64_t stride = 1;
  for (size_t d = owner->shape.size(); d-- > 0;) {
    owner->strides[d] = stride;
    stride *= owner->shape[d];
  }
  DLTensor& d = owner->managed.dl_tensor;
  d.data = const_cast<void*>(owner->tensor.data());
  d.device = DLDevice{kDLCPU, 0};
  d.ndim = int(owner->shape.size());
  d.dtype = dlpack_dtype(t.dtype());
  d.shape = owner->shape.data();
  d.strides = owner->strides.data();
  d.byte_offset = 0;
  owner->managed.manager_ctx = owner;
  owner->managed.deleter = [](DLManagedTensor* self) { delete static_cast<DLPackOwner*>(self->manager_ctx); };
  return py::capsule(&owner->managed, kCapsule, [](PyObject* capsule) {
    if (!PyCapsule_IsValid(capsule, kCapsule)) return;  // consumed: the consumer calls the deleter
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
    m->deleter(m);
  });
}

// Where each name of `subset`, a subsequence of `all`, sits in it; repeated names map to successive
// occurrences (seeded outputs follow the outputs' order, and a model may return a value twice).
std::vector<int> subsequence_positions(const std::vector<std::string>& subset, const std::vector<std::string>& all) {
  std::vector<int> out;
  size_t i = 0;
  for (const auto& name : subset) {
    while (i < all.size() && all[i] != name) ++i;
    OT_CHECK(i < all.size(), "TrainModule: '", name, "' is out of the graph outputs' order");
    out.push_back(int(i++));
  }
  return out;
}

// Where each name of `subset` first occurs in `all`.
std::vector<int> positions(const std::vector<std::string>& subset, const std::vector<std::string>& all) {
  std::vector<int> out;
  for (const auto& name : subset)
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] == name) { out.push_back(int(i)); break; }
  return out;
}

std::vector<int> all_positions(size_t n) {
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

// The memory of the last block of one kind (saved values, gradients) to die in this process, kept
// for the next block of that kind. In this VM fresh pages are the cost: the kernel zero-fills
// every page of a new mapping when it is first written, may compact memory to find a free huge
// page (transparent huge pages' "defrag" is "madvise" here: the fault waits for it), and the
// host backs again the huge pages the guest reported free (virtio-balloon free page reporting):
// a BERT-style step's 20 MiB gradient block, mapped afresh every step, cost 0-38 ms of system
// time per step by process and by step (bench/bench_step_faults.py), the 1.5x spread of its
// step times between processes. The heap, which reused freed memory, fragmented (below).
// A block's memory becomes the spare only once its last tensor has died, so a block in use is
// never handed out, and a request that does not fit gives the spare back before allocating, so
// the process never holds two blocks' memory where it held one. When it is kept follows from a
// step's timeline: the saved values die at the end of the backward and only the accumulation,
// the optimizer and zero_grad come before the next forward takes their memory; the gradients die
// once torch has accumulated them (or at zero_grad), and the next backward comes after the
// optimizer, the forward, and the caller's loss and its backward: the runner gives their spare
// back at the end of a forward whose outputs could make the caller's part of the step the peak
// (TorchRunner::forward), and the spare stops holding blocks of a size once the process's peak
// grew while one was held (a caller's part that allocates more than its outputs tell).
class SpareBlock {
 public:
  // Memory of `bytes` (64-byte aligned) for a new block: the spare when it fits (at least `bytes`,
  // at most an eighth more), else a fresh allocation after the spare is given back. When the
  // returned pointer's last copy dies, its memory becomes the spare. `reused` says which it was.
  std::shared_ptr<void> take(size_t bytes, bool* reused) {
    std::shared_ptr<void> memory, unfit;
    size_t memory_bytes = bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Holding it was not free: the process peaked higher than before while it lay unused.
      if (guarded_ && memory_ && peak_kib() > peak_at_keep_kib_ + long(bytes_ / 8 / 1024)) gave_up_bytes_ = bytes_;
      if (memory_ && bytes_ >= bytes && bytes_ - bytes <= bytes / 8) {
        memory = std::move(memory_), memory_bytes = bytes_;
      } else {
        unfit = std::move(memory_);
      }
      bytes_ = 0;
    }
    *reused = memory != nullptr;
    unfit.reset();  // given back before the new allocation: never two at once
    if (!memory) memory = allocate_storage(bytes, Fill::kUninitialized);
    void* at = memory.get();
    return std::shared_ptr<void>(at, [this, memory, memory_bytes](void*) { keep(memory, memory_bytes); });
  }

  // Gives the spare back to the system (a request that will not take it).
  void release() {
    std::shared_ptr<void> spare;
    std::lock_guard<std::mutex> lock(mutex_);
    spare = std::move(memory_);  // unmapped after the lock (destroyed after `lock`)
    bytes_ = 0;
  }

  // The bytes of the spare held now (0: none).
  size_t held_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return memory_ ? bytes_ : 0;
  }

  // The saved values' spare is held through the optimizer's step only, unguarded: given back
  // there, the next forward's fresh pages made GPT-2's step 1.4-1.6x slower (docs/DESIGN.md).
  static SpareBlock& saved_values() { static SpareBlock* spare = new SpareBlock(false); return *spare; }
  static SpareBlock& gradients() { static SpareBlock* spare = new SpareBlock(true); return *spare; }

 private:
  // process-wide (above): a block's release may come from any thread, at any time
  explicit SpareBlock(bool guarded) : guarded_(guarded) {}

  // The process's peak resident size so far (KiB): what holding a spare must not raise.
  static long peak_kib() {
    rusage usage{};
    return getrusage(RUSAGE_SELF, &usage) == 0 ? usage.ru_maxrss : 0;
  }

  void keep(std::shared_ptr<void> memory, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes == gave_up_bytes_) return;  // the step that made it peaks higher with it held
    std::swap(memory_, memory);  // the spare it replaces is given back after the lock
    bytes_ = bytes;
    peak_at_keep_kib_ = peak_kib();
  }

  const bool guarded_;  // gives up holding once the process peaked higher while it was held
  std::mutex mutex_;
  std::shared_ptr<void> memory_;
  size_t bytes_ = 0;
  long peak_at_keep_kib_ = 0;
  size_t gave_up_bytes_ = 0;  // blocks of this size are not held (their step peaked higher)
};

// Whether two tensors share bytes (one views the other, or both view a third).
bool overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || !a.nbytes() || !b.nbytes()) return false;
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// One allocation for a run's outputs that die together: a step's saved values live from the
// forward to the end of the backward, and its gradients (without memory-efficient gradient
// management) are handed to torch at once and accumulated into .grad in one go. Passed to the run
// as output buffers (huge pages from 2 MiB on, core/memory.h), the block's memory becomes its
// kind's spare when the last of them dies (SpareBlock). Allocated one by one from glibc's heap,
// these 0.25-8 MiB values fragmented it step after step, interleaved with torch's own blocks (a
// GPT-style model's peak grew 45 MiB over 3 steps).
class OutputBlock {
 public:
  OutputBlock() = default;
  explicit OutputBlock(const std::vector<int>& outputs) {
    for (int i : outputs) slots_.push_back({size_t(i), DType::kUndefined, {}, true});
  }
  bool empty() const { return slots_.empty(); }
  // "K of N in one block of B bytes, R of them in the memory of the block before" (the next
  // run's block; R counts the runs whose block reused the spare).
  std::string describe() const {
    size_t in = 0, bytes = 0;
    for (const Slot& slot : slots_)
      if (slot.blocked()) ++in, bytes += size_t(numel(slot.shape)) * dtype_size(slot.dtype);
    return std::to_string(in) + " of " + std::to_string(slots_.size()) + " in one block of " + std::to_string(bytes) +
           " bytes, " + std::to_string(reused_) + " of " + std::to_string(blocks_) + " in the memory of the block before";
  }

  // Buffers for the next run (one per output of the run; undefined where none), carved from
  // `spare`'s memory when it fits: empty until a run has shown the outputs' dtypes and shapes.
  // A run without a block leaves `spare` as it is: the run of a module whose shapes change
  // (padding sparsity), interleaved with a dense one, or an evaluation between training steps,
  // would otherwise cost the next block its reuse; the spare is then held through that run.
  std::vector<Tensor> buffers(size_t num_outputs, SpareBlock& spare) {
    std::vector<TensorSpec> specs;
    for (const Slot& slot : slots_)
      if (slot.blocked()) specs.push_back({slot.dtype, slot.shape});
    if (specs.empty() || !stable_) return {};
    bool reused = false;
    std::vector<Tensor> carved = carve_tensors(spare.take(tensors_bytes(specs), &reused), specs), buffers(num_outputs);
    ++blocks_, reused_ += reused;
    size_t k = 0;
    for (const Slot& slot : slots_)
      if (slot.blocked()) buffers[slot.output] = std::move(carved[k++]);
    return buffers;
  }

  // Buffers for the next run carved from `storage` at the offsets `at` gives (output position,
  // offset, bytes) instead of one after the other: a block laid out together with another run's
  // outputs (TorchRunner's shared step block). A slot whose size is no longer `bytes` gets none.
  struct Placement {
    size_t output, offset, bytes;
  };
  std::vector<Tensor> place(size_t num_outputs, const std::shared_ptr<void>& storage, const std::vector<Placement>& at,
                            bool reused) {
    std::vector<Tensor> buffers(num_outputs);
    for (const Placement& p : at)
      for (const Slot& slot : slots_) {
        if (slot.output != p.output || !slot.blocked() || slot.bytes() != p.bytes) continue;
        std::shared_ptr<void> holder(static_cast<char*>(storage.get()) + p.offset, [storage](void*) {});
        buffers[slot.output] = Tensor::borrow(slot.dtype, slot.shape, holder.get(), holder);
      }
    ++blocks_, reused_ += reused;
    return buffers;
  }

  // After a run: dtypes and shapes for the next block. An output that was given a buffer and did
  // not land in it (a view of an input or of a parameter, a value set by its kernel) is left out
  // from then on: its bytes would be wasted.
  // Shapes that change from run to run (padding sparsity keeps a different number of rows each
  // step) get no block after a run that changed them, until two runs in a row agree: a block of
  // the last run's shapes would be allocated and not used. After a run without buffers, an output
  // sharing bytes with another output or with an input (`inputs`) is taken for such a view: it
  // would not land either (the executor routes a buffer through a view to the value it views
  // only when that value is the run's own and no other output views it).
  void learn(const std::vector<Tensor>& outs, const std::vector<Tensor>& buffers, const std::vector<Tensor>& inputs) {
    bool same = true;
    for (Slot& slot : slots_) {
      const Tensor& out = outs[slot.output];
      const Tensor* given = buffers.empty() ? nullptr : &buffers[slot.output];
      const bool fitted = given && given->defined() && out.defined() && given->dtype() == out.dtype() &&
                          given->shape() == out.shape();
      if (!out.defined() || (fitted && out.data() != given->data())) slot.in_block = false;
      if (buffers.empty() && out.defined()) {
        for (size_t j = 0; j < outs.size() && slot.in_block; ++j)
          if (j != slot.output && overlap(outs[j], out)) slot.in_block = false;
        for (const Tensor& in : inputs)
          if (overlap(in, out)) slot.in_block = false;
      }
      if (out.defined()) {
        same = same && (slot.dtype == DType::kUndefined || (slot.dtype == out.dtype() && slot.shape == out.shape()));
        slot.dtype = out.dtype(), slot.shape = out.shape();
      }
    }
    stable_ = same;
  }

  struct Slot {
    size_t output;  // position among the run's outputs
    DType dtype;
    Shape shape;
    bool in_block;
    bool blocked() const { return in_block && dtype != DType::kUndefined; }  // gets a buffer next run
    size_t bytes() const { return size_t(numel(shape)) * dtype_size(dtype); }
  };
  const std::vector<Slot>& slots() const { return slots_; }
  bool stable() const { return stable_; }

 private:
  std::vector<Slot> slots_;
  bool stable_ = false;
  size_t blocks_ = 0, reused_ = 0;  // blocks carved, and how many of them from a spare
};

// One exported module under one input schema: its forward and backward executors.
class TorchRunner {
 public:
  // Host values the export dropped (unused by the forward) are neither bound nor differentiated:
  // `inputs` and `gradients` say what was.
  // `fixed_dims`: symbolic dims (by name) to build the graphs at a size, as if exported with it
  // (TrainModule's first shape of a schema: every pass sees the sizes).
  TorchRunner(const std::string& model_bytes, const std::string& name, ForwardBackwardOptions options,
              const std::map<std::string, int64_t>& fixed_dims = {}) {
    Model model = load_model_from_bytes(model_bytes, "", name);
    if (!fixed_dims.empty()) fix_dims(model.graph, fixed_dims);
    std::erase_if(options.bind, [&](const std::string& n) { return !model.graph.is_initializer(n) && !model.graph.is_input(n); });
    std::erase_if(options.wrt, [&](const std::string& n) {
      return !model.graph.is_input(n) && std::find(options.bind.begin(), options.bind.end(), n) == options.bind.end();
    });
    fb_ = build_forward_backward(model, options);
    wrt_ = options.wrt;
    ExecutorOptions executor_options;
    executor_options.profile = profile_requested_by_environment();  // TrainModule.profile(), as Module::profile
    forward_ = std::make_unique<Executor>(fb_.forward, executor_options);
    if (!fb_.gradients.empty()) backward_ = std::make_unique<Executor>(fb_.backward, executor_options);
    for (const auto& out : fb_.forward.graph.outputs) forward_outputs_.push_back(out.name);
    handed_outputs_ = fb_.outputs.size() + fb_.buffer_outputs.size();
    share_step_block_ = options.memory.level >= 1 && backward_ != nullptr;
    for (const auto& node : fb_.forward.graph.nodes)
      random_ = random_ || (is_nondeterministic(node) && !node.has_attr("seed"));
  }

  const ForwardBackwardGraphs& graphs() const { return fb_; }
  const std::vector<std::string>& forward_outputs() const { return forward_outputs_; }
  const std::vector<std::string>& wrt() const { return wrt_; }
  bool has_backward() const { return backward_ != nullptr; }
  // Whether the forward draws random numbers (Dropout): the host then passes a seed per call.
  bool is_random() const { return random_; }

  // feeds: fb.forward_feeds, in order. Returns every forward output as a capsule. `random_seed`
  // keys this call's random draws (the host takes it from its own generator: torch.manual_seed
  // then reproduces the masks).
  py::list forward(const py::sequence& feeds, std::optional<uint64_t> random_seed) {
    if (random_seed) forward_->set_random_state(*random_seed, 0);
    std::map<std::string, Tensor> named;
    bind(named, feeds, fb_.forward_feeds, fb_.forward.graph, "forward feed");
    if (stash_.empty()) stash_ = OutputBlock(positions(fb_.saved, forward_outputs_));
    std::vector<Tensor> outs, stash;
    std::shared_ptr<void> shared;  // the step's block when its gradients go over the saved values
    if (layout_ && stash_.stable()) {
      bool reused = false;
      shared = SpareBlock::saved_values().take(layout_->bytes, &reused);
      stash = stash_.place(forward_outputs_.size(), shared, layout_->saved, reused);
    } else {
      stash = stash_.buffers(forward_outputs_.size(), SpareBlock::saved_values());
    }
    {
      py::gil_scoped_release release;
      outs = forward_->run(named, {}, {}, stash);
    }
    saved_dtypes_.clear();
    for (int i : positions(fb_.saved, forward_outputs_)) saved_dtypes_.push_back(outs[size_t(i)].dtype());
    stash_.learn(outs, stash, values_of(named));
    named.clear();
    find_pinned(outs);
    std::erase_if(shared_blocks_, [](const SharedBlock& b) { return b.storage.expired(); });
    if (shared) {
      // The part only gradients use, written by the last backward, is not needed before this
      // forward's backward; held through the caller's part of the step, it may raise the peak
      // (caller_may_peak): its pages are then faulted afresh in the backward.
      const size_t gradients_only = layout_->bytes - layout_->saved_bytes_placed;
      if (caller_may_peak(outs, gradients_only))
        release_huge_pages(static_cast<char*>(shared.get()) + layout_->saved_bytes_placed, gradients_only);
      // Usable by this forward's backward only if no saved value it lays gradients over is (or
      // shares memory with) an output the caller holds.
      const bool usable = layout_->pinned == pinned_;
      shared_blocks_.push_back({shared.get(), shared, layout_, usable, false});
      if (!usable) layout_.reset();
    }
    SpareBlock& gradients = SpareBlock::gradients();
    if (caller_may_peak(outs, gradients.held_bytes())) gradients.release();
    return to_capsules(outs);
  }

  // Returns the gradients (parallel to wrt) as capsules. With on_gradient, each gradient is also
  // offered to on_gradient(index, capsule) as soon as the backward has finished it (the GIL is
  // taken for the call); when it returns True the host keeps it, the list holds None there, and
  // the executor frees its own reference (memory-efficient gradient management).
  py::list backward(const py::sequence& seeds, const py::sequence& saved, const py::sequence& feeds,
                    const py::object& on_gradient) {
    OT_CHECK(backward_, "TrainModule: this graph was built without gradients");
    std::map<std::string, Tensor> named;
    bind(named, seeds, fb_.seeds, fb_.backward.graph, "upstream gradient");
    OT_CHECK(saved.size() == fb_.saved.size(), "TrainModule backward: expected ", fb_.saved.size(),
             " saved values, got ", saved.size());
    for (size_t i = 0; i < fb_.saved.size(); ++i) {
      DType expected = i < saved_dtypes_.size() ? saved_dtypes_[i] : DType::kUndefined;
      named[fb_.saved[i]] = tensor_from_dlpack(saved[i], expected, "saved value '" + fb_.saved[i] + "'");
    }
    bind(named, feeds, fb_.backward_feeds, fb_.backward.graph, "backward feed");
    std::vector<Tensor> grads, buffers;
    OutputReadyFn hand_over;
    if (!on_gradient.is_none()) {
      hand_over = [&](size_t index, const Tensor& g) {
        py::gil_scoped_acquire acquire;
        return on_gradient(index, tensor_to_dlpack(g)).cast<bool>();
      };
    } else {  // all handed over at the end, and accumulated into .grad in one go: one block
      if (gradient_block_.empty())
        gradient_block_ = OutputBlock(all_positions(fb_.backward.graph.outputs.size()));
      const size_t n = fb_.backward.graph.outputs.size();
      if (SharedBlock* block = shared_block_of(named)) {
        OT_CHECK(!block->consumed, "TrainModule: a second backward through the same forward (retain_graph=True) at "
                 "memory-optimizer level ", fb_.memory_plan.level, ": the first one wrote the gradients over the "
                 "saved values it had finished with; run such steps at ONNXTRAIN_MEMORY_OPT_LEVEL=0");
        block->consumed = true;
        if (std::shared_ptr<void> storage = block->storage.lock())
          buffers = gradient_block_.place(n, storage, block->layout->gradients, true);
      } else {
        buffers = gradient_block_.buffers(n, SpareBlock::gradients());
      }
    }
    {
      py::gil_scoped_release release;
      grads = backward_->run(named, {}, hand_over, buffers);
    }
    if (on_gradient.is_none()) {
      gradient_block_.learn(grads, buffers, values_of(named));
      if (share_step_block_) plan_shared_layout(named);
    }
    named.clear();
    py::list out;
    for (const auto& t : grads) out.append(t.defined() ? tensor_to_dlpack(t) : py::object(py::none()));
    return out;
  }

  // Per-node kernel times of the forward, then of the backward (empty unless ONNXTRAIN_PROFILE=1).
  py::list profile() const {
    py::list rows;
    auto add = [&](const char* graph, const Executor& e) {
      for (const auto& n : e.profile())
        rows.append(py::dict(py::arg("graph") = graph, py::arg("node") = n.node_name, py::arg("op_type") = n.op_type,
                             py::arg("calls") = n.calls, py::arg("total_us") = n.total_us));
    };
    add("forward", *forward_);
    if (backward_) add("backward", *backward_);
    return rows;
  }

  std::string memory_report() const {
    auto line = [](const char* what, const MemoryReport& r) {
      return std::string(what) + " arena " + std::to_string(r.planned_arena_bytes) + " bytes (naive " +
             std::to_string(r.naive_bytes) + ", peak live " + std::to_string(r.peak_live_bytes) + "), " +
             std::to_string(r.dynamic_allocations) + " allocations";
    };
    std::string s = line("forward", forward_->memory_report());
    if (backward_) s += "; " + line("backward", backward_->memory_report());
    if (!stash_.empty()) s += "; saved values: " + stash_.describe();
    if (!gradient_block_.empty()) s += "; gradients: " + gradient_block_.describe();
    if (layout_)
      s += "; gradients over the saved values: one block of " + std::to_string(layout_->bytes) + " bytes for " +
           std::to_string(layout_->saved_bytes) + " of saved values and " + std::to_string(layout_->gradient_bytes) +
           " of gradients";
    return s;
  }

 private:
  static void fix_dims(Graph& g, const std::map<std::string, int64_t>& sizes) {
    auto fix = [&](ValueInfo& v) {
      if (!v.shape) return;
      for (size_t d = 0; d < v.dim_params.size() && d < v.shape->size(); ++d)
        if (auto it = sizes.find(v.dim_params[d]); it != sizes.end()) (*v.shape)[d] = it->second, v.dim_params[d].clear();
    };
    for (auto& v : g.inputs) fix(v.info);
    for (auto& v : g.outputs) fix(v.info);
    for (auto& [name, v] : g.value_info) fix(v);
  }

  static void bind(std::map<std::string, Tensor>& named, const py::sequence& values, const std::vector<std::string>& names,
                   const Graph& graph, const char* what) {
    OT_CHECK(values.size() == names.size(), "TrainModule: expected ", names.size(), " ", what, "s, got ", values.size());
    for (size_t i = 0; i < names.size(); ++i) {
      DType expected = DType::kUndefined;
      for (const auto& in : graph.inputs)
        if (in.name == names[i]) expected = in.info.dtype;
      named[names[i]] = tensor_from_dlpack(values[i], expected, std::string(what) + " '" + names[i] + "'");
    }
  }

  static std::vector<Tensor> values_of(const std::map<std::string, Tensor>& named) {
    std::vector<Tensor> values;
    for (const auto& [name, t] : named) values.push_back(t);
    return values;
  }

  static py::list to_capsules(const std::vector<Tensor>& tensors) {
    py::list out;
    for (const auto& t : tensors) out.append(tensor_to_dlpack(t));
    return out;
  }

  // Whether memory held from this forward to its backward, unused (`held` bytes: the gradients'
  // spare, the gradients' part of a step block), may raise the process's peak. Between them the
  // caller works on the outputs handed to it: a loss over a GPT-style model's 32 MiB logits takes
  // log-softmax, its gradient and the logits' gradient, 32 MiB each, the step's peak (28 MiB higher
  // with the gradients' spare held); a classifier's few logits take nothing. Outputs of an eighth
  // of `held` or more are taken for the first kind. What the caller's part allocates beyond
  // what its outputs tell, the spare's own guard catches (SpareBlock).
  bool caller_may_peak(const std::vector<Tensor>& outs, size_t held) const {
    size_t handed = 0;
    for (size_t i = 0; i < handed_outputs_ && i < outs.size(); ++i)
      if (outs[i].defined()) handed += outs[i].nbytes();
    return held > 0 && handed >= held / 8;
  }

  // The saved values' slots a caller-held output shares memory with (or is): they live on after
  // the backward, so no gradient may go over them.
  void find_pinned(const std::vector<Tensor>& outs) {
    pinned_.clear();
    for (const auto& slot : stash_.slots()) {
      const Tensor& t = outs[slot.output];
      if (!slot.blocked() || !t.defined()) continue;
      bool pinned = slot.output < handed_outputs_;
      for (size_t j = 0; j < handed_outputs_ && !pinned; ++j) pinned = overlap(outs[j], t);
      if (pinned) pinned_.insert(slot.output);
    }
  }

  // The record of the block this backward's saved values were carved from (each at its offset), or
  // null (no shared block, or one a later change made unusable).
  struct SharedBlock;
  SharedBlock* shared_block_of(const std::map<std::string, Tensor>& named) {
    for (SharedBlock& block : shared_blocks_) {
      if (!block.usable || block.storage.expired()) continue;
      bool all = !block.layout->saved.empty();
      for (const auto& p : block.layout->saved) {
        auto it = named.find(forward_outputs_[p.output]);
        all = all && it != named.end() && it->second.data() == static_cast<const char*>(block.base) + p.offset &&
              it->second.nbytes() == p.bytes;
      }
      if (all) return &block;
    }
    return nullptr;
  }

  // After a backward: the next step's block, with the backward's gradients laid over the saved
  // values it has finished with (memory-optimizer level 1 and up). Steps are the backward's
  // (Executor::storage_timeline), shifted by one so that every saved value is alive from 0: a
  // saved value lives to the last step that reads it or any backward input sharing its memory (a
  // guard: OutputBlock::learn keeps values that share bytes with another output or an input out
  // of blocks), to the end when the caller holds it; a gradient from the step that first writes it
  // to the end (it is handed to torch). The arena planner places them so that no two alive at
  // once overlap: a gradient written at step s never shares bytes with a value read at s.
  void plan_shared_layout(const std::map<std::string, Tensor>& named) {
    layout_.reset();
    if (!stash_.stable() || !gradient_block_.stable()) return;
    const Executor::StorageTimeline timeline = backward_->storage_timeline();
    const int end = timeline.steps + 1;
    auto layout = std::make_shared<SharedLayout>();
    layout->pinned = pinned_;
    std::vector<Buffer> buffers;  // the saved values', then the gradients' of their own
    std::map<std::string, const OutputBlock::Slot*> saved_slot;  // by name, with its buffer below
    std::map<std::string, size_t> saved_buffer;
    for (const auto& slot : stash_.slots()) {
      if (!slot.blocked()) continue;
      const std::string& name = forward_outputs_[slot.output];
      int last = end;
      auto it = named.find(name);
      if (!pinned_.count(slot.output) && it != named.end()) {
        last = 0;
        for (const auto& [input, t] : named)
          if (overlap(t, it->second)) {
            auto read = timeline.input_last_read.find(input);
            last = std::max(last, read == timeline.input_last_read.end() ? end : read->second + 1);
          }
      }
      saved_slot[name] = &slot, saved_buffer[name] = buffers.size();
      layout->saved.push_back({slot.output, 0, slot.bytes()});
      layout->saved_bytes += slot.bytes();
      buffers.push_back({slot.bytes(), 0, std::min(last, end), 1});  // the saved values first: the block's front
    }
    // A gradient whose step may write it in place over a saved value read there for the last
    // time (dB = dLoss * dB1 of the fused output layer: 8 MiB for GPT's head) takes that value's
    // bytes, whose buffer then lives to the end; any other gets a buffer of its own.
    std::vector<size_t> buffer_of;  // per layout->gradients entry
    for (const auto& slot : gradient_block_.slots()) {
      if (!slot.blocked()) continue;
      const std::string& name = fb_.backward.graph.outputs[slot.output].name;
      const int first = timeline.output_first_write.at(name);
      if (first < 0) continue;  // a feed handed back: not the run's own storage
      layout->gradients.push_back({slot.output, 0, slot.bytes()});
      layout->gradient_bytes += slot.bytes();
      size_t placed = buffers.size();
      if (auto inputs = timeline.output_over_inputs.find(name); inputs != timeline.output_over_inputs.end())
        for (const std::string& input : inputs->second) {
          auto over = saved_buffer.find(input);
          if (over == saved_buffer.end() || saved_slot[input]->dtype != slot.dtype || saved_slot[input]->shape != slot.shape ||
              buffers[over->second].last_step != first + 1)
            continue;
          placed = over->second;
          buffers[placed].last_step = end;
          saved_buffer.erase(over);  // one gradient per saved value
          break;
        }
      buffer_of.push_back(placed);
      if (placed == buffers.size()) buffers.push_back({slot.bytes(), first + 1, end});
    }
    if (layout->saved.empty() || layout->gradients.empty()) return;
    const ArenaLayout arena = plan_arena(buffers);
    for (size_t k = 0; k < layout->saved.size(); ++k) {
      auto& p = layout->saved[k];
      p.offset = arena.offsets[k];
      layout->saved_bytes_placed = std::max(layout->saved_bytes_placed, p.offset + p.bytes);
    }
    for (size_t k = 0; k < layout->gradients.size(); ++k) layout->gradients[k].offset = arena.offsets[buffer_of[k]];
    layout->bytes = arena.arena_bytes;
    layout_ = std::move(layout);
  }

  // Where a step's saved values and gradients lie in its one block.
  struct SharedLayout {
    size_t bytes = 0, saved_bytes = 0, gradient_bytes = 0;
    size_t saved_bytes_placed = 0;  // the saved values lie in [0, this); beyond, gradients only
    std::vector<OutputBlock::Placement> saved, gradients;
    std::set<size_t> pinned;  // the saved values' positions held to the end (find_pinned)
  };
  // A block a forward carved its saved values from, alive until its last tensor dies; its backward
  // carves the gradients from it (once: a second backward would read overwritten saved values).
  struct SharedBlock {
    const void* base;
    std::weak_ptr<void> storage;
    std::shared_ptr<const SharedLayout> layout;
    bool usable, consumed;
  };

  ForwardBackwardGraphs fb_;
  bool share_step_block_ = false;
  size_t handed_outputs_ = 0;  // forward outputs the caller holds: the model's, then the buffers'
  std::set<size_t> pinned_;
  std::shared_ptr<const SharedLayout> layout_;  // for the next forward; null: separate blocks
  std::vector<SharedBlock> shared_blocks_;
  OutputBlock stash_, gradient_block_;
  std::unique_ptr<Executor> forward_, backward_;
  std::vector<std::string> forward_outputs_;
  std::vector<std::string> wrt_;  // what was differentiated, parallel to the gradients
  std::vector<DType> saved_dtypes_;
  bool random_ = false;
};

// glibc's malloc maps a block of M_MMAP_THRESHOLD or more afresh and unmaps it when freed, and
// gives the top of its heap back to the system once that is M_TRIM_THRESHOLD or more; left to
// itself it moves both (the first to the size of the largest mapped block freed so far, up to
// 32 MiB; the second to twice that). A training step's temporaries then come and go in fresh
// pages: torch's AdamW frees two per parameter together (sqrt, then its quotient), just enough to
// reach the trim threshold, so each of GPT-2 small's 9 MiB weights had its 18 MiB faulted in again
// (Hugging Face GPT-2 small: 185,000 faults in the optimizer's step, 110,000 of them this; BERT-base
// 118,500 and 63,000), at 1.5-15 us each here. Fixed once, at 32 MiB for both (glibc's most for the
// first, which is also where Tensor::empty maps its own pages, kLargeTensorBytes), blocks below
// 32 MiB stay on the heap and up to 32 MiB of free top stays with the process (64 MiB, glibc's own
// end value, kept 10,000 more faults away from BERT-base for up to 67 MiB more peak): Hugging
// Face peaks moved by -3% to +1.5%, within run-to-run noise. Not where the user chose thresholds.
void fix_heap_thresholds() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* chosen : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
      if (std::getenv(chosen)) return;
    if (const char* tunables = std::getenv("GLIBC_TUNABLES"); tunables && std::strstr(tunables, "glibc.malloc."))
      return;
    mallopt(M_MMAP_THRESHOLD, int(kLargeTensorBytes));
    mallopt(M_TRIM_THRESHOLD, int(kLargeTensorBytes));
  });
#endif
}

}  // namespace

void bind_torch_bridge(py::module_& m) {
  py::module_ t = m.def_submodule("torch_bridge", "DLPack exchange and forward/backward graphs for TrainModule");

  // The inputs whose density decides the sparsity passes: label inputs with their ignore_index,
  // embedding ids with their table.
  t.def("sparsity_inputs", [](py::bytes model) {
    Model exported = load_model_from_bytes(std::string(model), "", "TrainModule export");
    take_checkpoint_regions(exported.graph);  // ids may enter a checkpointed call
    SparsityInputs found = find_sparsity_inputs(exported);
    py::list labels, embeddings;
    for (const auto& l : found.labels) labels.append(py::make_tuple(l.input, l.ignore_index));
    for (const auto& e : found.embeddings) embeddings.append(py::make_tuple(e.input, e.weight));
    return py::make_tuple(labels, embeddings);
  }, py::arg("model"));

  // The export without the module's values (its parameters and buffers, which the host binds at
  // every run): what TrainModule keeps and builds from. Parses the bytes where they are.
  t.def("initializers_as_inputs", [](const py::bytes& model, const std::set<std::string>& names) {
    char* data = nullptr;
    Py_ssize_t size = 0;
    OT_CHECK(PyBytes_AsStringAndSize(model.ptr(), &data, &size) == 0, "TrainModule export: not a bytes object");
    std::string stripped = initializers_as_inputs(std::string_view(data, size_t(size)), names, "TrainModule export");
    return py::bytes(stripped);
  }, py::arg("model"), py::arg("names"));

  // Two exports of one module at different input sizes: "" when they are the same program (the
  // trace baked none of the sizes that differ), else the first difference (ir/program_difference.h).
  // `bound`: the initializers the host binds at each run (the module's parameters and buffers),
  // whose values may have changed between the two exports.
  t.def("export_difference", [](py::bytes a, py::bytes b, std::set<std::string> bound) {
    Model first = load_model_from_bytes(std::string(a), "", "TrainModule export");
    Model second = load_model_from_bytes(std::string(b), "", "TrainModule export");
    return program_difference(first.graph, second.graph, bound);
  }, py::arg("a"), py::arg("b"), py::arg("bound"));

  t.def("fix_heap_thresholds", &fix_heap_thresholds, "glibc's mmap and trim thresholds fixed (once per process)");

  // `nbytes` zero bytes (uint8) handed over: TrainModule's seed for an output the loss did not use.
  // From 2 MiB on a mapping of its own, whose pages read as zeros without being faulted in.
  t.def("zeros", [](size_t nbytes) {
    std::shared_ptr<void> memory = allocate_storage(nbytes, Fill::kZeros);
    void* at = memory.get();
    return tensor_to_dlpack(Tensor::borrow(DType::kUint8, {int64_t(nbytes)}, at, std::move(memory)));
  }, py::arg("nbytes"));

  py::class_<TorchRunner>(t, "Runner")
      .def(py::init([](py::bytes model, const std::string& name, std::vector<std::string> bind,
                       std::vector<std::string> wrt, int memory_opt_level, std::string memory_opt_config,
                       bool optimize, bool compute_optimizer, std::string mixed_precision, bool label_sparsity,
                       std::map<std::string, int64_t> padding_index, std::map<std::string, int64_t> fixed_dims) {
             ForwardBackwardOptions o;
             o.mixed_precision = std::move(mixed_precision);
             o.bind = std::move(bind);
             o.wrt = std::move(wrt);
             o.memory.level = memory_opt_level;
             o.memory.config = std::move(memory_opt_config);
             o.optimize = optimize;
             o.compute_optimizer = compute_optimizer;
             o.label_sparsity = label_sparsity;
             o.padding_index = std::move(padding_index);
             std::string bytes = model;
             py::gil_scoped_release release;
             return std::make_unique<TorchRunner>(bytes, name, o, fixed_dims);
           }),
           py::arg("model"), py::arg("name"), py::arg("bind"), py::arg("wrt"), py::arg("memory_opt_level") = 0,
           py::arg("memory_opt_config") = "",
           py::arg("optimize") = true, py::arg("compute_optimizer") = true, py::arg("mixed_precision") = "",
           py::arg("label_sparsity") = false, py::arg("padding_index") = std::map<std::string, int64_t>{},
           py::arg("fixed_dims") = std::map<std::string, int64_t>{})
      .def("forward", &TorchRunner::forward, py::arg("feeds"), py::arg("random_seed") = py::none())
      .def_property_readonly("is_random", &TorchRunner::is_random)
      .def("backward", &TorchRunner::backward, py::arg("seeds"), py::arg("saved"), py::arg("feeds"),
           py::arg("on_gradient") = py::none())
      .def_property_readonly("has_backward", &TorchRunner::has_backward)
      .def_property_readonly("inputs", [](const TorchRunner& r) { return r.graphs().inputs; })
      .def_property_readonly("forward_feeds", [](const TorchRunner& r) { return positions(r.graphs().forward_feeds, r.graphs().inputs); })
      .def_property_readonly("backward_feeds", [](const TorchRunner& r) { return positions(r.graphs().backward_feeds, r.graphs().inputs); })
      .def_property_readonly("outputs", [](const TorchRunner& r) { return r.graphs().outputs; })
      .def_property_readonly("seeded_outputs", [](const TorchRunner& r) { return subsequence_positions(r.graphs().seeded_outputs, r.graphs().outputs); })
      .def_property_readonly("buffers", [](const TorchRunner& r) { return r.graphs().buffers; })
      .def_property_readonly("buffer_outputs", [](const TorchRunner& r) { return positions(r.graphs().buffer_outputs, r.forward_outputs()); })
      .def_property_readonly("saved", [](const TorchRunner& r) { return positions(r.graphs().saved, r.forward_outputs()); })
      .def_property_readonly("gradients", [](const TorchRunner& r) { return r.graphs().gradients; })
      .def_property_readonly("wrt", &TorchRunner::wrt)
      .def("forward_model", [](const TorchRunner& r) { return py::bytes(save_model_to_bytes(r.graphs().forward)); })
      .def("backward_model", [](const TorchRunner& r) {
        return r.has_backward() ? py::object(py::bytes(save_model_to_bytes(r.graphs().backward))) : py::object(py::none());
      })
      .def("memory_report", &TorchRunner::memory_report)
      .def("profile", &TorchRunner::profile)
      .def_property_readonly("kept_label_losses", [](const TorchRunner& r) { return r.graphs().kept_label_losses; })
      .def_property_readonly("memory_plan", [](const TorchRunner& r) { return plan_table(r.graphs().memory_plan); })
      .def_property_readonly("saved_bytes", [](const TorchRunner& r) {  // activations held from forward to backward
        return saved_bytes(r.graphs());
      });
}

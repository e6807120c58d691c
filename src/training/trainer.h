// The training loop behind `onnxtrain train` and `onnxtrain eval`: batches from a Dataset,
// Module.train_step, a learning-rate schedule, Optimizer.step, and checkpoints that resume
// exactly where they left off.
//
//   Trainer trainer(artifact_paths("out"), "out/checkpoint");
//   Dataset train = trainer.load_dataset("train.npz", {"x"}, {"y"});
//   TrainOptions options;
//   options.epochs = 5;
//   options.checkpoint_out = "out/trained_checkpoint";
//   trainer.fit(train, options);
//   EvalResult r = trainer.evaluate(trainer.load_dataset("val.npz", {"x"}, {"y"}), 256);
//
// Progress lives in the checkpoint's properties (kProgress* below) next to the optimizer state,
// so a run started again from a saved checkpoint with the same data and options continues with
// the same batches, the same learning rates and bit-identical parameters. (Ops that draw random
// numbers without a fixed seed attribute, such as Dropout, break that identity.)
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/dataset.h"
#include "optim/lr_scheduler.h"
#include "training/generate_artifacts.h"
#include "training/module.h"

namespace onnxtrain {

// Checkpoint properties of a run in progress.
inline constexpr const char* kProgressEpoch = "train.epoch";            // epoch in progress, from 0
inline constexpr const char* kProgressEpochStep = "train.epoch_step";   // its updates done
inline constexpr const char* kProgressStep = "train.step";              // updates done in all
inline constexpr const char* kProgressLossSum = "train.epoch_loss_sum"; // sum of this epoch's update losses
inline constexpr const char* kProgressBaseLr = "train.base_lr";
// What the batches depend on: a resumed run must use the same values.
inline constexpr const char* kProgressSeed = "train.seed";
inline constexpr const char* kProgressShuffle = "train.shuffle";
inline constexpr const char* kProgressBatchSize = "train.batch_size";
inline constexpr const char* kProgressGradAccum = "train.grad_accum";  // micro-batches per update (absent: 1)
inline constexpr const char* kProgressDropLast = "train.drop_last";
inline constexpr const char* kProgressExamples = "train.num_examples";
inline constexpr const char* kProgressWorldSize = "train.world_size";  // data-parallel ranks (absent: 1)

struct TrainOptions {
  int64_t epochs = 1;
  int64_t batch_size = 32;            // examples per micro-batch (per rank)
  // Gradient accumulation: an update runs grad_accum micro-batches of batch_size through
  // Module::train_step, then one Optimizer::step on their gradients averaged by rows, so that
  // (batch_size B, grad_accum N) gives the update of (batch_size B x N, grad_accum 1). Steps,
  // schedules, checkpoint_every and max_steps count updates. The last update of an epoch takes
  // the examples left (fewer micro-batches, the last one partial), or is skipped with drop_last.
  int64_t grad_accum = 1;
  bool shuffle = false;
  uint64_t seed = 0;                  // at most INT64_MAX (it is stored as a property)
  bool drop_last = false;             // skip the last, partial update (< B x N examples) of each epoch
  std::optional<double> lr;           // the schedule's peak; default: the optimizer model's
  optim::LRScheduleKind schedule = optim::LRScheduleKind::kConstant;
  int64_t warmup_steps = 0;           // linear, cosine, constant
  int64_t step_size = 1;              // step: multiply by gamma every step_size updates
  double gamma = 0.1;
  int64_t checkpoint_every = 0;       // save every N updates (0: only at the end)
  std::string checkpoint_out;         // required
  int64_t max_steps = 0;              // stop (and save) once this many updates are done; 0: no limit
  int64_t eval_batch_size = 256;
  // Data parallelism over distributed_init()'s world (onnxtrain/distributed.h): each rank takes
  // the examples rank, rank + N, ... of every epoch's order (torch's DistributedSampler: the order
  // is padded by wrapping to a multiple of N), so an update sees batch_size x grad_accum x N examples; the
  // gradients and the reported loss are averaged over ranks; rank 0 alone writes checkpoints.
  DataParallelOptions data_parallel;
};

struct EvalResult {
  int64_t examples = 0;
  double loss = 0;                    // mean over examples (each batch's loss weighted by its rows)
  // Classification: predictions [N, C, ...] against integer class indices [N, ...]; labels
  // outside [0, C) (such as ignore_index) are not counted.
  std::optional<int64_t> correct, counted;
  double accuracy() const { return counted && *counted ? double(*correct) / double(*counted) : 0.0; }
};

struct StepReport {
  int64_t epoch, epochs;              // epoch from 0
  int64_t epoch_step, epoch_steps;    // updates done in this epoch, of
  int64_t step, total_steps;          // updates done in all, of
  double loss, lr;                    // loss: of the update's examples (micro-batch losses weighted by rows)
  bool skipped = false;               // fp16: the loss scaler found an inf/NaN gradient and skipped the update
  double loss_scale = 0.0;            // fp16: the scale after this update (0 without loss scaling)
};

struct EpochReport {
  int64_t epoch, epochs;
  double loss;                        // mean update loss of the epoch
  std::optional<EvalResult> eval;     // on the eval data, when given
};

struct TrainCallbacks {
  std::function<void(const StepReport&)> on_step;
  std::function<void(const EpochReport&)> on_epoch;
  std::function<void(const std::string& path, int64_t step)> on_checkpoint;
  // Before the checkpoint of update `step` is written (rank 0): what must be durable first.
  std::function<void(int64_t step)> before_checkpoint;
};

enum class FitOutcome { kFinished, kStoppedAtMaxSteps, kAlreadyDone };

class Trainer {
 public:
  // Loads the checkpoint and the training and eval models of an artifact directory.
  // resume: keep the checkpoint's training progress and optimizer state; otherwise a new run
  // starts from its parameters (progress properties and optimizer state are dropped).
  // `device`: where the Module's graphs run (Module's constructor says how).
  Trainer(const ArtifactPaths& artifacts, const std::string& checkpoint, bool resume = false,
          Device device = Device::kCpu);
  ~Trainer();

  // The data for the graphs' inputs: `inputs` and `labels` name npz arrays for the model's
  // inputs and the loss targets, in graph order; with both empty, arrays named like the graph
  // inputs are used. Arrays whose dtype differs from the graph input's are converted; `notes`
  // receives one line per conversion.
  Dataset load_dataset(const std::string& npz_path, const std::vector<std::string>& inputs,
                       const std::vector<std::string>& labels, std::vector<std::string>* notes = nullptr) const;

  // Trains for options.epochs (counting epochs already done when resuming); saves to
  // options.checkpoint_out every options.checkpoint_every updates and at the end.
  FitOutcome fit(const Dataset& train, const TrainOptions& options, const Dataset* eval = nullptr,
                 const TrainCallbacks& callbacks = {});

  EvalResult evaluate(const Dataset& data, int64_t batch_size);
  // Predictions (the loss's inputs) for every example, in order.
  std::vector<NamedArray> predict(const Dataset& data, int64_t batch_size);

  // The model's own outputs, as generate_artifacts recorded them (empty when not recorded).
  const std::vector<std::string>& model_outputs() const { return model_outputs_; }
  std::vector<std::string> input_names() const { return module_->input_names(true); }
  Module& module() { return *module_; }
  CheckpointState& state() { return state_; }

 private:
  template <typename F> void run_eval(const Dataset& data, int64_t batch_size, F&& on_batch);
  void save(const std::string& path);
  void scale_gradients(double factor);  // every trainable parameter's gradient, in place

  ArtifactPaths artifacts_;
  CheckpointState state_;
  std::map<std::string, DType> input_dtypes_;
  std::vector<std::string> model_outputs_, predictions_, targets_;
  std::unique_ptr<Module> module_;
  std::unique_ptr<Optimizer> optimizer_;  // created by fit
};

}  // namespace onnxtrain

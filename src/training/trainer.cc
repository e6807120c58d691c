#include "training/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "core/dispatch.h"
#include "distributed/data_parallel.h"
#include "onnx/model_io.h"
#include "training/artifacts.h"
#include "training/module.h"

namespace onnxtrain {

namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

// A progress property of the checkpoint, which must exist with type T (int64_t or double).
template <typename T>
T progress_property(const CheckpointState& state, const char* name) {
  OT_CHECK(state.has_property(name), "the checkpoint's training progress lacks the property '", name, "'");
  const PropertyValue& v = state.get_property(name);
  OT_CHECK(std::holds_alternative<T>(v), "checkpoint property '", name, "' is a ", property_type_name(v),
           ", expected ", property_type_name(PropertyValue(T{})));
  return std::get<T>(v);
}

// The mean of a loss output: a scalar for reductions "mean"/"sum", per element for "none".
double mean_of(const Tensor& t) {
  OT_CHECK(t.numel() > 0, "the loss output is empty");
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); ++i) sum += t.item_as_double(i);
  return sum / double(t.numel());
}

// argmax over dimension 1 of predictions [N, C, d...] against labels [N, d...]; labels outside
// [0, C) are skipped. Returns (correct, counted), or nullopt when the shapes are not those of
// class-index classification.
std::optional<std::pair<int64_t, int64_t>> count_correct(const Tensor& pred, const Tensor& labels) {
  if (!is_floating(pred.dtype()) || !is_integer(labels.dtype()) || pred.rank() < 2 ||
      labels.rank() != pred.rank() - 1 || labels.dim(0) != pred.dim(0))
    return std::nullopt;
  for (int d = 1; d < labels.rank(); ++d)
    if (labels.dim(d) != pred.dim(d + 1)) return std::nullopt;
  const int64_t n = pred.dim(0), classes = pred.dim(1), inner = labels.numel() / std::max<int64_t>(n, 1);
  int64_t correct = 0, counted = 0;
  dispatch_float(pred.dtype(), [&]<typename T>() {
    const T* p = pred.data<T>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < inner; ++r) {
        const int64_t label = labels.item_as_int(i * inner + r);
        if (label < 0 || label >= classes) continue;
        const T* row = p + i * classes * inner + r;
        int64_t best = 0;
        for (int64_t c = 1; c < classes; ++c)
          if (float(row[c * inner]) > float(row[best * inner])) best = c;
        correct += best == label;
        ++counted;
      }
  });
  return std::pair{correct, counted};
}

// This rank's examples of an epoch, in order: DistributedSampler's split of the epoch order, padded
// by wrapping around to a multiple of the world size. One rank: the order itself.
std::vector<int64_t> shard_of(const std::vector<int64_t>& order, int rank, int size) {
  if (size == 1) return order;
  const int64_t n = int64_t(order.size()), per = (n + size - 1) / size;
  std::vector<int64_t> shard(static_cast<size_t>(per));
  for (int64_t i = 0; i < per; ++i) shard[size_t(i)] = order[size_t((i * size + rank) % n)];
  return shard;
}

uint64_t file_checksum(const std::string& path, uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  OT_CHECK(in.good(), "cannot read '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return distributed::checksum_bytes(bytes.data(), bytes.size(), seed);
}

}  // namespace

Trainer::Trainer(const ArtifactPaths& artifacts, const std::string& checkpoint, bool resume, Device device)
    : artifacts_(artifacts), state_(CheckpointState::load(checkpoint)) {
  if (resume) {
    OT_CHECK(state_.has_property(kProgressStep), "checkpoint '", checkpoint, "' holds no training progress (no '",
             kProgressStep, "' property): start a new run from its parameters instead of resuming");
  } else {
    std::vector<std::string> progress;
    for (const auto& [name, value] : state_.properties())
      if (name.rfind("train.", 0) == 0) progress.push_back(name);
    for (const auto& name : progress) state_.remove_property(name);
    state_.clear_optimizer_state();
  }
  auto graphs = std::make_unique<CompiledGraphs>();
  graphs->training = load_model_for_runtime(artifacts.training_model);
  graphs->eval = load_model_for_runtime(artifacts.eval_model);
  const Model& training = graphs->training.model;
  Model& eval = graphs->eval->model;
  model_outputs_ = recorded_names(eval, kMetaModelOutputs).value_or(std::vector<std::string>{});
  predictions_ = recorded_names(eval, kMetaLossInputs).value_or(std::vector<std::string>{});
  targets_ = recorded_names(eval, kMetaTargets).value_or(std::vector<std::string>{});
  // The eval graph also returns the loss's inputs, for accuracy and predictions.
  for (const auto& p : predictions_)
    if (!eval.graph.is_output(p)) {
      eval.graph.outputs.push_back({p, ValueInfo{}});
      graphs->eval->plans.clear();  // planned for the graph's own outputs
    }
  for (const auto& in : training.graph.inputs) input_dtypes_[in.name] = in.info.dtype;
  module_ = std::make_unique<Module>(std::move(graphs), state_, device);
  OT_CHECK(module_->input_names(true) == module_->input_names(false), "the training model takes inputs (",
           joined(module_->input_names(true)), ") but the eval model takes (", joined(module_->input_names(false)),
           ")");
}

Trainer::~Trainer() = default;

Dataset Trainer::load_dataset(const std::string& npz_path, const std::vector<std::string>& inputs,
                              const std::vector<std::string>& labels, std::vector<std::string>* notes) const {
  const std::vector<std::string> names = module_->input_names(true);
  std::vector<std::string> keys = inputs;
  keys.insert(keys.end(), labels.begin(), labels.end());
  if (keys.empty()) {
    std::vector<std::string> have;
    for (const NpzEntry& e : list_npz(npz_path)) have.push_back(e.name);
    for (const auto& n : names)
      OT_CHECK(std::find(have.begin(), have.end(), n) != have.end(), "npz '", npz_path, "' has arrays (", joined(have),
               ") but the training graph takes (", joined(names),
               "): name the arrays for the model inputs and the labels (--inputs, --labels)");
    keys = names;
  }
  OT_CHECK(keys.size() == names.size(), "the training graph takes ", names.size(), " inputs (", joined(names),
           "), but ", keys.size(), " arrays were named (", joined(keys), ")");
  Dataset data(load_npz(npz_path, keys), "npz '" + npz_path + "'");
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = input_dtypes_.find(names[i]);
    const DType have = data.columns()[i].value.dtype();
    if (it == input_dtypes_.end() || it->second == DType::kUndefined || it->second == have) continue;
    data.convert_column(i, it->second);
    if (notes)
      notes->push_back("array '" + keys[i] + "' converted from " + dtype_name(have) + " to " +
                       dtype_name(it->second) + " for input '" + names[i] + "'");
  }
  return data;
}

void Trainer::save(const std::string& path) { state_.save(path, /*include_optimizer_state=*/true); }

void Trainer::scale_gradients(double factor) {
  for (const auto& name : module_->trainable_parameters()) {
    Parameter& p = state_.parameter(name);
    OT_CHECK(p.has_grad(), "gradient accumulation: parameter '", name, "' has no gradient after a train step");
    Tensor& g = p.ensure_grad();  // allocated: no zeros
    dispatch_float(g.dtype(), [&]<typename T>() {
      T* d = g.data<T>();
      const compute_t<T> f = compute_t<T>(factor);
      for (int64_t i = 0; i < g.numel(); ++i) d[i] = T(compute_t<T>(d[i]) * f);
    });
  }
}

namespace {

// Data parallelism: the world, or a single rank when disabled.
struct Ranks {
  distributed::Communicator* comm = nullptr;
  int rank = 0, size = 1;
};

}  // namespace

FitOutcome Trainer::fit(const Dataset& train, const TrainOptions& o, const Dataset* eval, const TrainCallbacks& cb) {
  OT_CHECK(o.epochs >= 1, "epochs must be >= 1, got ", o.epochs);
  OT_CHECK(o.batch_size >= 1, "batch_size must be >= 1, got ", o.batch_size);
  OT_CHECK(o.grad_accum >= 1, "grad_accum must be >= 1, got ", o.grad_accum);
  OT_CHECK(o.batch_size <= std::numeric_limits<int64_t>::max() / o.grad_accum, "batch_size ", o.batch_size,
           " x grad_accum ", o.grad_accum, " is too large");
  OT_CHECK(o.checkpoint_every >= 0, "checkpoint_every must be >= 0, got ", o.checkpoint_every);
  OT_CHECK(o.max_steps >= 0, "max_steps must be >= 0, got ", o.max_steps);
  OT_CHECK(!o.checkpoint_out.empty(), "fit: no checkpoint_out path given");
  OT_CHECK(o.seed <= uint64_t(std::numeric_limits<int64_t>::max()), "seed must be at most 2^63 - 1, got ", o.seed);
  Ranks ranks;
  std::string who;  // "rank 1 of 2: " in data-parallel runs
  if (o.data_parallel.enabled) {
    ranks.comm = &distributed::world();
    ranks.rank = ranks.comm->rank();
    ranks.size = ranks.comm->size();
    who = ranks.comm->label() + ": ";
    OT_CHECK(train.size() >= ranks.size, who, train.description(), " has ", train.size(),
             " examples, fewer than the ", ranks.size, " ranks: every rank needs a shard");
  }
  // Each rank's share of an epoch (DistributedSampler: padded to a multiple of the world size),
  // taken update_rows examples per update.
  const int64_t shard_size = (train.size() + ranks.size - 1) / ranks.size;
  const int64_t update_rows = o.batch_size * o.grad_accum;
  const int64_t epoch_steps = o.drop_last ? shard_size / update_rows : (shard_size + update_rows - 1) / update_rows;
  OT_CHECK(epoch_steps > 0, who, train.description(), ": ", train.size(), " examples make no full batch of ",
           o.batch_size, o.grad_accum > 1 ? " x " + std::to_string(o.grad_accum) + " micro-batches" : "",
           ranks.size > 1 ? " per rank" : "");
  OT_CHECK(o.epochs <= std::numeric_limits<int64_t>::max() / epoch_steps, "epochs ", o.epochs, " is too large");
  const int64_t total_steps = o.epochs * epoch_steps;
  if (!optimizer_) optimizer_ = std::make_unique<Optimizer>(artifacts_.optimizer_model, *module_);
  if (ranks.comm) {
    // The same graphs on every rank (the checkpoint is compared by set_data_parallel).
    uint64_t h = 1469598103934665603ull;
    for (const std::string& path : {artifacts_.training_model, artifacts_.eval_model, artifacts_.optimizer_model})
      h = file_checksum(path, h);
    distributed::check_same_on_all_ranks(*ranks.comm, h, "the training, eval and optimizer models");
    DataParallelOptions dp = o.data_parallel;
    dp.gradient_accumulation_steps = o.grad_accum;  // the allreduce overlaps the last micro-batch's backward
    optimizer_->set_data_parallel(dp);
  }

  // ---- where to start: a new run, or the progress the checkpoint recorded
  int64_t epoch = 0, epoch_step = 0, step = 0;
  double loss_sum = 0;
  double base_lr = o.lr.value_or(optimizer_->get_learning_rate());
  if (state_.has_property(kProgressStep)) {
    auto same = [&](const char* name, int64_t now) {
      const int64_t then = progress_property<int64_t>(state_, name);
      OT_CHECK(then == now, "resume: the checkpoint's run used ", name, " = ", then, ", this one ", now,
               "; resume with the same data and options");
    };
    const int64_t then_size =
        state_.has_property(kProgressWorldSize) ? progress_property<int64_t>(state_, kProgressWorldSize) : 1;
    OT_CHECK(then_size == ranks.size, who, "resume: the checkpoint's run had ", then_size,
             " rank(s) and this one has ", ranks.size, ": the data was sharded over ", then_size,
             " ranks, so the remaining batches differ; resume with mpirun -np ", then_size);
    same(kProgressSeed, int64_t(o.seed));
    same(kProgressShuffle, o.shuffle);
    same(kProgressBatchSize, o.batch_size);
    const int64_t then_accum =
        state_.has_property(kProgressGradAccum) ? progress_property<int64_t>(state_, kProgressGradAccum) : 1;
    OT_CHECK(then_accum == o.grad_accum, "resume: the checkpoint's run used ", kProgressGradAccum, " = ", then_accum,
             ", this one ", o.grad_accum, "; resume with the same --grad-accum (its updates took other examples)");
    same(kProgressDropLast, o.drop_last);
    same(kProgressExamples, train.size());
    epoch = progress_property<int64_t>(state_, kProgressEpoch);
    epoch_step = progress_property<int64_t>(state_, kProgressEpochStep);
    step = progress_property<int64_t>(state_, kProgressStep);
    loss_sum = progress_property<double>(state_, kProgressLossSum);
    if (!o.lr) base_lr = progress_property<double>(state_, kProgressBaseLr);
    OT_CHECK(epoch >= 0 && epoch_step >= 0 && epoch_step < epoch_steps && step == epoch * epoch_steps + epoch_step,
             "resume: inconsistent progress in the checkpoint (epoch ", epoch, ", epoch_step ", epoch_step, ", step ",
             step, " with ", epoch_steps, " updates per epoch)");
  }
  optim::LRSchedule schedule;
  schedule.kind = o.schedule;
  schedule.initial_lr = base_lr;
  schedule.warmup_step_count = o.warmup_steps;
  schedule.total_step_count = total_steps;
  schedule.step_size = o.step_size;
  schedule.gamma = o.gamma;
  schedule.validate();

  auto save_progress = [&](const std::string& path) {
    state_.add_property(kProgressEpoch, epoch);
    state_.add_property(kProgressEpochStep, epoch_step);
    state_.add_property(kProgressStep, step);
    state_.add_property(kProgressLossSum, loss_sum);
    state_.add_property(kProgressBaseLr, base_lr);
    state_.add_property(kProgressSeed, int64_t(o.seed));
    state_.add_property(kProgressShuffle, int64_t(o.shuffle));
    state_.add_property(kProgressBatchSize, o.batch_size);
    state_.add_property(kProgressGradAccum, o.grad_accum);
    state_.add_property(kProgressDropLast, int64_t(o.drop_last));
    state_.add_property(kProgressExamples, train.size());
    state_.add_property(kProgressWorldSize, int64_t(ranks.size));
    if (cb.before_checkpoint && ranks.rank == 0) cb.before_checkpoint(step);
    if (ranks.rank == 0) save(path);  // atomic; the other ranks hold the same state
    if (ranks.comm) ranks.comm->barrier();  // the file is complete before anyone goes on
    if (cb.on_checkpoint && ranks.rank == 0) cb.on_checkpoint(path, step);
  };
  if (epoch >= o.epochs) {
    save_progress(o.checkpoint_out);
    return FitOutcome::kAlreadyDone;
  }

  int64_t saved_at = -1;
  std::vector<int64_t> window(size_t(train.size()), 0);
  while (epoch < o.epochs) {
    const std::vector<int64_t> order =
        shard_of(epoch_order(train.size(), o.shuffle, o.seed, epoch), ranks.rank, ranks.size);
    bool due = false;  // a checkpoint is due once the epoch's bookkeeping is done
    while (epoch_step < epoch_steps) {
      if (o.max_steps && step >= o.max_steps) {
        save_progress(o.checkpoint_out);
        return FitOutcome::kStoppedAtMaxSteps;
      }
      const double lr = schedule.value(step);
      optimizer_->set_learning_rate(lr);
      // This rank's examples for the update: rows order[epoch_step * B * N, ...) of its shard, in
      // micro-batches of B, each put at the front of a window as long as the data (Dataset::batch
      // reads a full-length order).
      const int64_t update_first = epoch_step * update_rows;
      const int64_t rows_now = std::min(update_rows, int64_t(order.size()) - update_first);
      // The losses are means over their micro-batch: the update's gradient and loss are the
      // micro-batches' weighted by rows, as one batch of rows_now would give. train_step adds the
      // gradients; when a micro-batch of other rows comes (the epoch's last, partial one), the sum
      // so far is rescaled to its unit, and the sum is divided by the last train step itself (as
      // each gradient is final: overlapped data parallelism reduces it right after).
      double loss = 0;
      int64_t unit = 0;  // the rows of the micro-batches summed so far, with weight 1 each
      for (int64_t first = update_first; first < update_first + rows_now; first += o.batch_size) {
        const int64_t rows = std::min(o.batch_size, update_first + rows_now - first);
        std::copy(order.begin() + first, order.begin() + first + rows, window.begin());
        if (unit != 0 && unit != rows) scale_gradients(double(unit) / double(rows));
        unit = rows;
        if (first + rows == update_first + rows_now && rows != rows_now)
          module_->scale_gradients_in_next_step(double(rows) / double(rows_now));
        loss += mean_of(module_->train_step(train.batch(window, 0, rows))[0]) * (double(rows) / double(rows_now));
      }
      if (ranks.comm) {  // the loss of the global batch: the mean of the ranks' losses
        ranks.comm->allreduce_sum(&loss, 1, DType::kFloat64);
        loss /= double(ranks.size);
      }
      if (!std::isfinite(loss))
        OT_THROW(kRuntime, who, "the loss is ", loss, " at update ", step + 1, " (epoch ", epoch + 1, ", update ",
                 epoch_step + 1, " of the epoch): training diverged; try a lower learning rate");
      const StepStats stats = optimizer_->step();
      module_->lazy_reset_grad();
      ++step;
      ++epoch_step;
      loss_sum += loss;
      if (cb.on_step)
        cb.on_step({epoch, o.epochs, epoch_step, epoch_steps, step, total_steps, loss, lr, stats.skipped, stats.loss_scale});
      if (o.checkpoint_every && step % o.checkpoint_every == 0) {
        if (epoch_step < epoch_steps) {
          save_progress(o.checkpoint_out);
          saved_at = step;
        } else {
          due = true;
        }
      }
    }
    EpochReport report{epoch, o.epochs, loss_sum / double(epoch_steps), std::nullopt};
    if (eval) report.eval = evaluate(*eval, o.eval_batch_size);
    ++epoch;
    epoch_step = 0;
    loss_sum = 0;
    if (cb.on_epoch) cb.on_epoch(report);
    if (due) {
      save_progress(o.checkpoint_out);
      saved_at = step;
    }
  }
  if (saved_at != step) save_progress(o.checkpoint_out);
  return FitOutcome::kFinished;
}

template <typename F>
void Trainer::run_eval(const Dataset& data, int64_t batch_size, F&& on_batch) {
  const std::vector<int64_t> order = epoch_order(data.size(), false, 0, 0);
  for (int64_t b = 0; b < data.num_batches(batch_size); ++b) {
    std::vector<Tensor> batch = data.batch(order, b, batch_size);
    std::vector<Tensor> outputs = module_->eval_step(batch);
    on_batch(batch, outputs);
  }
}

EvalResult Trainer::evaluate(const Dataset& data, int64_t batch_size) {
  const std::vector<std::string> outputs = module_->output_names(false), inputs = module_->input_names(false);
  auto index_of = [](const std::vector<std::string>& names, const std::string& n) {
    return size_t(std::find(names.begin(), names.end(), n) - names.begin());
  };
  const bool classify = predictions_.size() == 1 && targets_.size() == 1;
  const size_t pred = classify ? index_of(outputs, predictions_[0]) : 0;
  const size_t label = classify ? index_of(inputs, targets_[0]) : 0;
  EvalResult r;
  double weighted = 0;
  bool counting = classify && pred < outputs.size() && label < inputs.size();
  int64_t correct = 0, counted = 0;
  run_eval(data, batch_size, [&](const std::vector<Tensor>& batch, const std::vector<Tensor>& out) {
    const int64_t rows = batch[0].dim(0);
    weighted += mean_of(out[0]) * double(rows);
    r.examples += rows;
    if (!counting) return;
    auto c = count_correct(out[pred], batch[label]);
    if (!c) {
      counting = false;  // not class indices: no accuracy
      return;
    }
    correct += c->first;
    counted += c->second;
  });
  r.loss = r.examples ? weighted / double(r.examples) : 0.0;
  if (counting) {
    r.correct = correct;
    r.counted = counted;
  }
  return r;
}

std::vector<NamedArray> Trainer::predict(const Dataset& data, int64_t batch_size) {
  OT_CHECK(!predictions_.empty(), "the eval model does not record the loss's inputs (artifacts from another "
           "generator?): no predictions to write");
  const std::vector<std::string> outputs = module_->output_names(false);
  std::vector<NamedArray> result;
  for (const auto& p : predictions_) result.push_back({p, Tensor()});
  int64_t row = 0;
  run_eval(data, batch_size, [&](const std::vector<Tensor>& batch, const std::vector<Tensor>& out) {
    const int64_t rows = batch[0].dim(0);
    for (auto& [name, all] : result) {
      const Tensor& t = out[size_t(std::find(outputs.begin(), outputs.end(), name) - outputs.begin())];
      OT_CHECK(t.rank() >= 1 && t.dim(0) == rows, "prediction '", name, "' has shape ", shape_str(t.shape()),
               ", not one row per example of the batch (", rows, ")");
      if (!all.defined()) {
        Shape shape = t.shape();
        shape[0] = data.size();
        all = Tensor::empty(t.dtype(), shape);
      }
      OT_CHECK(all.dtype() == t.dtype() && t.nbytes() / size_t(rows) * size_t(data.size()) == all.nbytes(),
               "prediction '", name, "' changes dtype or shape between batches");
      const size_t row_bytes = all.nbytes() / size_t(data.size());
      std::memcpy(static_cast<uint8_t*>(all.data()) + size_t(row) * row_bytes, t.data(), t.nbytes());
    }
    row += rows;
  });
  return result;
}

}  // namespace onnxtrain

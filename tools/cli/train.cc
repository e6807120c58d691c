// `onnxtrain train`: the training loop (src/training/trainer.h) over .npz data.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "onnxtrain/distributed.h"
#include "progress.h"
#include "train_log.h"

namespace onnxtrain::cli {

const Command kTrainCommand{
    "train",
    "train from an artifact directory on .npz data, with checkpoints that resume exactly",
    {"DIR"},
    {
        {"--data", "FILE.npz", "training data (required)"},
        kInputsOption,
        kLabelsOption,
        {"--epochs", "N", "epochs in all, counting those a resumed checkpoint already did (default 1)"},
        {"--batch-size", "B", "examples per micro-batch, per rank (default 32)"},
        {"--grad-accum", "N", "micro-batches per update, gradients averaged: B x N examples (default 1)"},
        {"--shuffle", "", "shuffle the examples every epoch"},
        {"--seed", "S", "shuffle seed (default 0)"},
        {"--drop-last", "", "skip the last, partial update (fewer than B x N examples) of each epoch"},
        {"--lr", "LR", "peak learning rate (default: the optimizer model's)"},
        {"--lr-schedule", "KIND", "constant (default), linear, cosine or step"},
        {"--warmup", "N", "linear warmup updates (linear, cosine, constant)"},
        {"--step-size", "N", "step schedule: multiply the rate by --gamma every N updates"},
        {"--gamma", "G", "step schedule factor (default 0.1)"},
        {"--checkpoint", "PATH", "start a new run from this checkpoint's parameters (default DIR/checkpoint)"},
        {"--resume", "PATH", "continue the run saved in PATH: same batches, rates and optimizer state"},
        {"--checkpoint-out", "PATH", "where to save (default DIR/trained_checkpoint)"},
        {"--checkpoint-every", "N", "also save every N updates (default: only at the end)"},
        {"--max-steps", "N", "stop and save after N updates in all"},
        {"--eval-data", "FILE.npz", "evaluate on this data after every epoch"},
        {"--eval-batch-size", "B", "batch size for evaluation (default 256)"},
        {"--progress", "STYLE", "auto (a bar on a terminal, lines otherwise), bar, lines or none"},
        {"--log-every", "N", "with lines: one every N updates (default: about ten per epoch)"},
        {"--log", "FILE", "also write a JSON line per update and per epoch there (kept exact across --resume)"},
        {"--bucket-mb", "MB", "under mpirun: gradient allreduce bucket size (default 25)"},
        {"--dp-check-every", "N", "under mpirun: compare a parameter checksum across ranks every N updates"},
        {"--dp-timeout", "S", "under mpirun: seconds a rank waits for the others before failing (default 300)"},
        {"--device", "DEV", "cpu (default) or cuda: where the graphs run (a CUDA build on a machine with a GPU)"},
    },
    "Checkpoints hold the parameters, the optimizer state and the run's progress (train.* properties),\n"
    "and are written atomically. Resuming needs the same data, --batch-size, --grad-accum, --shuffle,\n"
    "--seed and --drop-last; then the parameters match an uninterrupted run bit for bit, Dropout\n"
    "included (its masks follow the checkpoint's onnxtrain.random_seed and onnxtrain.train_steps).\n\n"
    "Gradient accumulation: with --grad-accum N an update runs N micro-batches of --batch-size B, then\n"
    "one optimizer step on their gradients averaged (weighted by rows), so it equals an update with\n"
    "--batch-size B*N, as torch's loop with loss / N does (the C++/Python APIs and ORTTrainer sum\n"
    "instead, as ONNX Runtime does). The loss printed is that of the update's examples; --lr-schedule,\n"
    "--warmup, --step-size, --checkpoint-every, --max-steps and --log-every count updates.\n\n"
    "Under `mpirun -np R` every rank trains on its shard of the data (DistributedSampler's split;\n"
    "an update sees --batch-size x --grad-accum x R examples), the gradients are averaged over the\n"
    "ranks once per update, rank 0 prints and writes the checkpoints, and a resumed run needs the\n"
    "same R.\n\n"
    "example:\n"
    "  onnxtrain train out --data train.npz --inputs x --labels y --epochs 10 --batch-size 64 --shuffle \\\n"
    "      --lr-schedule cosine --warmup 100 --checkpoint-every 500 --eval-data val.npz\n"};

namespace {

int train_with(const Args& a, const DistributedWorld& world);

}  // namespace

int run_train(const Args& a) {
  const DistributedWorld world = distributed_init();
  if (world.size == 1) return train_with(a, world);
  try {
    return train_with(a, world);
  } catch (const UsageError&) {
    if (world.rank == 0) throw;
    distributed_abort(2);  // rank 0 reports the usage error
  } catch (const std::exception& e) {
    // Another rank may be waiting in a collective: end the whole job, naming this rank.
    const std::string what = e.what(), label = "rank " + std::to_string(world.rank);
    std::fprintf(stderr, "onnxtrain train: error: %s%s\n",
                 what.rfind(label, 0) == 0 ? "" : (label + " of " + std::to_string(world.size) + ": ").c_str(),
                 what.c_str());
    distributed_abort(1);
  }
}

namespace {

int train_with(const Args& a, const DistributedWorld& world) {
  const std::string dir = a.positional(0);
  const std::string data = a.require("--data");
  if (a.has("--checkpoint") && a.has("--resume")) throw UsageError("give --checkpoint or --resume, not both");
  TrainOptions o;
  o.epochs = a.get_int("--epochs", 1, 1);
  o.batch_size = a.get_int("--batch-size", 32, 1);
  o.grad_accum = a.get_int("--grad-accum", 1, 1);
  o.shuffle = a.flag("--shuffle");
  o.seed = uint64_t(a.get_int("--seed", 0, 0));
  o.drop_last = a.flag("--drop-last");
  o.lr = a.get_optional_double("--lr");
  if (o.lr && *o.lr < 0) throw UsageError("--lr must be >= 0");
  const std::string kind = a.get_choice("--lr-schedule", {"constant", "linear", "cosine", "step"}, "constant");
  o.schedule = kind == "linear"   ? optim::LRScheduleKind::kLinear
               : kind == "cosine" ? optim::LRScheduleKind::kCosine
               : kind == "step"   ? optim::LRScheduleKind::kStep
                                  : optim::LRScheduleKind::kConstant;
  if (a.has("--warmup") && kind == "step") throw UsageError("--warmup does not apply to the step schedule");
  if ((a.has("--step-size") || a.has("--gamma")) && kind != "step")
    throw UsageError("--step-size and --gamma apply to --lr-schedule step only");
  o.warmup_steps = a.get_int("--warmup", 0, 0);
  o.step_size = a.get_int("--step-size", 1, 1);
  o.gamma = a.get_double("--gamma", 0.1);
  o.checkpoint_every = a.get_int("--checkpoint-every", 0, 1);
  o.max_steps = a.get_int("--max-steps", 0, 1);
  o.eval_batch_size = a.get_int("--eval-batch-size", 256, 1);
  o.checkpoint_out = a.has("--checkpoint-out") ? a.require("--checkpoint-out")
                                               : (std::filesystem::path(dir) / "trained_checkpoint").string();
  o.data_parallel.enabled = world.size > 1;
  o.data_parallel.bucket_bytes = int64_t(a.get_double("--bucket-mb", 25.0) * double(1 << 20));
  if (o.data_parallel.bucket_bytes <= 0) throw UsageError("--bucket-mb must be > 0");
  o.data_parallel.check_every = a.get_int("--dp-check-every", 0, 1);
  o.data_parallel.timeout_seconds = a.get_double("--dp-timeout", 300.0);
  if (o.data_parallel.timeout_seconds <= 0) throw UsageError("--dp-timeout must be > 0");
  const std::string style = world.rank == 0 ? a.get_choice("--progress", {"auto", "bar", "lines", "none"}, "auto") : "none";
  ProgressPrinter progress(progress_style(style),
                           a.get_int("--log-every", 0, 1));
  const std::vector<std::string> inputs = a.get_list("--inputs"), labels = a.get_list("--labels");
  const std::string eval_data = a.has("--eval-data") ? a.require("--eval-data") : "";
  const bool resume = a.has("--resume");
  const ArtifactPaths artifacts = artifact_paths(dir);
  const std::string checkpoint = resume ? a.require("--resume") : a.get("--checkpoint", artifacts.checkpoint);

  const Device device = a.get_choice("--device", {"cpu", "cuda"}, "cpu") == "cuda" ? Device::kCuda : Device::kCpu;
  Trainer trainer(artifacts, checkpoint, resume, device);
  std::vector<std::string> notes;
  Dataset train = trainer.load_dataset(data, inputs, labels, &notes);
  std::optional<Dataset> eval;
  if (!eval_data.empty()) eval = trainer.load_dataset(eval_data, inputs, labels, &notes);
  if (world.rank == 0)
    for (const auto& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());

  std::optional<TrainLog> log;
  int64_t last_step = 0;
  if (a.has("--log") && world.rank == 0) {
    std::optional<int64_t> resumed_at;
    if (resume) {
      const CheckpointState& s = trainer.state();
      const int64_t* done = s.has_property(kProgressStep) ? std::get_if<int64_t>(&s.get_property(kProgressStep)) : nullptr;
      resumed_at = done ? *done : 0;
      last_step = *resumed_at;
    }
    log.emplace(a.require("--log"), resumed_at);
  }
  TrainCallbacks callbacks;
  callbacks.on_step = [&](const StepReport& r) {
    progress.step(r);
    if (log) log->step(r);
    last_step = r.step;
  };
  callbacks.on_epoch = [&](const EpochReport& r) {
    progress.epoch(r);
    if (log) log->epoch(r, last_step);
  };
  callbacks.before_checkpoint = [&](int64_t) {
    if (log) log->sync();
  };
  callbacks.on_checkpoint = [&](const std::string& path, int64_t step) { progress.checkpoint(path, step); };
  const FitOutcome outcome = trainer.fit(train, o, eval ? &*eval : nullptr, callbacks);
  if (world.rank != 0) return 0;
  switch (outcome) {
    case FitOutcome::kFinished:
      std::printf("finished %lld epochs; checkpoint %s\n", (long long)o.epochs, o.checkpoint_out.c_str());
      break;
    case FitOutcome::kStoppedAtMaxSteps:
      std::printf("stopped after %lld updates (--max-steps); resume with --resume %s\n", (long long)o.max_steps,
                  o.checkpoint_out.c_str());
      break;
    case FitOutcome::kAlreadyDone:
      std::printf("nothing to do: the checkpoint already finished %lld epochs; checkpoint %s\n", (long long)o.epochs,
                  o.checkpoint_out.c_str());
      break;
  }
  return 0;
}

}  // namespace

}  // namespace onnxtrain::cli

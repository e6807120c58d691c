// `onnxtrain train --log FILE`: one JSON line per update and per epoch, which a killed and resumed
// run leaves identical to an uninterrupted run's (timings are not logged, so it is reproducible):
//
//   {"step": 3, "epoch": 0, "loss": 2.2931, "lr": 0.001}
//   {"step": 40, "epoch_end": 0, "loss": 1.9, "eval_loss": 1.8, "eval_accuracy": 0.51}
//
// Crash consistency: every line is appended with one write(2); before a checkpoint is saved the
// log is fsynced, so the log on disk covers at least the checkpoint's updates. A resumed run first
// cuts the log back to the complete lines of updates 1..S (S: the checkpoint's train.step),
// rewriting it atomically, then appends: lines of updates done after the checkpoint by the killed
// run (and a torn last line, after a power cut) go, and the run writes them again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/file_io.h"
#include "training/trainer.h"

namespace onnxtrain::cli {

class TrainLog {
 public:
  // resume_step: the resumed checkpoint's updates (nullopt: a new run, which starts an empty log).
  TrainLog(const std::string& path, std::optional<int64_t> resume_step);
  void step(const StepReport& r);
  void epoch(const EpochReport& r, int64_t step);
  void sync();  // before a checkpoint is saved

 private:
  void append(const std::string& line);
  std::string path_;
  file_io::Fd fd_;
};

}  // namespace onnxtrain::cli

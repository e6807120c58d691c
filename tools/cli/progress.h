// Training progress on stderr: a bar redrawn in place when stderr is a terminal, plain lines
// otherwise (logs, CI). Epoch summaries go to stdout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "training/trainer.h"

namespace onnxtrain::cli {

enum class ProgressStyle { kBar, kLines, kNone };

// "auto" (a bar on a terminal, lines otherwise), "bar", "lines" or "none".
ProgressStyle progress_style(const std::string& choice);

class ProgressPrinter {
 public:
  // lines: print one every `every` updates (0: about ten per epoch).
  ProgressPrinter(ProgressStyle style, int64_t every);
  void step(const StepReport& r);
  void epoch(const EpochReport& r);
  void checkpoint(const std::string& path, int64_t step);

 private:
  double rate() const;   // updates per second in this process
  void clear_bar();

  ProgressStyle style_;
  int64_t every_;
  int64_t steps_ = 0;    // updates seen by this process
  int64_t skipped_ = 0;  // of them, skipped by the fp16 loss scaler
  bool bar_shown_ = false;
  std::chrono::steady_clock::time_point first_step_{};
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace onnxtrain::cli

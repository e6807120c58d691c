#include "progress.h"

#include <unistd.h>

#include <cstdio>

namespace onnxtrain::cli {

ProgressStyle progress_style(const std::string& choice) {
  if (choice == "bar") return ProgressStyle::kBar;
  if (choice == "lines") return ProgressStyle::kLines;
  if (choice == "none") return ProgressStyle::kNone;
  return ::isatty(STDERR_FILENO) ? ProgressStyle::kBar : ProgressStyle::kLines;
}

ProgressPrinter::ProgressPrinter(ProgressStyle style, int64_t every) : style_(style), every_(every) {}

double ProgressPrinter::rate() const {
  // Timed from the end of the first update, which also plans memory and compiles kernels.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - first_step_).count();
  return steps_ > 1 && seconds > 0 ? double(steps_ - 1) / seconds : 0.0;
}

void ProgressPrinter::clear_bar() {
  if (!bar_shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  bar_shown_ = false;
}

void ProgressPrinter::step(const StepReport& r) {
  if (++steps_ == 1) first_step_ = std::chrono::steady_clock::now();
  if (r.skipped) ++skipped_;
  if (style_ == ProgressStyle::kNone) return;
  if (r.skipped) {  // every skip gets its own line, whatever the style
    clear_bar();
    std::fprintf(stderr, "update %lld skipped: a gradient overflowed in fp16; loss scale now %g (%lld skipped in this run)\n",
                 (long long)r.step, r.loss_scale, (long long)skipped_);
  }
  if (style_ == ProgressStyle::kLines) {
    const int64_t every = every_ > 0 ? every_ : std::max<int64_t>(1, r.epoch_steps / 10);
    if (r.epoch_step % every != 0 && r.epoch_step != r.epoch_steps) return;
    std::fprintf(stderr, "epoch %lld/%lld step %lld/%lld (update %lld/%lld) loss %.4g lr %.3g %.1f it/s\n",
                 (long long)r.epoch + 1, (long long)r.epochs, (long long)r.epoch_step, (long long)r.epoch_steps,
                 (long long)r.step, (long long)r.total_steps, r.loss, r.lr, rate());
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (r.epoch_step != r.epoch_steps && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  constexpr int kWidth = 30;
  const int filled = int(kWidth * r.epoch_step / std::max<int64_t>(1, r.epoch_steps));
  std::string bar(size_t(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(size_t(kWidth - filled - 1), ' ');
  const double per_second = rate();
  const double eta = per_second > 0 ? double(r.total_steps - r.step) / per_second : 0.0;
  char eta_text[32] = "?";
  if (per_second > 0) std::snprintf(eta_text, sizeof eta_text, "%.0fs", eta);
  std::fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4g lr %.3g %.1f it/s eta %s",
               (long long)r.epoch + 1, (long long)r.epochs, bar.c_str(), (long long)r.epoch_step,
               (long long)r.epoch_steps, r.loss, r.lr, per_second, eta_text);
  std::fflush(stderr);
  bar_shown_ = true;
}

void ProgressPrinter::epoch(const EpochReport& r) {
  clear_bar();
  std::printf("epoch %lld/%lld: loss %.6g", (long long)r.epoch + 1, (long long)r.epochs, r.loss);
  if (r.eval) {
    std::printf(", eval loss %.6g", r.eval->loss);
    if (r.eval->correct)
      std::printf(", eval accuracy %.4f (%lld/%lld)", r.eval->accuracy(), (long long)*r.eval->correct,
                  (long long)*r.eval->counted);
  }
  std::printf("\n");
  std::fflush(stdout);
}

void ProgressPrinter::checkpoint(const std::string& path, int64_t step) {
  if (style_ == ProgressStyle::kNone) return;
  clear_bar();
  std::fprintf(stderr, "saved checkpoint %s at update %lld\n", path.c_str(), (long long)step);
}

}  // namespace onnxtrain::cli

#include "train_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "onnxtrain/status.h"

namespace onnxtrain::cli {

namespace {

std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips: a resumed run's lines compare equal
  return buf;
}

// The update a line belongs to: every line starts with {"step": N. nullopt for anything else
// (a torn line).
std::optional<int64_t> step_of(const std::string& line) {
  static const std::string prefix = "{\"step\": ";
  if (line.compare(0, prefix.size(), prefix) != 0 || line.back() != '}') return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(line.c_str() + prefix.size(), &end, 10);
  if (*end != ',') return std::nullopt;
  return int64_t(v);
}

}  // namespace

TrainLog::TrainLog(const std::string& path, std::optional<int64_t> resume_step) : path_(path) {
  std::string kept;
  if (resume_step) {
    std::ifstream in(path, std::ios::binary);
    std::string line;
    // Complete lines only (getline's last piece has no newline when eof() is set after it).
    while (std::getline(in, line) && !in.eof()) {
      const std::optional<int64_t> s = step_of(line);
      if (!s || *s > *resume_step) break;
      kept += line + "\n";
    }
  }
  file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
    file_io::write_all(fd, kept.data(), kept.size(), what);
  });
  fd_.adopt(::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  if (fd_.get() < 0) OT_THROW(kRuntime, "cannot open the training log '", path, "': ", file_io::errno_text(errno));
}

void TrainLog::append(const std::string& line) {
  const std::string text = line + "\n";
  // One write(2) per line: a killed process leaves whole lines.
  const ssize_t w = ::write(fd_.get(), text.data(), text.size());
  if (w != ssize_t(text.size()))
    OT_THROW(kRuntime, "cannot append to the training log '", path_, "': ",
             w < 0 ? file_io::errno_text(errno) : std::string("short write"));
}

void TrainLog::step(const StepReport& r) {
  append("{\"step\": " + std::to_string(r.step) + ", \"epoch\": " + std::to_string(r.epoch) +
         ", \"loss\": " + number(r.loss) + ", \"lr\": " + number(r.lr) + "}");
}

void TrainLog::epoch(const EpochReport& r, int64_t step) {
  std::string line = "{\"step\": " + std::to_string(step) + ", \"epoch_end\": " + std::to_string(r.epoch) +
                     ", \"loss\": " + number(r.loss);
  if (r.eval) {
    line += ", \"eval_loss\": " + number(r.eval->loss);
    if (r.eval->correct) line += ", \"eval_accuracy\": " + number(r.eval->accuracy());
  }
  append(line + "}");
}

void TrainLog::sync() {
  if (::fdatasync(fd_.get()) != 0)
    OT_THROW(kRuntime, "cannot sync the training log '", path_, "': ", file_io::errno_text(errno));
}

}  // namespace onnxtrain::cli

// Startup to the first train step of on-device training artifacts (bench_minimal.py runs it on
// ONNX and on pre-compiled copies of the same artifacts, on the full and the minimal build):
//
//   startup [--compile] ART_DIR NAME=D0,D1,...[:i64] ...   (one per training input, zero-filled;
//                                                          :i64 for integer inputs such as labels)
//
// Prints one line of milliseconds: checkpoint load, Module, Optimizer, the first train step (with
// its optimizer step), the startup total (all four), and the median of 5 further steps
// (--steady-steps N: N; 0 to profile the startup alone); then per phase the main thread's CPU time
// (`<phase>_cpu`) and the process's minor page faults (`<phase>_faults`; for the steady steps the
// median CPU time and the most faults of one). Time before main (exec,
// loading and relocating the libraries) is not in the startup, since both forms pay it alike; with
// ONNXTRAIN_BENCH_SPAWN_NS set to CLOCK_MONOTONIC nanoseconds just before the spawn (bench_minimal.py
// sets it), `before_main` says how long it took.
// --compile instead pre-compiles ART_DIR for those shapes with this build (compile_artifacts).
// `startup --first-touch MIB` prints what writing MIB of fresh anonymous memory costs, in 4 KiB pages
// and in 2 MiB pages (MADV_HUGEPAGE), the cost core/memory.h's storage avoids.
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "onnxtrain/module.h"

using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// What a phase cost besides wall time: the main thread's CPU time (wall time minus it is waiting
// for a core, on a shared machine) and the process's minor page faults (first touches of pages).
struct Usage {
  double cpu_ms;
  long faults;
  static Usage now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return {double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6, ru.ru_minflt};
  }
  Usage operator-(const Usage& o) const { return {cpu_ms - o.cpu_ms, faults - o.faults}; }
};

// Milliseconds to write one byte per 4 KiB page of `mib` MiB of fresh anonymous memory.
static double first_touch_ms(size_t mib, bool huge_pages) {
  const size_t huge = size_t(2) << 20, bytes = mib << 20;
  char* raw = static_cast<char*>(mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (raw == MAP_FAILED) return -1;
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) / huge * huge);
  if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
  const auto t = Clock::now();
  for (size_t i = 0; i < bytes; i += 4096) p[i] = 1;
  const double ms = ms_since(t);
  munmap(raw, bytes + huge);
  return ms;
}

int main(int argc, char** argv) {
  double before_main_ms = -1;
  if (const char* spawn = std::getenv("ONNXTRAIN_BENCH_SPAWN_NS")) {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    before_main_ms = (double(ts.tv_sec) * 1e9 + double(ts.tv_nsec) - std::atof(spawn)) / 1e6;
  }
  if (argc == 3 && std::string(argv[1]) == "--first-touch") {
    const size_t mib = size_t(std::atoll(argv[2]));
    const double small = first_touch_ms(mib, false), huge = first_touch_ms(mib, true);
    std::printf("first_touch_4k_ms_per_mib %.3f first_touch_2m_ms_per_mib %.3f\n", small / double(mib), huge / double(mib));
    return 0;
  }
  const bool compile = argc > 1 && std::string(argv[1]) == "--compile";
  if (compile) ++argv, --argc;
  int steady_steps = 5;  // --steady-steps 0: only the startup (for profiling it)
  if (argc > 2 && std::string(argv[1]) == "--steady-steps") {
    steady_steps = std::atoi(argv[2]);
    argv += 2, argc -= 2;
  }
  if (argc < 3) {
    std::fprintf(stderr, "usage: startup [--compile | --steady-steps N] ART_DIR NAME=D0,D1,...[:i64] ...\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<onnxtrain::Tensor> inputs;
  std::map<std::string, onnxtrain::Shape> shapes;
  for (int i = 2; i < argc; ++i) {
    std::string spec = argv[i];
    onnxtrain::DType dtype = onnxtrain::DType::kFloat32;
    if (spec.size() > 4 && spec.compare(spec.size() - 4, 4, ":i64") == 0) {
      dtype = onnxtrain::DType::kInt64;
      spec.resize(spec.size() - 4);
    }
    onnxtrain::Shape shape;
    for (size_t at = spec.find('=') + 1; at && at <= spec.size();) {
      size_t comma = std::min(spec.find(',', at), spec.size());
      shape.push_back(std::atoll(spec.substr(at, comma - at).c_str()));
      at = comma + 1;
    }
    inputs.push_back(onnxtrain::Tensor::zeros(dtype, shape));
    shapes[spec.substr(0, spec.find('='))] = shape;
  }
  try {
    if (compile) {
      for (const auto& path : onnxtrain::compile_artifacts(dir, shapes)) std::printf("wrote %s\n", path.c_str());
      return 0;
    }
    const auto start = Clock::now();
    const Usage at_start = Usage::now();
    auto t = start;
    Usage u = at_start;
    std::vector<std::pair<const char*, Usage>> costs;  // per phase: CPU time and page faults
    auto phase_done = [&](const char* name) {
      const double ms = ms_since(t);
      const Usage now = Usage::now();
      costs.emplace_back(name, now - u);
      t = Clock::now();
      u = Usage::now();
      return ms;
    };
    onnxtrain::CheckpointState state = onnxtrain::CheckpointState::load(dir + "/checkpoint");
    const double checkpoint = phase_done("checkpoint");
    onnxtrain::Module module(dir + "/training_model.onnx", state, dir + "/eval_model.onnx");
    const double module_ms = phase_done("module");
    onnxtrain::Optimizer optimizer(dir + "/optimizer_model.onnx", module);
    const double optimizer_ms = phase_done("optimizer");
    auto step = [&] {
      module.train_step(inputs);
      optimizer.step();
      module.lazy_reset_grad();
    };
    step();
    const double first = phase_done("first_step");
    const double total = ms_since(start);
    const Usage whole = Usage::now() - at_start;
    std::vector<double> later, later_cpu;
    long steady_faults = 0;  // the most of one steady step (0 once every buffer is in place)
    for (int i = 0; i < steady_steps; ++i) {
      t = Clock::now();
      const Usage before = Usage::now();
      step();
      later.push_back(ms_since(t));
      const Usage used = Usage::now() - before;
      later_cpu.push_back(used.cpu_ms);
      steady_faults = std::max(steady_faults, used.faults);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    std::printf("checkpoint %.3f module %.3f optimizer %.3f first_step %.3f startup %.3f steady_step %.3f",
                checkpoint, module_ms, optimizer_ms, first, total, median(later));
    for (const auto& [name, c] : costs) std::printf(" %s_cpu %.3f %s_faults %ld", name, c.cpu_ms, name, c.faults);
    std::printf(" startup_cpu %.3f startup_faults %ld steady_step_cpu %.3f steady_step_faults %ld before_main %.3f\n",
                whole.cpu_ms, whole.faults, median(later_cpu), steady_faults, before_main_ms);
  } catch (const onnxtrain::Error& e) {
    std::fprintf(stderr, "startup: %s\n", e.what());
    return 1;
  }
  return 0;
}

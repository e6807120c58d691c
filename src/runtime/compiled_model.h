// Pre-compiled models (`onnxtrain compile`; the format is in docs/DESIGN.md, "Formats"): a graph
// as the executor runs it (topologically sorted), the since-version of each node's resolved kernel
// and the executor's recorded plans (dtypes, shapes, views and arena offsets of every value) for
// the shape signatures it was compiled for, in one checksummed binary file next to the ONNX file.
// Loading one skips ONNX parsing and, for its signatures, the recording run and the arena planning.
//
//   CompiledModel m = load_model_for_runtime("out/training_model.onnx");
//   // m.model: from out/training_model.otc when it is present and valid, else from the .onnx file
//   // (with one note on stderr saying why the .otc file was ignored); m.plans: its plans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/executor.h"

namespace onnxtrain {

inline constexpr uint32_t kCompiledFormatVersion = 1;

struct CompiledModel {
  Model model;
  std::vector<int64_t> kernel_versions;  // per node (Executor::kernel_versions); empty: not checked
  std::vector<PlanRecord> plans;
  std::string compiled_from;             // the .otc file it came from; empty when from ONNX
};

// "dir/training_model.onnx" -> "dir/training_model.otc" (a path not ending in .onnx gets ".otc" added).
std::string compiled_path_for(const std::string& onnx_path);

// Writes `path` atomically. The CRC-32C and size of source_path's bytes go in, so that a changed
// ONNX file makes the compiled one stale.
void write_compiled_model(const std::string& path, const CompiledModel& compiled, const std::string& source_path);

// Reads and checks a compiled file: magic, format version, sizes, checksums, the library version
// that wrote it, and (when source_path exists) that the ONNX file is the one it was compiled from.
// Any mismatch or damage is Error(kInvalidModel) saying which; never a crash.
CompiledModel read_compiled_model(const std::string& path, const std::string& source_path);

// What Module and Optimizer load: compiled_path_for(onnx_path) when present and valid (also when
// the ONNX file itself is absent: a device may ship only the compiled files), else the ONNX file;
// a compiled file that is present but unusable is ignored with one note on stderr. A path ending
// in .otc names the compiled file itself (errors are then errors).
CompiledModel load_model_for_runtime(const std::string& onnx_path);

}  // namespace onnxtrain

// InferenceSession: load an ONNX model and run it on CPU.
//
//   onnxtrain::InferenceSession sess("model.onnx");
//   auto outputs = sess.run({{"input", x}});          // every output, in graph order
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "onnxtrain/tensor.h"
#include "onnxtrain/value.h"

namespace onnxtrain {

struct SessionOptions {
  int num_threads = 0;               // 0: OpenMP's default (all cores)
  bool optimize = true;              // constant folding, DCE, CSE, fusions
  bool check_shape_rules = false;    // verify static shape rules against kernels (tests)
  bool enable_profiling = false;     // time every kernel call: profile(), profile_report()
};

// Wall time spent in one node's kernel, summed over the runs since the session was made.
struct NodeProfile {
  std::string node_name;
  std::string op_type;
  int64_t calls = 0;
  double total_us = 0;
};

struct IoInfo {
  std::string name;
  DType dtype = DType::kUndefined;
  std::vector<int64_t> shape;        // -1 for unknown dims
  std::vector<std::string> dim_params;
  bool rank_known = false;
  bool sequence = false;             // sequence(tensor): fed and returned as a Value (run_values)
  bool optional = false;             // optional(T): may be fed or returned as an empty Value
};

struct MemoryReport;

class InferenceSession {
 public:
  explicit InferenceSession(const std::string& model_path, SessionOptions options = {});
  static InferenceSession from_bytes(const std::string& model_bytes, SessionOptions options = {});
  ~InferenceSession();
  InferenceSession(InferenceSession&&) noexcept;
  InferenceSession& operator=(InferenceSession&&) noexcept;

  // Runs the model; output_names selects outputs (all when empty), in the order given.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds,
                          const std::vector<std::string>& output_names = {});
  // The same for models whose inputs or outputs are sequences or optionals (run() refuses
  // non-tensor outputs).
  std::vector<Value> run_values(const std::map<std::string, Value>& feeds,
                                const std::vector<std::string>& output_names = {});
  const std::vector<IoInfo>& inputs() const;
  const std::vector<IoInfo>& outputs() const;
  // Planned arena vs naive bytes, in-place reuses and allocations of the last run.
  std::string memory_report() const;
  MemoryReport memory_stats() const;
  // Per-node kernel times in execution order; empty unless SessionOptions::enable_profiling.
  std::vector<NodeProfile> profile() const;
  // The same, summed by op type, slowest first, with each type's share of the total.
  std::string profile_report() const;

  struct Impl;

 private:
  InferenceSession() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace onnxtrain

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/parallel.h"
#include "onnx/model_io.h"
#include "onnxtrain/session.h"
#include "passes/passes.h"
#include "runtime/executor.h"

namespace onnxtrain {

struct InferenceSession::Impl {
  std::unique_ptr<Executor> executor;
  std::vector<IoInfo> inputs, outputs;
};

namespace {

IoInfo io_info(const NamedValue& v) {
  IoInfo info;
  info.name = v.name;
  info.dtype = v.info.dtype;
  info.rank_known = v.info.shape.has_value();
  if (v.info.shape) info.shape = *v.info.shape;
  info.dim_params = v.info.dim_params;
  info.sequence = v.info.kind == ValueKind::kSequence || v.info.kind == ValueKind::kOptionalSequence;
  info.optional = v.info.kind == ValueKind::kOptionalTensor || v.info.kind == ValueKind::kOptionalSequence;
  return info;
}

std::unique_ptr<InferenceSession::Impl> make_impl(Model model, const SessionOptions& options) {
  set_num_threads(options.num_threads);
  if (options.optimize) optimize_for_inference(model);
  auto impl = std::make_unique<InferenceSession::Impl>();
  for (const auto& in : model.graph.inputs) impl->inputs.push_back(io_info(in));
  for (const auto& out : model.graph.outputs) impl->outputs.push_back(io_info(out));
  ExecutorOptions exec_options;
  exec_options.check_shape_rules = options.check_shape_rules;
  exec_options.profile = options.enable_profiling;
  impl->executor = std::make_unique<Executor>(model, exec_options);
  return impl;
}

}  // namespace

InferenceSession::InferenceSession(const std::string& model_path, SessionOptions options)
    : impl_(make_impl(load_model(model_path), options)) {}

InferenceSession InferenceSession::from_bytes(const std::string& model_bytes, SessionOptions options) {
  InferenceSession s;
  s.impl_ = make_impl(load_model_from_bytes(model_bytes), options);
  return s;
}

InferenceSession::~InferenceSession() = default;
InferenceSession::InferenceSession(InferenceSession&&) noexcept = default;
InferenceSession& InferenceSession::operator=(InferenceSession&&) noexcept = default;

std::vector<Tensor> InferenceSession::run(const std::map<std::string, Tensor>& feeds,
                                          const std::vector<std::string>& output_names) {
  return impl_->executor->run(feeds, output_names);
}

std::vector<Value> InferenceSession::run_values(const std::map<std::string, Value>& feeds,
                                                const std::vector<std::string>& output_names) {
  return impl_->executor->run_values(feeds, output_names);
}

const std::vector<IoInfo>& InferenceSession::inputs() const { return impl_->inputs; }
const std::vector<IoInfo>& InferenceSession::outputs() const { return impl_->outputs; }

MemoryReport InferenceSession::memory_stats() const { return impl_->executor->memory_report(); }

std::string InferenceSession::memory_report() const {
  MemoryReport r = memory_stats();
  std::ostringstream os;
  os << "arena " << r.planned_arena_bytes << " bytes planned vs " << r.naive_bytes << " naive ("
     << (r.naive_bytes ? 100.0 * double(r.planned_arena_bytes) / double(r.naive_bytes) : 0.0) << "%), "
     << r.inplace_reuses << " in-place, " << r.views << " views, " << r.dynamic_allocations
     << " allocations in the last run, " << r.plans << " plan(s)";
  return os.str();
}

std::vector<NodeProfile> InferenceSession::profile() const { return impl_->executor->profile(); }

std::string InferenceSession::profile_report() const {
  std::vector<NodeProfile> nodes = profile();
  if (nodes.empty()) return "profiling is off (SessionOptions::enable_profiling)";
  std::map<std::string, NodeProfile> by_type;
  double total_us = 0;
  for (const auto& n : nodes) {
    NodeProfile& t = by_type[n.op_type];
    t.op_type = n.op_type;
    t.calls += n.calls;
    t.total_us += n.total_us;
    total_us += n.total_us;
  }
  std::vector<NodeProfile> rows;
  for (auto& [type, t] : by_type) rows.push_back(t);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.total_us > b.total_us; });
  int64_t runs = nodes.front().calls;
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  os << "op type                      calls  ms/run   share\n";
  for (const auto& t : rows)
    os << std::left << std::setw(28) << t.op_type << std::right << std::setw(6) << t.calls << std::setw(8)
       << (runs ? t.total_us / 1e3 / double(runs) : 0.0) << std::setw(7) << std::setprecision(1)
       << (total_us > 0 ? 100.0 * t.total_us / total_us : 0.0) << "%\n" << std::setprecision(3);
  os << "total " << (runs ? total_us / 1e3 / double(runs) : 0.0) << " ms/run over " << runs << " run(s)";
  return os.str();
}

}  // namespace onnxtrain

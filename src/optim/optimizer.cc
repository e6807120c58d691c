// The multi-tensor update kernels (see optimizer.h for the rules and their references).
//
// Work layout: every parameter is cut into chunks of at most kChunk elements; the chunk list of
// all parameters is the unit of parallel work, split between the threads by element count. Each
// rule is one generic lambda over vector lanes (simd.h), so the main loops are AVX-512 and the
// tails compute the same expression on scalars. Reductions (gradient norm, LAMB's per-tensor
// norms) are summed per chunk and then in chunk order: the result does not depend on the thread
// count.
#include "optim/optimizer.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/memory.h"
#include "core/parallel.h"
#include "optim/simd.h"

namespace onnxtrain::optim {

using simd::vmax;
using simd::vsqrt;

namespace {

constexpr int64_t kChunk = 16384;  // elements: 5 fp32 streams of a chunk stay in L2

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

struct ChunkList {
  std::vector<Chunk> chunks;
  std::vector<int64_t> start;  // element offset of each chunk in the concatenation, plus the total
  int64_t total() const { return start.back(); }
};

ChunkList make_chunks(const std::vector<Tensor>& tensors) {
  ChunkList list;
  int64_t offset = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    int64_t n = tensors[t].numel();
    for (int64_t b = 0; b < n; b += kChunk) {
      list.chunks.push_back({t, b, std::min(n, b + kChunk)});
      list.start.push_back(offset + b);
    }
    offset += n;
  }
  list.start.push_back(offset);
  return list;
}

// Calls fn(chunk_index) for every chunk; threads get contiguous chunk ranges of about equal
// element counts. fn must not throw.
template <typename F>
void for_chunks(const ChunkList& list, F&& fn) {
  size_t nc = list.chunks.size();
  if (nc == 0) return;
  int64_t total = list.total();
  int64_t threads = std::min<int64_t>({int64_t(omp_get_max_threads()), total / kElementwiseGrain, int64_t(nc)});
  if (threads <= 1 || omp_in_parallel()) {
    for (size_t c = 0; c < nc; ++c) fn(c);
    return;
  }
#pragma omp parallel num_threads(int(threads))
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    int64_t lo = total * t / nt, hi = total * (t + 1) / nt;
    auto first = std::lower_bound(list.start.begin(), list.start.end() - 1, lo);
    auto last = std::lower_bound(list.start.begin(), list.start.end() - 1, hi);
    for (auto c = size_t(first - list.start.begin()); c < size_t(last - list.start.begin()); ++c) fn(c);
  }
}

template <typename T>
std::vector<T*> pointers(std::vector<Tensor>& ts) {
  std::vector<T*> out;
  out.reserve(ts.size());
  for (auto& t : ts) out.push_back(static_cast<T*>(t.data()));
  return out;
}
template <typename T>
std::vector<const T*> const_pointers(const std::vector<Tensor>& ts) {
  std::vector<const T*> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(static_cast<const T*>(t.data()));
  return out;
}

template <typename T>
double global_l2_norm_typed(const std::vector<Tensor>& tensors, const ChunkList& list) {
  auto ptr = const_pointers<T>(tensors);
  std::vector<double> partial(list.chunks.size(), 0.0);
  for_chunks(list, [&](size_t c) {
    const Chunk& ch = list.chunks[c];
    partial[c] = simd::sum_squares(ptr[ch.tensor], ch.begin, ch.end);
  });
  double sum = 0;
  for (double s : partial) sum += s;
  return std::sqrt(sum);
}

// ---- the rules ---------------------------------------------------------------------------------

enum class AdamMode { kAdamW, kAdamL2, kHF };

// Scalars of one step, computed in double as the references do, then cast to T.
struct Scalars {
  double gscale = 1;  // clip coefficient, negated for maximize
  double lr = 0;
};

template <typename T, AdamMode kMode, bool kAmsgrad, bool kL2>
void adam_pass(const OptimizerConfig& cfg, int64_t step, const Scalars& s, const ChunkList& list,
               std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               std::vector<std::vector<Tensor>>& state) {
  auto P = pointers<T>(params);
  auto G = const_pointers<T>(grads);
  auto M = pointers<T>(state[0]);
  auto V = pointers<T>(state[1]);
  std::vector<T*> VM;
  if constexpr (kAmsgrad) VM = pointers<T>(state[2]);
  const double b1 = cfg.betas[0], b2 = cfg.betas[1];
  const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
  const T gs = T(s.gscale), tb1 = T(b1), tb2 = T(b2), omb1 = T(1 - b1), omb2 = T(1 - b2), eps = T(cfg.eps);
  const T wd = T(cfg.weight_decay);
  // torch: p *= 1 - lr*wd;  step_size = lr / bc1;  denom = sqrt(v) / sqrt(bc2) + eps
  // transformers: denom = sqrt(v) + eps;  step_size = lr * sqrt(bc2) / bc1;  p += (-lr*wd) * p
  const T decay = T(1 - s.lr * cfg.weight_decay);
  const T bc2_sqrt = T(std::sqrt(bc2));
  T step_size = T(s.lr / bc1);
  if constexpr (kMode == AdamMode::kHF) step_size = cfg.correct_bias ? T(s.lr * std::sqrt(bc2) / bc1) : T(s.lr);
  const T hf_decay = T(-s.lr * cfg.weight_decay);
  const bool hf_do_decay = cfg.weight_decay > 0;

  auto moments = [&](auto& p, const auto& g0, auto& m, auto& v) {
    auto g = g0 * gs;
    if constexpr (kL2) g = g + wd * p;
    if constexpr (kMode == AdamMode::kAdamW) p = p * decay;
    m = tb1 * m + omb1 * g;
    v = tb2 * v + omb2 * (g * g);
  };
  for_chunks(list, [&](size_t c) {
    const Chunk& ch = list.chunks[c];
    const size_t t = ch.tensor;
    if constexpr (kMode == AdamMode::kHF) {
      simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& g, auto& m, auto& v) {
        moments(p, g, m, v);
        p = p - step_size * (m / (vsqrt(v) + eps));
        if (hf_do_decay) p = p + hf_decay * p;
      }, P[t], G[t], M[t], V[t]);
    } else if constexpr (kAmsgrad) {
      simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& g, auto& m, auto& v, auto& vmx) {
        moments(p, g, m, v);
        vmx = vmax(vmx, v);
        p = p - step_size * (m / (vsqrt(vmx) / bc2_sqrt + eps));
      }, P[t], G[t], M[t], V[t], VM[t]);
    } else {
      simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& g, auto& m, auto& v) {
        moments(p, g, m, v);
        p = p - step_size * (m / (vsqrt(v) / bc2_sqrt + eps));
      }, P[t], G[t], M[t], V[t]);
    }
  });
}

template <typename T, bool kL2>
void sgd_pass(const OptimizerConfig& cfg, int64_t step, const Scalars& s, const ChunkList& list,
              std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              std::vector<std::vector<Tensor>>& state) {
  auto P = pointers<T>(params);
  auto G = const_pointers<T>(grads);
  const T gs = T(s.gscale), lr = T(s.lr), wd = T(cfg.weight_decay), mom = T(cfg.momentum),
          omd = T(1 - cfg.dampening);
  const bool nesterov = cfg.nesterov;
  if (cfg.momentum == 0) {
    for_chunks(list, [&](size_t c) {
      const Chunk& ch = list.chunks[c];
      simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& g0) {
        auto d = g0 * gs;
        if constexpr (kL2) d = d + wd * p;
        p = p - lr * d;
      }, P[ch.tensor], G[ch.tensor]);
    });
    return;
  }
  auto B = pointers<T>(state[0]);
  const bool first = step == 1;  // torch: the buffer starts as a copy of the first gradient
  for_chunks(list, [&](size_t c) {
    const Chunk& ch = list.chunks[c];
    simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& g0, auto& buf) {
      auto d = g0 * gs;
      if constexpr (kL2) d = d + wd * p;
      if (first) buf = d;
      else buf = mom * buf + omd * d;
      if (nesterov) d = d + mom * buf;
      else d = buf;
      p = p - lr * d;
    }, P[ch.tensor], G[ch.tensor], B[ch.tensor]);
  });
}

template <typename T, bool kL2>
void adagrad_pass(const OptimizerConfig& cfg, int64_t step, const Scalars& s, const ChunkList& list,
                  std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  std::vector<std::vector<Tensor>>& state) {
  auto P = pointers<T>(params);
  auto G = const_pointers<T>(grads);
  auto S = pointers<T>(state[0]);
  const T gs = T(s.gscale), wd = T(cfg.weight_decay), eps = T(cfg.eps);
  const T clr = T(s.lr / (1 + double(step - 1) * cfg.lr_decay));
  for_chunks(list, [&](size_t c) {
    const Chunk& ch = list.chunks[c];
    simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& g0, auto& sum) {
      auto g = g0 * gs;
      if constexpr (kL2) g = g + wd * p;
      sum = sum + g * g;
      p = p - clr * (g / (vsqrt(sum) + eps));
    }, P[ch.tensor], G[ch.tensor], S[ch.tensor]);
  });
}

// LAMB (apex FusedLAMB): stage 1 updates the moments and measures |p| and |update| per tensor;
// stage 2 recomputes the update from (p, m, v) - no scratch buffer - and applies it with the
// tensor's trust ratio.
template <typename T>
void lamb_pass(const OptimizerConfig& cfg, int64_t step, const Scalars& s, const ChunkList& list,
               std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               std::vector<std::vector<Tensor>>& state) {
  auto P = pointers<T>(params);
  auto G = const_pointers<T>(grads);
  auto M = pointers<T>(state[0]);
  auto V = pointers<T>(state[1]);
  const double b1 = cfg.betas[0], b2 = cfg.betas[1];
  const double bc1 = cfg.correct_bias ? 1 - std::pow(b1, double(step)) : 1.0;
  const double bc2 = cfg.correct_bias ? 1 - std::pow(b2, double(step)) : 1.0;
  const T gs = T(s.gscale), tb1 = T(b1), tb2 = T(b2), b3 = T(cfg.grad_averaging ? 1 - b1 : 1.0),
          omb2 = T(1 - b2), eps = T(cfg.eps), wd = T(cfg.weight_decay), tbc1 = T(bc1), tbc2 = T(bc2);
  const bool decoupled = cfg.adam_w_mode;
  auto update = [&](const auto& p, const auto& m, const auto& v) {
    auto u = (m / tbc1) / (vsqrt(v / tbc2) + eps);
    if (decoupled) u = u + wd * p;
    return u;
  };
  const size_t nc = list.chunks.size();
  std::vector<double> p_sq(nc, 0.0), u_sq(nc, 0.0);
  constexpr int64_t kBlock = 1024;  // vector partial sums are flushed into double per block
  for_chunks(list, [&](size_t c) {
    const Chunk& ch = list.chunks[c];
    const size_t t = ch.tensor;
    p_sq[c] = simd::sum_squares(P[t], ch.begin, ch.end);
    double acc = 0;
    for (int64_t b = ch.begin; b < ch.end; b += kBlock) {
      simd::Vec<T> vacc(T(0));
      T sacc = 0;
      simd::for_lanes<T>(b, std::min(ch.end, b + kBlock), [&](const auto& p, const auto& g0, auto& m, auto& v) {
        auto g = g0 * gs;
        if (!decoupled) g = g + wd * p;
        m = tb1 * m + b3 * g;
        v = tb2 * v + omb2 * (g * g);
        auto u = update(p, m, v);
        if constexpr (std::is_floating_point_v<std::remove_cvref_t<decltype(u)>>) sacc += u * u;
        else vacc += u * u;
      }, static_cast<const T*>(P[t]), G[t], M[t], V[t]);
      acc += double(simd::stdx::reduce(vacc)) + double(sacc);
    }
    u_sq[c] = acc;
  });
  // Per-tensor trust ratios, summing chunk partials in order.
  std::vector<double> p_norm(params.size(), 0.0), u_norm(params.size(), 0.0);
  for (size_t c = 0; c < nc; ++c) {
    p_norm[list.chunks[c].tensor] += p_sq[c];
    u_norm[list.chunks[c].tensor] += u_sq[c];
  }
  std::vector<T> ratio(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    double pn = std::sqrt(p_norm[t]), un = std::sqrt(u_norm[t]);
    double r = s.lr;
    if ((cfg.use_nvlamb || cfg.weight_decay != 0) && pn != 0 && un != 0) r = s.lr * (pn / un);
    ratio[t] = T(r);
  }
  for_chunks(list, [&](size_t c) {
    const Chunk& ch = list.chunks[c];
    const size_t t = ch.tensor;
    const T r = ratio[t];
    simd::for_lanes<T>(ch.begin, ch.end, [&](auto& p, const auto& m, const auto& v) {
      p = p - r * update(p, m, v);
    }, P[t], static_cast<const T*>(M[t]), static_cast<const T*>(V[t]));
  });
}

template <typename T>
void run_rule(const OptimizerConfig& cfg, int64_t step, const Scalars& s, const ChunkList& list,
              std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              std::vector<std::vector<Tensor>>& state) {
  const bool l2 = cfg.weight_decay != 0;
  switch (cfg.type) {
    case OptimizerType::kAdamW:
      if (cfg.amsgrad) adam_pass<T, AdamMode::kAdamW, true, false>(cfg, step, s, list, params, grads, state);
      else adam_pass<T, AdamMode::kAdamW, false, false>(cfg, step, s, list, params, grads, state);
      break;
    case OptimizerType::kAdam:
      if (cfg.amsgrad) {
        if (l2) adam_pass<T, AdamMode::kAdamL2, true, true>(cfg, step, s, list, params, grads, state);
        else adam_pass<T, AdamMode::kAdamL2, true, false>(cfg, step, s, list, params, grads, state);
      } else {
        if (l2) adam_pass<T, AdamMode::kAdamL2, false, true>(cfg, step, s, list, params, grads, state);
        else adam_pass<T, AdamMode::kAdamL2, false, false>(cfg, step, s, list, params, grads, state);
      }
      break;
    case OptimizerType::kHFAdamW:
      adam_pass<T, AdamMode::kHF, false, false>(cfg, step, s, list, params, grads, state);
      break;
    case OptimizerType::kSGD:
      if (l2) sgd_pass<T, true>(cfg, step, s, list, params, grads, state);
      else sgd_pass<T, false>(cfg, step, s, list, params, grads, state);
      break;
    case OptimizerType::kAdagrad:
      if (l2) adagrad_pass<T, true>(cfg, step, s, list, params, grads, state);
      else adagrad_pass<T, false>(cfg, step, s, list, params, grads, state);
      break;
    case OptimizerType::kLamb: lamb_pass<T>(cfg, step, s, list, params, grads, state); break;
  }
}

std::string where(const OptimizerConfig& cfg) {
  return std::string("optimizer ") + optimizer_type_name(cfg.type) + ": ";
}

void check_same(const OptimizerConfig& cfg, const Tensor& t, const Tensor& p, const std::string& what, size_t i) {
  OT_CHECK(t.defined(), where(cfg), what, " ", i, " is missing");
  OT_CHECK(t.dtype() == p.dtype() && t.shape() == p.shape(), where(cfg), what, " ", i, " has dtype ",
           dtype_name(t.dtype()), " and shape ", shape_str(t.shape()), ", expected ", dtype_name(p.dtype()), " ",
           shape_str(p.shape()), " like parameter ", i);
}

}  // namespace

double global_l2_norm(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return 0.0;
  DType dt = tensors[0].dtype();
  for (size_t i = 0; i < tensors.size(); ++i)
    OT_CHECK(tensors[i].dtype() == dt, "global_l2_norm: tensor ", i, " has dtype ", dtype_name(tensors[i].dtype()),
             ", expected ", dtype_name(dt), " like tensor 0");
  ChunkList list = make_chunks(tensors);
  if (dt == DType::kFloat32) return global_l2_norm_typed<float>(tensors, list);
  if (dt == DType::kFloat64) return global_l2_norm_typed<double>(tensors, list);
  OT_THROW(kNotImplemented, "global_l2_norm: dtype ", dtype_name(dt), " is not supported (float32, float64)");
}

StepStats apply_update(const OptimizerConfig& cfg, int64_t step, std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, std::vector<std::vector<Tensor>>& state) {
  cfg.validate();
  OT_CHECK(step >= 1, where(cfg), "step must count updates from 1, got ", step);
  OT_CHECK(grads.size() == params.size(), where(cfg), params.size(), " parameters but ", grads.size(), " gradients");
  auto names = cfg.state_names();
  OT_CHECK(state.size() == names.size(), where(cfg), "expected ", names.size(), " state lists, got ", state.size());
  StepStats stats;
  if (params.empty()) return stats;
  const DType dt = params[0].dtype();
  OT_CHECK(dt == DType::kFloat32 || dt == DType::kFloat64, where(cfg), "parameters must be float32 or float64, "
           "parameter 0 is ", dtype_name(dt));
  for (size_t i = 0; i < params.size(); ++i) {
    OT_CHECK(params[i].defined() && params[i].dtype() == dt, where(cfg), "parameter ", i, " has dtype ",
             dtype_name(params[i].dtype()), ", expected ", dtype_name(dt), " like parameter 0");
    check_same(cfg, grads[i], params[i], "gradient", i);
  }
  for (size_t k = 0; k < names.size(); ++k) {
    OT_CHECK(state[k].size() == params.size(), where(cfg), "state '", names[k], "' has ", state[k].size(),
             " tensors for ", params.size(), " parameters");
    for (size_t i = 0; i < params.size(); ++i) check_same(cfg, state[k][i], params[i], "state '" + names[k] + "' of parameter", i);
  }
  // In place: a parameter or state tensor sharing bytes with another would be updated twice.
  {
    std::set<const void*> seen;
    auto add = [&](const Tensor& t, const std::string& what, size_t i) {
      if (t.numel() == 0) return;
      OT_CHECK(seen.insert(t.data()).second, where(cfg), what, " ", i, " shares its memory with another updated tensor");
    };
    for (size_t i = 0; i < params.size(); ++i) add(params[i], "parameter", i);
    for (size_t k = 0; k < names.size(); ++k)
      for (size_t i = 0; i < params.size(); ++i) add(state[k][i], "state '" + names[k] + "' of parameter", i);
  }

  ChunkList list = make_chunks(params);
  Scalars s;
  s.lr = cfg.lr;
  if (cfg.max_grad_norm > 0) {
    stats.grad_norm = dt == DType::kFloat32 ? global_l2_norm_typed<float>(grads, list)
                                            : global_l2_norm_typed<double>(grads, list);
    double coef = cfg.max_grad_norm / (stats.grad_norm + 1e-6);
    if (!(coef >= 1.0)) stats.clip_coef = coef;  // NaN norms propagate, as in torch
  }
  s.gscale = cfg.maximize ? -stats.clip_coef : stats.clip_coef;
  if (dt == DType::kFloat32) run_rule<float>(cfg, step, s, list, params, grads, state);
  else run_rule<double>(cfg, step, s, list, params, grads, state);
  return stats;
}

MultiTensorOptimizer::MultiTensorOptimizer(OptimizerConfig config) : config_(std::move(config)) { config_.validate(); }

void MultiTensorOptimizer::set_lr(double lr) {
  OT_CHECK(std::isfinite(lr) && lr >= 0, where(config_), "invalid learning rate ", lr);
  config_.lr = lr;
}

void MultiTensorOptimizer::init_state(const std::vector<Tensor>& params, OptimizerState& state) const {
  OT_CHECK(state.step >= 0, where(config_), "negative step count ", state.step);
  for (const std::string& name : config_.state_names()) {
    auto& list = state.tensors[name];
    if (list.empty()) {
      // One zeroed allocation per state: fresh pages the kernel zero-fills when the first update
      // touches them, rather than a memset of every tensor here.
      std::vector<TensorSpec> specs;
      for (const auto& p : params) specs.push_back({p.dtype(), p.shape()});
      list = allocate_tensors(specs, Fill::kZeros);
      if (name == "sum" && config_.initial_accumulator_value != 0)
        for (Tensor& t : list) {
          double v = config_.initial_accumulator_value;
          if (t.dtype() == DType::kFloat32) std::fill_n(t.data<float>(), t.numel(), float(v));
          else if (t.dtype() == DType::kFloat64) std::fill_n(t.data<double>(), t.numel(), v);
        }
      continue;
    }
    OT_CHECK(list.size() == params.size(), where(config_), "state '", name, "' has ", list.size(), " tensors for ",
             params.size(), " parameters");
    for (size_t i = 0; i < params.size(); ++i) check_same(config_, list[i], params[i], "state '" + name + "' of parameter", i);
  }
}

StepStats MultiTensorOptimizer::step(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                     OptimizerState& state) const {
  init_state(params, state);
  std::vector<std::vector<Tensor>> lists;
  for (const std::string& name : config_.state_names()) lists.push_back(state.tensors.at(name));
  StepStats stats = apply_update(config_, state.step + 1, params, grads, lists);
  state.step += 1;
  return stats;
}

}  // namespace onnxtrain::optim

// Python bindings of the optimizer update kernels and LR schedulers (src/optim/), as the
// submodule onnxtrain._C.optim. Parameters and state cross as numpy arrays and are updated in
// place, with no copies: they must be writable, C-contiguous float32/float64 arrays (numpy views
// of torch CPU tensors, t.detach().numpy(), qualify). Gradients are only read; a non-contiguous
// gradient is copied once.
#include <pybind11/stl.h>

#include <algorithm>
#include <functional>

#include "bindings.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace py = pybind11;
using namespace onnxtrain;
using namespace onnxtrain::optim;
using onnxtrain::python::tensor_from_numpy;
using onnxtrain::python::tensor_to_numpy;
using onnxtrain::python::stats_dict;

namespace {

// A tensor sharing the array's memory, for arrays the update writes.
Tensor writable_tensor(py::handle obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj))
    OT_THROW(kInvalidArgument, what, ": expected a numpy array (updated in place), got ",
             std::string(py::str(obj.get_type())));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  OT_CHECK(arr.writeable(), what, ": the array is read-only; the update writes it in place");
  OT_CHECK(arr.flags() & py::array::c_style, what, ": the array is not C-contiguous; an in-place update needs "
           "contiguous memory (pass the tensor itself, not a strided view)");
  OT_CHECK(arr.dtype().kind() == 'f' && (arr.itemsize() == 4 || arr.itemsize() == 8), what,
           ": expected float32 or float64, got ", std::string(py::str(static_cast<const py::handle&>(arr.dtype()))));
  return tensor_from_numpy(arr, what);  // zero-copy: the array is already C-contiguous
}

std::vector<Tensor> writable_list(const py::sequence& seq, const std::string& what) {
  std::vector<Tensor> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) out.push_back(writable_tensor(seq[i], what + " " + std::to_string(i)));
  return out;
}

std::vector<Tensor> readonly_list(const py::sequence& seq, const std::string& what) {
  std::vector<Tensor> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) out.push_back(tensor_from_numpy(seq[i], what + " " + std::to_string(i)));
  return out;
}

// Keyword setters of OptimizerConfig, shared by the constructor and update().
using Setter = std::function<void(OptimizerConfig&, py::handle)>;
const std::map<std::string, Setter>& config_setters() {
  static const std::map<std::string, Setter> setters = [] {
    std::map<std::string, Setter> s;
    auto d = [&](const char* k, double OptimizerConfig::*f) {
      s[k] = [f](OptimizerConfig& c, py::handle v) { c.*f = v.cast<double>(); };
    };
    auto b = [&](const char* k, bool OptimizerConfig::*f) {
      s[k] = [f](OptimizerConfig& c, py::handle v) { c.*f = v.cast<bool>(); };
    };
    d("lr", &OptimizerConfig::lr);
    d("eps", &OptimizerConfig::eps);
    d("weight_decay", &OptimizerConfig::weight_decay);
    d("momentum", &OptimizerConfig::momentum);
    d("dampening", &OptimizerConfig::dampening);
    d("lr_decay", &OptimizerConfig::lr_decay);
    d("initial_accumulator_value", &OptimizerConfig::initial_accumulator_value);
    d("max_grad_norm", &OptimizerConfig::max_grad_norm);
    b("amsgrad", &OptimizerConfig::amsgrad);
    b("maximize", &OptimizerConfig::maximize);
    b("correct_bias", &OptimizerConfig::correct_bias);
    b("bias_correction", &OptimizerConfig::correct_bias);
    b("nesterov", &OptimizerConfig::nesterov);
    b("adam_w_mode", &OptimizerConfig::adam_w_mode);
    b("grad_averaging", &OptimizerConfig::grad_averaging);
    b("use_nvlamb", &OptimizerConfig::use_nvlamb);
    s["betas"] = [](OptimizerConfig& c, py::handle v) {
      auto t = v.cast<std::vector<double>>();
      OT_CHECK(t.size() == 2, "OptimizerConfig: betas must be a pair, got ", t.size(), " values");
      c.betas = {t[0], t[1]};
    };
    return s;
  }();
  return setters;
}

void apply_kwargs(OptimizerConfig& c, const py::kwargs& kw) {
  const auto& setters = config_setters();
  for (auto [k, v] : kw) {
    std::string key = py::str(k);
    auto it = setters.find(key);
    if (it == setters.end()) {
      std::string known;
      for (const auto& [name, fn] : setters) known += (known.empty() ? "" : ", ") + name;
      OT_THROW(kInvalidArgument, "OptimizerConfig: unknown option '", key, "' (known: ", known, ")");
    }
    it->second(c, v);
  }
}

OptimizerType type_from(py::handle h) {
  if (py::isinstance<OptimizerType>(h)) return h.cast<OptimizerType>();
  return parse_optimizer_type(py::str(h));
}

// State lists in config.state_names() order from {name: [arrays]}.
std::vector<std::vector<Tensor>> state_lists(const OptimizerConfig& cfg, const py::dict& state, size_t n) {
  auto names = cfg.state_names();
  std::vector<std::vector<Tensor>> lists;
  for (const auto& name : names) {
    OT_CHECK(state.contains(name), "optimizer ", optimizer_type_name(cfg.type), ": state '", name,
             "' is missing (expected ", names.size(), " lists)");
    lists.push_back(writable_list(state[py::str(name)].cast<py::sequence>(), "state '" + name + "'"));
    OT_CHECK(lists.back().size() == n, "optimizer ", optimizer_type_name(cfg.type), ": state '", name, "' has ",
             lists.back().size(), " arrays for ", n, " parameters");
  }
  for (auto [k, v] : state) {
    std::string key = py::str(k);
    OT_CHECK(std::find(names.begin(), names.end(), key) != names.end(), "optimizer ",
             optimizer_type_name(cfg.type), ": unexpected state '", key, "'");
  }
  return lists;
}

}  // namespace


void bind_optim(pybind11::module_& root) {
  py::module_ m = root.def_submodule("optim", "multi-tensor optimizer updates and LR schedules (src/optim)");

  py::enum_<OptimizerType>(m, "OptimizerType")
      .value("AdamW", OptimizerType::kAdamW)
      .value("Adam", OptimizerType::kAdam)
      .value("HFAdamW", OptimizerType::kHFAdamW)
      .value("SGD", OptimizerType::kSGD)
      .value("Lamb", OptimizerType::kLamb)
      .value("Adagrad", OptimizerType::kAdagrad);

  py::class_<OptimizerConfig>(m, "OptimizerConfig",
                              "An update rule and its hyperparameters. OptimizerConfig('adamw', lr=1e-3, ...) starts "
                              "from the reference defaults of the rule ('adamw', 'adam', 'hf_adamw', 'sgd', 'lamb', "
                              "'adagrad').")
      .def(py::init([](py::object type, py::kwargs kw) {
             OptimizerConfig c = OptimizerConfig::defaults(type_from(type));
             apply_kwargs(c, kw);
             c.validate();
             return c;
           }),
           py::arg("type") = "adamw")
      .def_property("type", [](const OptimizerConfig& c) { return std::string(optimizer_type_name(c.type)); },
                    [](OptimizerConfig& c, py::object t) { c.type = type_from(t); })
      .def_readwrite("lr", &OptimizerConfig::lr)
      .def_property("betas", [](const OptimizerConfig& c) { return py::make_tuple(c.betas[0], c.betas[1]); },
                    [](OptimizerConfig& c, py::handle v) { config_setters().at("betas")(c, v); })
      .def_readwrite("eps", &OptimizerConfig::eps)
      .def_readwrite("weight_decay", &OptimizerConfig::weight_decay)
      .def_readwrite("amsgrad", &OptimizerConfig::amsgrad)
      .def_readwrite("maximize", &OptimizerConfig::maximize)
      .def_readwrite("correct_bias", &OptimizerConfig::correct_bias)
      .def_readwrite("momentum", &OptimizerConfig::momentum)
      .def_readwrite("dampening", &OptimizerConfig::dampening)
      .def_readwrite("nesterov", &OptimizerConfig::nesterov)
      .def_readwrite("adam_w_mode", &OptimizerConfig::adam_w_mode)
      .def_readwrite("grad_averaging", &OptimizerConfig::grad_averaging)
      .def_readwrite("use_nvlamb", &OptimizerConfig::use_nvlamb)
      .def_readwrite("lr_decay", &OptimizerConfig::lr_decay)
      .def_readwrite("initial_accumulator_value", &OptimizerConfig::initial_accumulator_value)
      .def_readwrite("max_grad_norm", &OptimizerConfig::max_grad_norm)
      .def("update", [](OptimizerConfig& c, py::kwargs kw) { apply_kwargs(c, kw); c.validate(); })
      .def("validate", &OptimizerConfig::validate)
      .def("state_names", &OptimizerConfig::state_names)
      .def("__repr__", [](const OptimizerConfig& c) {
        return "OptimizerConfig('" + std::string(optimizer_type_name(c.type)) + "', lr=" + std::to_string(c.lr) + ")";
      });

  py::class_<OptimizerState>(m, "OptimizerState",
                             "Completed step count and per-parameter state tensors by name; .tensors gives numpy "
                             "views of the state (no copies).")
      .def(py::init<>())
      .def_readwrite("step", &OptimizerState::step)
      .def_property(
          "tensors",
          [](const OptimizerState& s) {
            py::dict d;
            for (const auto& [name, list] : s.tensors) {
              py::list l;
              for (const auto& t : list) l.append(tensor_to_numpy(t));
              d[py::str(name)] = l;
            }
            return d;
          },
          [](OptimizerState& s, const py::dict& d) {
            std::map<std::string, std::vector<Tensor>> tensors;
            for (auto [k, v] : d) {
              std::string name = py::str(k);
              tensors[name] = writable_list(v.cast<py::sequence>(), "state '" + name + "'");
            }
            s.tensors = std::move(tensors);
          });

  py::class_<MultiTensorOptimizer>(m, "MultiTensorOptimizer",
                                   "Runs one fused multi-tensor update over all parameters, in place.")
      .def(py::init<OptimizerConfig>(), py::arg("config"))
      .def_property_readonly("config", &MultiTensorOptimizer::config)
      .def_property("lr", &MultiTensorOptimizer::lr, &MultiTensorOptimizer::set_lr)
      .def("init_state",
           [](const MultiTensorOptimizer& o, const py::sequence& params, OptimizerState& state) {
             auto p = writable_list(params, "parameter");
             o.init_state(p, state);
           })
      .def(
          "step",
          [](const MultiTensorOptimizer& o, const py::sequence& params, const py::sequence& grads,
             OptimizerState& state) {
            auto p = writable_list(params, "parameter");
            auto g = readonly_list(grads, "gradient");
            StepStats stats;
            {
              py::gil_scoped_release release;
              stats = o.step(p, g, state);
            }
            return stats_dict(stats);
          },
          py::arg("params"), py::arg("grads"), py::arg("state"),
          "state.step += 1, then one update of every parameter in place; returns {grad_norm, clip_coef}.");

  m.def(
      "multi_tensor_step",
      [](const OptimizerConfig& cfg, int64_t step, const py::sequence& params, const py::sequence& grads,
         const py::dict& state) {
        auto p = writable_list(params, "parameter");
        auto g = readonly_list(grads, "gradient");
        auto s = state_lists(cfg, state, p.size());
        StepStats stats;
        {
          py::gil_scoped_release release;
          stats = apply_update(cfg, step, p, g, s);
        }
        return stats_dict(stats);
      },
      py::arg("config"), py::arg("step"), py::arg("params"), py::arg("grads"), py::arg("state"),
      "One fused update in place over numpy arrays. step counts this update from 1; state maps each name of "
      "config.state_names() to one array per parameter. Returns {grad_norm, clip_coef}.");

  m.def(
      "global_l2_norm", [](const py::sequence& ts) { return global_l2_norm(readonly_list(ts, "tensor")); },
      py::arg("tensors"));

  // Schedules.
  m.def("linear_lr", &linear_lr, py::arg("step"), py::arg("warmup_step_count"), py::arg("total_step_count"),
        py::arg("initial_lr"));
  m.def("cosine_lr", &cosine_lr, py::arg("step"), py::arg("warmup_step_count"), py::arg("total_step_count"),
        py::arg("initial_lr"), py::arg("num_cycles") = 0.5);
  m.def("step_lr", &step_lr, py::arg("step"), py::arg("step_size"), py::arg("gamma"), py::arg("initial_lr"));
  m.def("constant_lr", &constant_lr, py::arg("step"), py::arg("warmup_step_count"), py::arg("initial_lr"));

  // A schedule's values; the schedulers that drive an Optimizer are onnxtrain._C.*LRScheduler.
  py::class_<LRSchedule>(m, "LRSchedule")
      .def_static("linear", &LRSchedule::linear, py::arg("warmup_step_count"), py::arg("total_step_count"),
                  py::arg("initial_lr"))
      .def_static("cosine", &LRSchedule::cosine, py::arg("warmup_step_count"), py::arg("total_step_count"),
                  py::arg("initial_lr"), py::arg("num_cycles") = 0.5)
      .def_static("stepped", &LRSchedule::stepped, py::arg("step_size"), py::arg("gamma"), py::arg("initial_lr"))
      .def_static("constant", &LRSchedule::constant, py::arg("warmup_step_count"), py::arg("initial_lr"))
      .def("value", &LRSchedule::value, py::arg("step"), "the learning rate after `step` optimizer steps");
}

// Python bindings of artifact generation, Module and Optimizer (src/training/).
#include <pybind11/stl.h>

#include "bindings.h"
#include "onnx/model_io.h"
#include "training/generate_artifacts.h"
#include "training/module.h"

namespace py = pybind11;
using namespace onnxtrain;
using namespace onnxtrain::python;

namespace {

std::vector<Tensor> tensors_from(const py::sequence& inputs) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) out.push_back(tensor_from_numpy(inputs[i], "input " + std::to_string(i)));
  return out;
}

py::list to_numpy_list(const std::vector<Tensor>& tensors) {
  py::list out;
  for (const auto& t : tensors) out.append(tensor_to_numpy(t));
  return out;
}

}  // namespace

void bind_training(py::module_& m) {
  m.def(
      "generate_artifacts",
      [](py::object model, std::vector<std::string> requires_grad, std::vector<std::string> frozen_params,
         std::optional<std::string> loss, std::optional<py::bytes> custom_loss, const optim::OptimizerConfig& optimizer,
         std::string directory, std::string prefix, std::vector<std::string> additional_output_names,
         bool nominal_checkpoint, std::vector<std::string> loss_input_names, py::dict loss_options,
         std::string mixed_precision, std::optional<py::dict> lora, int memory_opt_level,
         std::string memory_opt_config, bool compute_optimizer, bool label_sparsity, bool ort_compatible) {
        ArtifactOptions o;
        o.graphs.mixed_precision = std::move(mixed_precision);
        if (lora) {  // artifacts.LoraConfig as a dict
          LoraConfig c;
          c.rank = (*lora)["rank"].cast<int64_t>();
          c.alpha = (*lora)["alpha"].cast<double>();
          c.target = (*lora)["target"].cast<std::vector<std::string>>();
          c.dropout = (*lora)["dropout"].cast<double>();
          c.seed = (*lora)["seed"].cast<uint64_t>();
          o.lora = c;
        }
        o.graphs.requires_grad = std::move(requires_grad);
        o.graphs.frozen_params = std::move(frozen_params);
        if (loss) o.graphs.loss = loss_type_from_name(*loss);
        if (custom_loss)
          o.graphs.custom_loss =
              std::make_shared<const Model>(load_model_from_bytes(std::string(*custom_loss), "", "<custom loss>"));
        for (auto [k, v] : loss_options) {
          std::string key = py::str(k);
          LossOptions& lo = o.graphs.loss_options;
          if (key == "reduction") lo.reduction = v.cast<std::string>();
          else if (key == "ignore_index") lo.ignore_index = v.cast<int64_t>();
          else if (key == "label_smoothing") lo.label_smoothing = v.cast<double>();
          else if (key == "beta" || key == "delta") lo.beta = v.cast<double>();
          else if (key == "log_target") lo.log_target = v.cast<bool>();
          else OT_THROW(kInvalidArgument, "generate_artifacts: unknown loss option '", key, "'");
        }
        o.graphs.additional_output_names = std::move(additional_output_names);
        o.graphs.loss_input_names = std::move(loss_input_names);
        o.optimizer = optimizer;
        o.directory = std::move(directory);
        o.prefix = std::move(prefix);
        o.nominal_checkpoint = nominal_checkpoint;
        o.memory.level = memory_opt_level;
        o.memory.config = std::move(memory_opt_config);
        o.graphs.compute_optimizer = compute_optimizer;
        o.graphs.label_sparsity = label_sparsity;
        o.graphs.ort_compatible = ort_compatible;
        // A path keeps external data (models over 2 GB) resolvable next to the file.
        std::optional<std::string> bytes, path;
        if (py::isinstance<py::bytes>(model)) bytes = model.cast<std::string>();
        else path = py::str(model);
        py::gil_scoped_release release;
        Model mdl = bytes ? load_model_from_bytes(*bytes, "", "<model>") : load_model(*path);
        bytes.reset();
        ArtifactPaths p = generate_artifacts(mdl, o);
        return std::vector<std::string>{p.training_model, p.eval_model, p.optimizer_model, p.checkpoint};
      },
      py::arg("model"), py::arg("requires_grad"), py::arg("frozen_params"), py::arg("loss"), py::arg("custom_loss"),
      py::arg("optimizer"), py::arg("directory"), py::arg("prefix"), py::arg("additional_output_names"),
      py::arg("nominal_checkpoint"), py::arg("loss_input_names"), py::arg("loss_options"),
      py::arg("mixed_precision") = "", py::arg("lora") = std::nullopt, py::arg("memory_opt_level") = 0,
      py::arg("memory_opt_config") = "", py::arg("compute_optimizer") = true, py::arg("label_sparsity") = false,
      py::arg("ort_compatible") = false);

  m.def(
      "all_parameters",
      [](py::object model) {
        Model mdl = py::isinstance<py::bytes>(model) ? load_model_from_bytes(model.cast<std::string>(), "", "<model>")
                                                     : load_model(py::str(model));
        return all_parameters(mdl);
      },
      py::arg("model"));

  m.def(
      "compile_artifacts",
      [](const std::string& dir, const std::map<std::string, std::vector<int64_t>>& shapes) {
        py::gil_scoped_release release;
        return compile_artifacts(dir, std::map<std::string, Shape>(shapes.begin(), shapes.end()));
      },
      py::arg("artifact_directory"), py::arg("input_shapes") = std::map<std::string, std::vector<int64_t>>{});

  py::class_<Module>(m, "Module")
      .def(py::init([](const std::string& training, std::shared_ptr<CheckpointState> state, const std::string& eval,
                       const std::string& device) {
             OT_CHECK(device == "cpu" || device == "cuda", "Module: device should be 'cpu' or 'cuda', got '", device, "'");
             py::gil_scoped_release release;
             return std::make_unique<Module>(training, *state, eval, device == "cuda" ? Device::kCuda : Device::kCpu);
           }),
           py::arg("training_model"), py::arg("state"), py::arg("eval_model") = "", py::arg("device") = "cpu",
           py::keep_alive<1, 3>())
      .def("train_step", [](Module& mod, const py::sequence& inputs) {
        auto ts = tensors_from(inputs);
        std::vector<Tensor> out;
        {
          py::gil_scoped_release release;
          out = mod.train_step(ts);
          ts.clear();
        }
        return to_numpy_list(out);
      })
      .def("eval_step", [](Module& mod, const py::sequence& inputs) {
        auto ts = tensors_from(inputs);
        std::vector<Tensor> out;
        {
          py::gil_scoped_release release;
          out = mod.eval_step(ts);
          ts.clear();
        }
        return to_numpy_list(out);
      })
      .def("lazy_reset_grad", &Module::lazy_reset_grad)
      .def("memory_report", &Module::memory_report)
      .def("profile",
           [](const Module& mod) {
             py::list rows;
             for (const auto& n : mod.profile())
               rows.append(py::dict(py::arg("node") = n.node_name, py::arg("op_type") = n.op_type,
                                    py::arg("calls") = n.calls, py::arg("total_us") = n.total_us));
             return rows;
           })
      .def("input_names", &Module::input_names, py::arg("training") = true)
      .def("output_names", &Module::output_names, py::arg("training") = true)
      .def("get_parameters_size", &Module::get_parameters_size, py::arg("trainable_only") = true)
      .def("get_contiguous_parameters", [](const Module& mod, bool trainable_only) {
        return tensor_to_numpy(mod.get_contiguous_parameters(trainable_only));
      }, py::arg("trainable_only") = true)
      .def("copy_buffer_to_parameters", [](Module& mod, py::array buffer, bool trainable_only) {
        mod.copy_buffer_to_parameters(tensor_from_numpy(buffer, "buffer"), trainable_only);
      }, py::arg("buffer"), py::arg("trainable_only") = true)
      .def("export_model_for_inferencing", &Module::export_model_for_inferencing, py::arg("path"),
           py::arg("output_names"));

  py::class_<Optimizer>(m, "Optimizer")
      .def(py::init([](const std::string& path, Module& module) { return std::make_unique<Optimizer>(path, module); }),
           py::arg("optimizer_model"), py::arg("module"), py::keep_alive<1, 3>())
      .def("step", [](Optimizer& o) {
        StepStats stats;
        {
          py::gil_scoped_release release;
          stats = o.step();
        }
        return stats_dict(stats);
      }, "One update; returns {grad_norm, clip_coef, skipped, loss_scale} (skipped: the fp16 loss scaler "
         "found an inf or NaN gradient and left the parameters alone).")
      .def("set_learning_rate", &Optimizer::set_learning_rate)
      .def("get_learning_rate", &Optimizer::get_learning_rate)
      .def("step_count", &Optimizer::step_count)
      .def("set_data_parallel",
           [](Optimizer& o, bool enabled, int64_t bucket_bytes, int64_t check_every, double timeout_seconds,
              bool overlap, int64_t gradient_accumulation_steps) {
             DataParallelOptions d;
             d.enabled = enabled;
             d.bucket_bytes = bucket_bytes;
             d.check_every = check_every;
             d.timeout_seconds = timeout_seconds;
             d.overlap = overlap;
             d.gradient_accumulation_steps = gradient_accumulation_steps;
             py::gil_scoped_release release;
             o.set_data_parallel(d);
           },
           py::arg("enabled"), py::arg("bucket_bytes"), py::arg("check_every"), py::arg("timeout_seconds"),
           py::arg("overlap") = true, py::arg("gradient_accumulation_steps") = 1)
      .def("set_param_groups",
           [](Optimizer& o, const std::vector<std::pair<std::vector<std::string>, OptimizerConfig>>& groups) {
             std::vector<ParamGroup> gs;
             for (const auto& [names, config] : groups) gs.push_back({names, config});
             o.set_param_groups(gs);
           },
           py::arg("groups"))
      .def("data_parallel_stats", [](const Optimizer& o) {
        const DataParallelStats s = o.data_parallel_stats();
        py::dict d;
        d["steps"] = s.steps;
        d["calls"] = s.calls;
        d["bytes"] = s.bytes;
        d["seconds"] = s.seconds;
        d["wait_seconds"] = s.wait_seconds;
        d["overlapped_steps"] = s.overlapped_steps;
        return d;
      });

  // Data parallelism (onnxtrain/distributed.h), for python/onnxtrain/distributed.py.
  m.def("distributed_init", [] {
    DistributedWorld w;
    {
      py::gil_scoped_release release;
      w = distributed_init();
    }
    return py::make_tuple(w.rank, w.size, w.local_rank, w.backend);
  });
  m.def("distributed_mpi_built", &distributed_mpi_built);
  m.def("distributed_abort", [](int code) { distributed_abort(code); }, py::arg("code"));

  // LR schedulers read the optimizer's step count (a resumed run continues its schedule), as the
  // C++ and C ones do: this is the one implementation, bound.
  py::class_<LRScheduler>(m, "LRScheduler")
      .def("step", &LRScheduler::step, "sets the optimizer's learning rate for its step count and returns it")
      .def("lr_at", &LRScheduler::lr_at, py::arg("step"));
  py::class_<LinearLRScheduler, LRScheduler>(m, "LinearLRScheduler")
      .def(py::init<Optimizer&, int64_t, int64_t, double>(), py::arg("optimizer"), py::arg("warmup_step_count"),
           py::arg("total_step_count"), py::arg("initial_lr"), py::keep_alive<1, 2>());
  py::class_<CosineLRScheduler, LRScheduler>(m, "CosineLRScheduler")
      .def(py::init<Optimizer&, int64_t, int64_t, double, double>(), py::arg("optimizer"),
           py::arg("warmup_step_count"), py::arg("total_step_count"), py::arg("initial_lr"),
           py::arg("num_cycles") = 0.5, py::keep_alive<1, 2>());
  py::class_<StepLRScheduler, LRScheduler>(m, "StepLRScheduler")
      .def(py::init<Optimizer&, int64_t, double, double>(), py::arg("optimizer"), py::arg("step_size"),
           py::arg("gamma"), py::arg("initial_lr"), py::keep_alive<1, 2>());
  py::class_<ConstantLRScheduler, LRScheduler>(m, "ConstantLRScheduler")
      .def(py::init<Optimizer&, int64_t, double>(), py::arg("optimizer"), py::arg("warmup_step_count"),
           py::arg("initial_lr"), py::keep_alive<1, 2>());
}

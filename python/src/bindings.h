// Shared pieces of the Python extension: numpy <-> Tensor (python/src/convert.cc), and each
// binding file's entry point.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <map>
#include <string>

#include "onnxtrain/optimizer_config.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::python {

namespace py = pybind11;

DType dtype_from_numpy(const py::dtype& dt);
py::dtype numpy_dtype(DType dt);
Tensor tensor_from_numpy(py::handle obj, const std::string& what);  // zero-copy when C-contiguous
py::array tensor_to_numpy(const Tensor& t);                          // zero-copy
std::map<std::string, Tensor> feeds_from_dict(const py::dict& feeds);
// {grad_norm, clip_coef, skipped, loss_scale}: what one optimizer step reports.
py::dict stats_dict(const StepStats& stats);

}  // namespace onnxtrain::python

void bind_tools(pybind11::module_& m);     // python/src/tools.cc: model inspection helpers
void bind_autodiff(pybind11::module_& m);  // python/src/autodiff.cc
void bind_checkpoint(pybind11::module_& m);  // python/src/checkpoint.cc
void bind_optim(pybind11::module_& m);       // python/src/optim.cc
void bind_training(pybind11::module_& m);    // python/src/training.cc
void bind_torch_bridge(pybind11::module_& m);  // python/src/torch_bridge.cc

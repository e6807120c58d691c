// ModelProto <-> IR. Loading validates what it reads (dtypes, tensor sizes, external data
// bounds) so that a malformed file is an error naming the model, never a crash.
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace onnx { class ModelProto; class TensorProto; }

namespace onnxtrain {

// Parses a model file; external data is resolved relative to the file's directory.
Model load_model(const std::string& path);
// Parses serialized bytes; external data, if any, is resolved relative to base_dir.
Model load_model_from_bytes(const std::string& bytes, const std::string& base_dir = "",
                            const std::string& description = "<bytes>");
Model from_proto(const onnx::ModelProto& proto, const std::string& base_dir,
                 const std::string& description);

// The serialized model with the named top-level initializers turned into graph inputs of their
// dtype and shape, their data dropped (names it lacks are skipped). For a host that binds those
// values at every run (TrainModule: the torch module's parameters and buffers): what it keeps and
// builds from holds no second copy of them. Parses `bytes` in place.
std::string initializers_as_inputs(std::string_view bytes, const std::set<std::string>& names,
                                   const std::string& description = "<bytes>");

onnx::ModelProto to_proto(const Model& model);
// Throws, before copying any tensor, when the model would pass protobuf's 2 GB limit.
std::string save_model_to_bytes(const Model& model);
// Writes the model (atomically: temporary file, then rename). When the whole model would pass
// protobuf's 2 GB limit (or when forced), every initializer of at least 1 KiB goes to
// "<path>.data" as ONNX external data, page-aligned, written straight from the tensors (no copy).
void save_model(const Model& model, const std::string& path, bool force_external_data = false);

Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir = "");
void tensor_to_proto(const Tensor& tensor, onnx::TensorProto* proto);

}  // namespace onnxtrain

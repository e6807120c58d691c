// Checkpoint internals: how a CheckpointState maps onto a safetensors file (training/safetensors.h
// holds the format itself). The public API is include/onnxtrain/training.h.
//
//   tensors    parameters under their ONNX initializer names; optimizer state as
//              "__optimizer__/<param>/<state name>" (state names contain no '/').
//   metadata   (string values; the JSON ones are JSON text inside the string)
//     onnxtrain.format_version   "1"
//     onnxtrain.parameters       [{"name": "w", "requires_grad": true}, ...] in parameter order;
//                                a nominal parameter (no data) adds "dtype" and "shape" and has
//                                no tensor.
//     onnxtrain.property.<name>  {"type": "int"|"float"|"string", "value": ...}; non-finite
//                                floats are the strings "nan", "inf", "-inf".
//     onnxtrain.optimizer        {"step": 10, "learning_rate": 0.001} (only with optimizer state)
//     onnxtrain.data_crc32c, onnxtrain.header_crc32c   the format's checksums (required here)
// A safetensors file written by another tool (no onnxtrain.* keys) loads too: every tensor is a
// parameter, floating-point ones require grad.
#pragma once

#include <string_view>

#include "onnxtrain/training.h"
#include "training/safetensors.h"

namespace onnxtrain::checkpoint {

inline constexpr const char* kFormatVersion = "1";
inline constexpr std::string_view kOptimizerPrefix = "__optimizer__/";
// __metadata__ keys (all values are strings, as safetensors requires).
inline constexpr std::string_view kKeyPrefix = "onnxtrain.";
inline constexpr const char* kKeyFormatVersion = "onnxtrain.format_version";
inline constexpr const char* kKeyParameters = "onnxtrain.parameters";
inline constexpr const char* kKeyOptimizer = "onnxtrain.optimizer";
inline constexpr const char* kKeyPropertyPrefix = "onnxtrain.property.";

}  // namespace onnxtrain::checkpoint

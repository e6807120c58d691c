// ONNX Runtime's on-device training checkpoint format (ORT 1.16+), read and written without the
// flatbuffers library (docs/DESIGN.md, "Formats" and the dependency table say why). The schema is
// onnxruntime/core/flatbuffers/schema/ort_training_checkpoint.fbs and ort.fbs's Tensor; slots
// follow declaration order:
//
//   file        u32 offset of the root table | "ODTC" | tables, vectors, strings (flatbuffers)
//   Checkpoint  0 version:int32  1 module_state  2 optimizer_groups:[OptimizerGroup]  3 property_bag
//   ModuleState 0 requires_grad_params:[Tensor]  1 frozen_params:[Tensor]  2 is_nominal_state:bool
//               3 has_external_data:bool (version 2)
//   OptimizerGroup 0 group_name  1 step:int64  2 initial_learning_rate:float
//               3 optimizer_states:[ParameterOptimizerState{0 param_name, 1 momentums:[Tensor]}]
//   PropertyBag 0 ints:[{name, value:int64}]  1 floats:[{name, value:float}]  2 strings:[{name, value}]
//   Tensor      0 name  1 doc_string  2 dims:[int64]  3 data_type:int32 (ONNX's codes)  4 raw_data:[uint8]
//               5 string_data  6 external_data_offset:int64 = -1 (version 2)
//
// Version 1 (ORT 1.16-1.17) has no external data; version 2 (1.18+) may put tensors of 64 bytes
// or more in "<path>.data" at external_data_offset, their size given by dims and data_type. ORT
// writes a nominal checkpoint's tensors with empty dims and no data: such parameters load with
// no shape (Parameter::shape_known()).
//
// Mapping onto CheckpointState: requires_grad_params then frozen_params are the parameters, in
// file order. One optimizer group (ORT writes "group0"): its step and initial_learning_rate are
// SavedOptimizerState's step and learning_rate. ORT's AdamW moments momentum0/momentum1 are
// exp_avg/exp_avg_sq (the names onnxtrain's AdamW uses), both ways; other state names pass as
// they are. Properties: int64, float (float32 in the file: a double property is rounded when
// written) and string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "onnxtrain/training.h"

namespace onnxtrain::ort_checkpoint {

inline constexpr char kFileIdentifier[5] = "ODTC";
inline constexpr int32_t kNewestVersion = 2;
inline constexpr const char* kGroupName = "group0";
// ORT keeps tensors smaller than this inline even when the rest goes to external data.
inline constexpr uint64_t kMinExternalBytes = 64;
// A flatbuffer addresses at most 2 GiB: larger checkpoints put their tensors in "<path>.data".
// ORT 1.19.2 writes a 1.9 GB checkpoint inline (and fails past 2 GiB); the default does the same
// and moves tensors out only when the file would not fit.
inline constexpr uint64_t kExternalWhenNeeded = ~uint64_t(0);

// True when the first 8 bytes carry the format's file identifier ("ODTC" at byte 4).
bool has_identifier(const void* head, size_t n);

// Reads and validates a checkpoint. Errors (kInvalidModel, kRuntime) name the field, not the
// path, which CheckpointState::load adds.
CheckpointState read(const std::string& path);

struct WriteOptions {
  int32_t version = kNewestVersion;  // 1 writes ORT 1.16/1.17's layout (no external data)
  // Tensor bytes above which "<path>.data" is used; kExternalWhenNeeded: when past 2 GiB.
  uint64_t external_threshold = kExternalWhenNeeded;
};
// Writes atomically, with onnxtrain's CRC trailer; with external data the two files are replaced
// as one unit (training/ort_checkpoint_trailer.h), and read() verifies both CRCs.
// Throws kInvalidArgument for what ORT's format cannot hold, before any file is touched.
void write(const CheckpointState& state, const std::string& path, bool include_optimizer_state,
           const WriteOptions& options = {});

}  // namespace onnxtrain::ort_checkpoint

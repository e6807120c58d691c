// The checkpoint targets' second half: a state that loaded from fuzzed bytes must save, in both
// formats, and load again.
#pragma once

#include "fuzz_util.h"
#include "onnxtrain/training.h"

namespace fuzz {

inline void save_and_load_in_both_formats(const onnxtrain::CheckpointState& state) {
  using onnxtrain::CheckpointFormat;
  const std::string again = scratch_dir() + "/checkpoint.again";
  for (CheckpointFormat format : {CheckpointFormat::kOnnxtrain, CheckpointFormat::kOrt}) {
    state.save(again, /*include_optimizer_state=*/true, format);
    onnxtrain::CheckpointState::load(again);
  }
}

}  // namespace fuzz

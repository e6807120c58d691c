// onnxtrain checkpoints (safetensors, src/training/safetensors.cc and checkpoint.cc): the bytes as
// a checkpoint file through CheckpointState::load (header JSON, tensor entries and layout, the
// onnxtrain.* metadata: parameter list, properties, optimizer state); a state that loads is saved
// and loaded again, in both formats.
#include "checkpoint_round_trip.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  const std::string path = fuzz::write_scratch("checkpoint", data, size);
  try {
    fuzz::save_and_load_in_both_formats(CheckpointState::load(path));
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}

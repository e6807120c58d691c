// ONNX Runtime's training checkpoints (flatbuffers, src/training/ort_checkpoint.cc): the bytes
// through ort_checkpoint::read (tables, vtables, vectors, strings, tensors, property bag); a state
// that reads is saved in ORT's format and in onnxtrain's, and loaded again.
#include "checkpoint_round_trip.h"
#include "training/ort_checkpoint.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  const std::string path = fuzz::write_scratch("ort_checkpoint", data, size);
  try {
    fuzz::save_and_load_in_both_formats(ort_checkpoint::read(path));
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}

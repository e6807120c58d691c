// numpy data (src/data/npz.cc): the bytes as an .npz archive (zip records, ZIP64, stored and
// deflated members, each member's .npy header) through list_npz and load_npz, and as one .npy file
// through load_npy.
#include "fuzz_util.h"
#include "onnxtrain/npz.h"
#include "onnxtrain/status.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  const std::string path = fuzz::write_scratch("input.npz", data, size);
  try {
    list_npz(path);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  try {
    load_npz(path);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  try {
    load_npy(path);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}

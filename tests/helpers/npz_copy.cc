// Test helper for tests/python/test_npz.py: reads an .npz (or .npy) file with onnxtrain's reader
// and writes its arrays back with onnxtrain's writer, so numpy can check both directions.
//   npz_copy IN OUT [NAME...]    exit 1 with the error message when IN cannot be read
#include <cstdio>
#include <string>

#include "onnxtrain/npz.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: npz_copy IN OUT [NAME...]\n");
    return 2;
  }
  const std::string in = argv[1];
  try {
    std::vector<onnxtrain::NamedArray> arrays;
    if (in.size() > 4 && in.compare(in.size() - 4, 4, ".npy") == 0)
      arrays.push_back({"arr_0", onnxtrain::load_npy(in)});
    else
      arrays = onnxtrain::load_npz(in, std::vector<std::string>(argv + 3, argv + argc));
    onnxtrain::save_npz(argv[2], arrays);
  } catch (const onnxtrain::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

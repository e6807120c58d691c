// numpy's .npy and .npz files, read and written without Python.
//
//   std::vector<NamedArray> all = load_npz("train.npz");         // every array, in file order
//   std::vector<NamedArray> xy = load_npz("train.npz", {"x", "y"}); // the named ones, in that order
//   for (const NpzEntry& e : list_npz("train.npz")) ...           // names, dtypes, shapes only
//   save_npz("out.npz", {{"pred", t}});                           // as np.savez writes it
//
// An .npz file is a zip archive of "<name>.npy" members, stored (np.savez) or deflated
// (np.savez_compressed). ZIP64 records are read: numpy writes a ZIP64 extra field for every
// member, and archives past 4 GiB or 65535 members need the ZIP64 end records too. .npy format
// versions 1.0, 2.0 and 3.0 are read; dtypes are bool, (u)int8-64, float16/32/64 in little-endian
// or byte-order-free form, in C order. Everything is validated before it is used: offsets and
// sizes against the file, the header's syntax and keys, the data size against dtype and shape,
// and each member's CRC-32. Errors are onnxtrain::Error (kInvalidModel for malformed files,
// kNotImplemented for valid numpy data we do not read, such as Fortran order or object arrays)
// and name the file and the array.
#pragma once

#include <string>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

struct NamedArray {
  std::string name;  // the member name without ".npy"
  Tensor value;
};

struct NpzEntry {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
  bool compressed = false;
  uint64_t stored_bytes = 0;  // bytes the member takes in the archive
};

// Every array in the archive's order, or the arrays named in `only`, in that order (each must exist).
std::vector<NamedArray> load_npz(const std::string& path, const std::vector<std::string>& only = {});
// Names, dtypes and shapes from the members' headers, without reading the data.
std::vector<NpzEntry> list_npz(const std::string& path);
// Writes an uncompressed archive, as np.savez does (ZIP64 records when sizes need them),
// atomically: on failure the previous file at path is untouched. Names must be unique.
void save_npz(const std::string& path, const std::vector<NamedArray>& arrays);

// One .npy file.
Tensor load_npy(const std::string& path);

}  // namespace onnxtrain

// onnxtrain's integrity trailer on ONNX Runtime checkpoints, and the commit that replaces a
// checkpoint and its external data ("<path>.data") as one unit.
//
// ORT's flatbuffer has no checksum, and its readers ignore bytes after the buffer (flatbuffers'
// verifier checks offsets against the file size only: tests/python/test_ort_checkpoint.py loads
// them in ORT 1.19.2, external data included). So files onnxtrain writes end with 24 bytes:
//
//   u64 LE   bytes of "<path>.data" (0 without external data)
//   u32 LE   CRC-32C of "<path>.data" (0 without)
//   u32 LE   CRC-32C of every byte before this field (the flatbuffer, inline data, the two above)
//   8 bytes  "OTCRC32C"
//
// read() verifies both CRCs when the trailer is there (a file from ORT has none and loads as before).
//
// The set is atomic because the main file is the commit point and names its data file by CRC:
//   1. "<path>.data.new" is written (temporary file, fsync, rename, fsync of the folder);
//   2. the main file is written the same way: its rename is the commit;
//   3. "<path>.data.new" is renamed to "<path>.data".
// A crash before 2 leaves the old pair (the stray ".data.new" is not what the old trailer names);
// a crash between 2 and 3 leaves the new main file with "<path>.data.new" holding its data: the
// next load or save finds "<path>.data" failing the trailer's CRC and "<path>.data.new" passing
// it, and finishes step 3 (roll forward). ORT itself does not know step 3: after such a crash,
// load the checkpoint once with onnxtrain before handing it to ORT.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/file_io.h"

namespace onnxtrain::ort_checkpoint {

inline constexpr size_t kTrailerBytes = 24;
inline constexpr char kTrailerMagic[9] = "OTCRC32C";

struct Trailer {
  uint64_t data_bytes = 0;  // of "<path>.data"; 0: the checkpoint has no external data
  uint32_t data_crc = 0;
};

// The trailer for a main file whose bytes before it have CRC-32C main_crc (zlib-style running value).
std::array<uint8_t, kTrailerBytes> encode_trailer(uint32_t main_crc, const Trailer& t);
// The trailer of a main file's bytes, when it ends with one; throws Error(kInvalidModel) when its
// CRC does not match the bytes (the file is corrupt).
std::optional<Trailer> check_trailer(const uint8_t* file, uint64_t size);

// An external data file opened once: the CRC was computed through this descriptor, so reads from
// it see the checked bytes even when a concurrent save renames another file over its path (saves
// never write a data file in place).
struct ExternalData {
  std::string path;
  file_io::Fd fd;
  uint64_t size = 0;
};

// The external data file that belongs to a main file with trailer t: "<path>.data" when its size
// and CRC match; else "<path>.data.new" when that one matches (an interrupted commit, renamed into
// place when the folder is writable). Throws Error(kInvalidModel) when neither matches.
ExternalData matching_external_data(const std::string& path, const Trailer& t);

// Test seam: called by read() between the external data file's check and the read of its tensors
// (tests/cpp/ort_checkpoint_test.cc replaces the file there, as a concurrent save would). Empty: no-op.
extern void (*debug_after_external_check)(const std::string& data_path);

// Steps 1-3 above. write_external null: no external data (a stale "<path>.data" stays; the new
// main file does not name it). A pending step 3 of an earlier, interrupted commit is finished first.
void commit(const std::string& path, const file_io::FileWriter& write_main, const file_io::FileWriter* write_external);

}  // namespace onnxtrain::ort_checkpoint

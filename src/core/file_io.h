// POSIX file helpers shared by the file formats (checkpoint, npz): an owning descriptor, exact
// positional reads, complete writes, and atomic replacement of a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace onnxtrain::file_io {

std::string errno_text(int err);

// Owns a file descriptor; closes it when destroyed.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset();
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

inline constexpr size_t kIoChunk = size_t(64) << 20;  // 64 MiB per read/write call

// Writes all n bytes (retrying short writes and EINTR); `what` names the file in errors.
void write_all(int fd, const void* data, size_t n, const std::string& what);
// Reads exactly n bytes at offset; a short file is Error(kInvalidModel) ("file truncated").
void read_exact_at(int fd, void* data, size_t n, uint64_t offset, uint64_t file_size);

// Replaces path atomically: write(fd, what) fills a new temporary file in the same directory,
// which is fsynced and renamed over path, then the directory is fsynced (best effort). On any
// failure the temporary file is removed and path keeps its previous contents.
void write_file_atomically(const std::string& path,
                           const std::function<void(int fd, const std::string& what)>& write);

// Replaces several files together: each is written to its own temporary file and fsynced first;
// only then are they renamed over their paths, in the order given. An error before the renames
// leaves every path as it was (a crash between two renames can still mix old and new).
using FileWriter = std::function<void(int fd, const std::string& what)>;
void write_files_atomically(const std::vector<std::pair<std::string, FileWriter>>& files);

}  // namespace onnxtrain::file_io

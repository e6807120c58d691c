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
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) adopt(other.release());
    return *this;
  }
  int get() const { return fd_; }
  void reset();
  void adopt(int fd) {
    reset();
    fd_ = fd;
  }
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

// Replaces path atomically: write(fd, what) fills a new temporary file in the same directory
// ("<path>.tmp-<pid>-<host key>-<n>"), which is fsynced and renamed over path, then the directory
// is fsynced. On any failure the temporary file is removed and path keeps its previous contents; a
// process killed meanwhile leaves path as it was (and its temporary file, which the first write of
// path by a later process of the same host removes: see remove_stale_temporaries).
using FileWriter = std::function<void(int fd, const std::string& what)>;
void write_file_atomically(const std::string& path, const FileWriter& write);

// rename(from, to), then fsync of to's directory: the new name survives a power cut.
void rename_durably(const std::string& from, const std::string& to);
// fsync of the directory holding path (best effort: some filesystems refuse it).
void sync_parent_directory(const std::string& path);

// This machine's boot and PID namespace as 16 hex digits (the host name where /proc is missing).
const std::string& host_key();
// Removes "<path>.tmp-<pid>-<host key>-<n>" files that write_file_atomically left in path's
// directory when their process was killed: this host key's, pid no longer running. Files of other
// hosts (a shared filesystem, another container) stay: their pids cannot be checked here. Best
// effort, errors ignored.
void remove_stale_temporaries(const std::string& path);

// Crash testing (tests/crash): with ONNXTRAIN_DEBUG_SAVE_PAUSE_MS=N in the environment, the atomic
// writes above sleep N ms at each of their steps (temporary file created, written, synced, renamed)
// so that a test which kills the process at random instants lands inside them often. Unset: no-op.
void debug_save_pause();

}  // namespace onnxtrain::file_io

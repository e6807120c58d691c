// The MPI communicator (Open MPI from Debian: libopenmpi-dev). Compiled when CMake finds MPI.
//
// Collectives are started non-blocking and polled against a deadline, so a rank that died or
// hangs makes the others throw after timeout() seconds instead of waiting forever. Errors from the
// MPI library are returned (MPI_ERRORS_RETURN on our own duplicate of MPI_COMM_WORLD), not fatal.
#ifdef ONNXTRAIN_WITH_MPI

#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's C++ bindings warn under -Wextra
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "distributed/communicator.h"

namespace onnxtrain::distributed {

namespace {

bool we_initialised = false;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt64: return MPI_INT64_T;
    default: OT_THROW(kInvalidArgument, "allreduce: dtype ", dtype_name(t), " is not reduced (float32, float64, int64)");
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      OT_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error(rc));
      we_initialised = true;
      std::atexit(finalize_at_exit);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_free(&local);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  const char* backend() const override { return "mpi"; }

  void allreduce_sum(void* data, int64_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    char* p = static_cast<char*>(data);
    for (int64_t done = 0; done < count;) {  // MPI counts are int
      const int n = int(std::min<int64_t>(count - done, INT_MAX / 2));
      MPI_Request req;
      check(MPI_Iallreduce(MPI_IN_PLACE, p + done * int64_t(dtype_size(dtype)), n, type, MPI_SUM, comm_, &req),
            "allreduce");
      wait(req, "allreduce", int64_t(n) * int64_t(dtype_size(dtype)));
      done += n;
    }
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    OT_CHECK(bytes <= INT_MAX, label(), ": broadcast of ", bytes, " bytes is too large");
    MPI_Request req;
    check(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    wait(req, "broadcast", bytes);
  }

  void allgather(const void* send, int64_t bytes, void* recv) override {
    OT_CHECK(bytes <= INT_MAX / size_, label(), ": allgather of ", bytes, " bytes is too large");
    MPI_Request req;
    check(MPI_Iallgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, comm_, &req), "allgather");
    wait(req, "allgather", bytes);
  }

  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier");
    wait(req, "barrier", 0);
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  void check(int rc, const char* what) const {
    if (rc != MPI_SUCCESS) OT_THROW(kRuntime, label(), ": MPI ", what, " failed: ", mpi_error(rc));
  }

  // Polls the request until it completes or the deadline passes. Spins first (a collective of a
  // training step usually completes within microseconds of the slowest rank), then yields.
  void wait(MPI_Request& req, const char* what, int64_t bytes) const {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout()));
    for (int64_t polls = 0;; ++polls) {
      int done = 0;
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (polls < 2000) continue;
      if ((polls & 255) == 0 && clock::now() > deadline)
        OT_THROW(kRuntime, label(), ": ", what, " of ", bytes, " bytes timed out after ", timeout(),
                 " s waiting for the other ranks: a rank died, hangs, or is not at the same step "
                 "(ONNXTRAIN_DP_TIMEOUT / DataParallelOptions::timeout_seconds sets the limit)");
      std::this_thread::yield();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace onnxtrain::distributed

#endif  // ONNXTRAIN_WITH_MPI

// The MPI communicator (Open MPI from Debian: libopenmpi-dev). Compiled when CMake finds MPI.
//
// Every collective runs on one communication thread (started on first use; posted jobs, such as
// a gradient bucket's pack-allreduce-unpack, run there too, in order), so MPI is initialised with
// MPI_THREAD_SERIALIZED: one thread at a time calls MPI, and it need not be the thread that
// initialised it (MPI_THREAD_FUNNELED would require that).
//
// Collectives are the blocking MPI calls (Open MPI's non-blocking Iallreduce measured 2.4x slower
// on a 21 MB gradient bucket) under a watchdog: a thread that, when a collective is still running
// timeout() seconds after it started, prints an error naming this rank and the collective and ends
// the process (exit status 1), so mpirun ends the job instead of letting it hang on a rank that
// died or hangs. The watchdog never calls MPI. Errors from the MPI library are returned
// (MPI_ERRORS_RETURN on our own duplicate of MPI_COMM_WORLD), not fatal.
#ifdef ONNXTRAIN_WITH_MPI

#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's C++ bindings warn under -Wextra
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

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

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

// One worker thread running jobs in the order they were posted. A job's error is kept for
// drain(); the jobs after it are skipped (their collectives would pair with other ranks' wrong ones).
class CommThread {
 public:
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  bool on_this_thread() const { return thread_.joinable() && std::this_thread::get_id() == thread_.get_id(); }

  void post(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    queue_.push_back(std::move(job));
    ++posted_;
    work_.notify_all();
  }

  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return finished_ == posted_; });
    if (std::exception_ptr e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      std::function<void()> job = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = error_ != nullptr;
      lock.unlock();
      std::exception_ptr failed;
      if (!skip) {
        try {
          job();
        } catch (...) {
          failed = std::current_exception();
        }
      }
      job = nullptr;  // release what the job holds before it counts as done
      lock.lock();
      if (failed && !error_) error_ = failed;
      ++finished_;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<std::function<void()>> queue_;
  uint64_t posted_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    int provided = 0;
    if (!initialised) {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      OT_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error(rc));
      we_initialised = true;
      std::atexit(finalize_at_exit);
    } else {
      MPI_Query_thread(&provided);
    }
    OT_CHECK(provided >= MPI_THREAD_SERIALIZED, "MPI provides ", thread_level_name(provided),
             ", but onnxtrain calls MPI from its communication thread and needs MPI_THREAD_SERIALIZED or "
             "MPI_THREAD_MULTIPLE (with mpi4py, leave mpi4py.rc.thread_level at its default, 'multiple')");
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

  ~MpiCommunicator() override {
    comm_thread_.reset();  // idle at exit: every caller drained its jobs
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  void allreduce_sum(void* data, int64_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    char* p = static_cast<char*>(data);
    on_comm_thread([&] {
      for (int64_t done = 0; done < count;) {  // MPI counts are int
        const int n = int(std::min<int64_t>(count - done, INT_MAX / 2));
        const int64_t bytes = int64_t(n) * int64_t(dtype_size(dtype));
        Guard guard(*this, "allreduce", bytes);
        check(MPI_Allreduce(MPI_IN_PLACE, p + done * int64_t(dtype_size(dtype)), n, type, MPI_SUM, comm_), "allreduce");
        done += n;
      }
    });
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    OT_CHECK(bytes <= INT_MAX, label(), ": broadcast of ", bytes, " bytes is too large");
    on_comm_thread([&] {
      Guard guard(*this, "broadcast", bytes);
      check(MPI_Bcast(data, int(bytes), MPI_BYTE, root, comm_), "broadcast");
    });
  }

  void allgather(const void* send, int64_t bytes, void* recv) override {
    OT_CHECK(bytes <= INT_MAX / size_, label(), ": allgather of ", bytes, " bytes is too large");
    on_comm_thread([&] {
      Guard guard(*this, "allgather", bytes);
      check(MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, comm_), "allgather");
    });
  }

  void barrier() override {
    on_comm_thread([&] {
      Guard guard(*this, "barrier", 0);
      check(MPI_Barrier(comm_), "barrier");
    });
  }

  void post(std::function<void()> job) override { comm_thread().post(std::move(job)); }
  void drain() override { comm_thread().drain(); }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  CommThread& comm_thread() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!comm_thread_) comm_thread_ = std::make_unique<CommThread>();
    return *comm_thread_;
  }

  // Runs a collective on the communication thread and waits for it (and for the jobs posted
  // before it); from a job on that thread it runs directly.
  void on_comm_thread(const std::function<void()>& collective) {
    CommThread& t = comm_thread();
    if (t.on_this_thread()) return collective();
    t.post(collective);
    t.drain();
  }

  void check(int rc, const char* what) const {
    if (rc != MPI_SUCCESS) OT_THROW(kRuntime, label(), ": MPI ", what, " failed: ", mpi_error(rc));
  }

  // Arms the watchdog for one collective (started on first use).
  class Guard {
   public:
    Guard(MpiCommunicator& c, const char* what, int64_t bytes) : c_(c) {
      std::lock_guard<std::mutex> lock(c_.mutex_);
      if (!c_.watchdog_.joinable()) c_.watchdog_ = std::thread([&c = c_] { c.watch(); });
      c_.what_ = what;
      c_.bytes_ = bytes;
      c_.limit_ = timeout();
      c_.deadline_ = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(c_.limit_));
      c_.armed_ = true;
      c_.cv_.notify_all();
    }
    ~Guard() {
      std::lock_guard<std::mutex> lock(c_.mutex_);
      c_.armed_ = false;
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    double timeout() const { return c_.timeout(); }
    MpiCommunicator& c_;
  };

  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (!armed_) {
        cv_.wait(lock);
        continue;
      }
      const auto deadline = deadline_;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && armed_ && deadline_ == deadline) {
        std::fprintf(stderr,
                     "onnxtrain: error: %s: %s of %lld bytes timed out after %g s waiting for the other ranks: a "
                     "rank died, hangs, or is not at the same step (ONNXTRAIN_DP_TIMEOUT / --dp-timeout / "
                     "DataParallelOptions::timeout_seconds set the limit); ending this rank\n",
                     label().c_str(), what_, (long long)bytes_, limit_);
        std::fflush(stderr);
        std::_Exit(1);  // mpirun sees a rank fail and ends the job
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::thread watchdog_;
  std::unique_ptr<CommThread> comm_thread_;
  bool armed_ = false, stop_ = false;
  const char* what_ = "";
  int64_t bytes_ = 0;
  double limit_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace onnxtrain::distributed

#endif  // ONNXTRAIN_WITH_MPI

// One rank: every collective is the identity.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>

#include "distributed/communicator.h"

namespace onnxtrain::distributed {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  const char* backend() const override { return "single"; }
  void allreduce_sum(void*, int64_t, DType) override {}
  void broadcast(void*, int64_t, int root) override {
    OT_CHECK(root == 0, label(), ": broadcast from rank ", root, ", but there is one rank");
  }
  void allgather(const void* send, int64_t bytes, void* recv) override {
    if (bytes > 0 && send != recv) std::memmove(recv, send, size_t(bytes));
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
  void post(std::function<void()> job) override {
    if (error_) return;
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  void drain() override {
    if (std::exception_ptr e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
  }

 private:
  std::exception_ptr error_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace onnxtrain::distributed

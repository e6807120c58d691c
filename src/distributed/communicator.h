// The communicator the optimizer step and the trainer talk to: collectives over the ranks of one
// data-parallel job. Implementations: MPI (mpi_communicator.cc, compiled when CMake finds MPI) and
// a single rank (single_communicator.cc). Nothing outside src/distributed calls MPI.
//
// Layering: distributed sits between optim and training. It includes core (tensors, errors) only;
// training (Optimizer, Trainer) includes it, never the other way round.
//
// Collectives and posted jobs run on one communication thread (post()), so a gradient bucket can
// be reduced while the caller computes the next gradients.
//
// Every collective waits at most timeout() seconds for the other ranks; then the MPI communicator
// prints an error naming this rank and the collective and ends the process (status 1), and
// mpirun ends the job: a rank that died or hangs never makes the others hang.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "onnxtrain/distributed.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::distributed {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;
  virtual const char* backend() const = 0;

  // In place: data[i] = sum over ranks of data[i]. dtype is kFloat32, kFloat64 or kInt64.
  virtual void allreduce_sum(void* data, int64_t count, DType dtype) = 0;
  // root's `bytes` bytes to every rank.
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  // recv (size() * bytes) receives every rank's `bytes` bytes, in rank order.
  virtual void allgather(const void* send, int64_t bytes, void* recv) = 0;
  virtual void barrier() = 0;
  [[noreturn]] virtual void abort(int code) = 0;

  // Runs `job` on the communication thread, after the jobs posted before it, and returns at once
  // (the MPI communicator makes every MPI call on that one thread, the collectives above included;
  // the single rank runs the job in the caller). drain() waits until every posted job is done and
  // rethrows the first job's error; jobs posted after a failed one are skipped.
  virtual void post(std::function<void()> job) = 0;
  virtual void drain() = 0;

  void set_timeout(double seconds) { timeout_ = seconds; }
  double timeout() const { return timeout_; }
  // "rank 1 of 2": the prefix of every error raised on behalf of this rank.
  std::string label() const { return "rank " + std::to_string(rank()) + " of " + std::to_string(size()); }

 private:
  double timeout_ = 300;
};

// The process's world (distributed_init() in onnxtrain/distributed.h): created on first use.
Communicator& world();

std::unique_ptr<Communicator> make_single_communicator();
#ifdef ONNXTRAIN_WITH_MPI
// Initialises MPI unless something else (mpi4py) already did.
std::unique_ptr<Communicator> make_mpi_communicator();
#endif

}  // namespace onnxtrain::distributed

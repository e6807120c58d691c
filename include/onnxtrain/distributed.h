// Data-parallel training: every rank trains on its shard of the data, and the optimizer averages
// the gradients over ranks (allreduce) before each update, so the parameters stay identical on
// every rank. Ranks are processes started by `mpirun -np N`; a build without MPI has one rank.
//
//   onnxtrain::DistributedWorld w = onnxtrain::distributed_init();   // rank, size, local rank
//   onnxtrain::Optimizer optimizer("out/optimizer_model.onnx", module);
//   onnxtrain::DataParallelOptions dp;
//   dp.enabled = true;
//   optimizer.set_data_parallel(dp);          // step() now allreduces, then updates
//
// Every rank must load the same artifacts and checkpoint (set_data_parallel compares a hash of
// the parameters and optimizer state on all ranks and throws on a mismatch, naming the ranks).
// Collectives wait at most timeout_seconds for the other ranks: a rank that died or hangs makes
// the others fail with an error naming them instead of hanging.
#pragma once

#include <cstdint>
#include <string>

namespace onnxtrain {

struct DataParallelOptions {
  bool enabled = false;
  int64_t bucket_bytes = int64_t(25) << 20;  // gradients are packed into buckets of about this size
  int64_t check_every = 0;                   // debug: compare a parameter checksum every N steps (0: never)
  double timeout_seconds = 300;              // how long a collective waits for the other ranks
  // Reduce each bucket on a communication thread as soon as the backward has finished its
  // gradients, while the backward goes on (same results as reducing after it, bit for bit).
  bool overlap = true;
  // Module::train_step calls per Optimizer::step: the allreduce overlaps the backward of the
  // last one (allreduce_post_accumulation). A train step after that one, before the optimizer
  // step and lazy_reset_grad, is an error; an optimizer step after fewer train steps reduces then.
  int64_t gradient_accumulation_steps = 1;
};

// What the allreduces of an optimizer have cost so far.
struct DataParallelStats {
  int64_t steps = 0;          // optimizer steps that allreduced
  int64_t calls = 0;          // allreduce calls (buckets)
  int64_t bytes = 0;          // gradient bytes reduced (per rank)
  double seconds = 0;         // time inside pack, allreduce and unpack (on the communication thread when overlapped)
  double wait_seconds = 0;    // time the training thread waited for them: all of `seconds` unless overlapped
  int64_t overlapped_steps = 0;  // steps whose buckets were reduced during the backward
};

struct DistributedWorld {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  std::string backend;  // "mpi" or "single"
};

// Joins the world: MPI when the process was started by mpirun (or MPI is already initialised,
// for instance by mpi4py), one rank otherwise. Idempotent. Throws when the environment says the
// process is one of several ranks but this build has no MPI, or the MPI runtime fails to start.
DistributedWorld distributed_init();
// Whether this build has MPI compiled in.
bool distributed_mpi_built();
// Ends the job on every rank with `code` (MPI_Abort); for error paths, where the other ranks may
// be blocked in a collective. With one rank it is std::exit.
[[noreturn]] void distributed_abort(int code);

}  // namespace onnxtrain

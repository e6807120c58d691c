// Which communicator the process gets: MPI when a launcher started it (or MPI is already up), a
// single rank otherwise; and the public distributed_* functions.
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "distributed/communicator.h"

namespace onnxtrain {

namespace {

// The rank and size a launcher put in the environment (Open MPI, then PMI/PMIx), or -1.
int env_int(const char* const* names) {
  for (const char* const* n = names; *n; ++n)
    if (const char* v = std::getenv(*n); v && *v) return std::atoi(v);
  return -1;
}
constexpr const char* kSizeVars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", nullptr};
constexpr const char* kRankVars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", nullptr};

std::unique_ptr<distributed::Communicator> make_world() {
  const int env_size = env_int(kSizeVars), env_rank = env_int(kRankVars);
#ifdef ONNXTRAIN_WITH_MPI
  if (env_size >= 1 || env_rank >= 0 || std::getenv("ONNXTRAIN_FORCE_MPI")) {
    auto c = distributed::make_mpi_communicator();
    OT_CHECK(env_size < 0 || c->size() == env_size, c->label(), ": the launcher's environment says ", env_size,
             " ranks but MPI reports ", c->size(), ": mpirun and the MPI library onnxtrain links disagree");
    return c;
  }
  return distributed::make_single_communicator();
#else
  if (env_size > 1)
    OT_THROW(kNotImplemented, "rank ", env_rank, " of ", env_size,
             ": started by an MPI launcher, but this onnxtrain was built without MPI (install libopenmpi-dev "
             "and openmpi-bin, scripts/install_deps.sh, and rebuild)");
  return distributed::make_single_communicator();
#endif
}

std::mutex world_mutex;
std::unique_ptr<distributed::Communicator> world_instance;

}  // namespace

namespace distributed {

Communicator& world() {
  std::lock_guard<std::mutex> lock(world_mutex);
  if (!world_instance) {
    world_instance = make_world();
    if (const char* t = std::getenv("ONNXTRAIN_DP_TIMEOUT"); t && *t) world_instance->set_timeout(std::atof(t));
  }
  return *world_instance;
}

}  // namespace distributed

DistributedWorld distributed_init() {
  distributed::Communicator& c = distributed::world();
  return {c.rank(), c.size(), c.local_rank(), c.backend()};
}

bool distributed_mpi_built() {
#ifdef ONNXTRAIN_WITH_MPI
  return true;
#else
  return false;
#endif
}

void distributed_abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  distributed::Communicator* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(world_mutex);
    c = world_instance.get();
  }
  if (c) c->abort(code);
  std::exit(code);
}

}  // namespace onnxtrain

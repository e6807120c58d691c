// Test helper for tests/python/test_distributed.py: data-parallel training through the public
// C++ API (Module, Optimizer::set_data_parallel), run under mpirun or alone.
//
//   dp_train ARTIFACTS DATA.npz OUT.npz GLOBAL_BATCH STEPS ACCUM [dp|dp-blocking]
//
// Micro-batch g covers rows [g*B, (g+1)*B) of DATA (x, y; wrapping); with N ranks, rank r takes
// rows [g*B + r*B/N, g*B + (r+1)*B/N). Every STEPS update accumulates ACCUM micro-batches. With
// "dp" the optimizer averages gradients over the ranks, each bucket during the backward of the
// update's last micro-batch; "dp-blocking" after it. Rank 0 writes the trained parameters.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "onnxtrain/dataset.h"
#include "onnxtrain/distributed.h"
#include "onnxtrain/module.h"

using namespace onnxtrain;

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: dp_train ARTIFACTS DATA.npz OUT.npz GLOBAL_BATCH STEPS ACCUM [dp|dp-blocking]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const int64_t batch = std::atoll(argv[4]), steps = std::atoll(argv[5]), accum = std::atoll(argv[6]);
  const std::string mode = argc > 7 ? argv[7] : "";
  const bool dp = mode == "dp" || mode == "dp-blocking";
  DistributedWorld world;
  try {
    if (dp) world = distributed_init();
    if (batch % world.size != 0) {
      std::fprintf(stderr, "rank %d of %d: global batch %lld does not split over %d ranks\n", world.rank, world.size,
                   (long long)batch, world.size);
      return 2;
    }
    const int64_t local = batch / world.size;
    CheckpointState state = CheckpointState::load((dir / "checkpoint").string());
    Module module((dir / "training_model.onnx").string(), state, (dir / "eval_model.onnx").string());
    Optimizer optimizer((dir / "optimizer_model.onnx").string(), module);
    if (dp) {
      DataParallelOptions o;
      o.enabled = true;
      o.bucket_bytes = 4096;  // several buckets even for a tiny model
      o.check_every = 10;
      o.overlap = mode == "dp";
      o.gradient_accumulation_steps = accum;
      optimizer.set_data_parallel(o);
    }
    Dataset data(load_npz(argv[2], {"x", "y"}), argv[2]);
    std::vector<int64_t> rows(static_cast<size_t>(data.size()), 0);  // Dataset::batch reads a full-length order
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t k = 0; k < accum; ++k) {
        const int64_t g = s * accum + k;
        for (int64_t i = 0; i < local; ++i) rows[size_t(i)] = (g * batch + world.rank * local + i) % data.size();
        module.train_step(data.batch(rows, 0, local));
      }
      optimizer.step();
      module.lazy_reset_grad();
    }
    if (world.rank == 0) {
      std::vector<NamedArray> out;
      for (const auto& name : module.trainable_parameters()) out.push_back({name, state.get_parameter(name)});
      save_npz(argv[3], out);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_train: error: %s\n", e.what());
    if (world.size > 1) distributed_abort(1);
    return 1;
  }
  return 0;
}

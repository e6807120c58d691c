// Dynamic loss scaling for fp16 mixed precision, the optimizer half (the graph half, loss * scale
// and the unscaled gradients, is in src/passes/mixed_precision.h). The semantics of PyTorch's
// torch.amp.GradScaler and ONNX Runtime's DynamicLossScaler with their defaults:
//
//   scale starts at 2^16
//   a step whose gradients are all finite: the update runs; after 2000 such steps in a row the
//     scale doubles and the count restarts
//   a step with an inf or NaN gradient: the update is skipped (parameters, moments and the
//     optimizer's step count stay as they were), the scale halves and the count restarts
//
// Neither bound of ONNX Runtime's scaler (min 1, max 2^24) is applied: PyTorch has none, and a
// scale that keeps halving means the gradients themselves are not finite.
#pragma once

#include <cstdint>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain::optim {

struct LossScaler {
  static constexpr double kInitialScale = 65536.0;  // 2^16
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

  double scale = kInitialScale;
  int64_t good_steps = 0;     // finite steps since the scale last changed (GradScaler's growth tracker)
  int64_t skipped_steps = 0;  // updates skipped so far, in the whole run

  // Records one step's verdict and moves the scale; returns true when the update should run.
  bool update(bool gradients_finite);
};

// True when every element of every tensor (fp32 or float64) is finite; one parallel pass.
bool all_finite(const std::vector<Tensor>& tensors);

}  // namespace onnxtrain::optim

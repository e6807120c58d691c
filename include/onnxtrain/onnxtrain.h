// The whole C++ API in one include. The stable C API is separate: onnxtrain/c_api.h.
#pragma once

#include "onnxtrain/artifacts.h"         // generate_artifacts, ArtifactOptions, LossType
#include "onnxtrain/module.h"            // Module, Optimizer, LR schedulers
#include "onnxtrain/optimizer_config.h"  // OptimizerType, OptimizerConfig
#include "onnxtrain/session.h"           // InferenceSession
#include "onnxtrain/limits.h"            // ResourceLimits: memory and Loop iteration caps
#include "onnxtrain/status.h"            // Error, ErrorCode
#include "onnxtrain/tensor.h"            // Tensor, DType
#include "onnxtrain/training.h"          // CheckpointState, Parameter

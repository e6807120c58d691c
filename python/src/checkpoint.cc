// Python bindings of CheckpointState (src/training/checkpoint.h).
#include "bindings.h"

void bind_checkpoint(pybind11::module_&) {}

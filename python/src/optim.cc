// Python bindings of the optimizer update kernels and LR schedulers (src/optim/).
#include "bindings.h"

void bind_optim(pybind11::module_&) {}

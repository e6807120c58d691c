// OT_INTERNAL: a function the library calls only inside itself (the portable kernels behind
// ConvPrimitive, Matmul and PoolPrimitive): not exported, so the minimal runtime's dynamic symbol
// table does not carry their long mangled names (its size target, issue 15).
#pragma once

#define OT_INTERNAL __attribute__((visibility("hidden")))

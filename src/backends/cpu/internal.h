// OT_INTERNAL: a function the library calls only inside itself (the portable kernels behind
// ConvPrimitive, Matmul and PoolPrimitive): not exported, so the minimal runtime's dynamic symbol
// table does not carry their long mangled names (its size target, issue 15).
#pragma once

#define OT_INTERNAL __attribute__((visibility("hidden")))

// OT_COLD: code that runs once per shape (a primitive's construction, its offset tables), compiled
// for size: the minimal runtime's size target; these functions do no floating-point arithmetic
// that a kernel's result depends on. Never on a function a kernel's hot path calls: GCC then takes
// the path for cold too and compiles the kernels it calls for size (the direct convolution ran
// 10x slower with its per-image offset helper marked).
// clang (the WebAssembly build) has no per-function optimize attribute: cold alone there.
// OT_NOCLONE: one copy of a template kernel per instance, none more per constant argument (GCC's
// noclone; clang makes no such clones).
#if defined(__clang__)
#define OT_COLD __attribute__((cold))
#define OT_NOCLONE __attribute__((noinline))
#else
#define OT_COLD __attribute__((cold, optimize("Os")))
#define OT_NOCLONE __attribute__((noinline, noclone))
#endif

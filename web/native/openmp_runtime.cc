// The OpenMP runtime of the WebAssembly build (emscripten has none). The single-threaded module
// compiles the sources with -fopenmp-simd: only the omp_* queries below are called, and they say
// one thread. The threaded module (-pthread -fopenmp) also gets the part of LLVM's libomp ABI that
// clang emits for the constructs the sources use: `parallel [for schedule(static)] num_threads(n)`
// (__kmpc_fork_call, __kmpc_push_num_threads, __kmpc_for_static_init_*, __kmpc_barrier), run by a
// team of pthreads created once (emscripten's pthread pool, sized before the module starts: a
// browser's main thread cannot wait for a new Worker to start). Nested regions run on one thread.
// Tensor storage comes from the heap in this build, never mmap (src/core/memory.h says why: a
// partial munmap in emscripten's libc left a lock held, and the first train step hung on it).
#include "omp.h"

#include <cstdarg>
#include <cstdint>

#ifdef __EMSCRIPTEN_PTHREADS__
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <emscripten/threading.h>
#endif

namespace {

#ifdef __EMSCRIPTEN_PTHREADS__
// The team's size: the pthread pool emscripten prepared (the module's numThreads) plus the caller.
int g_max_threads = -1;
thread_local int t_thread_num = 0;
thread_local int t_team_size = 1;
thread_local int t_pushed_threads = 0;  // num_threads(n) of the next region, from this thread

// More threads than the pool has would wait for a new Worker, which a page's main thread never gets.
int cap(int n) { return std::max(1, std::min(n, ONNXTRAIN_WEB_POOL_SIZE + 1)); }

int pool_threads() {
  if (g_max_threads < 0) g_max_threads = cap(emscripten_num_logical_cores());
  return g_max_threads;
}
#endif

}  // namespace

extern "C" {

#ifdef __EMSCRIPTEN_PTHREADS__
int omp_get_max_threads(void) { return t_team_size > 1 ? 1 : pool_threads(); }
void omp_set_num_threads(int n) {
  if (n > 0) g_max_threads = cap(n);
}
int omp_get_num_threads(void) { return t_team_size; }
int omp_get_thread_num(void) { return t_thread_num; }
int omp_in_parallel(void) { return t_team_size > 1; }
int omp_get_num_procs(void) { return emscripten_num_logical_cores(); }
#else
int omp_get_max_threads(void) { return 1; }
void omp_set_num_threads(int) {}
int omp_get_num_threads(void) { return 1; }
int omp_get_thread_num(void) { return 0; }
int omp_in_parallel(void) { return 0; }
int omp_get_num_procs(void) { return 1; }
#endif

}  // extern "C"

#ifdef __EMSCRIPTEN_PTHREADS__
// ---- libomp's ABI, as far as clang 14 emits it for the constructs above.
namespace {

struct ident_t;  // source location: unused
using Microtask = void (*)(int32_t* gtid, int32_t* btid, ...);
constexpr int kMaxArgs = 16;

// One region's work, published to the team by a generation counter the workers wait on.
struct Region {
  Microtask task = nullptr;
  int32_t argc = 0;
  void* args[kMaxArgs] = {};
  int team = 1;
};

// Captured variables arrive as pointer-sized values; WebAssembly's indirect calls check the exact
// signature, so the microtask is called through a pointer of its own arity.
void invoke(const Region& r, int32_t tid) {
  int32_t gtid = tid, btid = tid;
  void* const* a = r.args;
  using P = void*;
  switch (r.argc) {
    case 0: reinterpret_cast<void (*)(int32_t*, int32_t*)>(r.task)(&gtid, &btid); break;
    case 1: reinterpret_cast<void (*)(int32_t*, int32_t*, P)>(r.task)(&gtid, &btid, a[0]); break;
    case 2: reinterpret_cast<void (*)(int32_t*, int32_t*, P, P)>(r.task)(&gtid, &btid, a[0], a[1]); break;
    case 3: reinterpret_cast<void (*)(int32_t*, int32_t*, P, P, P)>(r.task)(&gtid, &btid, a[0], a[1], a[2]); break;
    case 4:
      reinterpret_cast<void (*)(int32_t*, int32_t*, P, P, P, P)>(r.task)(&gtid, &btid, a[0], a[1], a[2], a[3]);
      break;
    case 5:
      reinterpret_cast<void (*)(int32_t*, int32_t*, P, P, P, P, P)>(r.task)(&gtid, &btid, a[0], a[1], a[2], a[3],
                                                                             a[4]);
      break;
    case 6:
      reinterpret_cast<void (*)(int32_t*, int32_t*, P, P, P, P, P, P)>(r.task)(&gtid, &btid, a[0], a[1], a[2],
                                                                                a[3], a[4], a[5]);
      break;
    case 7:
      reinterpret_cast<void (*)(int32_t*, int32_t*, P, P, P, P, P, P, P)>(r.task)(&gtid, &btid, a[0], a[1], a[2],
                                                                                   a[3], a[4], a[5], a[6]);
      break;
    case 8:
      reinterpret_cast<void (*)(int32_t*, int32_t*, P, P, P, P, P, P, P, P)>(r.task)(
          &gtid, &btid, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
      break;
    default: __builtin_trap();  // more captures than any region of the sources has
  }
}

// Waits until done(word's value): spins a while (a region's threads usually finish close together),
// then sleeps on the word's futex, woken by whoever changes it. A waiter that only spins keeps the
// core from the thread it waits for when the machine has more runnable threads than cores: so a
// join or barrier costs a scheduling round instead of microseconds (libgomp also spins, then sleeps).
// On a browser's main thread, which may not sleep, emscripten_futex_wait spins instead; and on the
// main thread it serves the calls that workers' syscalls (a write to stderr, the file system) proxy
// to it, which would otherwise wait for the main thread while it waits for them.
constexpr int kSpinsBeforeSleep = 1 << 14;

template <typename Done>
void wait_until(std::atomic<int32_t>& word, Done done) {
  static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t), "a futex is one 32-bit word");
  for (int spins = 0;;) {
    const int32_t seen = word.load(std::memory_order_acquire);
    if (done(seen)) return;
    if (spins < kSpinsBeforeSleep) ++spins;
    else emscripten_futex_wait(&word, uint32_t(seen), INFINITY);  // at once if the word no longer holds `seen`
  }
}

void wake_all(std::atomic<int32_t>& word) { emscripten_futex_wake(&word, INT32_MAX); }

// The team: workers spin briefly, then sleep on a futex (emscripten's Atomics.wait), between regions.
// A region is published as one 64-bit ticket, (sequence number << 32) | team size, after its
// Region: a worker that wakes late and reads a newer ticket than the one it slept on sees that
// ticket's Region (the caller publishes no next region before every member of this one is done), and
// a worker started after the last ticket begins from it, so no region is missed or run twice.
class Team {
 public:
  void run(Region& r) {
    ensure_workers(r.team - 1);
    region_ = &r;
    pending_.store(r.team - 1, std::memory_order_relaxed);
    const uint64_t sequence = (ticket_.load(std::memory_order_relaxed) >> 32) + 1;
    ticket_.store(sequence << 32 | uint32_t(r.team), std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    emscripten_futex_wake(&wake_word_, INT32_MAX);
    run_member(r, 0);
    wait_until(pending_, [](int32_t left) { return left == 0; });
  }

  // A barrier among the current region's members.
  void barrier() {
    const int team = t_team_size;
    if (team <= 1) return;
    const int32_t phase = barrier_phase_.load(std::memory_order_acquire);
    if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == team - 1) {
      barrier_count_.store(0, std::memory_order_relaxed);
      barrier_phase_.fetch_add(1, std::memory_order_release);
      wake_all(barrier_phase_);
    } else {
      wait_until(barrier_phase_, [phase](int32_t now) { return now != phase; });
    }
  }

  void worker_loop(int index, uint64_t seen) {
    for (;;) {
      uint64_t ticket;
      for (int spins = 0; (ticket = ticket_.load(std::memory_order_acquire)) == seen;) {
        if (++spins < (1 << 16)) continue;
        const int32_t word = wake_.load(std::memory_order_acquire);
        if (ticket_.load(std::memory_order_acquire) == seen) emscripten_futex_wait(&wake_word_, uint32_t(word), 1e3);
      }
      seen = ticket;
      if (index < int(uint32_t(ticket))) {
        run_member(*region_, index);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) wake_all(pending_);  // the last: the caller may sleep
      }
    }
  }

 private:
  struct Start {
    int index;
    uint64_t ticket;
  };

  static void run_member(const Region& r, int tid) {
    t_thread_num = tid;
    t_team_size = r.team;
    invoke(r, tid);
    t_thread_num = 0;
    t_team_size = 1;
  }

  void ensure_workers(int n) {
    while (started_ < n) {
      pthread_t thread;
      auto* start = new Start{++started_, ticket_.load(std::memory_order_acquire)};
      pthread_create(&thread, nullptr, &Team::worker_main, start);
      pthread_detach(thread);
    }
  }

  static void* worker_main(void* arg);

  const Region* region_ = nullptr;
  int started_ = 0;
  std::atomic<int32_t> pending_{0};
  std::atomic<uint64_t> ticket_{0};
  union {  // the futex word the workers sleep on: bumped with every ticket
    std::atomic<int32_t> wake_{0};
    int32_t wake_word_;
  };
  std::atomic<int> barrier_count_{0};
  std::atomic<int32_t> barrier_phase_{0};
};

Team& team() {
  static Team* t = new Team;  // never destroyed: its workers outlive static destruction
  return *t;
}

void* Team::worker_main(void* arg) {
  const Start start = *static_cast<Start*>(arg);
  delete static_cast<Start*>(arg);
  team().worker_loop(start.index, start.ticket);
  return nullptr;
}

template <typename T>
void static_init(int32_t gtid, int32_t* plastiter, T* plower, T* pupper, T* pstride, T incr) {
  (void)gtid;
  const int team = t_team_size, tid = t_thread_num;
  using Wide = __int128;
  const Wide lower = *plower, upper = *pupper;
  const Wide trips = incr > 0 ? (upper - lower) / incr + 1 : (lower - upper) / -Wide(incr) + 1;
  if (trips <= 0 || team <= 1) {
    if (plastiter) *plastiter = 1;
    *pstride = T(trips * incr);
    return;
  }
  // schedule(static) without a chunk: contiguous blocks, the first (trips % team) one longer.
  const Wide base = trips / team, extra = trips % team;
  const Wide begin = tid * base + std::min<Wide>(tid, extra);
  const Wide count = base + (tid < extra ? 1 : 0);
  if (plastiter) *plastiter = (count > 0 && begin + count == trips) ? 1 : 0;
  *plower = T(lower + begin * incr);
  *pupper = T(lower + (begin + count - 1) * incr);  // count 0: upper < lower, no iteration
  *pstride = T(trips * incr);
}

}  // namespace

extern "C" {

int32_t __kmpc_global_thread_num(ident_t*) { return t_thread_num; }

void __kmpc_push_num_threads(ident_t*, int32_t, int32_t num_threads) { t_pushed_threads = num_threads; }

void __kmpc_fork_call(ident_t*, int32_t argc, Microtask task, ...) {
  Region r;
  r.task = task;
  r.argc = argc;
  if (argc > kMaxArgs) __builtin_trap();
  va_list ap;
  va_start(ap, task);
  for (int i = 0; i < argc; ++i) r.args[i] = va_arg(ap, void*);
  va_end(ap);
  int want = t_pushed_threads > 0 ? t_pushed_threads : pool_threads();
  t_pushed_threads = 0;
  r.team = t_team_size > 1 ? 1 : std::max(1, std::min(want, pool_threads()));
  if (r.team == 1) {  // a nested region, or one thread asked for: run it here
    const int saved_num = t_thread_num, saved_size = t_team_size;
    t_thread_num = 0;
    t_team_size = 1;
    invoke(r, 0);
    t_thread_num = saved_num;
    t_team_size = saved_size;
    return;
  }
  team().run(r);
}

void __kmpc_barrier(ident_t*, int32_t) { team().barrier(); }

void __kmpc_for_static_init_4(ident_t*, int32_t gtid, int32_t, int32_t* last, int32_t* lo, int32_t* hi,
                              int32_t* stride, int32_t incr, int32_t) {
  static_init(gtid, last, lo, hi, stride, incr);
}
void __kmpc_for_static_init_8(ident_t*, int32_t gtid, int32_t, int32_t* last, int64_t* lo, int64_t* hi,
                              int64_t* stride, int64_t incr, int64_t) {
  static_init(gtid, last, lo, hi, stride, incr);
}
void __kmpc_for_static_fini(ident_t*, int32_t) {}

}  // extern "C"
#endif

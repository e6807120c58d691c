// Vector lanes for the optimizer kernels (src/optim only).
//
// Each update rule is written once as a generic lambda over "lanes": for the main loop it receives
// std::experimental::native_simd<T> values (AVX-512 on the build machines), for the tail plain T.
// The same expression therefore runs in both, in the same order. This is used instead of relying
// on auto-vectorisation because GCC does not vectorise std::sqrt without -fno-math-errno, which
// the build does not set.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(_LIBCPP_VERSION)
// libc++ (emscripten's, the WebAssembly build) declares <experimental/simd> but defines none of its
// operators: a 16-byte vector of the compiler's vector extension stands in, with the members used
// here (SIMD128 lanes; the same expressions, so the same numbers lane by lane).
namespace onnxtrain::optim::simd::stdx {
inline constexpr struct element_aligned_tag {
} element_aligned{};
template <typename T, typename A = void>
struct simd {
  using Lanes = T __attribute__((vector_size(16)));
  Lanes v;
  simd() = default;
  simd(T x) : v(x - Lanes{}) {}  // NOLINT: broadcast, as stdx::simd's
  simd(Lanes x) : v(x) {}        // NOLINT
  simd(const T* p, element_aligned_tag) { std::memcpy(&v, p, sizeof v); }
  static constexpr size_t size() { return sizeof(Lanes) / sizeof(T); }
  void copy_to(T* p, element_aligned_tag) const { std::memcpy(p, &v, sizeof v); }
  T operator[](size_t i) const { return v[i]; }
  simd operator-() const { return -v; }
  friend simd operator+(simd a, simd b) { return a.v + b.v; }
  friend simd operator-(simd a, simd b) { return a.v - b.v; }
  friend simd operator*(simd a, simd b) { return a.v * b.v; }
  friend simd operator/(simd a, simd b) { return a.v / b.v; }
  simd& operator+=(simd b) { return *this = *this + b; }
};
template <typename T>
using native_simd = simd<T>;
template <typename T, typename A>
simd<T, A> sqrt(simd<T, A> x) {
  for (size_t i = 0; i < x.size(); ++i) x.v[i] = std::sqrt(x.v[i]);
  return x;
}
template <typename T, typename A>
simd<T, A> max(simd<T, A> a, simd<T, A> b) {
  for (size_t i = 0; i < a.size(); ++i) a.v[i] = a.v[i] < b.v[i] ? b.v[i] : a.v[i];
  return a;
}
template <typename T, typename A>
T reduce(simd<T, A> x) {
  T sum = x.v[0];
  for (size_t i = 1; i < x.size(); ++i) sum += x.v[i];
  return sum;
}
}  // namespace onnxtrain::optim::simd::stdx
#else
// GCC 12's <experimental/simd> trips -Wmaybe-uninitialized inside its own AVX-512 intrinsics
// (_mm512_undefined_ps); the warning is spurious and only concerns that header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <experimental/simd>
#pragma GCC diagnostic pop
namespace onnxtrain::optim::simd {
namespace stdx = std::experimental;
}
#endif

namespace onnxtrain::optim::simd {

template <typename T>
using Vec = stdx::native_simd<T>;

// sqrt and max for both lane kinds.
template <typename T>
  requires std::is_floating_point_v<T>
inline T vsqrt(T x) { return std::sqrt(x); }
template <typename T, typename A>
inline stdx::simd<T, A> vsqrt(const stdx::simd<T, A>& x) { return stdx::sqrt(x); }

template <typename T>
  requires std::is_floating_point_v<T>
inline T vmax(T a, T b) { return a < b ? b : a; }
template <typename T, typename A>
inline stdx::simd<T, A> vmax(const stdx::simd<T, A>& a, const stdx::simd<T, A>& b) { return stdx::max(a, b); }

namespace detail {
template <typename V, typename T>
inline void store(const V& v, T* p) { v.copy_to(p, stdx::element_aligned); }
template <typename V, typename T>
inline void store(const V&, const T*) {}  // read-only stream
}  // namespace detail

// Calls f(lanes...) over [begin, end) of every stream; T* streams are written back, const T*
// streams are read only. f takes each lane by reference (auto&) or by const reference.
template <typename T, typename F, typename... P>
inline void for_lanes(int64_t begin, int64_t end, F&& f, P... ptrs) {
  using V = Vec<T>;
  constexpr int64_t W = int64_t(V::size());
  int64_t i = begin;
  for (; i + W <= end; i += W) {
    std::tuple<decltype((void)ptrs, V())...> lanes{V(ptrs + i, stdx::element_aligned)...};
    std::apply([&](auto&... v) { f(v...); }, lanes);
    std::apply([&](const auto&... v) { (detail::store(v, ptrs + i), ...); }, lanes);
  }
  for (; i < end; ++i) f(ptrs[i]...);
}

// Sum of squares of x[begin, end) accumulated in double.
template <typename T>
inline double sum_squares(const T* x, int64_t begin, int64_t end) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = begin; i < end; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

}  // namespace onnxtrain::optim::simd

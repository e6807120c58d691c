#include "onnxtrain/dataset.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/dispatch.h"

namespace onnxtrain {

Dataset::Dataset(std::vector<NamedArray> columns, std::string description)
    : columns_(std::move(columns)), description_(std::move(description)) {
  OT_CHECK(!columns_.empty(), description_, ": a dataset needs at least one array");
  for (const auto& c : columns_) {
    OT_CHECK(c.value.rank() >= 1, description_, ": array '", c.name, "' is a scalar; examples are rows of arrays");
    OT_CHECK(c.value.dim(0) == columns_[0].value.dim(0), description_, ": array '", c.name, "' has ", c.value.dim(0),
             " rows but '", columns_[0].name, "' has ", columns_[0].value.dim(0), " (every array needs one row per example)");
  }
  size_ = columns_[0].value.dim(0);
}

int64_t Dataset::num_batches(int64_t batch_size, bool drop_last) const {
  OT_CHECK(batch_size >= 1, "batch size must be >= 1, got ", batch_size);
  return drop_last ? size_ / batch_size : (size_ + batch_size - 1) / batch_size;
}

std::vector<Tensor> Dataset::batch(const std::vector<int64_t>& order, int64_t b, int64_t batch_size) const {
  OT_CHECK(int64_t(order.size()) == size_, description_, ": the row order has ", order.size(), " entries for ",
           size_, " examples");
  OT_CHECK(b >= 0 && b < num_batches(batch_size), description_, ": batch ", b, " is out of range");
  const int64_t begin = b * batch_size, rows = std::min(batch_size, size_ - begin);
  std::vector<Tensor> out;
  for (const auto& c : columns_) {
    Shape shape = c.value.shape();
    shape[0] = rows;
    Tensor t = Tensor::empty(c.value.dtype(), shape);
    const size_t row_bytes = c.value.nbytes() / size_t(std::max<int64_t>(size_, 1));
    const auto* src = static_cast<const uint8_t*>(c.value.data());
    auto* dst = static_cast<uint8_t*>(t.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = order[size_t(begin + r)];
      OT_CHECK(row >= 0 && row < size_, description_, ": row index ", row, " is out of range");
      std::memcpy(dst + size_t(r) * row_bytes, src + size_t(row) * row_bytes, row_bytes);
    }
    out.push_back(std::move(t));
  }
  return out;
}

void Dataset::convert_column(size_t i, DType dtype) {
  NamedArray& c = columns_.at(i);
  if (c.value.dtype() == dtype) return;
  const std::string what = description_ + ": array '" + c.name + "' (" + dtype_name(c.value.dtype()) + " to " +
                           dtype_name(dtype) + ")";
  Tensor out = Tensor::empty(dtype, c.value.shape());
  dispatch_all(c.value.dtype(), [&]<typename From>() {
    dispatch_all(dtype, [&]<typename To>() {
      const From* src = c.value.data<From>();
      To* dst = out.data<To>();
      for (int64_t k = 0; k < c.value.numel(); ++k) {
        if constexpr (std::is_integral_v<To> && !std::is_same_v<To, bool> && is_float_like_v<From>) {
          const double x = cast_value<double>(src[k]);
          OT_CHECK(std::isfinite(x) && x == std::floor(x) && x >= double(std::numeric_limits<To>::min()) &&
                       x < std::ldexp(1.0, std::numeric_limits<To>::digits),
                   what, ": element ", k, " is ", x, ", not a whole number that fits");
          dst[k] = To(x);
        } else {
          dst[k] = cast_value<To>(src[k]);
        }
      }
    });
  });
  c.value = std::move(out);
}

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (Lemire's multiply-and-reject).
uint64_t bounded(uint64_t& state, uint64_t bound) {
  unsigned __int128 m = (unsigned __int128)splitmix64(state) * bound;
  uint64_t low = uint64_t(m);
  if (low < bound) {
    const uint64_t threshold = -bound % bound;
    while (low < threshold) {
      m = (unsigned __int128)splitmix64(state) * bound;
      low = uint64_t(m);
    }
  }
  return uint64_t(m >> 64);
}
}  // namespace

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed) {
  OT_CHECK(n >= 0, "shuffled_indices: n must be >= 0, got ", n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  uint64_t state = seed;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[bounded(state, uint64_t(i) + 1)]);
  return p;
}

std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  if (!shuffle) {
    std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::iota(p.begin(), p.end(), int64_t{0});
    return p;
  }
  uint64_t mix = seed ^ (0xD1B54A32D192ED03ull * uint64_t(epoch + 1));
  return shuffled_indices(n, splitmix64(mix));
}

}  // namespace onnxtrain

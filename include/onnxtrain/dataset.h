// Datasets for training loops: named arrays ("columns") that share their first dimension, one
// row per example, cut into batches of rows in a (shuffled) order.
//
//   Dataset data(load_npz("train.npz", {"x", "y"}), "train.npz");
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     std::vector<int64_t> order = epoch_order(data.size(), /*shuffle=*/true, seed, epoch);
//     for (int64_t b = 0; b < data.num_batches(32); ++b) {
//       std::vector<Tensor> batch = data.batch(order, b, 32);  // rows of x, rows of y
//       ...
//     }
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "onnxtrain/npz.h"

namespace onnxtrain {

class Dataset {
 public:
  Dataset() = default;
  // Every column needs rank >= 1 and the same first dimension; errors name the description
  // (usually the file) and the column.
  Dataset(std::vector<NamedArray> columns, std::string description);

  int64_t size() const { return size_; }  // number of examples (rows)
  const std::vector<NamedArray>& columns() const { return columns_; }
  const std::string& description() const { return description_; }

  // Batches per pass: the last one is partial unless drop_last.
  int64_t num_batches(int64_t batch_size, bool drop_last = false) const;
  // Batch b of a pass in `order`: rows order[b * batch_size, ...) of every column, as new
  // tensors of shape [rows, ...], in column order.
  std::vector<Tensor> batch(const std::vector<int64_t>& order, int64_t b, int64_t batch_size) const;

  // Converts column i to dtype. Any numeric or bool conversion works as numpy's astype, except
  // that floating-point values going to an integer dtype must be whole numbers in its range.
  void convert_column(size_t i, DType dtype);

 private:
  std::vector<NamedArray> columns_;
  std::string description_;
  int64_t size_ = 0;
};

// A uniformly random permutation of [0, n), the same on every platform for a given seed
// (SplitMix64 draws, unbiased bounded integers, Fisher-Yates).
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed);
// The row order of one epoch: 0..n-1, or a permutation drawn from (seed, epoch) alone, so a run
// resumed mid-epoch sees the same order.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

}  // namespace onnxtrain

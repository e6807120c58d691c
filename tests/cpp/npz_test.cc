// .npz reading and writing, and the Dataset built on it. Files numpy writes are checked from
// Python (tests/python/test_npz.py); here: round trips, and damaged files, which must all be
// clear errors naming the file (never a crash, never different values).
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "onnxtrain/dataset.h"
#include "onnxtrain/npz.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using test::error_of;

class NpzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("onnxtrain_npz_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string read(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  static void write(const std::string& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
  }

  fs::path dir_;
};

std::vector<NamedArray> sample_arrays() {
  return {
      {"x", Tensor::from_vector<float>({1.5f, -2.f, 3.25f, 0.f, 1e-7f, 6.f}, {2, 3})},
      {"y", Tensor::from_vector<int64_t>({0, 9, -3}, {3})},
      {"flags", Tensor::from_vector<bool>({true, false, true, true}, {2, 2})},
      {"d", Tensor::from_vector<double>({3.141592653589793}, {})},
      {"u8", Tensor::from_vector<uint8_t>({0, 255, 7}, {3, 1})},
      {"empty", Tensor::from_vector<int32_t>({}, {0, 4})},
  };
}

void expect_same(const std::vector<NamedArray>& a, const std::vector<NamedArray>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].value.dtype(), b[i].value.dtype()) << a[i].name;
    EXPECT_EQ(a[i].value.shape(), b[i].value.shape()) << a[i].name;
    ASSERT_EQ(a[i].value.nbytes(), b[i].value.nbytes()) << a[i].name;
    EXPECT_EQ(0, std::memcmp(a[i].value.data(), b[i].value.data(), a[i].value.nbytes())) << a[i].name;
  }
}

TEST_F(NpzTest, RoundTripKeepsNamesDtypesShapesAndBytes) {
  save_npz(path("a.npz"), sample_arrays());
  expect_same(load_npz(path("a.npz")), sample_arrays());
  std::vector<NpzEntry> entries = list_npz(path("a.npz"));
  ASSERT_EQ(entries.size(), 6u);
  EXPECT_EQ(entries[0].name, "x");
  EXPECT_EQ(entries[0].dtype, DType::kFloat32);
  EXPECT_EQ(entries[0].shape, (Shape{2, 3}));
  EXPECT_FALSE(entries[0].compressed);
}

TEST_F(NpzTest, SelectedArraysComeInTheOrderAsked) {
  save_npz(path("a.npz"), sample_arrays());
  std::vector<NamedArray> got = load_npz(path("a.npz"), {"y", "x"});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name, "y");
  EXPECT_EQ(got[1].name, "x");
  std::string e = error_of([&] { load_npz(path("a.npz"), {"nope"}); });
  EXPECT_NE(e.find("no array named 'nope'"), std::string::npos) << e;
  EXPECT_NE(e.find("x, y, flags"), std::string::npos) << e;
}

TEST_F(NpzTest, WriterRejectsBadInputAndKeepsTheOldFile) {
  save_npz(path("a.npz"), sample_arrays());
  const std::string before = read(path("a.npz"));
  std::vector<NamedArray> twice = {{"x", Tensor::scalar<float>(1)}, {"x", Tensor::scalar<float>(2)}};
  EXPECT_NE(error_of([&] { save_npz(path("a.npz"), twice); }).find("given twice"), std::string::npos);
  std::vector<NamedArray> bf16 = {{"b", Tensor::zeros(DType::kBFloat16, {2})}};
  EXPECT_NE(error_of([&] { save_npz(path("a.npz"), bf16); }).find("no numpy equivalent"), std::string::npos);
  EXPECT_EQ(read(path("a.npz")), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // no temporaries left
}

// Every single-byte change either fails with an error naming the file, or leaves the arrays
// exactly as written (bytes no reader uses: timestamps, attributes, "version made by").
TEST_F(NpzTest, EveryFlippedByteIsAnErrorOrHarmless) {
  save_npz(path("a.npz"), sample_arrays());
  const std::string good = read(path("a.npz"));
  int errors = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = char(bad[i] ^ 0x5A);
    write(path("b.npz"), bad);
    try {
      expect_same(load_npz(path("b.npz")), sample_arrays());
    } catch (const Error& e) {
      ++errors;
      ASSERT_NE(std::string(e.what()).find("npz '" + path("b.npz") + "'"), std::string::npos) << e.what();
    }
    if (HasFailure()) FAIL() << "byte " << i;
  }
  EXPECT_GT(errors, int(good.size()) * 3 / 4);
}

TEST_F(NpzTest, EveryTruncationIsAnError) {
  save_npz(path("a.npz"), sample_arrays());
  const std::string good = read(path("a.npz"));
  for (size_t n = 0; n < good.size(); ++n) {
    write(path("b.npz"), good.substr(0, n));
    std::string e = error_of([&] { load_npz(path("b.npz")); });
    ASSERT_NE(e.find("npz '"), std::string::npos) << "length " << n << ": " << e;
  }
}

TEST_F(NpzTest, DataCorruptionNamesTheArray) {
  save_npz(path("a.npz"), {{"weights", Tensor::from_vector<float>({1, 2, 3, 4}, {4})}});
  std::string bytes = read(path("a.npz"));
  const std::string one("\x00\x00\x80\x3f", 4);  // 1.0f
  size_t at = bytes.find(one);
  ASSERT_NE(at, std::string::npos);
  bytes[at + 3] = 0x40;
  write(path("a.npz"), bytes);
  std::string e = error_of([&] { load_npz(path("a.npz")); });
  EXPECT_NE(e.find("array 'weights'"), std::string::npos) << e;
  EXPECT_NE(e.find("CRC-32 mismatch"), std::string::npos) << e;
}

TEST_F(NpzTest, NotAnArchive) {
  write(path("a.npz"), "hello, this is not a zip file at all");
  EXPECT_NE(error_of([&] { load_npz(path("a.npz")); }).find("not a zip archive"), std::string::npos);
  EXPECT_NE(error_of([&] { load_npz(path("missing.npz")); }).find("cannot open"), std::string::npos);
}

TEST(DatasetTest, BatchesGatherRowsInOrder) {
  Dataset d({{"x", Tensor::from_vector<float>({0, 1, 10, 11, 20, 21, 30, 31, 40, 41}, {5, 2})},
             {"y", Tensor::from_vector<int64_t>({0, 1, 2, 3, 4}, {5})}},
            "test");
  EXPECT_EQ(d.size(), 5);
  EXPECT_EQ(d.num_batches(2), 3);
  EXPECT_EQ(d.num_batches(2, /*drop_last=*/true), 2);
  std::vector<int64_t> order = {4, 2, 0, 1, 3};
  std::vector<Tensor> b = d.batch(order, 0, 2);
  EXPECT_EQ(b[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(b[0].data<float>()[0], 40);
  EXPECT_EQ(b[0].data<float>()[3], 21);
  EXPECT_EQ(b[1].data<int64_t>()[1], 2);
  std::vector<Tensor> last = d.batch(order, 2, 2);  // partial
  EXPECT_EQ(last[1].shape(), (Shape{1}));
  EXPECT_EQ(last[1].data<int64_t>()[0], 3);
}

TEST(DatasetTest, ColumnsMustShareTheirRows) {
  std::string e = error_of([] {
    Dataset({{"x", Tensor::zeros(DType::kFloat32, {4, 2})}, {"y", Tensor::zeros(DType::kInt64, {3})}}, "data.npz");
  });
  EXPECT_NE(e.find("data.npz: array 'y' has 3 rows but 'x' has 4"), std::string::npos) << e;
  e = error_of([] { Dataset({{"s", Tensor::scalar<float>(1)}}, "data.npz"); });
  EXPECT_NE(e.find("'s' is a scalar"), std::string::npos) << e;
}

TEST(DatasetTest, ConversionChecksFloatToIntegerValues) {
  Dataset d({{"y", Tensor::from_vector<double>({0, 3, 9}, {3})}, {"x", Tensor::from_vector<int32_t>({1, 2, 3}, {3})}},
            "d");
  d.convert_column(0, DType::kInt64);
  d.convert_column(1, DType::kFloat32);
  EXPECT_EQ(d.columns()[0].value.data<int64_t>()[2], 9);
  EXPECT_EQ(d.columns()[1].value.data<float>()[1], 2.f);
  Dataset frac({{"y", Tensor::from_vector<float>({0, 1.5f}, {2})}}, "d");
  std::string e = error_of([&] { frac.convert_column(0, DType::kInt64); });
  EXPECT_NE(e.find("element 1 is 1.5, not a whole number"), std::string::npos) << e;
  Dataset big({{"y", Tensor::from_vector<double>({300}, {1})}}, "d");
  EXPECT_NE(error_of([&] { big.convert_column(0, DType::kUint8); }).find("element 0 is 300"), std::string::npos);
}

TEST(DatasetTest, ShuffleIsAPermutationFixedBySeedAndEpoch) {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    std::vector<int64_t> p = shuffled_indices(n, 42);
    std::set<int64_t> seen(p.begin(), p.end());
    EXPECT_EQ(int64_t(seen.size()), n);
    if (n) {
      EXPECT_EQ(*seen.rbegin(), n - 1);
    }
  }
  EXPECT_EQ(epoch_order(100, true, 1, 3), epoch_order(100, true, 1, 3));
  EXPECT_NE(epoch_order(100, true, 1, 3), epoch_order(100, true, 1, 4));
  EXPECT_NE(epoch_order(100, true, 1, 3), epoch_order(100, true, 2, 3));
  std::vector<int64_t> identity = epoch_order(5, false, 1, 3);
  EXPECT_EQ(identity, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // Pinned (and checked against a Python transcription of SplitMix64 + Lemire + Fisher-Yates) so
  // every platform and build draws the same batches: resumed runs depend on it.
  EXPECT_EQ(shuffled_indices(8, 7), (std::vector<int64_t>{7, 4, 6, 1, 2, 5, 0, 3}));
}

}  // namespace
}  // namespace onnxtrain

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain {

TEST(Tensor, EmptyIsAlignedAndSized) {
  Tensor t = Tensor::empty(DType::kFloat32, {3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.dim(-1), 5);
}

TEST(Tensor, ReshapedSharesStorageAndChecksCount) {
  Tensor t = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = t.reshaped({3, 2});
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(v.data<float>()[5], 6.0f);
  EXPECT_THROW(t.reshaped({4, 2}), Error);
  Tensor c = t.clone();
  EXPECT_FALSE(c.shares_storage_with(t));
}

TEST(Tensor, TypedAccessChecksDtype) {
  Tensor t = Tensor::zeros(DType::kInt64, {2});
  EXPECT_NO_THROW(t.data<int64_t>());
  EXPECT_THROW(t.data<float>(), Error);
}

TEST(Tensor, NegativeDimsAreRejected) { EXPECT_THROW(Tensor::empty(DType::kFloat32, {2, -1}), Error); }

// Shapes declared in files can multiply past 64 bits (a fuzzed Reshape did, in its shape rule):
// an error naming the shape, while a 0 anywhere still makes it empty.
TEST(Tensor, ElementCountsPast64BitsAreAnError) {
  const Shape huge = {int64_t(1) << 40, int64_t(1) << 30};
  EXPECT_THROW(numel(huge), Error);
  try {
    numel(huge);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[1099511627776, 1073741824]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(numel({int64_t(1) << 40, int64_t(1) << 30, 0}), 0);
  EXPECT_EQ(numel({int64_t(1) << 31, int64_t(1) << 31}), int64_t(1) << 62);
}

TEST(Float16, RoundTripsEveryHalfValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    float16 h = float16::from_bits(uint16_t(bits));
    float f = float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(float(float16(f))));
      continue;
    }
    EXPECT_EQ(float16(f).bits, h.bits) << "bits " << bits;
  }
}

TEST(Float16, RoundsToNearestEvenAndSaturatesToInf) {
  EXPECT_EQ(float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(float16(70000.0f).bits, 0x7c00);
  EXPECT_EQ(float16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  // 1 + 2^-11 lies halfway between 1 and the next half: ties go to even (1.0).
  EXPECT_EQ(float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(float(float16::from_bits(0x0001)), std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float(bfloat16(3.140625f)), 3.140625f);
  EXPECT_TRUE(std::isnan(float(bfloat16(std::nanf("")))));
}

// cast_value is the one element conversion: its edges are defined, never UB (UBSan checks this
// test in the sanitizer build, where a plain static_cast of 1e20f to int32 is reported).
TEST(CastValue, FloatToIntegerSaturatesAndNaNIsZero) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(cast_value<int32_t>(nan), 0);
  EXPECT_EQ(cast_value<int32_t>(inf), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(cast_value<int32_t>(-inf), std::numeric_limits<int32_t>::lowest());
  EXPECT_EQ(cast_value<int32_t>(1e20f), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(cast_value<int8_t>(-1e20), std::numeric_limits<int8_t>::lowest());
  EXPECT_EQ(cast_value<uint8_t>(300.7f), 255);
  EXPECT_EQ(cast_value<uint8_t>(-1.0), 0);
  EXPECT_EQ(cast_value<uint64_t>(-0.5), 0u);
  EXPECT_EQ(cast_value<int64_t>(9.3e18), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(cast_value<int64_t>(-9.3e18), std::numeric_limits<int64_t>::lowest());
  // In range: truncation toward zero, as static_cast.
  EXPECT_EQ(cast_value<int32_t>(-2.9f), -2);
  EXPECT_EQ(cast_value<int16_t>(32767.9), 32767);
  EXPECT_EQ(cast_value<int32_t>(float16(-7.5f)), -7);
  EXPECT_EQ(cast_value<uint8_t>(bfloat16(inf)), 255);
}

TEST(CastValue, IntegersWrapBoolsAndHalfTypes) {
  EXPECT_EQ(cast_value<int8_t>(int32_t(200)), int8_t(-56));
  EXPECT_EQ(cast_value<uint16_t>(int64_t(-1)), 65535);
  EXPECT_TRUE(cast_value<bool>(0.25f));
  EXPECT_FALSE(cast_value<bool>(int64_t(0)));
  EXPECT_TRUE(cast_value<bool>(std::numeric_limits<double>::quiet_NaN()));  // nonzero
  EXPECT_EQ(float(cast_value<float16>(true)), 1.0f);
  EXPECT_EQ(float(cast_value<bfloat16>(int64_t(3))), 3.0f);
  EXPECT_TRUE(std::isinf(float(cast_value<float16>(1e6))));  // beyond half's range: inf, as IEEE rounding
  EXPECT_EQ(cast_value<double>(float16(0.5f)), 0.5);
}

TEST(Dispatch, CallsWithTheMatchingType) {
  EXPECT_EQ(dispatch_all(DType::kInt16, []<typename T>() { return sizeof(T); }), 2u);
  EXPECT_TRUE((dispatch_float(DType::kBFloat16, []<typename T>() { return std::is_same_v<T, bfloat16>; })));
  EXPECT_THROW(dispatch_float(DType::kInt32, []<typename T>() { return 0; }), Error);
  EXPECT_EQ((cast_value<int64_t>(float16(3.0f))), 3);
  EXPECT_EQ((cast_value<bool>(0.5f)), true);
}

}  // namespace onnxtrain

// The storage of long-lived buffers (core/memory): large ones are mappings of their own on 2 MiB
// boundaries advised to use huge pages, zero-filled ones are zeros, and tensors carved from one
// allocation behave as separately allocated ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/memory.h"

namespace onnxtrain {
namespace {

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i]) return false;
  return true;
}

// The VmFlags line of the mapping that holds p, from /proc/self/smaps ("" when there is none).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find("kB") == std::string::npos)
      inside = lo <= at && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

TEST(MemoryTest, LargeStorageIsAHugePageAdvisedMappingOfZeros) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const size_t bytes = 5 * kHugePageBytes + 4096;
  for (int round = 0; round < 2; ++round) {  // the second gets memory the first wrote and gave back
    std::shared_ptr<void> s = allocate_storage(bytes, Fill::kZeros);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.get()) % kHugePageBytes, 0u);
    const std::string flags = vm_flags_of(s.get());
    EXPECT_NE(flags.find(" hg"), std::string::npos) << "no MADV_HUGEPAGE advice: " << flags;
    EXPECT_TRUE(all_zero(s.get(), bytes));
    std::memset(s.get(), 0xab, bytes);
  }
}

TEST(MemoryTest, SmallStorageIsAlignedAndZeroedWhenAsked) {
  for (size_t bytes : {size_t(1), size_t(100), size_t(100000), kHugePageBytes - 1}) {
    for (int i = 0; i < 4; ++i) {  // dirty the heap blocks the zeroed one is likely to reuse
      std::shared_ptr<void> dirty = allocate_storage(bytes, Fill::kUninitialized);
      std::memset(dirty.get(), 0xcd, bytes);
    }
    std::shared_ptr<void> s = allocate_storage(bytes, Fill::kZeros);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.get()) % 64, 0u) << bytes << " bytes";
    EXPECT_TRUE(all_zero(s.get(), bytes)) << bytes << " bytes";
  }
}

TEST(MemoryTest, TensorsFromOneAllocationAreSeparateTensors) {
  const std::vector<TensorSpec> specs = {
      {DType::kFloat32, {3, 5}}, {DType::kInt64, {0}}, {DType::kFloat32, {1000, 1000}}, {DType::kUint8, {7}}};
  std::vector<std::weak_ptr<void>> holders;
  std::vector<Tensor> t = allocate_tensors(specs, Fill::kZeros, &holders);
  ASSERT_EQ(t.size(), specs.size());
  ASSERT_EQ(holders.size(), specs.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].dtype(), specs[i].dtype);
    EXPECT_EQ(t[i].shape(), specs[i].shape);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t[i].data()) % 64, 0u) << "tensor " << i;
    EXPECT_TRUE(all_zero(t[i].data(), t[i].nbytes())) << "tensor " << i;
    EXPECT_EQ(holders[i].use_count(), 1) << "tensor " << i;
    for (size_t j = 0; j < i; ++j) {
      EXPECT_FALSE(t[i].shares_storage_with(t[j])) << i << " and " << j;
      const auto* a = static_cast<const char*>(t[i].data());
      const auto* b = static_cast<const char*>(t[j].data());
      EXPECT_TRUE(a >= b + std::max<size_t>(t[j].nbytes(), 1) || b >= a + std::max<size_t>(t[i].nbytes(), 1))
          << i << " and " << j << " overlap";
    }
  }
  Tensor copy = t[2];
  EXPECT_EQ(holders[2].use_count(), 2);
  EXPECT_TRUE(copy.shares_storage_with(t[2]));
  // The storage lives while any of its tensors does.
  Tensor last = t[3];
  t.clear();
  copy = Tensor();
  EXPECT_TRUE(holders[0].expired());
  EXPECT_EQ(holders[3].use_count(), 1);
  std::memset(last.data(), 0x5a, last.nbytes());
  EXPECT_EQ(last.data<uint8_t>()[6], 0x5a);
}

TEST(MemoryTest, LargeTensorsAreMappingsOfTheirOwnGoneWithTheTensor) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const void* at = nullptr;
  {
    Tensor large = Tensor::empty(DType::kFloat32, {33, 1 << 18});  // 33 MiB
    at = large.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % kHugePageBytes, 0u);
    EXPECT_NE(vm_flags_of(at).find(" hg"), std::string::npos);
    Tensor alias = large;  // a copy shares the mapping: it outlives the first name
    large = Tensor();
    std::memset(alias.data(), 0x5a, alias.nbytes());
    EXPECT_NE(vm_flags_of(at), "");
  }
  EXPECT_EQ(vm_flags_of(at), "") << "the mapping outlived its last tensor";
  Tensor small = Tensor::empty(DType::kFloat32, {31, 1 << 18});  // 31 MiB: the heap's
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(small.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(small.shape(), (Shape{31, 1 << 18}));
  EXPECT_THROW(Tensor::empty(DType::kFloat32, {1 << 20, -1}), Error);
}

// carve_tensors lays tensors out as allocate_tensors does, on the caller's storage, whose own
// release runs once the last tensor dies (TrainModule takes a dead block's memory back that way).
TEST(MemoryTest, CarvedTensorsReleaseTheStorageWithTheLastOfThem) {
  const std::vector<TensorSpec> specs{{DType::kFloat32, {3}}, {DType::kInt64, {0}}, {DType::kFloat64, {2, 5}}};
  EXPECT_EQ(tensors_bytes(specs), size_t(64 + 64 + 128));
  std::vector<char> bytes(tensors_bytes(specs) + 64);
  char* base = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
  int released = 0;
  std::vector<Tensor> t = carve_tensors(std::shared_ptr<void>(base, [&](void*) { ++released; }), specs);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].data(), base);
  EXPECT_EQ(t[1].data(), base + 64);  // an empty tensor still has an address of its own
  EXPECT_EQ(t[2].data(), base + 128);
  EXPECT_EQ(t[2].shape(), (Shape{2, 5}));
  Tensor last = t[1];
  t.clear();
  EXPECT_EQ(released, 0) << "released while a tensor still lives";
  last = Tensor();
  EXPECT_EQ(released, 1);
  EXPECT_THROW(carve_tensors(std::shared_ptr<void>(base + 1, [](void*) {}), specs), Error);
}

TEST(MemoryTest, BadSpecsAreErrors) {
  EXPECT_THROW(allocate_tensors({{DType::kString, {2}}}, Fill::kZeros), Error);
  EXPECT_THROW(allocate_tensors({{DType::kFloat32, {2, -1}}}, Fill::kZeros), Error);
}

}  // namespace
}  // namespace onnxtrain

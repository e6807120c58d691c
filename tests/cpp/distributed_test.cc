// src/distributed without MPI: gradient buckets over a scripted communicator, checksums, and the
// single-rank world.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>

#include "distributed/data_parallel.h"

using namespace onnxtrain;
using namespace onnxtrain::distributed;

namespace {

// Rank 0 of 2, where the other rank's gradient is always `other` everywhere: allreduce adds it.
// Records each call's element count; allgather pretends rank 1 sends `peer_value`.
class ScriptedCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  const char* backend() const override { return "scripted"; }
  void allreduce_sum(void* data, int64_t count, DType dtype) override {
    counts.push_back(count);
    if (dtype == DType::kFloat32)
      for (int64_t i = 0; i < count; ++i) static_cast<float*>(data)[i] += float(other);
    else
      for (int64_t i = 0; i < count; ++i) static_cast<double*>(data)[i] += other;
  }
  void broadcast(void*, int64_t, int) override {}
  void allgather(const void* send, int64_t bytes, void* recv) override {
    std::memcpy(recv, send, size_t(bytes));
    std::memcpy(static_cast<char*>(recv) + bytes, &peer_value, size_t(bytes));
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  // Posted jobs wait in a queue until drain(), so a test sees which buckets have started.
  void post(std::function<void()> job) override { jobs.push_back(std::move(job)); }
  void drain() override {
    for (auto& job : jobs) job();
    jobs.clear();
  }

  std::vector<std::function<void()>> jobs;
  double other = 1.0;
  uint64_t peer_value = 0;
  std::vector<int64_t> counts;
};

Tensor filled(int64_t n, float start) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + float(i);
  return Tensor::from_vector(v, {n});
}

}  // namespace

TEST(GradientAllreducer, PacksBucketsAndAverages) {
  ScriptedCommunicator comm;
  comm.other = 3.0;
  // 10 + 20 floats fit in a 128-byte bucket (120 bytes); 40 floats (160 bytes) go alone; 5 + 6 share one.
  std::vector<Tensor> grads = {filled(10, 0), filled(20, 100), filled(40, 200), filled(5, 300), filled(6, 400)};
  std::vector<Tensor> before;
  for (const Tensor& g : grads) before.push_back(g.clone());
  GradientAllreducer reducer(comm, 128);
  reducer.average(grads);
  EXPECT_EQ(comm.counts, (std::vector<int64_t>{30, 40, 11}));
  EXPECT_EQ(reducer.last_bucket_sizes(), (std::vector<int64_t>{2, 1, 2}));
  for (size_t t = 0; t < grads.size(); ++t)
    for (int64_t i = 0; i < grads[t].numel(); ++i)
      ASSERT_FLOAT_EQ(grads[t].data<float>()[i], (before[t].data<float>()[i] + 3.0f) / 2.0f) << "tensor " << t;
  EXPECT_EQ(reducer.stats().calls, 3);
  EXPECT_EQ(reducer.stats().bytes, (30 + 40 + 11) * 4);
}

TEST(GradientAllreducer, ReadyOrderCutsTheBuckets) {
  ScriptedCommunicator comm;
  // In ready order 4, 3, 2, 1, 0: (6 + 5) floats, then 40 alone, then 20 + 10.
  std::vector<Tensor> grads = {filled(10, 0), filled(20, 100), filled(40, 200), filled(5, 300), filled(6, 400)};
  GradientAllreducer reducer(comm, 128);
  reducer.set_order({4, 3, 2, 1, 0});
  reducer.average(grads);
  EXPECT_EQ(comm.counts, (std::vector<int64_t>{11, 40, 30}));
  EXPECT_EQ(reducer.last_bucket_sizes(), (std::vector<int64_t>{2, 1, 2}));
  EXPECT_THROW(reducer.set_order({0, 0, 1, 2, 3}), Error);
}

TEST(GradientAllreducer, OverlappedStartsFullBucketsInOrderAndMatchesBlocking) {
  ScriptedCommunicator comm;
  comm.other = 0.37;
  std::vector<Tensor> blocking = {filled(10, 0.1f), filled(20, 100.3f), filled(40, 200.7f), filled(5, 300.9f),
                                  filled(6, 400.2f)};
  std::vector<Tensor> overlapped;
  for (const Tensor& g : blocking) overlapped.push_back(g.clone());
  GradientAllreducer a(comm, 128), b(comm, 128);
  a.set_order({4, 3, 2, 1, 0});
  b.set_order({4, 3, 2, 1, 0});
  a.average(blocking);
  comm.counts.clear();
  b.begin(overlapped);
  b.ready(1, overlapped[1]);  // bucket 2 (tensors 1, 0) is not full
  b.ready(4, overlapped[4]);  // bucket 0 (4, 3) is not full
  EXPECT_EQ(comm.jobs.size(), 0u);
  b.ready(0, overlapped[0]);  // bucket 2 is full, but buckets 0 and 1 have not started
  EXPECT_EQ(comm.jobs.size(), 0u);
  b.ready(3, overlapped[3]);  // bucket 0 starts
  EXPECT_EQ(comm.jobs.size(), 1u);
  b.ready(2, overlapped[2]);  // bucket 1 and then the waiting bucket 2
  EXPECT_EQ(comm.jobs.size(), 3u);
  b.finish();
  EXPECT_EQ(comm.counts, (std::vector<int64_t>{11, 40, 30}));
  for (size_t t = 0; t < blocking.size(); ++t)
    EXPECT_EQ(std::memcmp(blocking[t].data(), overlapped[t].data(), blocking[t].nbytes()), 0) << "tensor " << t;
  EXPECT_EQ(b.stats().overlapped_steps, 1);
  EXPECT_EQ(b.stats().calls, 3);
}

TEST(GradientAllreducer, OverlappedStepMissingAGradientIsAnError) {
  ScriptedCommunicator comm;
  std::vector<Tensor> grads = {filled(4, 0), filled(4, 1)};
  GradientAllreducer reducer(comm, 1 << 20);
  reducer.begin(grads);
  reducer.ready(0, grads[0]);
  EXPECT_THROW(reducer.ready(0, grads[0]), Error);  // twice
  EXPECT_THROW(reducer.ready(1, filled(3, 0)), Error);  // not its parameter's shape
  try {
    reducer.finish();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never handed over"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(reducer.in_step());
}

TEST(GradientAllreducer, DtypeChangeStartsANewBucket) {
  ScriptedCommunicator comm;
  std::vector<Tensor> grads = {filled(4, 0), Tensor::from_vector(std::vector<double>{1, 2}, {2}), filled(4, 0)};
  GradientAllreducer reducer(comm, 1 << 20);
  reducer.average(grads);
  EXPECT_EQ(comm.counts, (std::vector<int64_t>{4, 2, 4}));
  EXPECT_DOUBLE_EQ(grads[1].data<double>()[1], 1.5);
}

TEST(GradientAllreducer, RejectsIntegerGradients) {
  ScriptedCommunicator comm;
  std::vector<Tensor> grads = {Tensor::from_vector(std::vector<int64_t>{1}, {1})};
  GradientAllreducer reducer(comm, 1 << 20);
  try {
    reducer.average(grads);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
  }
}

TEST(DataParallelChecks, MismatchNamesTheRank) {
  ScriptedCommunicator comm;
  comm.peer_value = 7;
  EXPECT_NO_THROW(check_same_on_all_ranks(comm, 7, "x"));
  try {
    check_same_on_all_ranks(comm, 8, "the artifacts");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank(s) 1 differ from rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("the artifacts"), std::string::npos) << m;
  }
}

TEST(DataParallelChecks, ChecksumSeesValuesAndShapes) {
  Tensor a = filled(6, 0);
  Tensor b = a.clone();
  EXPECT_EQ(checksum({a}), checksum({b}));
  b.data<float>()[5] = 5.5f;
  EXPECT_NE(checksum({a}), checksum({b}));
  Tensor c = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_NE(checksum({a}), checksum({c}));
}

TEST(DistributedWorld, OutsideALauncherIsOneRank) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) GTEST_SKIP() << "running under mpirun";
  const DistributedWorld w = distributed_init();
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.backend, "single");
}

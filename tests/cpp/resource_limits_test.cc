// Resource limits (include/onnxtrain/limits.h): tensor memory past ONNXTRAIN_MAX_ALLOC /
// set_resource_limits is an error naming the request and the limit, not an out-of-memory kill, and
// a Loop that never ends fails at the iteration limit; within the limits results are unchanged.
// The environment variables themselves are tested from Python (tests/python/test_resource_limits.py,
// a fresh process each).
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include "onnx/model_io.h"
#include "onnxtrain/limits.h"
#include "onnxtrain/session.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

using test::error_of;
using test::make_model;
using test::make_node;
using test::value;

// Sets limits for one test and puts the previous ones back.
class ResourceLimitsTest : public test::TempDirTest {
 protected:
  void SetUp() override {
    test::TempDirTest::SetUp();
    saved_ = resource_limits();
  }
  void TearDown() override {
    set_resource_limits(saved_);
    test::TempDirTest::TearDown();
  }
  void limit(uint64_t bytes, int64_t loops = 0) {
    ResourceLimits l = saved_;
    l.max_alloc_bytes = bytes;
    if (loops) l.max_loop_iterations = loops;
    set_resource_limits(l);
  }
  ResourceLimits saved_;
};

TEST_F(ResourceLimitsTest, TensorMemoryIsCountedAndCapped) {
  limit(uint64_t(8) << 20);
  const uint64_t before = live_tensor_bytes();
  {
    Tensor small = Tensor::zeros(DType::kFloat32, {1 << 19});  // 2 MiB: within the limit
    Tensor large = Tensor::empty(DType::kFloat32, {1 << 20});  // 4 MiB: huge-page storage, within
    EXPECT_EQ(live_tensor_bytes(), before + (uint64_t(6) << 20));
    // 6 MiB live + 4 MiB more passes 8 MiB.
    const std::string what = error_of([] { Tensor::empty(DType::kFloat32, {1 << 20}); });
    EXPECT_NE(what.find("allocating 4194304 bytes of tensor storage"), std::string::npos) << what;
    EXPECT_NE(what.find("memory limit of 8388608 bytes (ONNXTRAIN_MAX_ALLOC"), std::string::npos) << what;
    EXPECT_EQ(live_tensor_bytes(), before + (uint64_t(6) << 20));  // the refused request is not counted
  }
  EXPECT_EQ(live_tensor_bytes(), before);  // released with the tensors
  // A shape whose size passes 64 bits is an error before any allocation.
  const std::string what = error_of([] { Tensor::empty(DType::kFloat32, {int64_t(1) << 40, int64_t(1) << 40}); });
  EXPECT_NE(what.find("passes 2^62 bytes"), std::string::npos) << what;
}

// A model that declares a 4 GiB initializer in external data (the file holds 2400 bytes): loading
// it under a 64 MiB limit fails at the allocation, naming it, instead of mapping 4 GiB.
TEST_F(ResourceLimitsTest, DeclaredExternalDataPastTheLimitIsAnError) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{600})};
  g.outputs = {value("y", DType::kFloat32, Shape{600})};
  g.initializers["big"] = Tensor::zeros(DType::kFloat32, {600});
  g.nodes = {make_node("Mul", {"x", "big"}, {"y"})};
  save_model(make_model(std::move(g)), path("m.onnx"), /*force_external_data=*/true);
  load_model(path("m.onnx"));  // loads within the default limit
  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(test::read_file(path("m.onnx"))));
  for (auto& init : *proto.mutable_graph()->mutable_initializer())
    if (init.name() == "big") init.set_dims(0, int64_t(1) << 30);  // x 4 bytes = 4 GiB
  test::write_file(path("huge.onnx"), proto.SerializeAsString());
  limit(uint64_t(64) << 20);
  const std::string what = error_of([&] { load_model(path("huge.onnx")); });
  EXPECT_NE(what.find("memory limit of 67108864 bytes"), std::string::npos) << what;
}

// ConstantOfShape asked for 2^31 floats (8 GiB) by its input: the kernel's allocation fails with
// the limit's error; a small shape runs.
TEST_F(ResourceLimitsTest, ShapesComputedAtRunTimePastTheLimitAreAnError) {
  Graph g;
  g.inputs = {value("shape", DType::kInt64, Shape{2})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("ConstantOfShape", {"shape"}, {"y"})};
  g.nodes[0].attributes["value"] = Attribute::of(Tensor::from_vector<float>({1.5f}, {1}));
  InferenceSession session = InferenceSession::from_bytes(save_model_to_bytes(make_model(std::move(g))));
  limit(uint64_t(64) << 20);
  std::vector<Tensor> out = session.run({{"shape", Tensor::from_vector<int64_t>({3, 4}, {2})}});
  EXPECT_EQ(out[0].shape(), (Shape{3, 4}));
  EXPECT_EQ(out[0].data<float>()[11], 1.5f);
  const std::string what =
      error_of([&] { session.run({{"shape", Tensor::from_vector<int64_t>({1 << 16, 1 << 15}, {2})}}); });
  EXPECT_NE(what.find("memory limit of 67108864 bytes"), std::string::npos) << what;
}

// v counts iterations: Loop(M, cond=true) with body (i, cond, v) -> (cond, v + 1).
Model counting_loop(bool with_trip_count) {
  auto body = std::make_shared<Graph>();
  body->name = "body";
  body->inputs = {value("i", DType::kInt64, Shape{}), value("cond_in", DType::kBool, Shape{}),
                  value("v_in", DType::kInt64, Shape{})};
  body->outputs = {value("cond_out", DType::kBool, Shape{}), value("v_out", DType::kInt64, Shape{})};
  body->initializers["one"] = Tensor::scalar<int64_t>(1);
  body->nodes = {make_node("Identity", {"cond_in"}, {"cond_out"}), make_node("Add", {"v_in", "one"}, {"v_out"})};
  Graph g;
  g.inputs = {value("v0", DType::kInt64, Shape{})};
  g.outputs = {value("v", DType::kInt64, Shape{})};
  g.initializers["cond"] = Tensor::scalar<bool>(true);
  g.initializers["M"] = Tensor::scalar<int64_t>(50);
  Node loop = make_node("Loop", {with_trip_count ? "M" : "", "cond", "v0"}, {"v"});
  Attribute a;
  a.kind = Attribute::Kind::kGraph;
  a.g = body;
  loop.attributes["body"] = a;
  g.nodes = {loop};
  return make_model(std::move(g));
}

TEST_F(ResourceLimitsTest, ALoopThatNeverEndsFailsAtTheIterationLimit) {
  limit(resource_limits().max_alloc_bytes, 100);
  InferenceSession bounded = InferenceSession::from_bytes(save_model_to_bytes(counting_loop(true)));
  EXPECT_EQ(bounded.run({{"v0", Tensor::scalar<int64_t>(7)}})[0].item_as_int(), 57);  // 50 trips, within 100
  InferenceSession endless = InferenceSession::from_bytes(save_model_to_bytes(counting_loop(false)));
  const std::string what = error_of([&] { endless.run({{"v0", Tensor::scalar<int64_t>(0)}}); });
  EXPECT_NE(what.find("[Loop]"), std::string::npos) << what;
  EXPECT_NE(what.find("ran 100 iterations without ending"), std::string::npos) << what;
  EXPECT_NE(what.find("ONNXTRAIN_MAX_LOOP_ITERATIONS"), std::string::npos) << what;
}

}  // namespace
}  // namespace onnxtrain

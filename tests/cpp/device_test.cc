// The device layer without a GPU: what a build says where no CUDA device is, and the executor's
// device path (device arena, one stream, copies only at the graph's edges and around ops that
// run on the CPU) over a host-memory stand-in registered as the CUDA device for the test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "core/device.h"
#include "ops/registry.h"
#include "runtime/executor.h"
#include "test_util.h"

namespace onnxtrain {
using test::error_of;
using test::make_model;
using test::make_node;
using test::value;

namespace {

// Host memory posing as device memory, counting what the executor asks of it.
class HostDevice final : public DeviceBackend {
 public:
  Device device() const override { return Device::kCuda; }
  std::string description() const override { return "host memory standing in for a device"; }
  std::shared_ptr<void> allocate(size_t bytes) override {
    ++allocations;
    return std::shared_ptr<void>(std::aligned_alloc(256, (bytes + 255) / 256 * 256), std::free);
  }
  Stream create_stream() override {
    ++streams;
    return Stream(new int(0), [](void* p) { delete static_cast<int*>(p); });
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes, const Stream&) override {
    if (dst_device != src_device) ++host_device_copies;
    std::memcpy(dst, src, bytes);
  }
  void synchronize(const Stream&) override { ++synchronizations; }
  int allocations = 0, streams = 0, host_device_copies = 0, synchronizations = 0;
};

HostDevice* g_host_device = nullptr;
DeviceBackend* host_device_probe(std::string*) { return g_host_device; }

// Registers the stand-in for the test's lifetime, then puts back whatever was registered.
class HostDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_host_device = &device_;
    previous_ = register_device_backend(Device::kCuda, host_device_probe);
  }
  void TearDown() override {
    register_device_backend(Device::kCuda, previous_);
    g_host_device = nullptr;
  }
  HostDevice device_;
  DeviceProbe previous_ = nullptr;
};

// onnxtrain.TestDeviceScale(X) -> 2 X, with a "device" kernel that checks it is handed device
// tensors and a stream; the CPU kernel checks host tensors.
int g_device_calls = 0;
void scale_cpu(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.device() == Device::kCpu && ctx.device() == Device::kCpu, "CPU kernel given a device tensor");
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = 2 * x.data<float>()[i];
}
void scale_device(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.device() == Device::kCuda && ctx.device() == Device::kCuda && ctx.stream(), "device kernel given ",
           device_name(x.device()), " input");
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  OT_CHECK(y.device() == Device::kCuda, "device kernel given a ", device_name(y.device()), " output");
  ++g_device_calls;
  for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = 2 * x.data<float>()[i];
}
ONNXTRAIN_OP(TestDeviceScale, kOnnxTrainDomain, 1).inputs(1).outputs(1).cpu(scale_cpu).cuda(scale_device)
    .inplace(0, 0);

// onnxtrain.TestDeviceBump(W) -> W: adds 1 to W in place (as update ops with in_place = 1 do),
// on either device.
void bump(KernelContext& ctx) {
  Tensor w = ctx.input(0);  // shares the input's storage
  OT_CHECK(w.device() == ctx.device(), "kernel given a ", device_name(w.device()), " input");
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] += 1;
  ctx.set_output(0, w);
}
ONNXTRAIN_OP(TestDeviceBump, kOnnxTrainDomain, 1).inputs(1).outputs(1).cpu(bump).cuda(bump)
    .written_inputs([](const Node&, size_t) { return std::vector<size_t>{0}; });

// y = scale(cos(scale(scale(x)))): Cos has no device kernel in any build, so it runs on the host
// between device steps.
Model mixed_model() {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{64})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  Node a = make_node("TestDeviceScale", {"x"}, {"a"}), b = make_node("TestDeviceScale", {"a"}, {"b"});
  Node c = make_node("Cos", {"b"}, {"c"}), d = make_node("TestDeviceScale", {"c"}, {"y"});
  for (Node* n : {&a, &b, &d}) n->domain = kOnnxTrainDomain;
  g.nodes = {a, b, c, d};
  Model m = make_model(std::move(g));
  m.opsets[kOnnxTrainDomain] = 1;
  return m;
}

}  // namespace

TEST(Device, AskingForAMissingDeviceSaysWhy) {
  std::string why;
  if (device_available(Device::kCuda, &why)) GTEST_SKIP() << "this machine has a CUDA device";
  // A build without the backend names the option; a CUDA build without a GPU says so.
  EXPECT_TRUE(why.find("this build has no CUDA backend (configure with -DONNXTRAIN_CUDA=ON)") != std::string::npos ||
              why.rfind("no CUDA device", 0) == 0) << why;
  ExecutorOptions options;
  options.device = Device::kCuda;
  EXPECT_EQ(error_of([&] { Executor(mixed_model(), options); }), why);
  EXPECT_EQ(error_of([&] { empty_on(Device::kCuda, DType::kFloat32, {4}); }), why);
  // Everything else works: the same model on the CPU.
  Executor cpu(mixed_model());
  EXPECT_EQ(cpu.run({{"x", Tensor::from_vector<float>(std::vector<float>(64, 0.5f), {64})}})[0].numel(), 64);
}

TEST_F(HostDeviceTest, StepsRunOnTheDeviceAndCopiesHappenOnlyAtEdges) {
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * float(i) - 0.3f;
  const std::map<std::string, Tensor> feeds{{"x", Tensor::from_vector(x, {64})}};
  Executor cpu(mixed_model());
  const Tensor want = cpu.run(feeds)[0];
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor dev(mixed_model(), options);
  EXPECT_EQ(device_.streams, 1);  // one stream per executor
  for (int run = 0; run < 3; ++run) {
    g_device_calls = 0;
    device_.host_device_copies = 0;
    const Tensor got = dev.run(feeds)[0];
    ASSERT_EQ(got.device(), Device::kCpu);
    for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
    EXPECT_EQ(g_device_calls, 3);
    // The feed in, b out to Cos, c back in: three copies to hand steps their inputs, and the
    // output's copy to the host: four in all, the same in the recording run and planned runs.
    EXPECT_EQ(dev.memory_report().device_copies, 3u) << "run " << run;
    EXPECT_EQ(device_.host_device_copies, 4) << "run " << run;
  }
  // The plan's arena is device memory: planned runs allocate on the device only for the graph
  // output (fresh storage each run, as on the host).
  const int before = device_.allocations;
  dev.run(feeds);
  EXPECT_LE(device_.allocations - before, 3);
  EXPECT_GT(dev.memory_report().planned_arena_bytes, 0u);
  EXPECT_GE(device_.synchronizations, 1);
}

TEST_F(HostDeviceTest, TensorsCrossBetweenDevicesByCopy) {
  Tensor host = Tensor::from_vector<float>({1, 2, 3}, {3});
  Tensor dev = to_device(host, Device::kCuda);
  EXPECT_EQ(dev.device(), Device::kCuda);
  EXPECT_EQ(to_device(dev, Device::kCuda).data(), dev.data());  // already there: no copy
  EXPECT_NE(error_of([&] { dev.item_as_double(0); }).find("cannot read an element of a cuda tensor"), std::string::npos);
  Tensor twin = dev.clone();
  EXPECT_EQ(twin.device(), Device::kCuda);
  EXPECT_NE(twin.data(), dev.data());
  Tensor back = to_device(twin, Device::kCpu);
  EXPECT_EQ(back.device(), Device::kCpu);
  EXPECT_EQ(back.item_as_double(2), 3.0);
}

// An op that writes its inputs in place, given device copies of host values (an initializer, a
// host feed) or host copies of device values (a host step): the values themselves change, on
// every run, whether or not the op's outputs are requested; nothing reverts on the next run.
TEST_F(HostDeviceTest, InPlaceUpdatesOfCopiedInputsReachTheirValues) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{4})};
  g.initializers["w"] = Tensor::from_vector<float>({0, 10, 20, 30}, {4});
  g.outputs = {value("y", DType::kFloat32, std::nullopt), value("w_new", DType::kFloat32, std::nullopt)};
  Node scale = make_node("TestDeviceScale", {"x"}, {"y"}), update = make_node("TestDeviceBump", {"w"}, {"w_new"});
  scale.domain = update.domain = kOnnxTrainDomain;
  g.nodes = {scale, update};
  Model m = make_model(std::move(g));
  m.opsets[kOnnxTrainDomain] = 1;
  const Tensor w = m.graph.initializers.at("w");  // shares the storage the executor updates
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor dev(m, options);
  const std::map<std::string, Tensor> feeds{{"x", Tensor::from_vector<float>({1, 2, 3, 4}, {4})}};
  for (int run = 1; run <= 3; ++run) {
    dev.run(feeds, {"y"});  // the update's output not requested
    EXPECT_EQ(w.item_as_double(1), 10.0 + run) << "run " << run;
  }
  EXPECT_EQ(dev.run(feeds, {"w_new"})[0].item_as_double(3), 34.0);
  EXPECT_EQ(w.item_as_double(3), 34.0);

  // AdamW (in_place = 1) on device-resident float64 state, which runs on the host in every build
  // (a host step without CUDA; run_on_host with it, its device kernel being float32 only): the
  // host copies it wrote go back into the device tensors fed.
  Graph a;
  for (const char* name : {"lr", "step"}) a.inputs.push_back(value(name, DType::kFloat32, Shape{}));
  a.inputs[1] = value("step", DType::kInt64, Shape{});
  for (const char* name : {"p", "g", "m", "v"}) a.inputs.push_back(value(name, DType::kFloat64, Shape{3}));
  a.outputs = {value("p_new", DType::kFloat64, std::nullopt)};
  Node adamw = make_node("AdamW", {"lr", "step", "p", "g", "m", "v"}, {"p_new", "m_new", "v_new"});
  adamw.domain = kOnnxTrainDomain;
  adamw.attributes["in_place"] = Attribute::of(int64_t{1});
  a.nodes = {adamw};
  Model am = make_model(std::move(a));
  am.opsets[kOnnxTrainDomain] = 1;
  auto state = [] {
    return std::map<std::string, Tensor>{{"p", Tensor::from_vector<double>({1, -2, 3}, {3})},
                                         {"g", Tensor::from_vector<double>({0.5, 0.25, -1}, {3})},
                                         {"m", Tensor::zeros(DType::kFloat64, {3})},
                                         {"v", Tensor::zeros(DType::kFloat64, {3})}};
  };
  std::map<std::string, Tensor> host = state(), on_device;
  for (const auto& [name, t] : state()) on_device[name] = to_device(t, Device::kCuda);
  Executor cpu_update(am), dev_update(am, options);
  for (int64_t step = 1; step <= 2; ++step)
    for (auto* fed : {&host, &on_device}) {
      std::map<std::string, Tensor> f = *fed;
      f["lr"] = Tensor::scalar(0.1f);
      f["step"] = Tensor::scalar(step);
      (fed == &host ? cpu_update : dev_update).run(f, {"p_new"});
    }
  for (const char* name : {"p", "m", "v"}) {
    const Tensor got = to_device(on_device[name], Device::kCpu);
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(got.item_as_double(i), host[name].item_as_double(i)) << name << i;
  }
  EXPECT_NE(host["p"].item_as_double(0), 1.0);  // the reference did move
}

// If's branches run on the host: a branch that reads a value of the outer graph made on the
// device is handed a host copy of it (the host kernel in the branch checks it gets one).
TEST_F(HostDeviceTest, ControlFlowBodiesReadOuterDeviceValuesOnTheHost) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{4}), value("cond", DType::kBool, Shape{})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  Node scale = make_node("TestDeviceScale", {"x"}, {"a"}), choose = make_node("If", {"cond"}, {"y"});
  scale.domain = kOnnxTrainDomain;
  choose.attributes["then_branch"] = test::one_node_branch("TestDeviceScale", "a", kOnnxTrainDomain);  // "a": the outer graph's
  choose.attributes["else_branch"] = test::one_node_branch("Neg", "a");
  g.nodes = {scale, choose};
  Model m = make_model(std::move(g));
  m.opsets[kOnnxTrainDomain] = 1;
  ExecutorOptions options;
  options.device = Device::kCuda;
  Executor dev(m, options);
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  for (bool cond : {true, false, true}) {
    const Tensor y = dev.run({{"x", x}, {"cond", Tensor::scalar(cond)}})[0];
    EXPECT_EQ(to_device(y, Device::kCpu).item_as_double(3), cond ? 16.0 : -8.0) << "cond " << cond;
  }
}

}  // namespace onnxtrain

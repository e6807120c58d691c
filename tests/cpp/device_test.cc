// The device layer without a GPU: what a build says where no CUDA device is, the executor's
// device path (device arena, one stream, copies only at the graph's edges and around ops that
// run on the CPU) over a host-memory stand-in registered as the CUDA device for the test, and a
// device Module's training state on that stand-in (with a host stand-in for the device update).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/device.h"
#include "core/device_update.h"
#include "core/dispatch.h"
#include "onnxtrain/artifacts.h"
#include "onnxtrain/module.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "onnx/model_io.h"
#include "ops/registry.h"
#include "runtime/executor.h"
#include "training/module.h"
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

// ---- A Module whose training state lives on the device. The stand-ins: every op's CPU kernel as
// its "device" kernel (the device's memory is host memory here; in a CUDA build too, where they
// replace the CUDA kernels for the test), and the device update computed as the CPU computes it. Training on that device must then give the CPU's bits exactly, with
// nothing but the feeds and the loss crossing per step; what differs from the CPU run is where
// the state lives, which is what these tests are about.

namespace {

// The device update on host memory, as the CPU path computes each part (so the bits agree).
class HostUpdate final : public DeviceUpdate {
 public:
  void add(Tensor& dst, const Tensor& src, const Stream&) override {
    ++adds;
    dispatch_float(dst.dtype(), [&]<typename T>() {
      for (int64_t i = 0; i < dst.numel(); ++i)
        dst.data<T>()[i] = T(compute_t<T>(dst.data<T>()[i]) + compute_t<T>(src.data<T>()[i]));
    });
  }
  void scale(Tensor& t, double factor, const Stream&) override {
    ++scales;
    dispatch_float(t.dtype(), [&]<typename T>() {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(compute_t<T>(t.data<T>()[i]) * compute_t<T>(factor));
    });
  }
  bool all_finite(const std::vector<Tensor>& tensors, const Stream&) override { return optim::all_finite(tensors); }
  double l2_norm(const std::vector<Tensor>& tensors, const Stream&) override { return optim::global_l2_norm(tensors); }
  bool adamw_supports(DType dtype) const override { return dtype == DType::kFloat32; }
  void adamw(const DeviceAdamW& d, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
             std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const Stream&) override {
    ++adamw_calls;
    for (const auto* list : {&params, &exp_avg, &exp_avg_sq})
      for (const Tensor& t : *list) EXPECT_EQ(t.device(), Device::kCuda) << "the update is given device tensors";
    OptimizerConfig c = OptimizerConfig::defaults(d.hf ? OptimizerType::kHFAdamW : OptimizerType::kAdamW);
    c.lr = d.lr;
    c.betas = {d.beta1, d.beta2};
    c.eps = d.eps;
    c.weight_decay = d.weight_decay;
    c.max_grad_norm = d.max_grad_norm;
    c.correct_bias = d.correct_bias;
    c.maximize = d.maximize;
    std::vector<std::vector<Tensor>> state = {exp_avg, exp_avg_sq};
    optim::apply_update(c, d.step, params, grads, state);
  }
  int adds = 0, scales = 0, adamw_calls = 0;
};

const char* const kMlpParameters[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};

class DeviceModuleTest : public HostDeviceTest {
 protected:
  void SetUp() override {
    HostDeviceTest::SetUp();
    previous_update_ = register_device_update(Device::kCuda, &update_);
    // Shape and Size keep theirs: it makes the result on the host in every build.
    for (const OpSchema* schema : OpRegistry::global().all())
      if (schema->cpu && schema->op_type != "Shape" && schema->op_type != "Size") {
        replaced_.emplace_back(schema, schema->cuda);
        const_cast<OpSchema*>(schema)->cuda = schema->cpu;
      }
    dir_ = std::filesystem::temp_directory_path() /
           ("onnxtrain_devstate_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    ArtifactOptions o;
    o.graphs.requires_grad.assign(std::begin(kMlpParameters), std::end(kMlpParameters));
    o.graphs.loss = LossType::kCrossEntropy;
    o.directory = dir_.string();
    paths_ = generate_artifacts(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", o);
  }
  void TearDown() override {
    for (auto& [schema, kernel] : replaced_) const_cast<OpSchema*>(schema)->cuda = std::move(kernel);
    register_device_update(Device::kCuda, previous_update_);
    std::filesystem::remove_all(dir_);
    HostDeviceTest::TearDown();
  }
  // Batch `i` of 16 points in 2-D with 3 classes.
  static std::vector<Tensor> batch(int i) {
    std::vector<float> x;
    std::vector<int64_t> y;
    for (int k = 0; k < 16; ++k) {
      x.push_back(std::sin(0.7f * float(k + 16 * i)));
      x.push_back(std::cos(1.3f * float(k + 16 * i)));
      y.push_back((k + i) % 3);
    }
    return {Tensor::from_vector(x, {16, 2}), Tensor::from_vector(y, {16})};
  }
  static OptimizerConfig adamw() {
    OptimizerConfig c = OptimizerConfig::defaults(OptimizerType::kAdamW);
    c.lr = 1e-2;
    c.max_grad_norm = 0.5;  // clips at some steps
    return c;
  }
  std::unique_ptr<Module> module(CheckpointState& state, Device device) const {
    return std::make_unique<Module>(paths_.training_model, state, paths_.eval_model, device);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  HostUpdate update_;
  DeviceUpdate* previous_update_ = nullptr;
  std::vector<std::pair<const OpSchema*, KernelFactory>> replaced_;  // (schema, its own device kernel)
  std::filesystem::path dir_;
  ArtifactPaths paths_;
};

// Bit for bit, on the host.
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.device(), Device::kCpu) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0) << what << " differs";
}

void expect_same_state(const CheckpointState& got, const CheckpointState& want, const std::string& when) {
  for (const char* name : kMlpParameters) {
    expect_same(got.parameter(name).data(), want.parameter(name).data(), std::string(name) + " " + when);
    for (const char* moment : {"exp_avg", "exp_avg_sq"})
      expect_same(got.optimizer_state().param_states.at(name).at(moment),
                  want.optimizer_state().param_states.at(name).at(moment), std::string(name) + " " + moment + " " + when);
  }
  EXPECT_EQ(got.optimizer_state().step, want.optimizer_state().step) << when;
}

}  // namespace

TEST_F(DeviceModuleTest, TrainsAsTheCpuDoesWithTheStateOnTheDevice) {
  CheckpointState cpu_state = CheckpointState::load(paths_.checkpoint), dev_state = cpu_state.clone();
  auto cpu = module(cpu_state, Device::kCpu), dev = module(dev_state, Device::kCuda);
  Optimizer cpu_opt(adamw(), *cpu), dev_opt(adamw(), *dev);
  LinearLRScheduler cpu_lr(cpu_opt, 2, 12, 1e-2), dev_lr(dev_opt, 2, 12, 1e-2);
  const Executor& dev_executor = CompileAccess::executor(*dev, true);
  for (int step = 0; step < 8; ++step) {
    // Steps 2 and 5 accumulate two micro-batches, the second weighted by 0.5.
    const int micro_batches = step == 2 || step == 5 ? 2 : 1;
    for (int micro = 0; micro < micro_batches; ++micro) {
      if (micro == 1) {
        cpu->scale_gradients_in_next_step(0.5);
        dev->scale_gradients_in_next_step(0.5);
      }
      const std::vector<Tensor> inputs = batch(step + 10 * micro);
      const Tensor want = cpu->train_step(inputs)[0];
      device_.host_device_copies = 0;
      const Tensor got = dev->train_step(inputs)[0];
      expect_same(got, want, "the loss at step " + std::to_string(step));
      // Two feeds in and the loss out. Besides, the first step uploads the parameters and the
      // graph's constant (the gradient seed), and step 6 the parameter the host wrote.
      EXPECT_EQ(dev_executor.memory_report().device_copies, step == 0 ? 3u : 2u) << "step " << step;
      EXPECT_EQ(device_.host_device_copies, 3 + (step == 0 ? 7 : 0) + (step == 6 ? 1 : 0)) << "step " << step;
    }
    cpu_opt.step();
    device_.host_device_copies = 0;
    dev_opt.step();
    // The moments' one upload on the first step; nothing else crosses.
    EXPECT_EQ(device_.host_device_copies, step == 0 ? 12 : 0) << "optimizer step " << step;
    cpu->lazy_reset_grad();
    dev->lazy_reset_grad();
    cpu_lr.step();
    dev_lr.step();
    if (step == 3) {  // a checkpoint saved mid-training holds the current values, in both formats
      for (CheckpointFormat format : {CheckpointFormat::kOnnxtrain, CheckpointFormat::kOrt}) {
        const std::string ext = checkpoint_format_name(format);
        cpu_state.save(path("cpu." + ext), true, format);
        dev_state.save(path("dev." + ext), true, format);
        EXPECT_EQ(test::read_file(path("dev." + ext)), test::read_file(path("cpu." + ext))) << ext;
      }
      expect_same_state(CheckpointState::load(path("dev.onnxtrain")), cpu_state, "saved at step 3");
    }
    if (step == 5) {  // a host write between steps reaches the device
      const Tensor zeros = Tensor::zeros(DType::kFloat32, {32});
      cpu_state.set_parameter("fc2.bias", zeros);
      dev_state.set_parameter("fc2.bias", zeros);
    }
  }
  EXPECT_GT(update_.adds, 0);
  EXPECT_GT(update_.scales, 0);
  EXPECT_EQ(update_.adamw_calls, 8);
  expect_same_state(dev_state, cpu_state, "after 8 steps");
  // The host's other views: the contiguous buffer, the exported inference model, the eval graph.
  expect_same(dev->get_contiguous_parameters(), cpu->get_contiguous_parameters(), "the contiguous parameters");
  cpu->export_model_for_inferencing(path("cpu.onnx"), {"logits"});
  dev->export_model_for_inferencing(path("dev.onnx"), {"logits"});
  EXPECT_EQ(test::read_file(path("dev.onnx")), test::read_file(path("cpu.onnx")));
  const std::vector<Tensor> inputs = batch(3);
  expect_same(dev->eval_step(inputs)[0], cpu->eval_step(inputs)[0], "the eval loss");
}

// CPU checkpoint -> device -> CPU: the same bits as training on the CPU throughout; a contiguous
// buffer copied into the parameters between steps is picked up; a device Module's end leaves its
// trained values in the state.
TEST_F(DeviceModuleTest, ResumesAcrossDevicesExactly) {
  CheckpointState straight = CheckpointState::load(paths_.checkpoint);
  {
    auto m = module(straight, Device::kCpu);
    Optimizer opt(adamw(), *m);
    for (int step = 0; step < 9; ++step) {
      m->train_step(batch(step));
      opt.step();
      m->lazy_reset_grad();
      if (step == 4) m->copy_buffer_to_parameters(m->get_contiguous_parameters());
    }
  }
  std::string checkpoint = paths_.checkpoint;
  for (auto [device, first] : {std::pair{Device::kCpu, 0}, std::pair{Device::kCuda, 3}, std::pair{Device::kCpu, 6}}) {
    CheckpointState state = CheckpointState::load(checkpoint);
    {
      auto m = module(state, device);
      Optimizer opt(adamw(), *m);
      for (int step = first; step < first + 3; ++step) {
        m->train_step(batch(step));
        opt.step();
        m->lazy_reset_grad();
        if (step == 4) {
          Tensor buffer = m->get_contiguous_parameters();
          m->copy_buffer_to_parameters(buffer);
        }
      }
    }  // the Module's end leaves the trained values in the state, which is saved after it
    checkpoint = path("resumed_" + std::to_string(first));
    state.save(checkpoint);
  }
  expect_same_state(CheckpointState::load(checkpoint), straight, "after CPU, device, CPU");
}

// Param groups with global clipping run one update per group on the device; a rule the device has
// no update for (SGD) runs on the host with copies, and both give the CPU's bits.
TEST_F(DeviceModuleTest, ParamGroupsAndHostRulesGiveTheCpuBits) {
  for (OptimizerType type : {OptimizerType::kAdamW, OptimizerType::kSGD}) {
    CheckpointState cpu_state = CheckpointState::load(paths_.checkpoint), dev_state = cpu_state.clone();
    auto cpu = module(cpu_state, Device::kCpu), dev = module(dev_state, Device::kCuda);
    OptimizerConfig config = OptimizerConfig::defaults(type);
    config.lr = 1e-2;
    config.max_grad_norm = 0.5;
    if (type == OptimizerType::kSGD) config.momentum = 0.9;
    Optimizer cpu_opt(config, *cpu), dev_opt(config, *dev);
    OptimizerConfig slow = config;
    slow.lr = 1e-3;
    for (Optimizer* opt : {&cpu_opt, &dev_opt}) opt->set_param_groups({{{"fc1.weight", "fc3.bias"}, slow}});
    update_.adamw_calls = 0;
    for (int step = 0; step < 4; ++step) {
      expect_same(dev->train_step(batch(step))[0], cpu->train_step(batch(step))[0], "the loss");
      const StepStats want = cpu_opt.step(), got = dev_opt.step();
      EXPECT_EQ(got.grad_norm, want.grad_norm) << optimizer_type_name(type) << " step " << step;
      cpu->lazy_reset_grad();
      dev->lazy_reset_grad();
    }
    EXPECT_EQ(update_.adamw_calls, type == OptimizerType::kAdamW ? 8 : 0) << "two groups, four steps";
    for (const char* name : kMlpParameters)
      expect_same(dev_state.parameter(name).data(), cpu_state.parameter(name).data(),
                  std::string(name) + " " + optimizer_type_name(type));
  }
}

// fp16 mixed precision: the loss scaler's overflow check runs on the device's gradients; steps
// skipped (the scale starts far too high) and steps taken match the CPU's, bit for bit.
TEST_F(DeviceModuleTest, LossScalingSkipsTheStepsTheCpuSkips) {
  ArtifactOptions o;
  o.graphs.requires_grad.assign(std::begin(kMlpParameters), std::end(kMlpParameters));
  o.graphs.loss = LossType::kCrossEntropy;
  o.graphs.mixed_precision = "fp16";
  o.directory = path("fp16");
  const ArtifactPaths fp16 = generate_artifacts(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", o);
  CheckpointState cpu_state = CheckpointState::load(fp16.checkpoint);
  cpu_state.add_property(CheckpointState::kLossScaleProperty, std::ldexp(1.0, 22));  // overflows float16
  CheckpointState dev_state = cpu_state.clone();
  Module cpu(fp16.training_model, cpu_state, "", Device::kCpu), dev(fp16.training_model, dev_state, "", Device::kCuda);
  Optimizer cpu_opt(adamw(), cpu), dev_opt(adamw(), dev);
  int skipped = 0;
  for (int step = 0; step < 12; ++step) {
    expect_same(dev.train_step(batch(step))[0], cpu.train_step(batch(step))[0], "the loss at step " + std::to_string(step));
    const StepStats want = cpu_opt.step(), got = dev_opt.step();
    EXPECT_EQ(got.skipped, want.skipped) << "step " << step;
    EXPECT_EQ(got.loss_scale, want.loss_scale) << "step " << step;
    skipped += want.skipped ? 1 : 0;
    cpu.lazy_reset_grad();
    dev.lazy_reset_grad();
  }
  EXPECT_GT(skipped, 0);
  EXPECT_LT(skipped, 12);
  expect_same_state(dev_state, cpu_state, "after 12 fp16 steps");
}

// BatchNormalization's running statistics (the training graph's "<buffer>_updated" outputs) stay
// on the device too: the step still copies only its feeds and loss, and the host sees the CPU's
// statistics when it looks.
TEST_F(DeviceModuleTest, UpdatedBuffersStayOnTheDevice) {
  Graph g;  // logits = BatchNormalization(x w + b)
  g.inputs = {value("x", DType::kFloat32, Shape{16, 2})};
  g.outputs = {value("logits", DType::kFloat32, Shape{16, 3})};
  std::vector<float> w;
  for (int i = 0; i < 6; ++i) w.push_back(0.3f * std::sin(float(i) + 0.5f));
  g.initializers["w"] = Tensor::from_vector(w, {2, 3});
  g.initializers["b"] = Tensor::from_vector<float>({0.1f, -0.2f, 0.05f}, {3});
  g.initializers["gamma"] = Tensor::from_vector<float>({1, 1, 1}, {3});
  g.initializers["beta"] = Tensor::from_vector<float>({0, 0, 0}, {3});
  g.initializers["mean"] = Tensor::from_vector<float>({0, 0, 0}, {3});
  g.initializers["var"] = Tensor::from_vector<float>({1, 1, 1}, {3});
  Node norm = make_node("BatchNormalization", {"z", "gamma", "beta", "mean", "var"}, {"logits", "new_mean", "new_var"});
  norm.attributes["training_mode"] = Attribute::of(int64_t{1});  // exported in training mode, as torch does
  g.nodes = {make_node("MatMul", {"x", "w"}, {"h"}), make_node("Add", {"h", "b"}, {"z"}), norm};
  save_model(make_model(std::move(g), 15), path("bn.onnx"));
  ArtifactOptions o;
  o.graphs.requires_grad = {"w", "b", "gamma", "beta"};
  o.graphs.loss = LossType::kCrossEntropy;
  o.directory = path("bn");
  const ArtifactPaths bn = generate_artifacts(path("bn.onnx"), o);
  CheckpointState cpu_state = CheckpointState::load(bn.checkpoint), dev_state = cpu_state.clone();
  Module cpu(bn.training_model, cpu_state, "", Device::kCpu), dev(bn.training_model, dev_state, "", Device::kCuda);
  Optimizer cpu_opt(adamw(), cpu), dev_opt(adamw(), dev);
  for (int step = 0; step < 4; ++step) {
    const std::vector<Tensor> inputs = batch(step);
    const Tensor want = cpu.train_step(inputs)[0];
    device_.host_device_copies = 0;
    expect_same(dev.train_step(inputs)[0], want, "the loss at step " + std::to_string(step));
    if (step > 0) {
      EXPECT_EQ(device_.host_device_copies, 3) << "step " << step << ": two feeds and the loss";
    }
    cpu_opt.step();
    dev_opt.step();
    cpu.lazy_reset_grad();
    dev.lazy_reset_grad();
  }
  for (const char* name : {"w", "b", "gamma", "beta", "mean", "var"})
    expect_same(dev_state.parameter(name).data(), cpu_state.parameter(name).data(), name);
  EXPECT_NE(cpu_state.parameter("mean").data().item_as_double(0), 0.0);  // the statistics did move
}

// Data parallelism keeps gradients on the host: refused on a device Module, by name.
TEST_F(DeviceModuleTest, DataParallelismOnADeviceModuleIsRefused) {
  CheckpointState state = CheckpointState::load(paths_.checkpoint);
  auto dev = module(state, Device::kCuda);
  Optimizer opt(adamw(), *dev);
  DataParallelOptions o;
  o.enabled = true;
  EXPECT_NE(test::error_of([&] { opt.set_data_parallel(o); }).find("data parallelism on a cuda Module"),
            std::string::npos);
}

}  // namespace onnxtrain

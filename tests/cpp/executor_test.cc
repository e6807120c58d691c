#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include <unistd.h>

#include "core/memory.h"
#include "core/parallel.h"
#include "onnx/model_io.h"
#include "ops/registry.h"
#include "passes/passes.h"
#include "runtime/executor.h"
#include "test_util.h"

namespace onnxtrain {
using test::make_model;
using test::make_node;
using test::value;

namespace {
// y = relu(x + b) * x: a chain where in-place reuse and arena sharing apply.
Model chain_model() {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{4, 8}), value("b", DType::kFloat32, Shape{8})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Add", {"x", "b"}, {"t0"}), make_node("Relu", {"t0"}, {"t1"}),
             make_node("Exp", {"t1"}, {"t2"}), make_node("Mul", {"t2", "x"}, {"y"})};
  return make_model(std::move(g));
}

std::map<std::string, Tensor> chain_feeds(float shift) {
  std::vector<float> x(32), b(8);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = float(i % 7) * 0.25f - 0.5f + shift;
  for (int i = 0; i < 8; ++i) b[size_t(i)] = float(i) * 0.1f;
  return {{"x", Tensor::from_vector(x, {4, 8})}, {"b", Tensor::from_vector(b, {8})}};
}

float chain_reference(float x, float b) { return std::exp(std::max(x + b, 0.0f)) * x; }

// onnxtrain.TestThreadProbe(X) -> Y [1]: the OpenMP thread count its kernel ran with; a memory-bound
// op by its stated work (8 per element of X and Y).
void thread_probe_kernel(KernelContext& ctx) {
  ctx.output(0, DType::kFloat32, {1}).data<float>()[0] = float(omp_get_max_threads());
}
ONNXTRAIN_OP(TestThreadProbe, kOnnxTrainDomain, 1).inputs(1).outputs(1).cpu(thread_probe_kernel)
    .work(memory_bound_work);

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * size_t(sysconf(_SC_PAGESIZE));
}

// Probes of X (elements each) and of a second input (big elements), under 2 threads: the thread
// counts the probes saw in the recording run and in the next run.
std::vector<float> probe_threads(int64_t elements, int64_t big) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{elements}), value("z", DType::kFloat32, Shape{big})};
  g.outputs = {value("a", DType::kFloat32, std::nullopt), value("b", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("TestThreadProbe", {"x"}, {"a"}), make_node("TestThreadProbe", {"z"}, {"b"})};
  for (auto& n : g.nodes) n.domain = kOnnxTrainDomain;
  Model m = make_model(std::move(g));
  m.opsets[kOnnxTrainDomain] = 1;
  const int saved = num_threads();
  set_num_threads(2);
  Executor ex(m);
  std::map<std::string, Tensor> feeds{{"x", Tensor::zeros(DType::kFloat32, {elements})},
                                      {"z", Tensor::zeros(DType::kFloat32, {big})}};
  std::vector<float> seen;
  for (int run = 0; run < 2; ++run)
    for (const Tensor& t : ex.run(feeds)) seen.push_back(t.data<float>()[0]);
  EXPECT_EQ(num_threads(), 2);  // restored after a serial run
  set_num_threads(saved);
  return seen;
}
}  // namespace

// Sets an environment variable for a scope, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) saved_ = before;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (saved_) setenv(name_, saved_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// A plan whose every step is below kSerialWork runs on the calling thread alone (after its
// recording run); one large step keeps the session's threads for the whole plan (while the pool
// spins between regions: OMP_WAIT_POLICY=active, the test below has the passive policy).
TEST(Executor, SmallPlansRunOnOneThread) {
  ScopedEnv policy("OMP_WAIT_POLICY", "active");
  const int64_t large = kSerialWork / kMemoryBoundElementWork;  // X and Y: over the bar
  EXPECT_EQ(probe_threads(16, 16), (std::vector<float>{2, 2, 1, 1}));
  EXPECT_EQ(probe_threads(16, large), (std::vector<float>{2, 2, 2, 2}));
}

// Where OpenMP's threads sleep between regions (OMP_WAIT_POLICY=passive), every region pays a
// wake-up, so each step below kPassiveSerialWork runs on one thread even in a plan with larger
// steps; while the pool spins, the same plan keeps its threads for every step.
TEST(Executor, SmallStepsRunOnOneThreadWhereThePoolSleeps) {
  const int64_t huge = kPassiveSerialWork / kMemoryBoundElementWork;  // over the passive bar
  const int64_t mid = kSerialWork / kMemoryBoundElementWork;          // over kSerialWork, under it
  {
    ScopedEnv policy("OMP_WAIT_POLICY", "PASSIVE");
    EXPECT_EQ(probe_threads(16, huge), (std::vector<float>{2, 2, 1, 2}));
    EXPECT_EQ(probe_threads(mid, huge), (std::vector<float>{2, 2, 1, 2}));
  }
  ScopedEnv policy("OMP_WAIT_POLICY", "active");
  EXPECT_EQ(probe_threads(16, huge), (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(probe_threads(mid, huge), (std::vector<float>{2, 2, 2, 2}));
}

TEST(Executor, PlannedRunsMatchTheRecordingRunAndAllocateNothing) {
  Executor exec(chain_model());
  for (int run = 0; run < 3; ++run) {
    auto feeds = chain_feeds(float(run));
    auto out = exec.run(feeds);
    ASSERT_EQ(out.size(), 1u);
    const float* y = out[0].data<float>();
    const float* x = feeds["x"].data<float>();
    const float* b = feeds["b"].data<float>();
    for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(y[i], chain_reference(x[i], b[i % 8])) << "run " << run;
    MemoryReport r = exec.memory_report();
    EXPECT_EQ(r.dynamic_allocations, 0u);
    EXPECT_EQ(r.plans, 1u);
    // t0 -> t1 -> t2 run in place over one 128-byte buffer.
    EXPECT_EQ(r.inplace_reuses, 2u);
    EXPECT_EQ(r.planned_arena_bytes, 128u);
  }
}

// A residual add, y = (r + exp(r)) * 2 with r = relu(x): the Add may compute in place over either
// input, both of which die there, but over only one of them. Taking over both would put r and
// exp(r) in one buffer although both are live while Exp runs.
TEST(Executor, InPlaceOutputTakesOverOneInputOnly) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{64})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.initializers["two"] = Tensor::scalar<float>(2.0f);
  g.nodes = {make_node("Relu", {"x"}, {"r"}), make_node("Exp", {"r"}, {"e"}), make_node("Add", {"r", "e"}, {"s"}),
             make_node("Mul", {"s", "two"}, {"y"})};
  Executor exec(make_model(std::move(g)));
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.05f - 1.0f;
  for (int run = 0; run < 3; ++run) {
    auto out = exec.run({{"x", Tensor::from_vector(x, {64})}});
    for (size_t i = 0; i < x.size(); ++i) {
      float r = std::max(x[i], 0.0f);
      ASSERT_NEAR(out[0].data<float>()[i], (r + std::exp(r)) * 2.0f, 1e-5f) << "run " << run << ", element " << i;
    }
  }
  EXPECT_EQ(exec.memory_report().inplace_reuses, 1u);
}

TEST(Executor, OutputsOfEarlierRunsAreNotOverwritten) {
  Executor exec(chain_model());
  auto first = exec.run(chain_feeds(0));
  auto before = first[0].clone();
  exec.run(chain_feeds(1));
  exec.run(chain_feeds(2));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(first[0].data<float>()[i], before.data<float>()[i]);
}

// y = (a - b) / (c + d) * e: Div's inputs both die at the Div, and either could take the output
// in place, but only one may; sharing both buffers made later runs compute (a - b) / (a - b).
TEST(Executor, AnOutputTakesOverAtMostOneInputBuffer) {
  Graph g;
  for (const char* n : {"a", "b", "c", "d", "e"}) g.inputs.push_back(value(n, DType::kFloat32, Shape{}));
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Sub", {"a", "b"}, {"num"}), make_node("Add", {"c", "d"}, {"den"}),
             make_node("Div", {"num", "den"}, {"q"}), make_node("Mul", {"e", "q"}, {"y"})};
  Executor exec(make_model(std::move(g)));
  std::map<std::string, Tensor> feeds;
  for (auto [n, v] : {std::pair{"a", 3.f}, {"b", 2.f}, {"c", 300.f}, {"d", 20.f}, {"e", 2.f}})
    feeds[n] = Tensor::scalar<float>(v);
  for (int run = 0; run < 3; ++run) EXPECT_FLOAT_EQ(exec.run(feeds)[0].data<float>()[0], 2.f / 320.f) << "run " << run;
}

TEST(Executor, AnOutputTakesOverAtMostOneDyingInput) {
  // Add's A and B both die at the Add: its output may reuse one of their buffers, never both.
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{4, 8})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Relu", {"x"}, {"a"}), make_node("Neg", {"x"}, {"b"}), make_node("Add", {"a", "b"}, {"s"}),
             make_node("Add", {"s", "x"}, {"y"})};
  Executor exec(make_model(std::move(g)));
  for (int run = 0; run < 3; ++run) {
    auto feeds = chain_feeds(float(run));
    auto out = exec.run({{"x", feeds["x"]}});
    const float* x = feeds["x"].data<float>();
    for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(out[0].data<float>()[i], std::max(x[i], 0.0f) - x[i] + x[i]) << "run " << run;
  }
  EXPECT_EQ(exec.memory_report().inplace_reuses, 1u);
}

TEST(Executor, NewShapeSignatureBuildsASecondPlan) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{-1, 3})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Relu", {"x"}, {"t"}), make_node("Add", {"t", "t"}, {"y"})};
  Executor exec(make_model(std::move(g)));
  for (int64_t rows : {2, 5, 2}) {
    Tensor x = Tensor::zeros(DType::kFloat32, {rows, 3});
    x.data<float>()[0] = 1.5f;
    auto out = exec.run({{"x", x}});
    EXPECT_EQ(out[0].shape(), (Shape{rows, 3}));
    EXPECT_EQ(out[0].data<float>()[0], 3.0f);
  }
  EXPECT_EQ(exec.memory_report().plans, 2u);
}

TEST(Executor, FeedErrorsNameTheInput) {
  Executor exec(chain_model());
  auto feeds = chain_feeds(0);
  feeds.erase("b");
  try {
    exec.run(feeds);
    FAIL() << "missing feed accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 'b' is missing"), std::string::npos) << e.what();
  }
  feeds = chain_feeds(0);
  feeds["x"] = Tensor::zeros(DType::kFloat64, {4, 8});
  EXPECT_THROW(exec.run(feeds), Error);
  feeds = chain_feeds(0);
  feeds["x"] = Tensor::zeros(DType::kFloat32, {4, 9});
  EXPECT_THROW(exec.run(feeds), Error);
  feeds = chain_feeds(0);
  feeds["z"] = Tensor::zeros(DType::kFloat32, {1});
  EXPECT_THROW(exec.run(feeds), Error);
}

TEST(Executor, KernelErrorsCarryOpAndNodeName) {
  Graph g;
  g.inputs = {value("a", DType::kFloat32, std::nullopt), value("b", DType::kFloat32, std::nullopt)};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Add", {"a", "b"}, {"y"}, "my_add")};
  Executor exec(make_model(std::move(g)));
  try {
    exec.run({{"a", Tensor::zeros(DType::kFloat32, {2, 3})}, {"b", Tensor::zeros(DType::kFloat32, {4})}});
    FAIL() << "bad broadcast accepted";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[Add] node 'my_add'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  }
}

TEST(Executor, UnknownOpIsRejectedAtLoad) {
  Graph g;
  g.inputs = {value("a", DType::kFloat32, std::nullopt)};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("NoSuchOp", {"a"}, {"y"}, "n0")};
  try {
    Executor exec(make_model(std::move(g)));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotImplemented);
    EXPECT_NE(std::string(e.what()).find("[NoSuchOp] node 'n0'"), std::string::npos) << e.what();
  }
}

TEST(Executor, OutputThatIsAnInputIsCopied) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{2})};
  g.outputs = {value("x", DType::kFloat32, Shape{2})};
  Executor exec(make_model(std::move(g)));
  Tensor x = Tensor::from_vector<float>({1, 2}, {2});
  auto out = exec.run({{"x", x}});
  EXPECT_FALSE(out[0].shares_storage_with(x));
  EXPECT_EQ(out[0].data<float>()[1], 2.0f);
}

// Outputs handed over as they become final: a = relu(x) (read again by the last step), b =
// exp(a), then y = a * b. a is final after step 0, b after step 1, y after step 2; x, an output
// too, before step 0 (a copy). A taken output leaves run()'s result empty, and the hook sees each
// value while the steps after its producer have not run yet.
TEST(Executor, OutputsAreHandedOverWhenFinal) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{3})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt), value("b", DType::kFloat32, std::nullopt),
               value("a", DType::kFloat32, std::nullopt), value("x", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Relu", {"x"}, {"a"}), make_node("Exp", {"a"}, {"b"}), make_node("Mul", {"a", "b"}, {"y"})};
  Executor exec(make_model(std::move(g)));
  EXPECT_EQ(exec.output_ready_step("a"), 0);
  EXPECT_EQ(exec.output_ready_step("b"), 1);
  EXPECT_EQ(exec.output_ready_step("y"), 2);
  EXPECT_EQ(exec.output_ready_step("x"), -1);
  Tensor x = Tensor::from_vector<float>({-1, 0.5f, 2}, {3});
  for (int run = 0; run < 2; ++run) {  // the recording run and a planned one
    std::vector<size_t> order;
    std::map<size_t, Tensor> taken;
    auto out = exec.run({{"x", x}}, {}, [&](size_t index, const Tensor& v) {
      order.push_back(index);
      if (index == 3) {
        EXPECT_FALSE(v.shares_storage_with(x));
      }
      if (index == 1 || index == 2) {  // take a and b; leave y and x in the result
        taken[index] = v;
        return true;
      }
      return false;
    });
    EXPECT_EQ(order, (std::vector<size_t>{3, 2, 1, 0})) << "run " << run;
    ASSERT_EQ(out.size(), 4u);
    EXPECT_FALSE(out[1].defined());
    EXPECT_FALSE(out[2].defined());
    EXPECT_FLOAT_EQ(taken[2].data<float>()[2], 2.0f);
    EXPECT_FLOAT_EQ(taken[1].data<float>()[1], std::exp(0.5f));
    EXPECT_FLOAT_EQ(out[0].data<float>()[2], 2.0f * std::exp(2.0f));
    EXPECT_FLOAT_EQ(out[3].data<float>()[0], -1.0f);
  }
}

// The recording run (the first run of a shape signature allocates value by value) gives a dead
// value's memory back when it dies: from the heap, a freed 16 MiB block below a live one stayed
// resident, so the first step's peak was the heap's high-water mark, above the arena's.
TEST(Executor, RecordingRunReturnsDeadValuesMemory) {
#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
  GTEST_SKIP() << "measures glibc's heap through the resident set";
#else
  // glibc serves blocks below its mmap threshold from the heap, and raises the threshold to the
  // size of a freed mapped block: after this, 16 MiB blocks come from the heap.
  void* volatile block = std::malloc(size_t(24) << 20);  // volatile: the pair is not elided
  std::free(block);
  constexpr int64_t kN = int64_t(4) << 20;  // 16 MiB of floats
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{kN})};
  g.outputs = {value("s", DType::kFloat32, std::nullopt), value("t", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Relu", {"x"}, {"y1"}), make_node("Neg", {"y1"}, {"y2"}),  // y1 dies here
             make_node("ReduceSum", {"y2"}, {"s"}), make_node("Mul", {"y2", "s"}, {"z"}),
             make_node("ReduceSum", {"z"}, {"t"})};
  Executor exec(make_model(std::move(g)));
  std::vector<float> ones(size_t(kN), 1.0f);
  std::map<std::string, Tensor> feeds{{"x", Tensor::from_vector(ones, {kN})}};
  const size_t before = resident_bytes();
  size_t at_s = 0;  // resident growth once s is computed: y2 is live, y1 is dead
  auto out = exec.run(feeds, {"s", "t"}, [&](size_t index, const Tensor&) {
    if (index == 0) at_s = resident_bytes() - before;
    return false;
  });
  EXPECT_FLOAT_EQ(out[0].data<float>()[0], -float(kN));
  EXPECT_GE(at_s, size_t(kN) * 4) << "y2 is live";
  EXPECT_LT(at_s, size_t(kN) * 4 * 3 / 2) << "y1's 16 MiB stayed resident after it died";
#endif
}

// Outputs a planned run hands out come from Tensor::empty: a large one is a huge-page mapping
// of its own (2 MiB aligned; glibc's own mappings put their header first), smaller ones the heap's.
TEST(Executor, LargeOutputsAreHugePageMappings) {
  constexpr int64_t kN = int64_t(9) << 20;  // 36 MiB of floats
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{kN}), value("s", DType::kFloat32, Shape{1000})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt), value("t", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Relu", {"x"}, {"y"}), make_node("Neg", {"s"}, {"t"})};
  Executor exec(make_model(std::move(g)));
  std::vector<float> ones(size_t(kN), 1.0f), small(1000, 2.0f);
  std::map<std::string, Tensor> feeds{{"x", Tensor::from_vector(ones, {kN})}, {"s", Tensor::from_vector(small, {1000})}};
  exec.run(feeds, {"y", "t"});  // the recording run
  auto out = exec.run(feeds, {"y", "t"});
  EXPECT_EQ(out[0].data<float>()[kN - 1], 1.0f);
  EXPECT_EQ(out[1].data<float>()[999], -2.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(out[0].data()) % kHugePageBytes, 0u);
}

TEST(Executor, StorageTimelineSaysWhenInputsDieAndOutputsAreWritten) {
  // s0: t = Mul(g, a) (may write over a or g: both die here); s1: y = Identity(t) (a view, so
  // its storage is written at s0); s2: u = Relu(r); s3: z = Add(u, r), the last read of r;
  // unused is never read.
  Graph g;
  g.inputs = {value("g", DType::kFloat32, Shape{4}), value("a", DType::kFloat32, Shape{4}),
              value("r", DType::kFloat32, Shape{4}), value("unused", DType::kFloat32, Shape{4})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt), value("z", DType::kFloat32, std::nullopt)};
  g.nodes = {make_node("Mul", {"g", "a"}, {"t"}), make_node("Identity", {"t"}, {"y"}),
             make_node("Relu", {"r"}, {"u"}), make_node("Add", {"u", "r"}, {"z"})};
  Executor ex(make_model(std::move(g)));
  EXPECT_EQ(ex.storage_timeline().steps, 0);  // no run yet
  std::map<std::string, Tensor> feeds;
  for (const char* name : {"g", "a", "r", "unused"}) feeds[name] = Tensor::from_vector(std::vector<float>{1, -2, 3, -4}, {4});
  for (int run = 0; run < 2; ++run) {  // the recording run, then a planned one: the same timeline
    ex.run(feeds);
    const Executor::StorageTimeline t = ex.storage_timeline();
    EXPECT_EQ(t.steps, 4);
    EXPECT_EQ(t.input_last_read.at("g"), 0);
    EXPECT_EQ(t.input_last_read.at("a"), 0);
    EXPECT_EQ(t.input_last_read.at("r"), 3);
    EXPECT_EQ(t.input_last_read.at("unused"), -1);
    EXPECT_EQ(t.output_first_write.at("y"), 0) << "run " << run;  // through the Identity's view
    EXPECT_EQ(t.output_first_write.at("z"), 3);
    EXPECT_EQ(t.output_over_inputs.at("y"), (std::vector<std::string>{"g", "a"}));
    // Add may write over u or r: only r is a graph input (u is the run's own value).
    EXPECT_EQ(t.output_over_inputs.at("z"), (std::vector<std::string>{"r"}));
  }
}

TEST(ModelIO, RoundTripsThroughProtobuf) {
  Model m = chain_model();
  m.graph.initializers["w"] = Tensor::from_vector<float>({1, 2, 3}, {3});
  m.graph.nodes[1].attributes["alpha"] = Attribute::of(0.5f);
  m.graph.nodes[1].attributes["perm"] = Attribute::of(std::vector<int64_t>{1, 0});
  Model back = load_model_from_bytes(save_model_to_bytes(m));
  EXPECT_EQ(back.graph.nodes.size(), 4u);
  EXPECT_EQ(back.graph.nodes[1].attr_float("alpha", 0), 0.5f);
  EXPECT_EQ(back.graph.nodes[1].attr_ints("perm"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(back.graph.initializers.at("w").data<float>()[2], 3.0f);
  EXPECT_EQ(*back.graph.inputs[0].info.shape, (Shape{4, 8}));
  EXPECT_EQ(back.opset(""), 17);
}

TEST(ModelIO, MalformedOrTruncatedBytesAreAnError) {
  EXPECT_THROW(load_model_from_bytes("not a model"), Error);
  EXPECT_THROW(load_model_from_bytes(""), Error);
  Model m = chain_model();
  m.graph.initializers["w"] = Tensor::zeros(DType::kFloat32, {256});
  std::string bytes = save_model_to_bytes(m);
  // Cut inside the initializer's raw data: protobuf sees a length past the end.
  EXPECT_THROW(load_model_from_bytes(bytes.substr(0, bytes.size() / 2)), Error);
}

TEST(Passes, FoldingCseAndDce) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{3})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.initializers["c"] = Tensor::from_vector<float>({1, 2, 3}, {3});
  g.nodes = {make_node("Exp", {"c"}, {"ec"}),            // folds to a constant
             make_node("Add", {"x", "ec"}, {"a1"}),
             make_node("Add", {"x", "ec"}, {"a2"}),      // same as a1: merged
             make_node("Relu", {"x"}, {"unused"}),       // dead
             make_node("Mul", {"a1", "a2"}, {"y"})};
  Model m = make_model(std::move(g));
  optimize_for_inference(m);
  ASSERT_EQ(m.graph.nodes.size(), 2u) << to_string(m.graph);
  EXPECT_EQ(m.graph.nodes[0].op_type, "Add");
  EXPECT_EQ(m.graph.nodes[1].inputs[0], m.graph.nodes[1].inputs[1]);
  EXPECT_TRUE(m.graph.is_initializer("ec"));
  EXPECT_FALSE(m.graph.is_initializer("c"));  // no longer read
}

}  // namespace onnxtrain

namespace onnxtrain {

// A sequence holds its own copies of the tensors put into it: r's arena buffer is taken over by
// t = Neg(x) once SequenceConstruct (r's last reader) has run, and the element must still be relu(x).
TEST(Executor, SequenceElementsSurviveTheReuseOfTheirSourceBuffer) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{8})};
  g.outputs = {value("y", DType::kFloat32, std::nullopt), value("t", DType::kFloat32, std::nullopt)};
  g.outputs.push_back(value("s", DType::kFloat32, std::nullopt));
  g.outputs.back().info.kind = ValueKind::kSequence;
  g.initializers["zero"] = Tensor::scalar<int64_t>(0);
  g.nodes = {make_node("Relu", {"x"}, {"r"}), make_node("SequenceConstruct", {"r"}, {"s"}),
             make_node("Neg", {"x"}, {"n"}), make_node("Exp", {"n"}, {"t"}),
             make_node("SequenceAt", {"s", "zero"}, {"y"})};
  Executor exec(make_model(std::move(g)));
  std::vector<float> x = {-2, -1, 0, 1, 2, 3, -3, 4};
  for (int run = 0; run < 2; ++run) {
    std::vector<Value> out = exec.run_values({{"x", Tensor::from_vector(x, {8})}});
    ASSERT_EQ(out.size(), 3u);
    ASSERT_TRUE(out[2].is_sequence());
    ASSERT_EQ(out[2].sequence.size(), 1u);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(out[0].tensor.data<float>()[i], std::max(x[size_t(i)], 0.0f)) << "run " << run;
      EXPECT_EQ(out[2].sequence[0].data<float>()[i], std::max(x[size_t(i)], 0.0f)) << "run " << run;
    }
  }
  // run() hands over tensors only, and says which output is not one.
  EXPECT_NE(test::error_of([&] { exec.run({{"x", Tensor::from_vector(x, {8})}}); })
                .find("output 2 is a sequence, not a tensor (run it with run_values)"),
            std::string::npos);
}

// A fuzzed model's Identity without an output (the op's check refuses it later) must leave the
// identity pass alone, not be read past its outputs (UBSan, found by the model_run fuzzer).
TEST(Passes, IdentityWithoutAnOutputIsLeftForItsCheck) {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{2})};
  g.outputs = {value("x", DType::kFloat32, Shape{2})};
  g.nodes = {make_node("Identity", {"x"}, {}, "identity_without_output")};
  EXPECT_EQ(eliminate_identities(g), 0);
  EXPECT_EQ(g.nodes.size(), 1u);
}

// Before any pass reads a node's first operands, nodes of known ops must have as many as their op
// takes: a MatMul without an output (the model_run fuzzer's) is an error naming it, from the
// inference pipeline and from the training fusions alike.
TEST(Passes, NodesWithTooFewOperandsAreRefusedBeforeThePasses) {
  auto model_of = [] {
    Graph g;
    g.inputs = {value("a", DType::kFloat32, Shape{2, 2}), value("b", DType::kFloat32, Shape{2, 2})};
    g.outputs = {value("a", DType::kFloat32, Shape{2, 2})};
    g.nodes = {make_node("MatMul", {"a", "b"}, {}, "matmul_without_output")};
    return make_model(std::move(g));
  };
  for (int pipeline = 0; pipeline < 2; ++pipeline) {
    Model m = model_of();
    const std::string error = test::error_of([&] { pipeline == 0 ? optimize_for_inference(m) : (void)fuse_for_training(m); });
    EXPECT_NE(error.find("[MatMul] node 'matmul_without_output'"), std::string::npos) << error;
    EXPECT_NE(error.find("produces 1 to 1 outputs, got 0"), std::string::npos) << error;
  }
}

}  // namespace onnxtrain

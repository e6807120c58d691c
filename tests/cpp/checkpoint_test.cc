// CheckpointState and the checkpoint file: round trips, the strict JSON reader, and corrupt files
// that must all be clear errors (never a crash, never a silently wrong state).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "onnxtrain/training.h"
#include "training/checkpoint.h"
#include "training/json.h"
#include "ir/graph.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using safetensors::TensorEntry;
using test::error_of;
using test::random_tensor;
using test::read_file;
using test::write_file;

class CheckpointTest : public test::TempDirTest {};


bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// A safetensors file from raw pieces: for hand-crafted (possibly invalid) headers.
std::string safetensors_bytes(const std::string& header, const std::string& data, int64_t len_override = -1) {
  uint64_t n = len_override >= 0 ? uint64_t(len_override) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint8_t(n >> (8 * i)));
  return out + header + data;
}

CheckpointState sample_state() {
  std::mt19937 rng(7);
  CheckpointState s;
  s.add_parameter("fc.weight", random_tensor(DType::kFloat32, {4, 3}, rng), true);
  s.add_parameter("fc.bias", random_tensor(DType::kFloat32, {4}, rng), true);
  s.add_parameter("emb/table:0", random_tensor(DType::kFloat16, {5, 2}, rng), false);
  s.add_parameter("steps", random_tensor(DType::kInt64, {}, rng), false);
  s.add_property("epoch", int64_t{3});
  s.add_property("lr", 0.001);
  s.add_property("note", std::string("héllo \"q\"\n"));
  s.optimizer_state().step = 12;
  s.optimizer_state().learning_rate = 0.01;
  s.set_optimizer_tensor("fc.weight", "exp_avg", random_tensor(DType::kFloat32, {4, 3}, rng));
  s.set_optimizer_tensor("fc.weight", "exp_avg_sq", random_tensor(DType::kFloat32, {4, 3}, rng));
  s.set_optimizer_tensor("emb/table:0", "momentum", random_tensor(DType::kFloat16, {5, 2}, rng));
  return s;
}

// ---------------------------------------------------------------- checksum and JSON

TEST(CheckpointCrc, KnownVectorsAndSplits) {
  const char* s = "123456789";
  EXPECT_EQ(safetensors::crc32c(0, s, 9), 0xE3069283u);
  EXPECT_EQ(safetensors::crc32c_portable(0, s, 9), 0xE3069283u);
  EXPECT_EQ(safetensors::crc32c(0, s, 0), 0u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(safetensors::crc32c(0, zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  std::mt19937 rng(1);
  std::vector<uint8_t> buf(1000);
  for (auto& b : buf) b = uint8_t(rng());
  uint32_t whole = safetensors::crc32c_portable(0, buf.data(), buf.size());
  EXPECT_EQ(safetensors::crc32c(0, buf.data(), buf.size()), whole);
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999}) {
    uint32_t c = safetensors::crc32c(0, buf.data(), cut);
    EXPECT_EQ(safetensors::crc32c(c, buf.data() + cut, buf.size() - cut), whole) << cut;
  }
  EXPECT_EQ(safetensors::hex32(0xE3069283u), "e3069283");
}

TEST(CheckpointJson, RoundTripAndStrictness) {
  auto v = json::parse(R"( {"a": [1, -2, 3.5, 1e3, true, false, null, "x\u00e9\ud83d\ude00\n"], "b": {}} )");
  EXPECT_EQ(v.find("a")->as_array()[0].as_int(), 1);
  EXPECT_EQ(v.find("a")->as_array()[1].as_int(), -2);
  EXPECT_DOUBLE_EQ(v.find("a")->as_array()[2].as_double(), 3.5);
  EXPECT_FALSE(v.find("a")->as_array()[3].is_integer());
  EXPECT_EQ(v.find("a")->as_array()[7].as_string(), "x\xC3\xA9\xF0\x9F\x98\x80\n");
  std::string d = json::dump(v);
  EXPECT_EQ(json::dump(json::parse(d)), d);
  EXPECT_EQ(json::parse("9223372036854775807").as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(json::parse("-9223372036854775808").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(json::parse("9223372036854775808").is_integer());
  EXPECT_EQ(json::dump(json::Value::number(0.1)), "0.1");
  EXPECT_EQ(json::dump(json::Value::number(2.0)), "2.0");
  EXPECT_EQ(json::dump(json::Value::string(std::string("\x01\x7f\"\\", 4))), "\"\\u0001\\u007f\\\"\\\\\"");
  for (const char* bad : {"", " ", "{", "[1,]", "{\"a\":1,}", "01", "-", "1.", ".5", "1e", "+1", "NaN",
                          "Infinity", "'a'", "{a:1}", "[1] x", "// c\n1", "\"\\x\"", "\"\\ud800\"",
                          "\"\\udc00\"", "\"a\tb\"", "\"\xC3\"", "\"\xC0\xAF\"", "\"\xED\xA0\x80\"",
                          "{\"a\":1,\"a\":2}", "tru", "nul", "1e999", "[1 2]", "{\"a\" 1}"}) {
    EXPECT_THROW(json::parse(bad), Error) << bad;
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_NE(error_of([&] { json::parse(deep); }).find("nesting"), std::string::npos);
  EXPECT_NE(error_of([&] { json::parse("{\"a\":1,\"a\":2}"); }).find("duplicate key"), std::string::npos);
  EXPECT_THROW(json::dump(json::Value::number(std::nan(""))), Error);
  EXPECT_THROW(json::dump(json::Value::string("\xFF")), Error);
}

// ---------------------------------------------------------------- round trips

TEST_F(CheckpointTest, RoundTripAllDtypes) {
  std::mt19937 rng(3);
  CheckpointState s;
  const DType dtypes[] = {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt64,
                          DType::kInt32,   DType::kInt16,   DType::kInt8,    DType::kUint64,   DType::kUint32,
                          DType::kUint16,  DType::kUint8,   DType::kBool};
  int i = 0;
  for (DType dt : dtypes) {
    s.add_parameter("p_" + dtype_name(dt), random_tensor(dt, {2, 3, 1 + i % 3}, rng), is_floating(dt));
    s.add_parameter("scalar_" + dtype_name(dt), random_tensor(dt, {}, rng), false);
    ++i;
  }
  s.add_parameter("empty", Tensor::empty(DType::kFloat32, {0, 4}), true);
  s.save(path("ckpt"));
  CheckpointState r = CheckpointState::load(path("ckpt"));
  ASSERT_EQ(r.parameter_names(), s.parameter_names());
  for (const auto& p : s.parameters()) {
    const Parameter& q = r.parameter(p.name());
    EXPECT_TRUE(same_bytes(p.data(), q.data())) << p.name();
    EXPECT_EQ(p.requires_grad(), q.requires_grad()) << p.name();
    EXPECT_FALSE(q.has_grad());
  }
  EXPECT_FALSE(r.is_nominal());
  EXPECT_FALSE(r.has_optimizer_state());
  // The data section is 8-byte aligned and the file ends exactly where the data does.
  std::string bytes = read_file(path("ckpt"));
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | uint8_t(bytes[size_t(k)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  // No temporary files are left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(CheckpointTest, PropertiesRoundTrip) {
  CheckpointState s;
  s.add_property("i_max", std::numeric_limits<int64_t>::max());
  s.add_property("i_min", std::numeric_limits<int64_t>::min());
  s.add_property("zero", int64_t{0});
  s.add_property("f", 0.1);
  s.add_property("f_denorm", 4.9e-324);
  s.add_property("f_big", 1.7976931348623157e308);
  s.add_property("f_neg0", -0.0);
  s.add_property("f_nan", std::nan(""));
  s.add_property("f_inf", HUGE_VAL);
  s.add_property("f_ninf", -HUGE_VAL);
  s.add_property("f_int", 2.0);
  s.add_property("s", std::string("line\nquote\" back\\ tab\t \xE2\x82\xAC"));
  s.add_property("s_empty", std::string());
  s.add_property("name with spaces/and.dots", std::string("ok"));
  s.save(path("ckpt"));
  CheckpointState r = CheckpointState::load(path("ckpt"));
  ASSERT_EQ(r.properties().size(), s.properties().size());
  for (const auto& [k, v] : s.properties()) {
    const PropertyValue& w = r.get_property(k);
    ASSERT_EQ(v.index(), w.index()) << k;
    if (auto* d = std::get_if<double>(&v)) {
      double e = std::get<double>(w);
      if (std::isnan(*d)) EXPECT_TRUE(std::isnan(e)) << k;
      else EXPECT_EQ(std::memcmp(d, &e, sizeof(double)), 0) << k;  // bit-exact, including -0.0
    } else {
      EXPECT_EQ(v, w) << k;
    }
  }
  EXPECT_TRUE(r.has_property("f"));
  EXPECT_FALSE(r.has_property("nope"));
  EXPECT_NE(error_of([&] { r.get_property("nope"); }).find("no property named 'nope'"), std::string::npos);
  EXPECT_THROW(s.add_property("", int64_t{1}), Error);
  EXPECT_THROW(s.add_property("x", std::string("\xFF")), Error);
}

TEST_F(CheckpointTest, OptimizerStateRoundTrip) {
  CheckpointState s = sample_state();
  s.save(path("with"));
  s.save(path("without"), /*include_optimizer_state=*/false);
  CheckpointState r = CheckpointState::load(path("with"));
  ASSERT_TRUE(r.has_optimizer_state());
  EXPECT_EQ(r.optimizer_state().step, 12);
  EXPECT_EQ(r.optimizer_state().learning_rate, 0.01);
  const auto& ps = r.optimizer_state().param_states;
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_TRUE(same_bytes(ps.at("fc.weight").at("exp_avg"), s.optimizer_state().param_states.at("fc.weight").at("exp_avg")));
  EXPECT_TRUE(same_bytes(ps.at("fc.weight").at("exp_avg_sq"),
                         s.optimizer_state().param_states.at("fc.weight").at("exp_avg_sq")));
  EXPECT_TRUE(same_bytes(ps.at("emb/table:0").at("momentum"),
                         s.optimizer_state().param_states.at("emb/table:0").at("momentum")));
  EXPECT_EQ(r.parameter_names(), s.parameter_names());
  EXPECT_EQ(std::get<std::string>(r.get_property("note")), "héllo \"q\"\n");

  CheckpointState w = CheckpointState::load(path("without"));
  EXPECT_FALSE(w.has_optimizer_state());
  EXPECT_EQ(w.num_parameters(), 4u);
  EXPECT_LT(read_file(path("without")).size(), read_file(path("with")).size());

  // Errors name what is wrong.
  EXPECT_NE(error_of([&] { s.set_optimizer_tensor("nope", "m", Tensor::zeros(DType::kFloat32, {1})); })
                .find("no parameter named 'nope'"),
            std::string::npos);
  EXPECT_THROW(s.set_optimizer_tensor("fc.bias", "a/b", Tensor::zeros(DType::kFloat32, {4})), Error);
  EXPECT_THROW(s.add_parameter("__optimizer__/x", Tensor::zeros(DType::kFloat32, {1}), true), Error);
  EXPECT_THROW(s.add_parameter("__metadata__", Tensor::zeros(DType::kFloat32, {1}), true), Error);
  EXPECT_THROW(s.add_parameter("fc.bias", Tensor::zeros(DType::kFloat32, {1}), true), Error);
}

TEST_F(CheckpointTest, ParametersGradsAndChecks) {
  CheckpointState s = sample_state();
  Parameter& w = s.parameter("fc.weight");
  Tensor alias = w.data();
  Tensor v = Tensor::from_vector<float>(std::vector<float>(12, 2.5f), {4, 3});
  s.set_parameter("fc.weight", v);
  EXPECT_EQ(alias.data<float>()[5], 2.5f);  // copied into the existing storage
  EXPECT_FALSE(v.shares_storage_with(alias));
  std::string e1 = error_of([&] { s.set_parameter("fc.weight", Tensor::zeros(DType::kFloat64, {4, 3})); });
  EXPECT_NE(e1.find("parameter 'fc.weight'"), std::string::npos) << e1;
  EXPECT_NE(e1.find("expected float32 [4, 3], got float64 [4, 3]"), std::string::npos) << e1;
  std::string e2 = error_of([&] { s.set_parameter("fc.weight", Tensor::zeros(DType::kFloat32, {3, 4})); });
  EXPECT_NE(e2.find("expected float32 [4, 3], got float32 [3, 4]"), std::string::npos) << e2;
  EXPECT_NE(error_of([&] { s.get_parameter("missing"); }).find("no parameter named 'missing'"), std::string::npos);

  EXPECT_FALSE(w.has_grad());
  Tensor& g = w.ensure_grad();
  EXPECT_EQ(g.shape(), (Shape{4, 3}));
  g.data<float>()[0] = 1.0f;
  w.zero_grad();
  EXPECT_EQ(w.grad().data<float>()[0], 0.0f);
  EXPECT_THROW(w.set_grad(Tensor::zeros(DType::kFloat32, {4})), Error);
  w.set_grad(Tensor());
  EXPECT_FALSE(w.has_grad());

  CheckpointState c = s.clone();
  Tensor cb = c.parameter("fc.bias").data();  // a Tensor copy aliases the parameter's storage
  cb.data<float>()[0] = 42.0f;
  EXPECT_EQ(c.parameter("fc.bias").data().data<float>()[0], 42.0f);
  EXPECT_NE(s.parameter("fc.bias").data().data<float>()[0], 42.0f);
}

TEST_F(CheckpointTest, NominalAndContiguousBuffer) {
  Graph g;
  g.name = "mlp";
  g.initializers["w"] = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  g.initializers["b"] = Tensor::from_vector<float>({7, 8}, {2});
  g.initializers["frozen"] = Tensor::from_vector<float>({9}, {1});
  g.initializers["shape"] = Tensor::from_vector<int64_t>({2, 3}, {2});

  CheckpointState full = CheckpointState::from_initializers(g, {"w", "b"});
  EXPECT_EQ(full.parameter_names(), (std::vector<std::string>{"w", "b", "frozen", "shape"}));
  EXPECT_TRUE(full.parameter("w").requires_grad());
  EXPECT_FALSE(full.parameter("frozen").requires_grad());
  EXPECT_FALSE(full.parameter("w").data().shares_storage_with(g.initializers["w"]));
  Tensor buf = full.to_contiguous_buffer(true);
  ASSERT_EQ(buf.shape(), (Shape{8}));
  EXPECT_EQ(buf.data<float>()[6], 7.0f);
  EXPECT_EQ(full.buffer_numel(true), 8);
  EXPECT_NE(error_of([&] { full.to_contiguous_buffer(false); }).find("share one dtype"), std::string::npos);

  CheckpointState nom = CheckpointState::from_initializers(g, {"w", "b"}, /*nominal=*/true);
  EXPECT_TRUE(nom.is_nominal());
  EXPECT_NE(error_of([&] { nom.get_parameter("w"); }).find("nominal"), std::string::npos);
  nom.save(path("nominal"));
  CheckpointState r = CheckpointState::load(path("nominal"));
  EXPECT_TRUE(r.is_nominal());
  EXPECT_EQ(r.parameter_names(), nom.parameter_names());
  EXPECT_EQ(r.parameter("w").shape(), (Shape{2, 3}));
  EXPECT_EQ(r.parameter("shape").dtype(), DType::kInt64);
  EXPECT_TRUE(r.parameter("b").requires_grad());

  // A wrong buffer is rejected before anything is written.
  std::string e = error_of([&] { r.fill_parameters_from_buffer(Tensor::zeros(DType::kFloat32, {7}), true); });
  EXPECT_NE(e.find("1-D float32 buffer of 8 elements"), std::string::npos) << e;
  EXPECT_FALSE(r.parameter("w").has_data());
  EXPECT_THROW(r.fill_parameters_from_buffer(Tensor::zeros(DType::kFloat64, {8}), true), Error);
  EXPECT_THROW(r.fill_parameters_from_buffer(Tensor::zeros(DType::kFloat32, {2, 4}), true), Error);

  r.fill_parameters_from_buffer(buf, true);
  EXPECT_TRUE(same_bytes(r.get_parameter("w"), g.initializers["w"]));
  EXPECT_TRUE(same_bytes(r.get_parameter("b"), g.initializers["b"]));
  EXPECT_TRUE(r.is_nominal());  // frozen ones still have no data
  r.parameter("frozen").set_data(g.initializers["frozen"]);
  r.parameter("shape").set_data(g.initializers["shape"]);
  EXPECT_FALSE(r.is_nominal());

  EXPECT_NE(error_of([&] { CheckpointState::from_initializers(g, {"nope"}); }).find("'nope' is not an initializer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { CheckpointState::from_initializers(g, {"shape"}); }).find("only floating-point"),
            std::string::npos);
}

TEST_F(CheckpointTest, ForeignSafetensorsFileLoads) {
  // As another safetensors writer might produce it: no onnxtrain metadata, other key order.
  std::string data(8 + 2, '\0');
  float f[2] = {1.5f, -2.0f};
  std::memcpy(data.data(), f, 8);
  data[8] = 5;
  data[9] = 6;
  std::string header = R"({"ids":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},)"
                       R"("__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}})";
  write_file(path("foreign"), safetensors_bytes(header, data));
  CheckpointState s = CheckpointState::load(path("foreign"));
  EXPECT_EQ(s.parameter_names(), (std::vector<std::string>{"ids", "w"}));
  EXPECT_EQ(s.get_parameter("w").data<float>()[1], -2.0f);
  EXPECT_TRUE(s.parameter("w").requires_grad());
  EXPECT_FALSE(s.parameter("ids").requires_grad());
  EXPECT_EQ(s.get_parameter("ids").data<uint8_t>()[1], 6);
}

// ---------------------------------------------------------------- corrupt files

TEST_F(CheckpointTest, TruncatedAtEveryPoint) {
  CheckpointState s = sample_state();
  s.save(path("good"));
  std::string bytes = read_file(path("good"));
  write_file(path("bad"), bytes);
  for (size_t cut = bytes.size(); cut-- > 0;) {  // shrink the same file: no rewrites
    ASSERT_EQ(::truncate(path("bad").c_str(), off_t(cut)), 0);
    std::string e = error_of([&] { CheckpointState::load(path("bad")); });
    ASSERT_NE(e, "<no error>") << "cut at " << cut;
    ASSERT_NE(e.find(path("bad")), std::string::npos) << e;
  }
  write_file(path("bad"), bytes.substr(0, 4));
  EXPECT_NE(error_of([&] { CheckpointState::load(path("bad")); }).find("too short"), std::string::npos);
}

TEST_F(CheckpointTest, EveryFlippedByteIsDetected) {
  CheckpointState s = sample_state();
  s.save(path("good"));
  const std::string bytes = read_file(path("good"));
  write_file(path("bad"), bytes);
  int fd = ::open(path("bad").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80)}) {
      char flipped = char(uint8_t(bytes[i]) ^ mask);
      ASSERT_EQ(::pwrite(fd, &flipped, 1, off_t(i)), 1);
      std::string e = error_of([&] { CheckpointState::load(path("bad")); });
      ASSERT_EQ(::pwrite(fd, &bytes[i], 1, off_t(i)), 1);
      ASSERT_NE(e, "<no error>") << "byte " << i << " mask " << int(mask);
    }
  }
  ::close(fd);
  // A flipped data byte is a data checksum error; a flipped metadata value a header checksum error.
  std::string bad = bytes;
  bad.back() = char(bad.back() ^ 0x10);
  write_file(path("bad"), bad);
  std::string e = error_of([&] { CheckpointState::load(path("bad")); });
  EXPECT_NE(e.find("data checksum mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find(path("bad")), std::string::npos) << e;
  bad = bytes;
  size_t pos = bad.find("\\\"step\\\":12");
  ASSERT_NE(pos, std::string::npos);
  bad[pos + 10] = '3';  // step 12 -> 13: still valid JSON
  write_file(path("bad"), bad);
  e = error_of([&] { CheckpointState::load(path("bad")); });
  EXPECT_NE(e.find("header checksum mismatch"), std::string::npos) << e;
}

TEST_F(CheckpointTest, RandomMutationsNeverCrash) {
  CheckpointState s = sample_state();
  s.save(path("good"));
  const std::string bytes = read_file(path("good"));
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 300; ++iter) {
    std::string bad = bytes;
    int edits = 1 + int(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      size_t at = rng() % bad.size();
      switch (rng() % 3) {
        case 0: bad[at] = char(rng()); break;                       // overwrite
        case 1: bad.erase(at, 1 + rng() % 8); break;                // delete
        default: bad.insert(at, 1 + rng() % 4, char(rng())); break;  // insert
      }
    }
    write_file(path("bad"), bad);
    std::string e = error_of([&] { CheckpointState::load(path("bad")); });
    ASSERT_NE(e, "<no error>") << "seed 12345, iteration " << iter;
  }
  for (int iter = 0; iter < 2000; ++iter) {  // the JSON reader alone, on random bytes
    std::string junk(rng() % 16, ' ');
    static const char kAlphabet[] = "{}[]\":,0123456789.eE-+tfnrulse \\u\x01\xC3\xA9";
    for (auto& c : junk) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    try {
      json::Value v = json::parse(junk);
      EXPECT_EQ(json::dump(json::parse(json::dump(v))), json::dump(v)) << junk;
    } catch (const Error&) {
    }
  }
}

TEST_F(CheckpointTest, HandCraftedBadHeaders) {
  auto load_error = [&](const std::string& file) {
    write_file(path("bad"), file);
    return error_of([&] { CheckpointState::load(path("bad")); });
  };
  std::string data(16, '\0');
  auto hdr = [](const std::string& a, const std::string& b) {
    return R"({"a":{"dtype":"F32","shape":[2],"data_offsets":)" + a + R"(},"b":{"dtype":"F32","shape":[2],"data_offsets":)" +
           b + "}}";
  };
  EXPECT_EQ(load_error(safetensors_bytes(hdr("[0,8]", "[8,16]"), data)), "<no error>");
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8]", "[4,12]"), data.substr(0, 12))).find("overlaps tensor 'a'"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8]", "[0,8]"), data.substr(0, 8))).find("overlaps"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8]", "[9,17]"), data + "x")).find("belong to no tensor"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8]", "[8,16]"), data + "xx")).find("trailing bytes"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8]", "[8,12]"), data.substr(0, 12))).find("need 8 bytes"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[8,0]", "[8,16]"), data)).find("reversed"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8]", "[8,24]"), data)).find("run past the data section"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,-8]", "[8,16]"), data)).find("non-negative"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0,8.0]", "[8,16]"), data)).find("non-negative integers"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(hdr("[0]", "[8,16]"), data)).find("[begin, end]"), std::string::npos);
  std::string e = load_error(safetensors_bytes(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", data.substr(0, 8)));
  EXPECT_NE(e.find("dtype \"F31\" is not supported"), std::string::npos) << e;
  EXPECT_NE(load_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data)).find("non-negative"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", data.substr(0, 8)))
                .find("unknown key"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "\x01\x02"))
                .find("not 0 or 1"),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"({"a":1})", "")).find("expected an object"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"({"__metadata__":{"k":1}})", "")).find("not a string"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"([])", "")).find("does not start with '{'"), std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"({"a":})", "")).find("invalid JSON at byte 5"), std::string::npos);
  e = load_error(safetensors_bytes("{}", "", 1000));
  EXPECT_NE(e.find("header length 1000 runs past the end of the file (10 bytes"), std::string::npos) << e;
  EXPECT_NE(e.find(path("bad")), std::string::npos) << e;
  e = load_error(safetensors_bytes("{}", "", int64_t(1) << 62));
  EXPECT_NE(e.find("header length 4611686018427387904 runs past"), std::string::npos) << e;
  // onnxtrain keys without the rest of the onnxtrain metadata.
  EXPECT_NE(load_error(safetensors_bytes(R"({"__metadata__":{"onnxtrain.format_version":"2"}})", "")).find("format version \"2\""),
            std::string::npos);
  EXPECT_NE(load_error(safetensors_bytes(R"({"__metadata__":{"onnxtrain.format_version":"1"}})", "")).find("header checksum"),
            std::string::npos);
  // Not a file.
  EXPECT_NE(error_of([&] { CheckpointState::load(dir_.string()); }).find("not a regular file"), std::string::npos);
  e = error_of([&] { CheckpointState::load(path("missing")); });
  EXPECT_NE(e.find("cannot open"), std::string::npos);
  EXPECT_NE(e.find(path("missing")), std::string::npos);
}

TEST_F(CheckpointTest, FailedLoadLeavesStateUntouched) {
  CheckpointState s = sample_state();
  s.save(path("good"));
  std::string bytes = read_file(path("good"));
  bytes[bytes.size() - 3] ^= 0x55;
  write_file(path("bad"), bytes);
  CheckpointState kept = CheckpointState::load(path("good"));
  Tensor before = kept.get_parameter("fc.weight").clone();
  EXPECT_THROW(kept = CheckpointState::load(path("bad")), Error);
  EXPECT_TRUE(same_bytes(kept.get_parameter("fc.weight"), before));
  EXPECT_EQ(kept.num_parameters(), 4u);
}

// ---------------------------------------------------------------- 64-bit sizes

TEST(CheckpointLayout, SixtyFourBitOffsets) {
  const uint64_t G = uint64_t(1) << 30;
  std::vector<TensorEntry> ok = {{"b", DType::kFloat32, {int64_t(G)}, 4 * G, 8 * G},
                                 {"a", DType::kFloat32, {int64_t(G)}, 0, 4 * G}};
  EXPECT_NO_THROW(safetensors::validate_layout(ok, 8 * G));
  std::vector<TensorEntry> overlap = {{"a", DType::kFloat32, {int64_t(G)}, 0, 4 * G},
                                      {"b", DType::kFloat32, {int64_t(G)}, 4 * G - 4, 8 * G - 4}};
  std::string e = error_of([&] { safetensors::validate_layout(overlap, 8 * G); });
  EXPECT_NE(e.find("[4294967292, 8589934588)"), std::string::npos) << e;
  e = error_of([&] { safetensors::validate_layout(ok, 8 * G + 1); });
  EXPECT_NE(e.find("8589934593"), std::string::npos) << e;

  // Sizes over 4 GiB from the header, without the data.
  auto header = json::parse(R"({"big":{"dtype":"F32","shape":[2147483653],"data_offsets":[0,8589934612]}})");
  auto entries = safetensors::parse_tensor_entries(header, 8589934612ull);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].end, 8589934612ull);
  e = error_of([&] { safetensors::parse_tensor_entries(header, 8589934611ull); });
  EXPECT_NE(e.find("run past the data section (8589934611 bytes)"), std::string::npos) << e;
  auto overflow = json::parse(R"({"x":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,0]}})");
  EXPECT_NE(error_of([&] { safetensors::parse_tensor_entries(overflow, 0); }).find("overflows"), std::string::npos);
  EXPECT_EQ(safetensors::checked_nbytes(DType::kFloat64, {int64_t(G), 3}, "t"), 24 * G);
}

TEST_F(CheckpointTest, SparseFileOverFourGigabytes) {
  // A 5 GiB sparse file whose header claims 5 GiB + 4 bytes: rejected from the header alone,
  // with the sizes computed in 64 bits (nothing is allocated or read).
  const uint64_t size = uint64_t(5) << 30;
  std::string header = R"({"w":{"dtype":"F32","shape":[1342177281],"data_offsets":[0,5368709124]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  write_file(path("sparse"), safetensors_bytes(header, ""));
  ASSERT_EQ(::truncate(path("sparse").c_str(), off_t(8 + header.size() + size)), 0);
  std::string e = error_of([&] { CheckpointState::load(path("sparse")); });
  EXPECT_NE(e.find("data_offsets [0, 5368709124] run past the data section (5368709120 bytes)"), std::string::npos) << e;
}

// ---------------------------------------------------------------- failed saves

TEST_F(CheckpointTest, FailedSaveLeavesOldFile) {
  CheckpointState old_state = sample_state();
  old_state.save(path("ckpt"));
  const std::string old_bytes = read_file(path("ckpt"));

  // An I/O failure while writing (file size limit: works even as root, unlike chmod).
  CheckpointState big;
  big.add_parameter("w", Tensor::zeros(DType::kFloat32, {1 << 18}), true);  // 1 MiB
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string e = error_of([&] { big.save(path("ckpt")); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(e.find("cannot write temporary file"), std::string::npos) << e;
  EXPECT_NE(e.find(path("ckpt")), std::string::npos) << e;
  EXPECT_EQ(read_file(path("ckpt")), old_bytes);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // temp file removed

  // An invalid state fails before the file is touched.
  CheckpointState bad = sample_state();
  bad.optimizer_state().param_states["ghost"]["m"] = Tensor::zeros(DType::kFloat32, {1});
  e = error_of([&] { bad.save(path("ckpt")); });
  EXPECT_NE(e.find("'ghost', which is not a parameter"), std::string::npos) << e;
  EXPECT_EQ(read_file(path("ckpt")), old_bytes);

  // A directory that does not exist, and a path that is a directory.
  e = error_of([&] { old_state.save(path("no/such/dir/ckpt")); });
  EXPECT_NE(e.find("cannot create temporary file"), std::string::npos) << e;
  fs::create_directories(path("adir/sub"));
  e = error_of([&] { old_state.save(path("adir")); });
  EXPECT_NE(e.find("cannot rename"), std::string::npos) << e;
  EXPECT_TRUE(fs::is_directory(path("adir/sub")));

  // Unwritable directory (meaningful only when not running as root).
  if (::geteuid() != 0) {
    fs::create_directories(path("ro"));
    old_state.save(path("ro/ckpt"));
    fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_THROW(big.save(path("ro/ckpt")), Error);
    fs::permissions(path("ro"), fs::perms::owner_all);
    EXPECT_EQ(read_file(path("ro/ckpt")), old_bytes);
  }

  // Overwriting works and replaces the file atomically.
  big.save(path("ckpt"));
  EXPECT_EQ(CheckpointState::load(path("ckpt")).parameter_names(), std::vector<std::string>{"w"});
}

}  // namespace
}  // namespace onnxtrain

// ONNX Runtime's training checkpoint format (src/training/ort_checkpoint.*): round trips through
// the writer and reader, versions 1 and 2, external data, nominal states, and bad files (truncated,
// flipped, bad offsets, unknown version, dims that disagree with the bytes) that must all be clear
// errors naming the file and the field; failed saves leave the files on disk as they were.
// tests/python/test_ort_checkpoint.py checks the same files against ONNX Runtime 1.19.2 itself.
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "onnxtrain/training.h"
#include "test_util.h"
#include "training/ort_checkpoint.h"
#include "training/ort_checkpoint_trailer.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::random_tensor;
using test::read_file;
using test::write_file;

class OrtCheckpointTest : public test::TempDirTest {};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

// Trainable parameters first, then frozen ones: the order ORT's format keeps them in.
CheckpointState sample_state() {
  std::mt19937 rng(11);
  CheckpointState s;
  s.add_parameter("fc.weight", random_tensor(DType::kFloat32, {4, 3}, rng), true);
  s.add_parameter("fc.bias", random_tensor(DType::kFloat32, {4}, rng), true);
  s.add_parameter("emb/table:0", random_tensor(DType::kBFloat16, {5, 2}, rng), true);
  s.add_parameter("big", random_tensor(DType::kFloat32, {8, 8}, rng), true);  // 256 bytes: external when asked
  s.add_parameter("mask", random_tensor(DType::kBool, {3}, rng), false);
  s.add_parameter("steps", random_tensor(DType::kInt64, {}, rng), false);
  s.add_parameter("empty", Tensor::empty(DType::kFloat16, {0, 4}), false);
  s.add_property("epoch", int64_t{3});
  s.add_property("best", 0.5);  // exact in float32
  s.add_property("note", std::string("h\xc3\xa9llo"));
  s.optimizer_state().step = 12;
  s.optimizer_state().learning_rate = 0.25;
  s.set_optimizer_tensor("fc.weight", "exp_avg", random_tensor(DType::kFloat32, {4, 3}, rng));
  s.set_optimizer_tensor("fc.weight", "exp_avg_sq", random_tensor(DType::kFloat32, {4, 3}, rng));
  s.set_optimizer_tensor("fc.bias", "exp_avg", random_tensor(DType::kFloat32, {4}, rng));
  s.set_optimizer_tensor("fc.bias", "exp_avg_sq", random_tensor(DType::kFloat32, {4}, rng));
  s.set_optimizer_tensor("big", "exp_avg", random_tensor(DType::kFloat32, {8, 8}, rng));
  s.set_optimizer_tensor("emb/table:0", "max_exp_avg_sq", random_tensor(DType::kBFloat16, {5, 2}, rng));
  return s;
}

void expect_same(const CheckpointState& a, const CheckpointState& b) {
  ASSERT_EQ(a.parameter_names(), b.parameter_names());
  for (const auto& p : a.parameters()) {
    const Parameter& q = b.parameter(p.name());
    EXPECT_EQ(p.requires_grad(), q.requires_grad()) << p.name();
    ASSERT_EQ(p.has_data(), q.has_data()) << p.name();
    if (p.has_data()) {
      EXPECT_TRUE(same_bytes(p.data(), q.data())) << p.name();
    }
  }
  EXPECT_EQ(a.properties(), b.properties());
  ASSERT_EQ(a.has_optimizer_state(), b.has_optimizer_state());
  if (!a.has_optimizer_state()) return;
  EXPECT_EQ(a.optimizer_state().step, b.optimizer_state().step);
  EXPECT_EQ(a.optimizer_state().learning_rate, b.optimizer_state().learning_rate);
  const auto& x = a.optimizer_state().param_states;
  const auto& y = b.optimizer_state().param_states;
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [param, states] : x) {
    ASSERT_TRUE(y.count(param)) << param;
    ASSERT_EQ(states.size(), y.at(param).size()) << param;
    for (const auto& [name, t] : states) {
      ASSERT_TRUE(y.at(param).count(name)) << param << "/" << name;
      EXPECT_TRUE(same_bytes(t, y.at(param).at(name))) << param << "/" << name;
    }
  }
}

// Little-endian reads and writes of the flatbuffer, for tests that corrupt one field.
uint32_t u32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
template <typename T>
void poke(std::string& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}
// Position of a field of the table at `table` (slot in declaration order), 0 when absent.
size_t field_pos(const std::string& b, size_t table, int slot) {
  int32_t soff;
  std::memcpy(&soff, b.data() + table, 4);
  const size_t vt = size_t(int64_t(table) - soff);
  uint16_t vsize, off = 0;
  std::memcpy(&vsize, b.data() + vt, 2);
  if (size_t(4 + 2 * slot + 2) <= vsize) std::memcpy(&off, b.data() + vt + 4 + 2 * slot, 2);
  return off ? table + off : 0;
}
size_t follow(const std::string& b, size_t at) { return at + u32(b, at); }
// The first trainable parameter's Tensor table.
size_t first_tensor(const std::string& b) {
  const size_t root = follow(b, 0);
  const size_t ms = follow(b, field_pos(b, root, 1));
  const size_t vec = follow(b, field_pos(b, ms, 0));
  return follow(b, vec + 4);
}

TEST_F(OrtCheckpointTest, RoundTripKeepsEverything) {
  const CheckpointState s = sample_state();
  s.save(path("ckpt"), true, CheckpointFormat::kOrt);
  const std::string bytes = read_file(path("ckpt"));
  ASSERT_GE(bytes.size(), 8u);
  EXPECT_EQ(bytes.substr(4, 4), "ODTC");
  EXPECT_EQ(CheckpointState::file_format(path("ckpt")), CheckpointFormat::kOrt);
  const CheckpointState back = CheckpointState::load(path("ckpt"));
  expect_same(s, back);
  // ORT's names for AdamW's moments in the file, onnxtrain's in memory.
  EXPECT_TRUE(contains(bytes, "momentum0") && contains(bytes, "momentum1"));
  EXPECT_FALSE(contains(bytes, std::string("\x0a\0\0\0exp_avg_sq", 14)));  // as a name of its own (length 10)
  EXPECT_TRUE(back.optimizer_state().param_states.at("fc.weight").count("exp_avg_sq"));
  // Saved again, the same bytes; without optimizer state, none.
  back.save(path("again"), true, CheckpointFormat::kOrt);
  EXPECT_EQ(read_file(path("again")), bytes);
  s.save(path("noopt"), false, CheckpointFormat::kOrt);
  EXPECT_FALSE(CheckpointState::load(path("noopt")).has_optimizer_state());
  // And through onnxtrain's format and back.
  back.save(path("ours"));
  EXPECT_EQ(CheckpointState::file_format(path("ours")), CheckpointFormat::kOnnxtrain);
  CheckpointState::load(path("ours")).save(path("ort2"), true, CheckpointFormat::kOrt);
  EXPECT_EQ(read_file(path("ort2")), bytes);
}

TEST_F(OrtCheckpointTest, FloatPropertiesAndLearningRateAreFloat32) {
  CheckpointState s;
  s.add_parameter("w", Tensor::zeros(DType::kFloat32, {2}), true);
  s.add_property("x", 0.1);
  s.optimizer_state().learning_rate = 0.001;
  s.save(path("ckpt"), true, CheckpointFormat::kOrt);
  const CheckpointState back = CheckpointState::load(path("ckpt"));
  EXPECT_EQ(std::get<double>(back.get_property("x")), double(0.1f));
  EXPECT_EQ(*back.optimizer_state().learning_rate, double(0.001f));
}

TEST_F(OrtCheckpointTest, VersionOneReadsAndHasNoExternalData) {
  const CheckpointState s = sample_state();
  ort_checkpoint::write(s, path("v1"), true, {1, 0});  // threshold 0: version 1 still keeps all inline
  EXPECT_FALSE(fs::exists(path("v1.data")));
  expect_same(s, CheckpointState::load(path("v1")));
  std::string b = read_file(path("v1"));
  EXPECT_EQ(u32(b, field_pos(b, follow(b, 0), 0)), 1u);
}

TEST_F(OrtCheckpointTest, ExternalData) {
  const CheckpointState s = sample_state();
  ort_checkpoint::write(s, path("ckpt"), true, {2, 0});
  ASSERT_TRUE(fs::exists(path("ckpt.data")));
  expect_same(s, CheckpointState::load(path("ckpt")));
  // Tensors of 64 bytes or more moved out; smaller ones (ORT's rule) stay inline.
  ort_checkpoint::write(s, path("inline"), true, {2, ort_checkpoint::kExternalWhenNeeded});
  EXPECT_FALSE(fs::exists(path("inline.data")));
  EXPECT_LT(fs::file_size(path("ckpt")), fs::file_size(path("inline")));
  EXPECT_LT(fs::file_size(path("ckpt.data")), fs::file_size(path("inline")));
  const std::string data = read_file(path("ckpt.data"));

  // A truncated, a missing and a replaced external file: errors naming it (the trailer's CRC
  // catches them first)...
  const std::string main = read_file(path("ckpt"));
  write_file(path("ckpt.data"), data.substr(0, data.size() - 1));
  std::string e = error_of([&] { CheckpointState::load(path("ckpt")); });
  EXPECT_TRUE(contains(e, path("ckpt")) && contains(e, "CRC-32C") && contains(e, "ckpt.data")) << e;
  std::string flipped = data;
  flipped[data.size() / 2] ^= 1;
  write_file(path("ckpt.data"), flipped);
  e = error_of([&] { CheckpointState::load(path("ckpt")); });
  EXPECT_TRUE(contains(e, "CRC-32C") && contains(e, "ckpt.data")) << e;
  // ... and, in a file as ORT writes it (no trailer), the structural checks name the tensor.
  write_file(path("ckpt"), main.substr(0, main.size() - ort_checkpoint::kTrailerBytes));
  write_file(path("ckpt.data"), data.substr(0, data.size() - 1));
  e = error_of([&] { CheckpointState::load(path("ckpt")); });
  EXPECT_TRUE(contains(e, path("ckpt")) && contains(e, "external_data_offset") && contains(e, "ckpt.data")) << e;
  fs::remove(path("ckpt.data"));
  e = error_of([&] { CheckpointState::load(path("ckpt")); });
  EXPECT_TRUE(contains(e, "cannot open external data file") && contains(e, "ckpt.data")) << e;
}

// The commit of a checkpoint with external data (ort_checkpoint_trailer.h), stopped at each step.
TEST_F(OrtCheckpointTest, ExternalDataCommitIsAtomic) {
  CheckpointState a = sample_state(), b = sample_state();
  std::mt19937 rng(7);
  b.set_parameter("big", random_tensor(DType::kFloat32, {8, 8}, rng));
  b.add_property("which", std::string("new"));
  ort_checkpoint::write(a, path("ckpt"), true, {2, 0});
  ort_checkpoint::write(b, path("next"), true, {2, 0});
  const std::string old_main = read_file(path("ckpt")), old_data = read_file(path("ckpt.data"));
  const std::string new_main = read_file(path("next")), new_data = read_file(path("next.data"));
  // Killed after step 1 (".data.new" written, the main file not yet): the old checkpoint.
  write_file(path("ckpt.data.new"), new_data);
  expect_same(a, CheckpointState::load(path("ckpt")));
  // Killed after step 2 (the commit), before step 3: the new one, and the load finishes step 3.
  write_file(path("ckpt"), new_main);
  expect_same(b, CheckpointState::load(path("ckpt")));
  EXPECT_EQ(read_file(path("ckpt.data")), new_data);
  EXPECT_FALSE(fs::exists(path("ckpt.data.new")));
  // The same stop, then a save: it finishes step 3 before writing its own ".data.new".
  write_file(path("ckpt"), old_main);
  write_file(path("ckpt.data"), new_data);
  write_file(path("ckpt.data.new"), old_data);
  ort_checkpoint::write(b, path("ckpt"), true, {2, 0});
  expect_same(b, CheckpointState::load(path("ckpt")));
  EXPECT_FALSE(fs::exists(path("ckpt.data.new")));
  // A data file that is neither: an error naming both CRCs.
  write_file(path("ckpt.data"), old_data);
  const std::string e = error_of([&] { CheckpointState::load(path("ckpt")); });
  EXPECT_TRUE(contains(e, "trailer expects") && contains(e, "ckpt.data")) << e;
}

// A save that renames its data file into place while a load is between the data file's check and
// the read of its tensors: the load still reads the checked file (the old checkpoint, whole), not
// the old main file's offsets into the new data.
TEST_F(OrtCheckpointTest, LoadReadsTheDataFileItChecked) {
  CheckpointState a = sample_state(), b = sample_state();
  std::mt19937 rng(7);
  b.set_parameter("big", random_tensor(DType::kFloat32, {8, 8}, rng));
  ort_checkpoint::write(a, path("ckpt"), true, {2, 0});
  ort_checkpoint::write(b, path("next"), true, {2, 0});
  static std::string replacement;
  replacement = path("next.data");
  ort_checkpoint::debug_after_external_check = [](const std::string& data_path) {
    fs::rename(replacement, data_path);
  };
  CheckpointState loaded;
  try {
    loaded = CheckpointState::load(path("ckpt"));
  } catch (...) {
    ort_checkpoint::debug_after_external_check = nullptr;
    throw;
  }
  ort_checkpoint::debug_after_external_check = nullptr;
  ASSERT_FALSE(fs::exists(path("next.data")));  // the hook ran
  expect_same(a, loaded);
}

TEST_F(OrtCheckpointTest, NominalStatesHaveNoShapesInOrtsFormat) {
  CheckpointState s;
  s.add_nominal_parameter("w", DType::kFloat32, {2, 3}, true);
  s.add_nominal_parameter("b", DType::kFloat32, {3}, false);
  s.save(path("nominal"), true, CheckpointFormat::kOrt);
  CheckpointState back = CheckpointState::load(path("nominal"));
  ASSERT_TRUE(back.is_nominal());
  EXPECT_FALSE(back.parameter("w").shape_known());
  EXPECT_TRUE(back.parameter("w").requires_grad());
  EXPECT_FALSE(back.parameter("b").requires_grad());
  EXPECT_TRUE(contains(error_of([&] { back.to_contiguous_buffer(true); }), "has no shape"));
  EXPECT_TRUE(contains(error_of([&] { back.set_parameter("w", Tensor::zeros(DType::kInt32, {2})); }), "expected float32"));
  // Unshaped parameters keep being unshaped through onnxtrain's format ("shape": null).
  back.save(path("ours"));
  CheckpointState ours = CheckpointState::load(path("ours"));
  EXPECT_FALSE(ours.parameter("w").shape_known());
  // The first data fixes the shape.
  ours.set_parameter("w", Tensor::zeros(DType::kFloat32, {2, 3}));
  EXPECT_EQ(ours.parameter("w").shape(), (Shape{2, 3}));
  // A state with some data and some not has no form in ORT's format.
  std::string e = error_of([&] { ours.save(path("mixed"), true, CheckpointFormat::kOrt); });
  EXPECT_TRUE(contains(e, "not a mix") && contains(e, path("mixed"))) << e;
  EXPECT_FALSE(fs::exists(path("mixed")));
}

TEST_F(OrtCheckpointTest, TruncatedAtEveryPoint) {
  sample_state().save(path("ckpt"), true, CheckpointFormat::kOrt);
  const std::string bytes = read_file(path("ckpt"));
  // A cut inside onnxtrain's trailer leaves ORT's complete buffer, which loads as ORT's own files do.
  const size_t buffer_end = bytes.size() - ort_checkpoint::kTrailerBytes;
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_file(path("cut"), bytes.substr(0, n));
    if (n >= buffer_end) {
      expect_same(sample_state(), CheckpointState::load(path("cut")));
      continue;
    }
    std::string e = error_of([&] { CheckpointState::load(path("cut")); });
    ASSERT_TRUE(contains(e, path("cut"))) << "cut at " << n << ": " << e;
  }
}

TEST_F(OrtCheckpointTest, FlippedBytesNeverCrash) {
  sample_state().save(path("ckpt"), true, CheckpointFormat::kOrt);
  const std::string bytes = read_file(path("ckpt"));
  // ORT's format has no checksum: a flipped tensor byte loads as another value. Every flip
  // must still be either a clean load or an error naming the file; structural flips are errors.
  size_t errors = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] = char(b[i] ^ 0x5a);
    write_file(path("flip"), b);
    std::string e = error_of([&] { CheckpointState::load(path("flip")); });
    if (e != "<no error>") {
      ++errors;
      ASSERT_TRUE(contains(e, path("flip"))) << i << ": " << e;
    }
  }
  EXPECT_GT(errors, bytes.size() / 4) << errors << " of " << bytes.size();
  // The first 8 bytes (root offset and identifier) are always caught.
  for (size_t i = 0; i < 8; ++i) {
    std::string b = bytes;
    b[i] = char(b[i] ^ 0x5a);
    write_file(path("flip"), b);
    EXPECT_NE(error_of([&] { CheckpointState::load(path("flip")); }), "<no error>") << i;
  }
}

TEST_F(OrtCheckpointTest, HandCraftedBadFields) {
  sample_state().save(path("ckpt"), true, CheckpointFormat::kOrt);
  std::string good = read_file(path("ckpt"));
  // Without onnxtrain's trailer, as ORT writes it (the trailer's CRC would catch every edit below
  // first): the structural checks are what guards ORT's files.
  good.resize(good.size() - ort_checkpoint::kTrailerBytes);
  const size_t root = follow(good, 0);
  auto load_error = [&](const std::string& b) {
    write_file(path("bad"), b);
    return error_of([&] { CheckpointState::load(path("bad")); });
  };
  // An unknown version.
  std::string b = good;
  poke<int32_t>(b, field_pos(b, root, 0), 3);
  std::string e = load_error(b);
  EXPECT_TRUE(contains(e, path("bad")) && contains(e, "checkpoint.version: expected 1") && contains(e, "got 3")) << e;
  // The root offset outside the file.
  b = good;
  poke<uint32_t>(b, 0, uint32_t(good.size() + 100));
  e = load_error(b);
  EXPECT_TRUE(contains(e, "root offset: expected an offset inside the file")) << e;
  // The module state's offset outside the file.
  b = good;
  const size_t ms_field = field_pos(b, root, 1);
  poke<uint32_t>(b, ms_field, uint32_t(0x7ffffff0));
  e = load_error(b);
  EXPECT_TRUE(contains(e, "checkpoint.module_state: expected an offset inside the file")) << e;
  // A vtable offset that points outside.
  b = good;
  poke<int32_t>(b, root, int32_t(-0x10000));
  e = load_error(b);
  EXPECT_TRUE(contains(e, "checkpoint: expected its vtable inside the file")) << e;
  // Dims that disagree with the bytes: fc.weight [4, 3] made [4, 5].
  b = good;
  const size_t t = first_tensor(b);
  const size_t dims = follow(b, field_pos(b, t, 2));
  ASSERT_EQ(u32(b, dims), 2u);
  poke<int64_t>(b, dims + 12, 5);
  e = load_error(b);
  EXPECT_TRUE(contains(e, "module_state.requires_grad_params[0] ('fc.weight').raw_data: expected 80 bytes for "
                          "float32 [4, 5], got 48")) << e;
  // A negative dim, and dims whose product overflows.
  poke<int64_t>(b, dims + 12, -2);
  EXPECT_TRUE(contains(load_error(b), ".dims[1]: expected a dimension >= 0, got -2"));
  poke<int64_t>(b, dims + 4, int64_t(1) << 40);
  poke<int64_t>(b, dims + 12, int64_t(1) << 40);
  EXPECT_TRUE(contains(load_error(b), "expected a size that fits 64 bits"));
  // An unknown data type.
  b = good;
  poke<int32_t>(b, field_pos(b, t, 3), 99);
  EXPECT_TRUE(contains(load_error(b), "('fc.weight').data_type: expected an ONNX tensor type code, got 99"));
  // A raw_data length past the end of the file.
  b = good;
  const size_t raw = follow(b, field_pos(b, t, 4));
  poke<uint32_t>(b, raw, 0x7fffffff);
  e = load_error(b);
  EXPECT_TRUE(contains(e, "('fc.weight').raw_data: expected 2147483647 bytes")) << e;
  // The nominal flag set on a complete checkpoint: its tensors have bytes a nominal one has not.
  b = good;
  const size_t ms = follow(b, field_pos(b, root, 1));
  poke<uint8_t>(b, field_pos(b, ms, 2), 1);
  e = load_error(b);
  EXPECT_TRUE(contains(e, "('fc.weight').raw_data: expected none in a nominal checkpoint, got 48 bytes")) << e;
  poke<uint8_t>(b, field_pos(b, ms, 2), 7);
  EXPECT_TRUE(contains(load_error(b), "module_state.is_nominal_state: expected a bool, got 7"));
  // Not an ORT file at all: onnxtrain's reader answers (and says what it expected).
  b = good;
  b[4] = 'X';
  e = load_error(b);
  EXPECT_TRUE(contains(e, path("bad"))) << e;
  EXPECT_TRUE(contains(error_of([&] { CheckpointState::file_format(path("bad")); }), "got neither"));
}

TEST_F(OrtCheckpointTest, FailedSaveLeavesOldFiles) {
  const CheckpointState old_state = sample_state();
  ort_checkpoint::write(old_state, path("ckpt"), true, {2, 0});  // with "ckpt.data"
  const std::string old_main = read_file(path("ckpt")), old_data = read_file(path("ckpt.data"));

  // An I/O failure while writing the external file (file size limit).
  CheckpointState big;
  big.add_parameter("w", Tensor::zeros(DType::kFloat32, {1 << 18}), true);  // 1 MiB
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string e1 = error_of([&] { ort_checkpoint::write(big, path("ckpt"), true, {2, 0}); });
  std::string e2 = error_of([&] { big.save(path("ckpt"), true, CheckpointFormat::kOrt); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(contains(e1, "cannot write temporary file")) << e1;
  EXPECT_TRUE(contains(e2, "cannot write temporary file") && contains(e2, path("ckpt"))) << e2;
  EXPECT_EQ(read_file(path("ckpt")), old_main);
  EXPECT_EQ(read_file(path("ckpt.data")), old_data);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);  // temp files removed

  // Invalid states fail before anything is touched.
  CheckpointState bad = sample_state();
  bad.optimizer_state().param_states["ghost"]["exp_avg"] = Tensor::zeros(DType::kFloat32, {1});
  std::string e = error_of([&] { bad.save(path("ckpt"), true, CheckpointFormat::kOrt); });
  EXPECT_TRUE(contains(e, "'ghost', which is not a parameter")) << e;
  e = error_of([&] { ort_checkpoint::write(old_state, path("ckpt"), true, {7, 0}); });
  EXPECT_TRUE(contains(e, "version: expected 1 or 2, got 7")) << e;
  EXPECT_EQ(read_file(path("ckpt")), old_main);
  EXPECT_EQ(read_file(path("ckpt.data")), old_data);
}

TEST_F(OrtCheckpointTest, OptimizerStateMustMatchItsParameter) {
  CheckpointState s;
  s.add_parameter("w", Tensor::zeros(DType::kFloat32, {2, 3}), true);
  s.set_optimizer_tensor("w", "exp_avg", Tensor::zeros(DType::kFloat32, {3, 2}));
  s.save(path("ckpt"), true, CheckpointFormat::kOrt);
  std::string e = error_of([&] { CheckpointState::load(path("ckpt")); });
  EXPECT_TRUE(contains(e, "('momentum0'): expected float32 [2, 3] like parameter 'w', got float32 [3, 2]")) << e;
}

}  // namespace
}  // namespace onnxtrain

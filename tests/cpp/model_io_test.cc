// ONNX external data: save_model writes large initializers beside the model (forced here; a model
// over 2 GB does it on its own, see tests/python/test_large_models.py), load_model reads them back,
// and malformed external-data entries are errors naming the tensor.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>

#include "onnx/model_io.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using test::make_model;
using test::make_node;
using test::value;

class ExternalDataTest : public test::TempDirTest {};

// y = x * big + small: one initializer large enough to go external (>= 1 KiB), one that stays inline.
Model model_with_initializers() {
  Graph g;
  g.inputs = {value("x", DType::kFloat32, Shape{600})};
  g.outputs = {value("y", DType::kFloat32, Shape{600})};
  std::vector<float> big(600), small(1);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i) * 0.5f;
  small[0] = 3.0f;
  g.initializers["big"] = Tensor::from_vector(big, {600});
  g.initializers["small"] = Tensor::from_vector(small, {1});
  g.nodes = {make_node("Mul", {"x", "big"}, {"t"}), make_node("Add", {"t", "small"}, {"y"})};
  return make_model(std::move(g));
}

onnx::ModelProto read_proto(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  onnx::ModelProto proto;
  EXPECT_TRUE(proto.ParseFromIstream(&f));
  return proto;
}

void write_proto(const onnx::ModelProto& proto, const std::string& p) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(proto.SerializeToOstream(&f));
}

std::string external_field(const onnx::TensorProto& t, const std::string& key) {
  for (const auto& kv : t.external_data())
    if (kv.key() == key) return kv.value();
  return "";
}

TEST_F(ExternalDataTest, LargeInitializersGoBesideTheModelAndLoadBack) {
  save_model(model_with_initializers(), path("m.onnx"), /*force_external_data=*/true);
  ASSERT_TRUE(fs::exists(path("m.onnx.data")));
  EXPECT_FALSE(fs::exists(path("m.onnx.tmp")));
  EXPECT_FALSE(fs::exists(path("m.onnx.data.tmp")));

  onnx::ModelProto proto = read_proto(path("m.onnx"));
  for (const auto& init : proto.graph().initializer()) {
    if (init.name() == "big") {
      EXPECT_EQ(init.data_location(), onnx::TensorProto::EXTERNAL);
      EXPECT_EQ(external_field(init, "location"), "m.onnx.data");
      EXPECT_EQ(std::stoll(external_field(init, "offset")) % 4096, 0);
      EXPECT_EQ(external_field(init, "length"), "2400");
      EXPECT_FALSE(init.has_raw_data());
    } else {
      EXPECT_NE(init.data_location(), onnx::TensorProto::EXTERNAL) << init.name();
      EXPECT_TRUE(init.has_raw_data()) << init.name();
    }
  }

  Model back = load_model(path("m.onnx"));
  const Tensor& big = back.graph.initializers.at("big");
  ASSERT_EQ(big.shape(), (Shape{600}));
  for (int i = 0; i < 600; ++i) ASSERT_EQ(big.data<float>()[i], float(i) * 0.5f);
  EXPECT_EQ(back.graph.initializers.at("small").data<float>()[0], 3.0f);

  // Saving again (inline now) replaces the model atomically; bytes round-trip too.
  save_model(back, path("m.onnx"));
  EXPECT_TRUE(read_proto(path("m.onnx")).graph().initializer(0).has_raw_data());
  Model again = load_model_from_bytes(save_model_to_bytes(back));
  EXPECT_EQ(again.graph.initializers.at("big").data<float>()[599], 299.5f);
}

// Edits the saved model's "big" initializer, then expects load_model to fail with `needle`.
void expect_bad_external(const std::string& model_path, const std::string& key, const std::string& new_value,
                         const std::string& needle) {
  onnx::ModelProto proto = read_proto(model_path);
  for (auto& init : *proto.mutable_graph()->mutable_initializer())
    if (init.name() == "big")
      for (auto& kv : *init.mutable_external_data())
        if (kv.key() == key) kv.set_value(new_value);
  std::string edited = model_path + "." + key + ".onnx";
  write_proto(proto, edited);
  try {
    load_model(edited);
    ADD_FAILURE() << key << "=" << new_value << " loaded";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("'big'"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  }
}

TEST_F(ExternalDataTest, MalformedEntriesAreErrorsNamingTheTensor) {
  save_model(model_with_initializers(), path("m.onnx"), /*force_external_data=*/true);
  expect_bad_external(path("m.onnx"), "offset", "12abc", "is not a non-negative integer");
  expect_bad_external(path("m.onnx"), "offset", "-4096", "is not a non-negative integer");
  expect_bad_external(path("m.onnx"), "offset", "1000000", "is outside");
  expect_bad_external(path("m.onnx"), "offset", "9223372036854775800", "is outside");  // offset + length overflows
  expect_bad_external(path("m.onnx"), "length", "4", "does not match");
  expect_bad_external(path("m.onnx"), "location", "../m.onnx.data", "must be a relative path");
  expect_bad_external(path("m.onnx"), "location", "missing.data", "cannot open external data file");
  // A truncated data file: the range check catches it before any read.
  fs::resize_file(path("m.onnx.data"), 100);
  try {
    load_model(path("m.onnx"));
    ADD_FAILURE() << "a truncated data file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is outside"), std::string::npos) << e.what();
  }
}

// A location may pass through a symbolic link only while it resolves inside the model folder: a
// link out of the folder would let a model read any file of the machine.
TEST_F(ExternalDataTest, LinksOutOfTheModelFolderAreRefused) {
  fs::create_directories(path("model/sub"));
  fs::create_directories(path("outside"));
  save_model(model_with_initializers(), path("model/m.onnx"), /*force_external_data=*/true);
  fs::copy_file(path("model/m.onnx.data"), path("outside/m.onnx.data"));
  fs::copy_file(path("model/m.onnx.data"), path("model/sub/m.onnx.data"));
  fs::create_directory_symlink("../outside", path("model/escape"));
  fs::create_directory_symlink("sub", path("model/inside"));
  expect_bad_external(path("model/m.onnx"), "location", "escape/m.onnx.data", "outside the model folder");
  expect_bad_external(path("model/m.onnx"), "location", "sub", "is not a regular file");
  onnx::ModelProto proto = read_proto(path("model/m.onnx"));  // a link that stays inside is followed
  for (auto& init : *proto.mutable_graph()->mutable_initializer())
    for (auto& kv : *init.mutable_external_data())
      if (kv.key() == "location") kv.set_value("inside/m.onnx.data");
  write_proto(proto, path("model/linked.onnx"));
  EXPECT_EQ(load_model(path("model/linked.onnx")).graph.initializers.at("big").data<float>()[599], 299.5f);
}

}  // namespace
}  // namespace onnxtrain

// The minimal build's protobuf wire-format reader and writer (src/onnx/wire_format.cc) against the
// protobuf-based model_io.cc: every model of the tests (tests/models, the artifacts generated from
// them with each loss, hand-built graphs with every attribute kind, subgraphs, typed-field and
// external tensors) reads into the same graph, the writer emits protobuf's bytes, and damaged
// bytes are errors, never crashes.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "onnx/model_io.h"
#include "onnx/wire_format.h"
#include "onnxtrain/artifacts.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;
using test::make_model;
using test::make_node;
using test::value;

class WireFormatTest : public test::TempDirTest {};

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Both readers on the same bytes give the same graph: protobuf's serialization of the two IR
// models (a canonical form: fields in number order, every value of the IR) is byte-identical.
void expect_same_reading(const std::string& bytes, const std::string& base_dir, const std::string& what) {
  SCOPED_TRACE(what);
  Model by_protobuf = load_model_from_bytes(bytes, base_dir, what);
  Model by_wire = wire::parse_model(bytes, base_dir, what);
  EXPECT_EQ(by_wire.description, by_protobuf.description);
  EXPECT_EQ(save_model_to_bytes(by_wire), save_model_to_bytes(by_protobuf));
  // And the wire writer emits what the protobuf writer does.
  EXPECT_EQ(wire::serialize_model(by_protobuf), save_model_to_bytes(by_protobuf));
}

// Every attribute kind, a subgraph (If) with an outer-scope read, symbolic and unknown dims.
Model model_with_everything() {
  Graph then_g, else_g;
  then_g.name = "then";
  then_g.outputs = {value("t_out", DType::kFloat32, Shape{2})};
  then_g.nodes = {make_node("Relu", {"x"}, {"t_out"})};
  else_g.name = "else";
  else_g.outputs = {value("e_out", DType::kFloat32, Shape{2})};
  else_g.nodes = {make_node("Neg", {"x"}, {"e_out"})};
  Graph g;
  g.name = "everything";
  g.inputs = {value("x", DType::kFloat32, Shape{2}), value("cond", DType::kBool, Shape{})};
  g.inputs[0].info.shape = Shape{-1, 2};
  g.inputs[0].info.dim_params = {"batch", ""};
  g.outputs = {value("y", DType::kFloat32, std::nullopt)};
  g.initializers["w16"] = Tensor::from_vector(std::vector<float>{1.5f, -2.0f}, {2});
  g.value_info["mid"] = ValueInfo{DType::kFloat32, Shape{-1, 2}, {"batch", ""}};
  Node attrs = make_node("CustomAttrs", {"x"}, {"mid"});
  attrs.domain = "com.example";
  attrs.attributes["f"] = Attribute::of(0.25f);
  attrs.attributes["i"] = Attribute::of(int64_t(-7));
  attrs.attributes["s"] = Attribute::of(std::string("text\0with nul", 13));
  attrs.attributes["t"] = Attribute::of(Tensor::from_vector(std::vector<int64_t>{1, -2, 3}, {3}));
  attrs.attributes["floats"] = Attribute::of(std::vector<float>{0.5f, -1e30f, 3.0f});
  attrs.attributes["ints"] = Attribute::of(std::vector<int64_t>{-1, 0, int64_t(1) << 40});
  attrs.attributes["strings"] = Attribute::of(std::vector<std::string>{"a", "", "ccc"});
  Attribute tensors;
  tensors.kind = Attribute::Kind::kTensors;
  tensors.tensors = {Tensor::from_vector(std::vector<float>{1, 2}, {1, 2}), Tensor::from_vector(std::vector<int32_t>{5}, {})};
  attrs.attributes["tensors"] = tensors;
  Node branch = make_node("If", {"cond"}, {"y"});
  Attribute then_a, else_a;
  then_a.kind = else_a.kind = Attribute::Kind::kGraph;
  then_a.g = std::make_shared<Graph>(then_g);
  else_a.g = std::make_shared<Graph>(else_g);
  branch.attributes["then_branch"] = then_a;
  branch.attributes["else_branch"] = else_a;
  g.nodes = {attrs, branch};
  Model m = make_model(std::move(g));
  m.opsets["com.example"] = 3;
  m.metadata["note"] = "metadata survives";
  m.producer_version = "9.9";
  return m;
}

TEST_F(WireFormatTest, EveryTestModelReadsTheSame) {
  int models = 0;
  for (const auto& entry : fs::directory_iterator(ONNXTRAIN_TEST_MODELS_DIR)) {
    if (entry.path().extension() != ".onnx") continue;
    expect_same_reading(file_bytes(entry.path().string()), entry.path().parent_path().string(), entry.path().string());
    ++models;
  }
  EXPECT_GT(models, 0);
}

TEST_F(WireFormatTest, GeneratedArtifactsReadTheSame) {
  // Training graphs hold what inference models do not: gradient ops of our domain, optimizer
  // ops, metadata; one set per loss.
  for (LossType loss : {LossType::kCrossEntropy, LossType::kMSE}) {
    ArtifactOptions o;
    o.graphs.loss = loss;
    o.graphs.requires_grad = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
    o.graphs.additional_output_names = {"logits"};
    o.directory = path("artifacts_" + loss_type_name(loss));
    if (loss == LossType::kMSE) o.graphs.additional_output_names.clear();
    ArtifactPaths p = generate_artifacts(std::string(ONNXTRAIN_TEST_MODELS_DIR) + "/mlp_classifier.onnx", o);
    for (const std::string& model : {p.training_model, p.eval_model, p.optimizer_model})
      expect_same_reading(file_bytes(model), o.directory, model);
  }
}

TEST_F(WireFormatTest, HandBuiltModelWithEveryAttributeKindReadsTheSame) {
  const std::string bytes = save_model_to_bytes(model_with_everything());
  expect_same_reading(bytes, dir_.string(), "everything");
  Model m = wire::parse_model(bytes, "", "everything");
  const Node& n = m.graph.nodes.at(0);
  EXPECT_EQ(n.domain, "com.example");
  EXPECT_EQ(n.attributes.at("s").s, std::string("text\0with nul", 13));
  EXPECT_EQ(n.attributes.at("ints").ints.at(2), int64_t(1) << 40);
  EXPECT_EQ(m.graph.inputs.at(0).info.dim_params.at(0), "batch");
  EXPECT_EQ(m.graph.nodes.at(1).attributes.at("then_branch").g->nodes.at(0).op_type, "Relu");
}

TEST_F(WireFormatTest, TypedFieldsPackedOrNotAndExternalDataReadTheSame) {
  // What other writers emit: float_data/int64_data/int32_data instead of raw_data, unpacked
  // dims, an unnamed node, the "ai.onnx" domain spelled out, initializers repeated as inputs.
  onnx::ModelProto proto;
  proto.set_ir_version(3);
  auto* op = proto.add_opset_import();
  op->set_domain("ai.onnx");
  op->set_version(13);
  auto* g = proto.mutable_graph();
  auto* t = g->add_initializer();
  t->set_name("wf");
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(3);
  for (float v : {1.0f, -0.5f, 2.25f}) t->add_float_data(v);
  auto* ti = g->add_initializer();
  ti->set_name("wi");
  ti->set_data_type(onnx::TensorProto::INT64);
  ti->add_dims(2);
  ti->add_int64_data(-3);
  ti->add_int64_data(int64_t(1) << 50);
  auto* th = g->add_initializer();
  th->set_name("wh");
  th->set_data_type(onnx::TensorProto::FLOAT16);
  th->add_dims(1);
  th->add_int32_data(0x3c00);
  auto* tb = g->add_initializer();
  tb->set_name("wb");
  tb->set_data_type(onnx::TensorProto::INT8);
  tb->add_dims(2);
  tb->add_int32_data(-128);
  tb->add_int32_data(127);
  auto* in = g->add_input();
  in->set_name("wf");  // IR 3: initializers listed as inputs too
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  auto* out = g->add_output();
  out->set_name("y");
  out->mutable_type();  // an empty type (spox writes these)
  auto* node = g->add_node();
  node->set_op_type("Identity");
  node->set_domain("ai.onnx");
  node->add_input("wf");
  node->add_output("y");
  expect_same_reading(proto.SerializeAsString(), dir_.string(), "typed fields");

  // External data: the wire reader resolves it like the protobuf path.
  save_model(model_with_everything(), path("ext.onnx"), /*force_external_data=*/false);
  Model big = make_model(Graph{});
  big.graph.outputs = {value("w", DType::kFloat32, Shape{512})};
  big.graph.initializers["w"] = Tensor::from_vector(std::vector<float>(512, 0.75f), {512});
  save_model(big, path("big.onnx"), /*force_external_data=*/true);
  ASSERT_TRUE(fs::exists(path("big.onnx.data")));
  expect_same_reading(file_bytes(path("big.onnx")), dir_.string(), "external data");
  EXPECT_EQ(wire::parse_model(file_bytes(path("big.onnx")), dir_.string(), "x").graph.initializers.at("w").data<float>()[511],
            0.75f);
}

TEST_F(WireFormatTest, DamagedBytesAreErrorsNotCrashes) {
  const std::string bytes = save_model_to_bytes(model_with_everything());
  // Every truncation, and single-byte damage at every position: an Error or a model, never a crash.
  int errors = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      wire::parse_model(std::string_view(bytes).substr(0, n), "", "cut");
    } catch (const Error& e) {
      ++errors;
      EXPECT_NE(std::string(e.what()).find("model cut"), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(errors, int(bytes.size()) / 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] = char(~damaged[i]);
    try {
      wire::parse_model(damaged, "", "damaged");
    } catch (const Error&) {
    }
  }
  EXPECT_NE(test::error_of([] { wire::parse_model("not a model at all", "", "'text'"); }).find("model 'text'"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { wire::parse_model("", "", "'empty'"); }).find("cannot parse 0 bytes"), std::string::npos);
}

TEST_F(WireFormatTest, RefusesWhatTheProtobufReaderRefuses) {
  onnx::ModelProto proto;
  proto.mutable_graph()->add_sparse_initializer();
  const std::string sparse = proto.SerializeAsString();
  EXPECT_EQ(test::error_of([&] { wire::parse_model(sparse, "", "'m'"); }),
            test::error_of([&] { load_model_from_bytes(sparse, "", "'m'"); }));
  onnx::ModelProto functions;
  functions.mutable_graph();
  functions.add_functions()->set_name("f");
  const std::string fbytes = functions.SerializeAsString();
  EXPECT_EQ(test::error_of([&] { wire::parse_model(fbytes, "", "'m'"); }),
            test::error_of([&] { load_model_from_bytes(fbytes, "", "'m'"); }));
  onnx::ModelProto map;
  auto* in = map.mutable_graph()->add_input();
  in->set_name("m");
  in->mutable_type()->mutable_map_type()->set_key_type(7);
  const std::string mbytes = map.SerializeAsString();
  EXPECT_NE(test::error_of([&] { load_model_from_bytes(mbytes, "", "'m'"); }), "<no error>");
  EXPECT_EQ(test::error_of([&] { wire::parse_model(mbytes, "", "'m'"); }),
            test::error_of([&] { load_model_from_bytes(mbytes, "", "'m'"); }));
}

// Sequence and optional values (of tensors, of sequences, of unknown element type) read as the
// protobuf path reads them, and write back to protobuf's bytes.
TEST_F(WireFormatTest, SequenceAndOptionalTypesReadTheSame) {
  onnx::ModelProto proto;
  proto.set_ir_version(8);
  auto* opset = proto.add_opset_import();
  opset->set_version(18);
  auto* g = proto.mutable_graph();
  g->set_name("g");
  auto tensor_of = [](onnx::TypeProto* t) {
    t->mutable_tensor_type()->set_elem_type(1);
    t->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(3);
  };
  auto* s = g->add_input();
  s->set_name("s");
  tensor_of(s->mutable_type()->mutable_sequence_type()->mutable_elem_type());
  auto* o = g->add_input();
  o->set_name("o");
  tensor_of(o->mutable_type()->mutable_optional_type()->mutable_elem_type());
  auto* os = g->add_input();
  os->set_name("os");
  tensor_of(os->mutable_type()->mutable_optional_type()->mutable_elem_type()->mutable_sequence_type()->mutable_elem_type());
  auto* u = g->add_output();
  u->set_name("u");
  u->mutable_type()->mutable_sequence_type();
  auto* n = g->add_node();
  n->set_op_type("SequenceConstruct");
  n->add_input("s");
  n->add_output("u");
  const std::string bytes = proto.SerializeAsString();
  const Model via_wire = wire::parse_model(bytes, "", "'m'");
  const Model via_protobuf = load_model_from_bytes(bytes, "", "'m'");
  ASSERT_EQ(via_wire.graph.inputs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(int(via_wire.graph.inputs[i].info.kind), int(via_protobuf.graph.inputs[i].info.kind)) << i;
    EXPECT_EQ(via_wire.graph.inputs[i].info.dtype, via_protobuf.graph.inputs[i].info.dtype) << i;
    EXPECT_EQ(via_wire.graph.inputs[i].info.shape, via_protobuf.graph.inputs[i].info.shape) << i;
  }
  EXPECT_EQ(int(via_wire.graph.inputs[0].info.kind), int(ValueKind::kSequence));
  EXPECT_EQ(int(via_wire.graph.inputs[1].info.kind), int(ValueKind::kOptionalTensor));
  EXPECT_EQ(int(via_wire.graph.inputs[2].info.kind), int(ValueKind::kOptionalSequence));
  EXPECT_EQ(int(via_wire.graph.outputs[0].info.kind), int(via_protobuf.graph.outputs[0].info.kind));
  EXPECT_EQ(wire::serialize_model(via_protobuf), save_model_to_bytes(via_protobuf));
}

}  // namespace
}  // namespace onnxtrain

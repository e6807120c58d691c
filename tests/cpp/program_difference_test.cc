// program_difference: two exports of one module at different sizes are the same program when only
// their shape annotations differ; a baked size (a Constant's value, an initializer, an attribute),
// a renamed input dim, an extra node or a subgraph's constant are differences, named.
#include <gtest/gtest.h>

#include "ir/program_difference.h"
#include "test_util.h"

namespace onnxtrain {
using test::make_node;

namespace {

// ids [batch, sequence] -> Reshape(ids, shape) -> Add(pos): what a trace of x.view(...) + pos[:n] gives.
Graph traced(int64_t length, int64_t annotated_batch) {
  Graph g;
  NamedValue ids = test::value("ids", DType::kFloat32, Shape{-1, -1});
  ids.info.dim_params = {"batch_0", "sequence_0"};
  g.inputs = {ids};
  g.initializers["pos"] = Tensor::from_vector<float>({0.5f, 1.5f}, {2});
  Node shape = make_node("Constant", {}, {"shape"});
  shape.attributes["value"] = Attribute::of(Tensor::from_vector<int64_t>({-1, length}, {2}));
  g.nodes = {shape, make_node("Reshape", {"ids", "shape"}, {"flat"}), make_node("Add", {"flat", "pos"}, {"y"})};
  g.nodes[1].name = "/Reshape";
  g.outputs = {test::value("y", DType::kFloat32, Shape{annotated_batch, length})};
  g.value_info["flat"] = ValueInfo{DType::kFloat32, Shape{annotated_batch, length}, {}, ValueKind::kTensor};
  return g;
}

TEST(ProgramDifference, ShapeAnnotationsAndNodeNamesAreNotTheProgram) {
  Graph a = traced(8, 4), b = traced(8, 3);
  b.nodes[1].name = "/Reshape_1";
  EXPECT_EQ(program_difference(a, b), "");
  EXPECT_EQ(program_difference(a, a), "");
  // The values nodes make may be numbered otherwise (another trace moved the exporter's counter on).
  b.nodes[1].outputs[0] = b.nodes[2].inputs[0] = "217";
  b.nodes[2].outputs[0] = b.outputs[0].name = "278";
  EXPECT_EQ(program_difference(a, b), "");
  b.nodes[2].inputs = {"pos", "217"};  // operands swapped: another program
  EXPECT_NE(program_difference(a, b).find("[Add] node"), std::string::npos) << program_difference(a, b);
}

TEST(ProgramDifference, AnInputDimFixedInOneExportAndNamedInTheOtherIsNoDifference) {
  Graph a = traced(8, 4), b = traced(8, 4);
  a.inputs[0].info.shape = Shape{4, 8};  // exported without symbolic dims
  a.inputs[0].info.dim_params.clear();
  EXPECT_EQ(program_difference(a, b), "");
  b.inputs[0].info.shape = Shape{4, 9};
  b.inputs[0].info.dim_params.clear();
  EXPECT_NE(program_difference(a, b).find("inputs (ids: float32[4,8]) against (ids: float32[4,9])"), std::string::npos)
      << program_difference(a, b);
}

TEST(ProgramDifference, ABakedSizeIsTheConstantThatHoldsIt) {
  std::string d = program_difference(traced(8, 4), traced(6, 4));
  EXPECT_NE(d.find("[Constant] node"), std::string::npos) << d;
  EXPECT_NE(d.find("attribute values or inputs differ"), std::string::npos) << d;
}

TEST(ProgramDifference, InputsInitializersAttributesAndNodeCountsAreCompared) {
  Graph a = traced(8, 4);
  Graph b = a;
  b.inputs[0].info.dim_params[1] = "sequence_1";
  EXPECT_NE(program_difference(a, b).find("inputs (ids: float32[batch_0,sequence_0])"), std::string::npos)
      << program_difference(a, b);
  b = a;
  b.initializers["pos"] = Tensor::from_vector<float>({0.5f, 2.5f}, {2});
  EXPECT_NE(program_difference(a, b).find("initializer 'pos'"), std::string::npos) << program_difference(a, b);
  EXPECT_EQ(program_difference(a, b, {"pos"}), "");  // a parameter the host binds: its values may change
  b.initializers["pos"] = Tensor::from_vector<float>({0.5f, 2.5f, 1.f}, {3});
  EXPECT_NE(program_difference(a, b, {"pos"}).find("initializer 'pos': float32[2] against float32[3]"),
            std::string::npos) << program_difference(a, b, {"pos"});
  b = a;
  b.initializers["extra"] = Tensor::from_vector<float>({1.f}, {1});
  EXPECT_NE(program_difference(a, b).find("'extra' is in one graph only"), std::string::npos);
  b = a;
  b.nodes[2].attributes["note"] = Attribute::of(int64_t{1});
  EXPECT_NE(program_difference(a, b).find("[Add] node"), std::string::npos) << program_difference(a, b);
  b = a;
  b.nodes.push_back(make_node("Identity", {"y"}, {"z"}));
  EXPECT_EQ(program_difference(a, b), "3 nodes against 4");
}

TEST(ProgramDifference, SubgraphsAreComparedAsPrograms) {
  auto with_branch = [](int64_t length) {
    Graph g = traced(8, 4);
    Node cond = make_node("If", {"c"}, {"r"});
    cond.attributes["then_branch"].kind = Attribute::Kind::kGraph;
    cond.attributes["then_branch"].g = std::make_shared<Graph>(traced(length, 4));
    g.nodes.push_back(cond);
    return g;
  };
  EXPECT_EQ(program_difference(with_branch(8), with_branch(8)), "");
  EXPECT_NE(program_difference(with_branch(8), with_branch(6)).find("[If] node"), std::string::npos);
}

// A Loop body that reads a value the outer graph made and has its own inputs, both numbered by the
// exporter's counter: two exports that number them otherwise are the same program (each was a
// difference, so every model with If or Loop exported again per shape).
TEST(ProgramDifference, SubgraphsReadingOuterValuesMatchThemByPosition) {
  auto with_loop = [](const std::string& outer, const std::string& iteration, const std::string& carried) {
    Graph g = traced(8, 4);
    g.nodes[1].outputs[0] = g.nodes[2].inputs[0] = outer;  // "flat", as the exporter numbered it
    auto body = std::make_shared<Graph>();
    body->inputs = {test::value(iteration, DType::kInt64, Shape{}), test::value("cond_in", DType::kBool, Shape{}),
                    test::value(carried, DType::kFloat32, std::nullopt)};
    body->nodes = {make_node("Add", {carried, outer}, {carried + "_next"}),
                   make_node("Identity", {"cond_in"}, {"cond_out"})};
    body->outputs = {test::value("cond_out", DType::kBool, std::nullopt),
                     test::value(carried + "_next", DType::kFloat32, std::nullopt)};
    Node loop = make_node("Loop", {"", "", "y"}, {"looped"});
    loop.attributes["body"].kind = Attribute::Kind::kGraph;
    loop.attributes["body"].g = body;
    g.nodes.push_back(loop);
    return g;
  };
  const Graph a = with_loop("flat", "i", "acc"), b = with_loop("317", "i.7", "acc.3");
  EXPECT_EQ(program_difference(a, b), "");
  // The body reading another outer value is another program.
  Graph c = b;
  c.nodes.back().attributes["body"].g->nodes[0].inputs[1] = "ids";
  EXPECT_NE(program_difference(a, c).find("[Loop] node"), std::string::npos) << program_difference(a, c);
}

}  // namespace
}  // namespace onnxtrain

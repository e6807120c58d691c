// Small helpers for tests: graphs built by hand, without protobuf, error messages, temporary directories.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/status.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::test {

inline Node make_node(std::string op, std::vector<std::string> inputs, std::vector<std::string> outputs,
                      std::string name = "") {
  Node n;
  n.op_type = std::move(op);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.name = name.empty() ? n.op_type + "_" + n.outputs.at(0) : std::move(name);
  return n;
}

inline NamedValue value(std::string name, DType dtype, std::optional<Shape> shape) {
  return NamedValue{std::move(name), ValueInfo{dtype, std::move(shape), {}}};
}

inline Model make_model(Graph graph, int64_t opset = 17) {
  Model m;
  m.graph = std::move(graph);
  m.opsets[""] = opset;
  m.description = "'test'";
  return m;
}

// A file's bytes ("" when it cannot be read), and bytes written over a file.
// A graph attribute (an If branch, a Loop body) of one node `op` reading `input` (a value of the
// outer graph) into its one output, "branch_out", of unknown shape.
inline Attribute one_node_branch(std::string op, const std::string& input, std::string domain = "") {
  auto body = std::make_shared<Graph>();
  Node n = make_node(std::move(op), {input}, {"branch_out"});
  n.domain = std::move(domain);
  body->nodes = {n};
  body->outputs = {value("branch_out", DType::kFloat32, std::nullopt)};
  Attribute attr;
  attr.kind = Attribute::Kind::kGraph;
  attr.g = body;
  return attr;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// A tensor of random bytes (random 0/1 for bool), for round trips that must keep every bit.
inline Tensor random_tensor(DType dt, Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(dt, std::move(shape));
  auto* p = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(dt == DType::kBool ? rng() % 2 : rng());
  return t;
}

// The message of the onnxtrain::Error that f throws, or "<no error>".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// A fixture with a fresh temporary directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / ("onnxtrain_" + std::string(info->test_suite_name()) + "_" +
                                                     std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

}  // namespace onnxtrain::test

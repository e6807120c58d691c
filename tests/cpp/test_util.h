// Small helpers for tests: graphs built by hand, without protobuf, error messages, temporary directories.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/status.h"

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

// `onnxtrain compile`: the pre-compiled form of training artifacts (onnxtrain/module.h).
#include <cstdio>
#include <string>

#include "commands.h"
#include "onnxtrain/module.h"

namespace onnxtrain::cli {

const Command kCompileCommand{
    "compile",
    "pre-compile training artifacts (graphs, kernels, memory plans) for a faster start",
    {"DIR"},
    {
        {"--shape", "NAME=D0,D1,...", "the dims of an input the plans are made for (repeat per input; inputs "
                                      "with a static declared shape need none)", true},
    },
    "Writes DIR/training_model.otc, eval_model.otc and optimizer_model.otc next to the ONNX files.\n"
    "Module and Optimizer load them instead of the ONNX files while they are valid; a stale or\n"
    "damaged one is ignored with a note.\n\n"
    "example:\n  onnxtrain compile out --shape input=32,1,8,8 --shape labels=32\n"};

namespace {

std::pair<std::string, Shape> parse_shape(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError("--shape '" + spec + "': expected NAME=D0,D1,... (e.g. input=32,1,8,8)");
  Shape dims;
  const std::string list = spec.substr(eq + 1);
  size_t start = 0;
  while (start <= list.size() && !list.empty()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    size_t used = 0;
    long long d = -1;
    try {
      d = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || d < 0)
      throw UsageError("--shape '" + spec + "': '" + item + "' is not a dim (a whole number >= 0)");
    dims.push_back(d);
    start = comma + 1;
  }
  return {spec.substr(0, eq), dims};
}

}  // namespace

int run_compile(const Args& a) {
  std::map<std::string, Shape> shapes;
  for (const auto& spec : a.get_all("--shape")) {
    auto [name, dims] = parse_shape(spec);
    if (!shapes.emplace(name, dims).second) throw UsageError("--shape " + name + " is given twice");
  }
  for (const auto& path : compile_artifacts(a.positional(0), shapes)) std::printf("wrote %s\n", path.c_str());
  return 0;
}

}  // namespace onnxtrain::cli

// The `onnxtrain` command line. Subcommands: ops, inspect, run-bench (more arrive with training).
#include <cstdio>
#include <cstring>
#include <string>

#include "onnx/model_io.h"
#include "ops/registry.h"

using namespace onnxtrain;

namespace {

int cmd_ops() {
  std::printf("%-34s %-6s %-5s %-6s %s\n", "op (domain.type)", "since", "cpu", "shape", "gradient");
  for (const OpSchema* s : OpRegistry::global().all()) {
    std::string name = (s->domain.empty() ? "" : s->domain + ".") + s->op_type;
    std::printf("%-34s %-6d %-5s %-6s %s%s%s\n", name.c_str(), s->since_version, s->cpu ? "yes" : "no",
                s->shape ? "yes" : "no", gradient_status_name(s->gradient_status),
                s->gradient_note.empty() ? "" : ": ", s->gradient_note.c_str());
  }
  return 0;
}

int cmd_inspect(const std::string& path) {
  Model model = load_model(path);
  std::printf("%s", to_string(model.graph).c_str());
  for (const auto& [domain, version] : model.opsets)
    std::printf("opset %s %lld\n", domain.empty() ? "ai.onnx" : domain.c_str(), (long long)version);
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: onnxtrain <command> [args]\n"
               "  ops                 list every op with its CPU kernel, shape rule and gradient status\n"
               "  inspect MODEL.onnx  print a model's graph\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "ops") return cmd_ops();
    if (cmd == "inspect" && argc == 3) return cmd_inspect(argv[2]);
  } catch (const Error& e) {
    std::fprintf(stderr, "onnxtrain %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  usage();
  return 2;
}

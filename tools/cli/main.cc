// The `onnxtrain` command line: generate training artifacts, train, evaluate, export and inspect
// without Python. Wrong arguments exit with status 2, failures while running with status 1.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "onnxtrain/status.h"

using namespace onnxtrain::cli;

namespace {

const Subcommand kSubcommands[] = {
    {kArtifactsCommand, run_artifacts}, {kTrainCommand, run_train},     {kEvalCommand, run_eval},
    {kExportCommand, run_export},       {kInspectCommand, run_inspect}, {kOpsCommand, run_ops},
    {kQuantizeCommand, run_quantize},   {kCompileCommand, run_compile},
    {kConvertCheckpointCommand, run_convert_checkpoint},
};

void usage(FILE* out) {
  std::fprintf(out, "usage: onnxtrain <command> [args]   (onnxtrain <command> --help for its options)\n\n");
  for (const auto& s : kSubcommands)
    std::fprintf(out, "  %-18s %s\n", s.command.name.c_str(), s.command.summary.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "-h" || name == "--help" || name == "help") {
    if (argc == 3)
      for (const auto& s : kSubcommands)
        if (s.command.name == argv[2]) {
          std::fputs(help_text(s.command).c_str(), stdout);
          return 0;
        }
    usage(stdout);
    return 0;
  }
  for (const auto& s : kSubcommands) {
    if (s.command.name != name) continue;
    try {
      std::optional<Args> args = Args::parse(s.command, argc, argv, 2);
      return args ? s.run(*args) : 0;
    } catch (const UsageError& e) {
      std::fprintf(stderr, "onnxtrain %s: %s\n(see 'onnxtrain %s --help')\n", name.c_str(), e.what(), name.c_str());
      return 2;
    } catch (const onnxtrain::Error& e) {
      std::fprintf(stderr, "onnxtrain %s: error: %s\n", name.c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "onnxtrain %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "onnxtrain: unknown command '%s'\n\n", name.c_str());
  usage(stderr);
  return 2;
}

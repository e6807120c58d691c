// The onnxtrain subcommands: each declares its options (for parsing and --help) and runs.
#pragma once

#include "args.h"

namespace onnxtrain::cli {

struct Subcommand {
  const Command& command;
  int (*run)(const Args& args);
};

extern const Command kOpsCommand, kInspectCommand, kArtifactsCommand, kTrainCommand, kEvalCommand, kExportCommand,
    kQuantizeCommand, kCompileCommand, kConvertCheckpointCommand;
int run_ops(const Args& args);
int run_inspect(const Args& args);
int run_artifacts(const Args& args);
int run_train(const Args& args);
int run_eval(const Args& args);
int run_export(const Args& args);
int run_quantize(const Args& args);
int run_compile(const Args& args);
int run_convert_checkpoint(const Args& args);

// Shared by train and eval: where the data's arrays go.
inline const Option kInputsOption{"--inputs", "KEYS",
                                  "npz arrays for the model inputs, comma-separated, in graph order"};
inline const Option kLabelsOption{"--labels", "KEYS",
                                  "npz arrays for the loss targets (default: arrays named like the graph inputs)"};

}  // namespace onnxtrain::cli

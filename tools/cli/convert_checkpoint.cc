// `onnxtrain convert-checkpoint`: a checkpoint from onnxtrain's format to ONNX Runtime's, or back
// (include/onnxtrain/training.h, CheckpointFormat).
#include <cstdio>
#include <string>

#include "commands.h"
#include "onnxtrain/training.h"

namespace onnxtrain::cli {

const Command kConvertCheckpointCommand{
    "convert-checkpoint",
    "rewrite a checkpoint in ONNX Runtime's format or onnxtrain's",
    {"IN", "OUT"},
    {
        {"--to", "FORMAT", "ort or onnxtrain (default: the format IN is not in)"},
        {"--no-optimizer-state", "", "leave the optimizer state (step, learning rate, moments) out"},
    },
    "IN's format is read from its bytes (ONNX Runtime's files carry \"ODTC\"), never from its name.\n"
    "OUT is written atomically; with ONNX Runtime's format, tensors past 1800 MiB go to OUT.data,\n"
    "as ONNX Runtime does. AdamW's moments are momentum0/momentum1 in ONNX Runtime's files and\n"
    "exp_avg/exp_avg_sq in onnxtrain's; float properties are float32 in ONNX Runtime's.\n\n"
    "example:\n  onnxtrain convert-checkpoint out/checkpoint ort_app/checkpoint --to ort\n"};

int run_convert_checkpoint(const Args& a) {
  const std::string in = a.positional(0), out = a.positional(1);
  const CheckpointFormat from = CheckpointState::file_format(in);
  CheckpointFormat to = from == CheckpointFormat::kOrt ? CheckpointFormat::kOnnxtrain : CheckpointFormat::kOrt;
  if (a.has("--to")) to = a.get_choice("--to", {"ort", "onnxtrain"}, "ort") == "ort" ? CheckpointFormat::kOrt : CheckpointFormat::kOnnxtrain;
  const CheckpointState state = CheckpointState::load(in);
  const bool with_optimizer = !a.flag("--no-optimizer-state") && state.has_optimizer_state();
  state.save(out, with_optimizer, to);
  std::printf("%s (%s) -> %s (%s): %zu parameters%s, %zu properties%s\n", in.c_str(), checkpoint_format_name(from),
              out.c_str(), checkpoint_format_name(to), state.num_parameters(), state.is_nominal() ? " (nominal)" : "",
              state.properties().size(), with_optimizer ? ", optimizer state" : "");
  return 0;
}

}  // namespace onnxtrain::cli

// onnxtrain quantize: fp32 MatMul/Gemm weights -> com.microsoft.MatMulNBits, with a per-layer report.
#include <cstdio>

#include "commands.h"
#include "onnxtrain/quantize.h"

namespace onnxtrain::cli {

const Command kQuantizeCommand{
    "quantize",
    "block-quantize MatMul/Gemm weights to MatMulNBits (int4/int8) and report the error per layer",
    {"MODEL"},
    {
        {"--out", "FILE.onnx", "the quantized model (default: MODEL with _int<bits> before .onnx)"},
        {"--bits", "N", "2, 4 or 8 (default 4)"},
        {"--block-size", "N", "weights per scale along K: a power of 2, >= 16 (default 32)"},
        {"--symmetric", "", "no zero points (implied 2^(bits-1)); default: asymmetric with uint8 zero points"},
        {"--exclude", "PATTERNS", "node or weight names to keep in fp32, comma-separated (substring or glob)"},
    },
    "example:\n  onnxtrain quantize model.onnx --bits 4 --block-size 32 --out model_int4.onnx\n"};

int run_quantize(const Args& a) {
  const std::string in = a.positional(0);
  QuantizeOptions o;
  o.bits = int(a.get_int("--bits", 4, 1));
  o.block_size = int(a.get_int("--block-size", 32, 1));
  o.symmetric = a.flag("--symmetric");
  o.exclude = a.get_list("--exclude");
  std::string out = a.get("--out");
  if (out.empty()) {
    std::string stem = in.size() > 5 && in.substr(in.size() - 5) == ".onnx" ? in.substr(0, in.size() - 5) : in;
    out = stem + "_int" + std::to_string(o.bits) + ".onnx";
  }
  QuantizeReport r = quantize(in, out, o);
  std::fputs(r.table().c_str(), stdout);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace onnxtrain::cli

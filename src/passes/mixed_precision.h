// Mixed precision: rewrites an fp32 forward graph so its GEMMs run in bf16 or fp16 while
// everything precision-sensitive stays fp32. Run it after fuse_for_training and before autodiff:
// the gradient rules then emit the backward of each op in that op's precision (the MatMul
// gradients in the low precision, the loss and LayerNorm gradients in fp32) with no second pass.
//
//   Model m = ...;                      // fp32 forward + loss, parameters as initializers or inputs
//   fuse_for_training(m);
//   convert_to_mixed_precision(m, DType::kBFloat16, {"fc1.weight", ...});
//   Model training = build_gradient_graph(m, ...);
//
// Op classes (DESIGN.md, "Mixed precision", says where they differ from PyTorch's CPU autocast
// and ONNX Runtime's transformer, and why):
//   low     MatMul, Gemm, onnxtrain.FusedMatMul, Conv: every float input in the low precision
//           (oneDNN accumulates in fp32 inside the product or convolution).
//   follow  elementwise arithmetic and activations, Softmax (fp32 sums inside the kernel),
//           Dropout, MaxPool, AveragePool, data movement (Reshape, Transpose, Concat, Slice,
//           Gather, ...): computed in
//           the widest type of their float inputs, as
//           PyTorch promotes; constants (initializers that are not parameters, Constant nodes)
//           adapt instead of widening.
//   fp32    everything else: losses, LogSoftmax, LayerNorm, BatchNorm and every other
//           normalisation, reductions, Exp/Log/Pow/Sqrt, ConvTranspose (no bf16 kernel wired).
//   any     Shape, Size, Cast: read any dtype, left alone.
// Each value is cast at most once per dtype, whatever the number of readers (a parameter gets one
// Cast per step, not one per use); a cast back to a value's source dtype reuses the source.
// Graph outputs keep their fp32 dtype (a Cast at the end where they became low precision).
#pragma once

#include <set>
#include <string>

#include "ir/graph.h"

namespace onnxtrain {

// "bf16"/"bfloat16" -> kBFloat16, "fp16"/"float16" -> kFloat16, "" / "none" -> kUndefined (off);
// anything else throws kInvalidArgument naming the value and the choices.
DType mixed_precision_dtype(const std::string& name);
// "bf16", "fp16" or "" for kUndefined: the name artifacts and checkpoints record.
std::string mixed_precision_name(DType low);

// `low` is kBFloat16 or kFloat16. Initializers named in `parameters` are values a step feeds
// (they get a Cast node); other fp32 initializers are constants, converted once in place. Throws
// naming the value when the model already holds half-precision values (it converts fp32 models).
// Returns the number of Cast nodes inserted. bf16 on a CPU whose bf16 GEMMs are no faster than its
// fp32 ones (gemm_rates(): no AMX) prints, once per process, a note naming the CPU and both rates.
int convert_to_mixed_precision(Model& model, DType low, const std::set<std::string>& parameters = {});

// After autodiff: a Cast to fp32 that is the only reader of a bf16/fp16 MatMul or FusedMatMul
// product is folded into it (FusedMatMul output_dtype = float: oneDNN writes its fp32 accumulator
// out, unrounded). These are the weight gradients, the products added to an fp32 residual and
// the partial gradients summed in fp32: one kernel instead of two, and no rounding to half in
// between. Returns the number of casts folded.
int fold_casts_into_gemms(Model& model);

// ---- Dynamic loss scaling (fp16): the graph half. fp16's 5 exponent bits flush small gradients
// to zero, so the backward starts from loss * scale and the fp32 gradients are multiplied by
// 1/scale before anyone reads them. The scale is a graph input (Module feeds it from the
// checkpoint); the optimizer half (skip on overflow, grow and back off) is in src/optim/loss_scaler.h.
//
//   std::string scaled = scale_loss(forward, "loss");             // before autodiff
//   Model training = build_gradient_graph(forward, params, {scaled}, &info);
//   unscale_gradients(training, info.gradient_outputs);            // "<p>_grad" now unscaled

// The training graph input holding the scale: an fp32 scalar.
inline constexpr const char* kLossScaleInput = "loss_scale";
// Adds the input kLossScaleInput and "<loss>_scaled" = loss * loss_scale; returns that name, the
// value to differentiate. Throws when the graph already has a value named kLossScaleInput or the
// loss is not fp32.
std::string scale_loss(Model& forward, const std::string& loss);
// Each named gradient output g (fp32) becomes g_scaled * Reciprocal(loss_scale) under its own name.
// Powers of two make the reciprocal and the product exact, so a finite gradient is unscaled
// without rounding; an inf or NaN stays one, for the optimizer to see.
void unscale_gradients(Model& training, const std::vector<std::string>& gradient_outputs);

}  // namespace onnxtrain

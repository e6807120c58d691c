// The update rules as ops of the onnxtrain domain, so that optimizer_model.onnx graphs can
// express one training update (registered in optimizer_ops.cc; the update math is src/optim):
//
//   onnxtrain.AdamW    (mode "adamw" = torch.optim.AdamW, "hf" = transformers' AdamW)
//   onnxtrain.Adam     (torch.optim.Adam: L2 decay)
//   onnxtrain.SGD      onnxtrain.Lamb      onnxtrain.Adagrad
//
//   inputs   lr     float scalar (float32 or float64): the learning rate of this update
//            step   integer scalar: the number of this update counting from 1 (torch's
//                   state["step"] after its increment; it drives bias correction, Adagrad's
//                   lr_decay and SGD's first-step momentum buffer)
//            params[n], grads[n], then each state list[n] in OptimizerConfig::state_names()
//            order (AdamW/Adam: exp_avg, exp_avg_sq[, max_exp_avg_sq when amsgrad];
//            Lamb: exp_avg, exp_avg_sq; SGD: momentum_buffer when momentum != 0; Adagrad: sum)
//   outputs  params_new[n], then the new state lists, same order (trailing or "" outputs may be
//            omitted; the state is updated regardless)
//
// The hyperparameters are attributes (see update_op_attributes). With in_place = 1 (the default)
// the kernel updates the input tensors themselves and returns them as the outputs
// (KernelContext::set_output of the input): no copies, but the inputs' buffers change, so a
// graph must not read a parameter or state input after the update node. With in_place = 0 the
// outputs are fresh buffers and the inputs are left untouched.
#pragma once

#include <map>
#include <string>

#include "ir/graph.h"
#include "optim/optimizer.h"

namespace onnxtrain::optim {

// "AdamW" (for kAdamW and kHFAdamW), "Adam", "SGD", "Lamb", "Adagrad".
std::string update_op_type(OptimizerType type);
// The attributes of the op expressing `config` (the learning rate is the lr input, not an
// attribute; Adagrad's initial_accumulator_value lives in the state the graph is fed).
std::map<std::string, Attribute> update_op_attributes(const OptimizerConfig& config, bool in_place = true);
// The configuration a node of one of the update ops stands for (lr left at its default).
OptimizerConfig config_from_update_node(const Node& node);

}  // namespace onnxtrain::optim

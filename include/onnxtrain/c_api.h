/* onnxtrain C API: a stable C ABI over on-device training (checkpoints, artifact generation,
 * Module, Optimizer, LR schedulers) and inference, for C programs and other languages' FFIs.
 * The header is C99 and has no C++ types; link against libonnxtrain.
 *
 *   OtCheckpoint* ckpt = NULL;  OtModule* module = NULL;  OtOptimizer* opt = NULL;
 *   if (ot_checkpoint_load("out/checkpoint", &ckpt) != OT_OK) fprintf(stderr, "%s\n", ot_last_error());
 *   ot_module_create("out/training_model.onnx", ckpt, "out/eval_model.onnx", &module);
 *   ot_optimizer_create("out/optimizer_model.onnx", module, &opt);
 *   OtTensorView inputs[2] = {{x, OT_DTYPE_FLOAT32, x_shape, 2}, {y, OT_DTYPE_INT64, y_shape, 1}};
 *   OtTensor* loss = NULL;
 *   ot_module_train_step(module, inputs, 2, &loss, 1);
 *   ot_optimizer_step(opt);  ot_module_lazy_reset_grad(module);
 *   ot_tensor_release(loss);
 *   ot_optimizer_release(opt);  ot_module_release(module);  ot_checkpoint_release(ckpt);
 *
 * Errors
 *   Every function returns an OtStatus (OT_OK is 0), except ot_last_error, ot_status_name,
 *   ot_version and the *_release functions. When a call fails, ot_last_error() returns a message
 *   naming the problem, for the calling thread; every status-returning call replaces it (with ""
 *   on success). No C++ exception crosses this API. A failed call leaves the objects it was given
 *   as they were and sets its handle outputs (OtModule** and the like) to NULL.
 *
 * Handles
 *   Opaque pointers. An object built on another keeps it alive: a module holds its checkpoint, an
 *   optimizer its module, a scheduler its optimizer, so handles may be released in any order.
 *   Release functions accept NULL. A handle may be used from one thread at a time.
 *
 * Memory: one ownership rule
 *   - Memory the caller passes in stays the caller's. The library reads or writes it during the
 *     call only and never keeps a pointer to it.
 *   - Data whose size the caller knows (a parameter, the contiguous parameter buffer) is copied
 *     into or out of caller buffers, described by (data, dtype, shape) and checked against the
 *     parameter's dtype and shape before anything is copied.
 *   - Tensors whose shape only the library knows (step and session outputs) come back as
 *     OtTensor handles that the caller owns and frees with ot_tensor_release.
 *   - Strings the library returns (names, string properties) are owned by the handle they came
 *     from and stay valid until it is released (a string property: until it is set or removed).
 *
 * Tensors cross as dense row-major data with a dtype (the ONNX TensorProto data type numbers)
 * and a shape of `rank` int64 dimensions (shape may be NULL when rank is 0: a scalar).
 */
#ifndef ONNXTRAIN_C_API_H
#define ONNXTRAIN_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define OT_API __attribute__((visibility("default")))
#else
#define OT_API
#endif

/* Enums are 32-bit integers. C++ sees them with that fixed underlying type, so any value a C
 * caller passes is representable and is rejected by name when it is not one of the listed ones. */
#ifdef __cplusplus
#define OT_ENUM(name) enum name : int32_t
#else
#define OT_ENUM(name) enum name
#endif

/* Bumped when a function's signature or meaning changes; new functions do not bump it. */
#define OT_API_VERSION 1

typedef OT_ENUM(OtStatus) {
  OT_OK = 0,
  OT_INVALID_ARGUMENT = 1, /* bad input: NULL handles, names, shapes, dtypes, values */
  OT_INVALID_MODEL = 2,    /* malformed, truncated or inconsistent model or checkpoint files */
  OT_NOT_IMPLEMENTED = 3,  /* a capability onnxtrain does not have yet, named in the message */
  OT_RUNTIME_ERROR = 4     /* a failure while running: I/O, out of memory, library errors */
} OtStatus;

/* Values are ONNX's TensorProto.DataType. */
typedef OT_ENUM(OtDType) {
  OT_DTYPE_FLOAT32 = 1,
  OT_DTYPE_UINT8 = 2,
  OT_DTYPE_INT8 = 3,
  OT_DTYPE_UINT16 = 4,
  OT_DTYPE_INT16 = 5,
  OT_DTYPE_INT32 = 6,
  OT_DTYPE_INT64 = 7,
  OT_DTYPE_BOOL = 9, /* one byte per element, 0 or 1 */
  OT_DTYPE_FLOAT16 = 10,
  OT_DTYPE_FLOAT64 = 11,
  OT_DTYPE_UINT32 = 12,
  OT_DTYPE_UINT64 = 13,
  OT_DTYPE_BFLOAT16 = 16
} OtDType;

/* Caller memory passed as a step or session input; read during the call only. */
typedef struct OtTensorView {
  const void* data;
  OtDType dtype;
  const int64_t* shape;
  size_t rank;
} OtTensorView;

typedef OT_ENUM(OtPropertyType) {
  OT_PROPERTY_NONE = 0, /* no property of that name */
  OT_PROPERTY_INT = 1,
  OT_PROPERTY_FLOAT = 2,
  OT_PROPERTY_STRING = 3
} OtPropertyType;

/* The losses of torch.nn with the same names. */
/* Checkpoint file formats: onnxtrain's (safetensors layout) and ONNX Runtime's training checkpoint. */
typedef OT_ENUM(OtCheckpointFormat) {
  OT_CHECKPOINT_ONNXTRAIN = 0,
  OT_CHECKPOINT_ORT = 1
} OtCheckpointFormat;

typedef OT_ENUM(OtLossType) {
  OT_LOSS_MSE = 0,
  OT_LOSS_L1 = 1,
  OT_LOSS_SMOOTH_L1 = 2,
  OT_LOSS_HUBER = 3,
  OT_LOSS_CROSS_ENTROPY = 4, /* logits [N, C, ...], int64 class targets */
  OT_LOSS_NLL = 5,
  OT_LOSS_BCE = 6,
  OT_LOSS_BCE_WITH_LOGITS = 7,
  OT_LOSS_KL_DIV = 8
} OtLossType;

/* Update rules with torch.optim semantics and defaults (HF_ADAMW: transformers' AdamW; LAMB:
 * apex FusedLAMB). */
typedef OT_ENUM(OtOptimizerType) {
  OT_OPTIMIZER_ADAMW = 0,
  OT_OPTIMIZER_ADAM = 1,
  OT_OPTIMIZER_HF_ADAMW = 2,
  OT_OPTIMIZER_SGD = 3,
  OT_OPTIMIZER_LAMB = 4,
  OT_OPTIMIZER_ADAGRAD = 5
} OtOptimizerType;

typedef struct OtTensor OtTensor;
typedef struct OtCheckpoint OtCheckpoint;
typedef struct OtModule OtModule;
typedef struct OtOptimizer OtOptimizer;
typedef struct OtLRScheduler OtLRScheduler;
typedef struct OtInferenceSession OtInferenceSession;
typedef struct OtArtifactOptions OtArtifactOptions;

/* ---- errors, version, threads */

/* The message of this thread's last failed call ("" after a successful one); never NULL. Valid
 * until this thread's next call into the API. */
OT_API const char* ot_last_error(void);
OT_API const char* ot_status_name(OtStatus status); /* "OK", "INVALID_ARGUMENT", ... */
OT_API const char* ot_version(void);                /* "0.1.0" */
/* Threads for kernels (one OpenMP pool shared with oneDNN); <= 0 keeps OpenMP's default. */
OT_API OtStatus ot_set_num_threads(int num_threads);

/* ---- tensors the library returns */

/* Any output pointer may be NULL. shape stays valid until the tensor is released. */
OT_API OtStatus ot_tensor_info(const OtTensor* tensor, OtDType* dtype, const int64_t** shape, size_t* rank);
OT_API OtStatus ot_tensor_data(const OtTensor* tensor, const void** data);
OT_API void ot_tensor_release(OtTensor* tensor);

/* ---- checkpoint: parameters, optimizer state and properties in one file */

OT_API OtStatus ot_checkpoint_load(const char* path, OtCheckpoint** out);
/* Atomic: on failure the previous file at path is untouched. */
OT_API OtStatus ot_checkpoint_save(const OtCheckpoint* checkpoint, const char* path, int include_optimizer_state);
/* The same in a chosen format: OT_CHECKPOINT_ORT writes ONNX Runtime's training checkpoint (loads in
 * ORT's CheckpointState.load_checkpoint; tensors in "<path>.data" past 1800 MiB). ot_checkpoint_load
 * reads both, telling them apart by the file's bytes; ot_checkpoint_file_format says which a file is. */
OT_API OtStatus ot_checkpoint_save_as(const OtCheckpoint* checkpoint, const char* path, int include_optimizer_state,
                                      OtCheckpointFormat format);
OT_API OtStatus ot_checkpoint_file_format(const char* path, OtCheckpointFormat* format);
OT_API void ot_checkpoint_release(OtCheckpoint* checkpoint);

OT_API OtStatus ot_checkpoint_parameter_count(const OtCheckpoint* checkpoint, size_t* count);
OT_API OtStatus ot_checkpoint_parameter_name(const OtCheckpoint* checkpoint, size_t index, const char** name);
/* Any output pointer may be NULL; shape stays valid until the checkpoint is released. */
OT_API OtStatus ot_checkpoint_parameter_info(const OtCheckpoint* checkpoint, const char* name, OtDType* dtype,
                                             const int64_t** shape, size_t* rank, int* requires_grad);
/* Copies the parameter into data, which the caller describes; dtype and shape must match. */
OT_API OtStatus ot_checkpoint_get_parameter(const OtCheckpoint* checkpoint, const char* name, void* data,
                                            OtDType dtype, const int64_t* shape, size_t rank);
/* Copies data into the parameter (modules using the checkpoint see it); dtype and shape must match. */
OT_API OtStatus ot_checkpoint_set_parameter(OtCheckpoint* checkpoint, const char* name, const void* data,
                                            OtDType dtype, const int64_t* shape, size_t rank);

OT_API OtStatus ot_checkpoint_set_int_property(OtCheckpoint* checkpoint, const char* name, int64_t value);
OT_API OtStatus ot_checkpoint_set_float_property(OtCheckpoint* checkpoint, const char* name, double value);
OT_API OtStatus ot_checkpoint_set_string_property(OtCheckpoint* checkpoint, const char* name, const char* value);
/* OT_PROPERTY_NONE (and OT_OK) when there is no property of that name. */
OT_API OtStatus ot_checkpoint_get_property_type(const OtCheckpoint* checkpoint, const char* name,
                                                OtPropertyType* type);
/* Fail with OT_INVALID_ARGUMENT when the property is missing or of another type. */
OT_API OtStatus ot_checkpoint_get_int_property(const OtCheckpoint* checkpoint, const char* name, int64_t* value);
OT_API OtStatus ot_checkpoint_get_float_property(const OtCheckpoint* checkpoint, const char* name, double* value);
OT_API OtStatus ot_checkpoint_get_string_property(const OtCheckpoint* checkpoint, const char* name,
                                                  const char** value);
OT_API OtStatus ot_checkpoint_remove_property(OtCheckpoint* checkpoint, const char* name);
OT_API OtStatus ot_checkpoint_property_count(const OtCheckpoint* checkpoint, size_t* count);
/* Properties in name order. */
OT_API OtStatus ot_checkpoint_property_name(const OtCheckpoint* checkpoint, size_t index, const char** name);

/* ---- artifacts: the offline step, from an inference model */

/* Options start empty: nothing trainable (initializers in neither list are frozen), no loss (one
 * must be set), AdamW with torch's defaults. The loss takes the model's first output and a new
 * target input. */
OT_API OtStatus ot_artifact_options_create(OtArtifactOptions** out);
OT_API void ot_artifact_options_release(OtArtifactOptions* options);
OT_API OtStatus ot_artifact_options_set_requires_grad(OtArtifactOptions* options, const char* const* names,
                                                      size_t num_names);
OT_API OtStatus ot_artifact_options_set_frozen_params(OtArtifactOptions* options, const char* const* names,
                                                      size_t num_names);
OT_API OtStatus ot_artifact_options_set_loss(OtArtifactOptions* options, OtLossType loss);
/* The rule's torch defaults with this learning rate. */
OT_API OtStatus ot_artifact_options_set_optimizer(OtArtifactOptions* options, OtOptimizerType optimizer,
                                                  double learning_rate);
/* Model values the training and eval graphs output after the loss (e.g. logits for accuracy). */
OT_API OtStatus ot_artifact_options_set_additional_output_names(OtArtifactOptions* options,
                                                                const char* const* names, size_t num_names);
/* Nonzero: the checkpoint holds shapes and dtypes only (fill it with ot_module_copy_buffer_to_parameters
 * after loading it elsewhere). */
OT_API OtStatus ot_artifact_options_set_nominal_checkpoint(OtArtifactOptions* options, int nominal);
/* "bf16", "fp16" (with a dynamic loss scaler: see ot_optimizer_step_report) or NULL/"" for fp32. */
OT_API OtStatus ot_artifact_options_set_mixed_precision(OtArtifactOptions* options, const char* mode);
/* The memory optimizer: recomputes stashed activations in the backward instead of keeping them.
 * level 0 applies only what config asks, 1 recomputes inside transformer layers (checkpoints at
 * their residual boundaries), 2 adds the compromised plans; config is "cluster:strategy:count,..."
 * (strategy 0 none, 1 recompute, 2 compromised; count -1 every occurrence), NULL or "" for none.
 * A level other than 0-2 fails here; a config entry naming no cluster of the model fails in
 * ot_generate_artifacts, listing the model's clusters (`onnxtrain inspect` prints the plan table). */
OT_API OtStatus ot_artifact_options_set_memory_optimizer(OtArtifactOptions* options, int level,
                                                         const char* config);
/* Nonzero (the default): a Gather or Slice that keeps a few positions (a head on token 0, the last
 * token) moves upstream past elementwise ops, LayerNorm, Softmax and MatMul, so the graphs compute
 * only those rows; exact. 0: every row is computed. */
OT_API OtStatus ot_artifact_options_set_compute_optimizer(OtArtifactOptions* options, int enabled);

/* Nonzero: a CrossEntropy/NLL loss with ignore_index computes the LM head (and its gradients) on
 * the rows whose label is kept only; same loss and gradients. 0 (the default): every row. */
OT_API OtStatus ot_artifact_options_set_label_sparsity(OtArtifactOptions* options, int enabled);

/* Nonzero: artifacts that ONNX Runtime training's API (1.16-1.19) loads and trains as well
 * (ORT's graph conventions, optimizer graph and checkpoint format; AdamW or plain SGD, fp32). */
OT_API OtStatus ot_artifact_options_set_ort_compatible(OtArtifactOptions* options, int enabled);

/* Writes training_model.onnx, eval_model.onnx, optimizer_model.onnx and checkpoint into
 * artifact_directory (created when missing). */
OT_API OtStatus ot_generate_artifacts(const char* model_path, const OtArtifactOptions* options,
                                      const char* artifact_directory);

/* Pre-compiles artifact_directory's models: writes training_model.otc, eval_model.otc and
 * optimizer_model.otc next to the ONNX files, with memory plans for the input shapes given
 * (input_names[i] has ranks[i] dims at dims[i]; inputs with a static declared shape need none, so
 * num_shapes may be 0). ot_module_create and ot_optimizer_create then load them while they are
 * valid, and ignore a stale or damaged one with a note on stderr. */
OT_API OtStatus ot_compile_artifacts(const char* artifact_directory, const char* const* input_names,
                                     const int64_t* const* dims, const size_t* ranks, size_t num_shapes);

/* ---- module: runs the training and eval graphs over a checkpoint's parameters */

/* eval_model_path may be NULL or "" (then eval_step and export are unavailable). When a valid
 * pre-compiled model (same path, .otc instead of .onnx; ot_compile_artifacts) is present, it is
 * loaded instead. */
OT_API OtStatus ot_module_create(const char* training_model_path, OtCheckpoint* checkpoint,
                                 const char* eval_model_path, OtModule** out);
/* ot_module_create on a device: "cpu" or "cuda" (the graphs run on the GPU; the parameters stay on
 * the host, copied in each step, and the optimizer updates on the CPU). "cuda" fails with the reason
 * where there is no GPU or the library was built without CUDA. */
OT_API OtStatus ot_module_create_on_device(const char* training_model_path, OtCheckpoint* checkpoint,
                                           const char* eval_model_path, const char* device, OtModule** out);
OT_API void ot_module_release(OtModule* module);

/* Forward, backward and gradient accumulation. inputs: the training graph's inputs in the order
 * ot_module_input_name gives (model inputs, then loss targets). outputs: an array of exactly
 * ot_module_output_count entries (the loss first), filled with new tensors. */
OT_API OtStatus ot_module_train_step(OtModule* module, const OtTensorView* inputs, size_t num_inputs,
                                     OtTensor** outputs, size_t num_outputs);
/* Forward and loss on the eval graph (inference-mode Dropout and BatchNorm). */
OT_API OtStatus ot_module_eval_step(OtModule* module, const OtTensorView* inputs, size_t num_inputs,
                                    OtTensor** outputs, size_t num_outputs);
/* The next train step overwrites the gradients instead of adding to them. */
OT_API OtStatus ot_module_lazy_reset_grad(OtModule* module);
/* The mode selects whose inputs and outputs the name functions list: the training graph's (the
 * default) or the eval graph's. */
OT_API OtStatus ot_module_train(OtModule* module);
OT_API OtStatus ot_module_eval(OtModule* module);
OT_API OtStatus ot_module_is_training(const OtModule* module, int* training);
OT_API OtStatus ot_module_input_count(const OtModule* module, size_t* count);
OT_API OtStatus ot_module_input_name(const OtModule* module, size_t index, const char** name);
OT_API OtStatus ot_module_output_count(const OtModule* module, size_t* count);
OT_API OtStatus ot_module_output_name(const OtModule* module, size_t index, const char** name);

/* Element count of the trainable (or all) parameters, concatenated in checkpoint order. */
OT_API OtStatus ot_module_get_parameters_size(const OtModule* module, int trainable_only, int64_t* size);
OT_API OtStatus ot_module_get_contiguous_parameters(const OtModule* module, int trainable_only, void* buffer,
                                                    OtDType dtype, int64_t numel);
OT_API OtStatus ot_module_copy_buffer_to_parameters(OtModule* module, int trainable_only, const void* buffer,
                                                    OtDType dtype, int64_t numel);
/* Writes the eval graph with the current parameters as initializers and the named outputs. */
OT_API OtStatus ot_module_export_model_for_inferencing(const OtModule* module, const char* path,
                                                       const char* const* output_names, size_t num_output_names);

/* ---- optimizer: the update rule of the optimizer model, over the module's parameters */

OT_API OtStatus ot_optimizer_create(const char* optimizer_model_path, OtModule* module, OtOptimizer** out);
OT_API void ot_optimizer_release(OtOptimizer* optimizer);
/* One update of every trainable parameter from its gradient (run a train step first). */
OT_API OtStatus ot_optimizer_step(OtOptimizer* optimizer);
/* The same step, reporting the fp16 loss scaler's verdict: *skipped = 1 when a gradient was inf
 * or NaN and the update was skipped, *loss_scale = the scale after the step (0 for artifacts
 * without loss scaling). Either pointer may be NULL. */
OT_API OtStatus ot_optimizer_step_report(OtOptimizer* optimizer, int* skipped, double* loss_scale);
OT_API OtStatus ot_optimizer_set_learning_rate(OtOptimizer* optimizer, double learning_rate);
OT_API OtStatus ot_optimizer_get_learning_rate(const OtOptimizer* optimizer, double* learning_rate);
OT_API OtStatus ot_optimizer_step_count(const OtOptimizer* optimizer, int64_t* count);
/* Data parallelism: with enabled != 0 every ot_optimizer_step first averages the gradients over
 * the ranks of the job (mpirun -np N). All ranks call it together; it fails, naming the ranks,
 * when their parameters or optimizer state differ. bucket_bytes <= 0: 25 MB; check_every > 0
 * compares a parameter checksum across ranks every N steps; timeout_seconds <= 0: 300. */
OT_API OtStatus ot_optimizer_set_data_parallel(OtOptimizer* optimizer, int enabled, int64_t bucket_bytes,
                                               int64_t check_every, double timeout_seconds);
/* How a data-parallel optimizer reduces (call after ot_optimizer_set_data_parallel, on every
 * rank): overlap != 0 (the default) reduces each bucket during the backward of the last of
 * gradient_accumulation_steps train steps per optimizer step (same results as overlap 0). */
OT_API OtStatus ot_optimizer_set_data_parallel_overlap(OtOptimizer* optimizer, int overlap,
                                                       int64_t gradient_accumulation_steps);
/* Joins the job's world (MPI when started by mpirun, else one rank); any output may be NULL. */
OT_API OtStatus ot_distributed_init(int* rank, int* size, int* local_rank);

/* ---- LR schedulers, with ONNX Runtime's semantics: lr = initial_lr * multiplier(step count of
 * the optimizer), set on the optimizer at creation and by every ot_lr_scheduler_step (call it
 * after ot_optimizer_step). */

/* ONNX Runtime's LinearLRScheduler: linear warmup from 0, then linear decay to 0 at total. */
OT_API OtStatus ot_lr_scheduler_create_linear(OtOptimizer* optimizer, int64_t warmup_step_count,
                                              int64_t total_step_count, double initial_lr, OtLRScheduler** out);
/* Linear warmup, then cosine decay (num_cycles 0.5: a half cosine down to 0 at total). */
OT_API OtStatus ot_lr_scheduler_create_cosine(OtOptimizer* optimizer, int64_t warmup_step_count,
                                              int64_t total_step_count, double initial_lr, double num_cycles,
                                              OtLRScheduler** out);
/* torch's StepLR: initial_lr * gamma ^ (step / step_size). */
OT_API OtStatus ot_lr_scheduler_create_step(OtOptimizer* optimizer, int64_t step_size, double gamma,
                                            double initial_lr, OtLRScheduler** out);
/* Linear warmup, then constant initial_lr. */
OT_API OtStatus ot_lr_scheduler_create_constant(OtOptimizer* optimizer, int64_t warmup_step_count,
                                                double initial_lr, OtLRScheduler** out);
/* Sets the optimizer's learning rate for its current step count; learning_rate may be NULL. */
OT_API OtStatus ot_lr_scheduler_step(OtLRScheduler* scheduler, double* learning_rate);
OT_API void ot_lr_scheduler_release(OtLRScheduler* scheduler);

/* ---- inference */

OT_API OtStatus ot_session_create(const char* model_path, OtInferenceSession** out);
OT_API void ot_session_release(OtInferenceSession* session);
OT_API OtStatus ot_session_input_count(const OtInferenceSession* session, size_t* count);
OT_API OtStatus ot_session_input_name(const OtInferenceSession* session, size_t index, const char** name);
OT_API OtStatus ot_session_output_count(const OtInferenceSession* session, size_t* count);
OT_API OtStatus ot_session_output_name(const OtInferenceSession* session, size_t index, const char** name);
/* inputs[i] feeds the input named input_names[i]. outputs: an array of exactly
 * ot_session_output_count entries, filled with new tensors in graph order. */
OT_API OtStatus ot_session_run(OtInferenceSession* session, const char* const* input_names,
                               const OtTensorView* inputs, size_t num_inputs, OtTensor** outputs,
                               size_t num_outputs);

#ifdef __cplusplus
}
#endif

#endif /* ONNXTRAIN_C_API_H */

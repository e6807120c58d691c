/* Compiled as C99 with -Wall -Wextra -Werror -pedantic: the C API header must be plain C. It calls
 * every function of the API with NULL handles (and NULL output pointers) and checks that each
 * fails with OT_INVALID_ARGUMENT and a message naming the function, without crashing; linking it
 * proves every declared function exists. */
#include <stdio.h>
#include <string.h>

#include "onnxtrain/c_api.h"

static int failures = 0;

static void rejects_null(OtStatus status, const char* function) {
  if (status != OT_INVALID_ARGUMENT || strstr(ot_last_error(), function) == NULL) {
    fprintf(stderr, "%s: expected INVALID_ARGUMENT naming the function, got %s: '%s'\n", function,
            ot_status_name(status), ot_last_error());
    ++failures;
  }
}

#define rejects_null(call, function) rejects_null(call, function)

int main(void) {
  size_t count = 0;
  int64_t i64 = 0;
  double f64 = 0;
  int flag = 0;
  const char* name = NULL;
  const void* data = NULL;
  OtDType dtype = OT_DTYPE_FLOAT32;
  OtPropertyType type = OT_PROPERTY_NONE;
  OtTensor* tensor = NULL;
  OtCheckpoint* checkpoint = NULL;
  OtModule* module = NULL;
  OtOptimizer* optimizer = NULL;
  OtLRScheduler* scheduler = NULL;
  OtInferenceSession* session = NULL;
  OtArtifactOptions* options = NULL;
  float buffer[4] = {0, 0, 0, 0};
  int64_t shape[1] = {4};

  if (strcmp(ot_status_name(OT_OK), "OK") != 0 || ot_version()[0] == '\0' || OT_API_VERSION < 1) {
    fprintf(stderr, "status names or version are wrong\n");
    ++failures;
  }
  if (ot_set_num_threads(0) != OT_OK || ot_last_error()[0] != '\0') {
    fprintf(stderr, "ot_set_num_threads(0) failed or left an error: '%s'\n", ot_last_error());
    ++failures;
  }

  rejects_null(ot_tensor_info(NULL, &dtype, NULL, &count), "ot_tensor_info");
  rejects_null(ot_tensor_data(NULL, &data), "ot_tensor_data");
  ot_tensor_release(NULL);

  rejects_null(ot_checkpoint_load(NULL, &checkpoint), "ot_checkpoint_load");
  rejects_null(ot_checkpoint_load("x", NULL), "ot_checkpoint_load");
  rejects_null(ot_checkpoint_save(NULL, "x", 1), "ot_checkpoint_save");
  rejects_null(ot_checkpoint_save_as(NULL, "x", 1, OT_CHECKPOINT_ORT), "ot_checkpoint_save_as");
  rejects_null(ot_checkpoint_file_format(NULL, NULL), "ot_checkpoint_file_format");
  rejects_null(ot_checkpoint_parameter_count(NULL, &count), "ot_checkpoint_parameter_count");
  rejects_null(ot_checkpoint_parameter_name(NULL, 0, &name), "ot_checkpoint_parameter_name");
  rejects_null(ot_checkpoint_parameter_info(NULL, "w", &dtype, NULL, NULL, &flag), "ot_checkpoint_parameter_info");
  rejects_null(ot_checkpoint_get_parameter(NULL, "w", buffer, OT_DTYPE_FLOAT32, shape, 1),
               "ot_checkpoint_get_parameter");
  rejects_null(ot_checkpoint_set_parameter(NULL, "w", buffer, OT_DTYPE_FLOAT32, shape, 1),
               "ot_checkpoint_set_parameter");
  rejects_null(ot_checkpoint_set_int_property(NULL, "p", 1), "ot_checkpoint_set_int_property");
  rejects_null(ot_checkpoint_set_float_property(NULL, "p", 1.0), "ot_checkpoint_set_float_property");
  rejects_null(ot_checkpoint_set_string_property(NULL, "p", "v"), "ot_checkpoint_set_string_property");
  rejects_null(ot_checkpoint_get_property_type(NULL, "p", &type), "ot_checkpoint_get_property_type");
  rejects_null(ot_checkpoint_get_int_property(NULL, "p", &i64), "ot_checkpoint_get_int_property");
  rejects_null(ot_checkpoint_get_float_property(NULL, "p", &f64), "ot_checkpoint_get_float_property");
  rejects_null(ot_checkpoint_get_string_property(NULL, "p", &name), "ot_checkpoint_get_string_property");
  rejects_null(ot_checkpoint_remove_property(NULL, "p"), "ot_checkpoint_remove_property");
  rejects_null(ot_checkpoint_property_count(NULL, &count), "ot_checkpoint_property_count");
  rejects_null(ot_checkpoint_property_name(NULL, 0, &name), "ot_checkpoint_property_name");
  ot_checkpoint_release(NULL);

  rejects_null(ot_artifact_options_create(NULL), "ot_artifact_options_create");
  rejects_null(ot_artifact_options_set_requires_grad(NULL, NULL, 0), "ot_artifact_options_set_requires_grad");
  rejects_null(ot_artifact_options_set_frozen_params(NULL, NULL, 0), "ot_artifact_options_set_frozen_params");
  rejects_null(ot_artifact_options_set_loss(NULL, OT_LOSS_MSE), "ot_artifact_options_set_loss");
  rejects_null(ot_artifact_options_set_optimizer(NULL, OT_OPTIMIZER_SGD, 0.1), "ot_artifact_options_set_optimizer");
  rejects_null(ot_artifact_options_set_additional_output_names(NULL, NULL, 0),
               "ot_artifact_options_set_additional_output_names");
  rejects_null(ot_artifact_options_set_nominal_checkpoint(NULL, 1), "ot_artifact_options_set_nominal_checkpoint");
  rejects_null(ot_artifact_options_set_memory_optimizer(NULL, 1, NULL), "ot_artifact_options_set_memory_optimizer");
  rejects_null(ot_artifact_options_set_compute_optimizer(NULL, 0), "ot_artifact_options_set_compute_optimizer");
  rejects_null(ot_artifact_options_set_mixed_precision(NULL, "bf16"), "ot_artifact_options_set_mixed_precision");
  rejects_null(ot_generate_artifacts("m.onnx", NULL, "out"), "ot_generate_artifacts");
  ot_artifact_options_release(NULL);

  rejects_null(ot_module_create("t.onnx", NULL, NULL, &module), "ot_module_create");
  rejects_null(ot_module_create_on_device("t.onnx", NULL, NULL, "cpu", &module), "ot_module_create_on_device");
  rejects_null(ot_module_train_step(NULL, NULL, 0, &tensor, 1), "ot_module_train_step");
  rejects_null(ot_module_eval_step(NULL, NULL, 0, &tensor, 1), "ot_module_eval_step");
  rejects_null(ot_module_lazy_reset_grad(NULL), "ot_module_lazy_reset_grad");
  rejects_null(ot_module_train(NULL), "ot_module_train");
  rejects_null(ot_module_eval(NULL), "ot_module_eval");
  rejects_null(ot_module_is_training(NULL, &flag), "ot_module_is_training");
  rejects_null(ot_module_input_count(NULL, &count), "ot_module_input_count");
  rejects_null(ot_module_input_name(NULL, 0, &name), "ot_module_input_name");
  rejects_null(ot_module_output_count(NULL, &count), "ot_module_output_count");
  rejects_null(ot_module_output_name(NULL, 0, &name), "ot_module_output_name");
  rejects_null(ot_module_get_parameters_size(NULL, 1, &i64), "ot_module_get_parameters_size");
  rejects_null(ot_module_get_contiguous_parameters(NULL, 1, buffer, OT_DTYPE_FLOAT32, 4),
               "ot_module_get_contiguous_parameters");
  rejects_null(ot_module_copy_buffer_to_parameters(NULL, 1, buffer, OT_DTYPE_FLOAT32, 4),
               "ot_module_copy_buffer_to_parameters");
  rejects_null(ot_module_export_model_for_inferencing(NULL, "i.onnx", NULL, 0),
               "ot_module_export_model_for_inferencing");
  ot_module_release(NULL);

  rejects_null(ot_optimizer_create("o.onnx", NULL, &optimizer), "ot_optimizer_create");
  rejects_null(ot_optimizer_step(NULL), "ot_optimizer_step");
  rejects_null(ot_optimizer_set_learning_rate(NULL, 0.1), "ot_optimizer_set_learning_rate");
  rejects_null(ot_optimizer_get_learning_rate(NULL, &f64), "ot_optimizer_get_learning_rate");
  rejects_null(ot_optimizer_step_count(NULL, &i64), "ot_optimizer_step_count");
  rejects_null(ot_optimizer_set_data_parallel(NULL, 1, 0, 0, 0), "ot_optimizer_set_data_parallel");
  rejects_null(ot_optimizer_set_data_parallel_overlap(NULL, 1, 1), "ot_optimizer_set_data_parallel_overlap");
  {
    int rank = -1, size = 0;
    if (ot_distributed_init(&rank, &size, NULL) != OT_OK || rank != 0 || size != 1) {
      fprintf(stderr, "ot_distributed_init outside mpirun: expected rank 0 of 1, got %d of %d: '%s'\n", rank, size,
              ot_last_error());
      ++failures;
    }
  }
  ot_optimizer_release(NULL);

  rejects_null(ot_lr_scheduler_create_linear(NULL, 1, 10, 0.1, &scheduler), "ot_lr_scheduler_create_linear");
  rejects_null(ot_lr_scheduler_create_cosine(NULL, 1, 10, 0.1, 0.5, &scheduler), "ot_lr_scheduler_create_cosine");
  rejects_null(ot_lr_scheduler_create_step(NULL, 1, 0.5, 0.1, &scheduler), "ot_lr_scheduler_create_step");
  rejects_null(ot_lr_scheduler_create_constant(NULL, 1, 0.1, &scheduler), "ot_lr_scheduler_create_constant");
  rejects_null(ot_lr_scheduler_step(NULL, &f64), "ot_lr_scheduler_step");
  ot_lr_scheduler_release(NULL);

  rejects_null(ot_session_create(NULL, &session), "ot_session_create");
  rejects_null(ot_session_input_count(NULL, &count), "ot_session_input_count");
  rejects_null(ot_session_input_name(NULL, 0, &name), "ot_session_input_name");
  rejects_null(ot_session_output_count(NULL, &count), "ot_session_output_count");
  rejects_null(ot_session_output_name(NULL, 0, &name), "ot_session_output_name");
  rejects_null(ot_session_run(NULL, NULL, NULL, 0, &tensor, 1), "ot_session_run");
  ot_session_release(NULL);

  if (checkpoint || module || optimizer || scheduler || session || options || tensor) {
    fprintf(stderr, "a failed call left a non-NULL handle\n");
    ++failures;
  }
  if (failures)
    fprintf(stderr, "%d failures\n", failures);
  else
    printf("every C API function rejects NULL handles\n");
  return failures ? 1 : 0;
}

# The minimal training runtime (-DONNXTRAIN_MINIMAL=ON, `make minimal`): the same sources as the
# full build, less what only artifact generation, TrainModule, Python and the CLI need, with no
# library outside the C++ runtime and OpenMP:
#   - ONNX files through the protobuf wire-format reader/writer (src/onnx/wire_format.cc), not
#     protobuf and the ONNX library;
#   - GEMM, convolution and pooling through the portable kernels of src/backends/cpu
#     (gemm_blocked.cc and conv_portable.cc over sgemm_blocked.cc, pool_loops.cc), not oneDNN; the
#     full build runs small shapes through the same files (portable.h);
# Files named *_minimal.cc replace their full-build counterparts here and only here.
#   - .npz archives stored uncompressed (np.savez), not zlib;
#   - the ops of ONNXTRAIN_OPS (a ;- or ,-separated list) and/or ONNXTRAIN_OPS_FILE (one op type a
#     line, as `onnxtrain artifacts` writes into ops.txt); neither: every op.
# A model that needs an op left out fails with the op's name and the option that adds it.

set(ONNXTRAIN_OPS "" CACHE STRING "Minimal build: op types to include (list); empty with no ops file: all")
set(ONNXTRAIN_OPS_FILE "" CACHE FILEPATH "Minimal build: a file of op types to include, one a line")

# ---- sources: everything under src/ except what only artifact generation and the full build use
file(GLOB_RECURSE _all_sources CONFIGURE_DEPENDS src/*.cc)
set(_left_out
  src/autodiff/                               # gradient graphs: artifact generation, TrainModule
  src/training/artifacts.cc src/training/generate_artifacts.cc src/training/losses.cc
  src/training/forward_backward.cc            # TrainModule's forward/backward split
  src/training/trainer.cc                     # the CLI's training loop
  src/passes/mixed_precision.cc src/passes/compute_optimizer.cc  # artifact/TrainModule-time passes
  src/passes/sparsity.cc                      # TrainModule-time label/padding sparsity
  src/passes/memory_optimizer.cc              # recompute/offload plans: artifact generation
  src/training/quantize.cc                    # weight quantization: artifact generation
  src/training/lora_apply.cc                  # adding LoRA adapters: artifact generation
  src/training/ort_export.cc                  # ORT-compatible artifacts: artifact generation
  src/ops/gradient_builder.cc src/ops/graph_builder.cc  # what gradient rules are written with
  src/onnx/model_io.cc                        # protobuf (replaced by model_io_minimal.cc)
  src/backends/cpu/gemm_dnnl.cc src/backends/cpu/conv_dnnl.cc src/backends/cpu/pool_dnnl.cc
  src/backends/cpu/dnnl_utils.cc              # oneDNN (replaced by gemm_, conv_, pool_minimal.cc)
  src/backends/cpu/portable.cc                # the full build's choice of oneDNN or the portable kernels
  src/ops/build_ops.cc                        # replaced by the generated list of left-out ops
)
set(ONNXTRAIN_MINIMAL_SOURCES "")
foreach(_f IN LISTS _all_sources)
  file(RELATIVE_PATH _rel ${CMAKE_CURRENT_SOURCE_DIR} ${_f})
  set(_keep TRUE)
  foreach(_out IN LISTS _left_out)
    string(FIND "${_rel}" "${_out}" _at)
    if(_at EQUAL 0)
      set(_keep FALSE)
    endif()
  endforeach()
  if(_keep)
    list(APPEND ONNXTRAIN_MINIMAL_SOURCES ${_f})
  endif()
endforeach()

# ---- ops: each op file (src/ops/<family>/*.cc) stays when it registers a selected op; files that
# register none (shared helpers) always stay, as does the optimizer family (Optimizer needs it).
# Within a kept file each op is guarded on its own (generated ops_in_build.h, read by
# ONNXTRAIN_OP in ops/registry.h): Relu keeps Relu's kernel, not its file's 30 other unary ops.
include(${CMAKE_CURRENT_LIST_DIR}/op_files.cmake)
set(_wanted ${ONNXTRAIN_OPS})
string(REPLACE "," ";" _wanted "${_wanted}")
if(ONNXTRAIN_OPS_FILE)
  file(STRINGS "${ONNXTRAIN_OPS_FILE}" _file_ops REGEX "^[A-Za-z]")
  list(APPEND _wanted ${_file_ops})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${ONNXTRAIN_OPS_FILE}")
endif()
list(TRANSFORM _wanted STRIP)
list(REMOVE_DUPLICATES _wanted)
set(_ops_left_out "")
if(_wanted)
  onnxtrain_op_files("${ONNXTRAIN_MINIMAL_SOURCES}" _op_of_file)
  set(_known_ops "")
  set(_ops_in_build "")
  foreach(_entry IN LISTS _op_of_file)
    string(REPLACE "=" ";" _pair "${_entry}")
    list(GET _pair 0 _file)
    list(GET _pair 1 _ops)
    string(REPLACE "," ";" _ops "${_ops}")
    list(APPEND _known_ops ${_ops})
    set(_selected FALSE)
    foreach(_op IN LISTS _ops)
      if(_op IN_LIST _wanted)
        set(_selected TRUE)
      endif()
    endforeach()
    if(_file MATCHES "/ops/optimizer/")
      set(_selected TRUE)
      list(APPEND _ops_in_build ${_ops})
    endif()
    if(NOT _selected)
      list(REMOVE_ITEM ONNXTRAIN_MINIMAL_SOURCES ${_file})
    endif()
  endforeach()
  # A family's helper files (src/ops/<family>/*.cc registering no op) stay when an op file of the
  # family stays, when a kept source includes the helper's own header (ops/<family>/<name>.h), or
  # when it includes a family header no file is named after (then all the family's helpers).
  set(_families_kept "")
  set(_helpers_included "")
  foreach(_f IN LISTS ONNXTRAIN_MINIMAL_SOURCES)
    set(_own_family "")
    if(_f MATCHES "/src/ops/([a-z_]+)/[^/]+\\.cc$")
      set(_own_family ${CMAKE_MATCH_1})
      set(_family ${CMAKE_MATCH_1})
      foreach(_entry IN LISTS _op_of_file)
        string(FIND "${_entry}" "${_f}=" _at)
        if(_at EQUAL 0)
          list(APPEND _families_kept ${_family})
        endif()
      endforeach()
    endif()
    file(STRINGS "${_f}" _includes REGEX "^#include \"ops/[a-z_]+/[a-z_]+\\.h\"")
    foreach(_inc IN LISTS _includes)
      string(REGEX REPLACE "^#include \"(ops/[a-z_]+/[a-z_]+)\\.h\".*" "\\1" _header "${_inc}")
      if(_header MATCHES "^ops/${_own_family}/")
        continue()
      elseif(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/src/${_header}.cc")
        list(APPEND _helpers_included ${_header})
      else()  # a family header with no file of its name (tensor_ops.h): all the family's helpers
        string(REGEX REPLACE "^ops/([a-z_]+)/.*" "\\1" _family "${_header}")
        list(APPEND _families_kept ${_family})
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES _families_kept)
  foreach(_f IN LISTS ONNXTRAIN_MINIMAL_SOURCES)
    if(_f MATCHES "/src/(ops/([a-z_]+)/[^/]+)\\.cc$" AND NOT CMAKE_MATCH_2 IN_LIST _families_kept
       AND NOT CMAKE_MATCH_1 IN_LIST _helpers_included)
      list(REMOVE_ITEM ONNXTRAIN_MINIMAL_SOURCES ${_f})
    endif()
  endforeach()
  list(APPEND _ops_in_build ${_wanted})
  list(REMOVE_DUPLICATES _ops_in_build)
  list(SORT _ops_in_build)
  set(_ops_left_out ${_known_ops})
  foreach(_op IN LISTS _wanted)
    if(NOT _op IN_LIST _known_ops)
      message(FATAL_ERROR "ONNXTRAIN_OPS: no op file registers '${_op}'")
    endif()
  endforeach()
  list(REMOVE_ITEM _ops_left_out ${_ops_in_build})
  list(REMOVE_DUPLICATES _ops_left_out)
  list(SORT _ops_left_out)
  list(LENGTH _wanted _n_wanted)
  list(LENGTH _ops_in_build _n_in)
  list(LENGTH _ops_left_out _n_out)
  message(STATUS "onnxtrain minimal: ${_n_wanted} ops asked for, ${_n_in} built (with the optimizer's), ${_n_out} left out")
  list(JOIN _ops_in_build "\", \"" _in_build_list)
  set(_in_build_body "for (std::string_view op : {\"${_in_build_list}\"})
    if (op == op_type) return true;
  return false;")
else()
  message(STATUS "onnxtrain minimal: every op (set ONNXTRAIN_OPS or ONNXTRAIN_OPS_FILE to choose)")
  set(_in_build_body "return true;")
endif()
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/src/ops/ops_in_build_minimal.h.in
               ${CMAKE_BINARY_DIR}/generated/ops_in_build.h @ONLY)
# Only the op files see the switch (and so recompile when the selection changes): every other
# source keeps the full build's command line, which the compiler cache serves to both builds.
# The fusion passes too: a fusion into an op left out compiles to nothing (src/passes/fusions.cc).
foreach(_f IN LISTS ONNXTRAIN_MINIMAL_SOURCES)
  if(_f MATCHES "/src/ops/[a-z_]+/[^/]+\\.cc$" OR _f MATCHES "/src/passes/fusions\\.cc$")
    set_property(SOURCE ${_f} APPEND PROPERTY COMPILE_DEFINITIONS ONNXTRAIN_MINIMAL_OPS=1)
  endif()
endforeach()
# The left-out list, so an unknown op can say which option adds it (src/ops/build_ops.h).
list(JOIN _ops_left_out "\",\n    \"" _left_out_lines)
if(_ops_left_out)
  set(_left_out_lines "\"${_left_out_lines}\"")
endif()
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/src/ops/build_ops_minimal.cc.in ${CMAKE_BINARY_DIR}/generated/build_ops.cc @ONLY)
list(APPEND ONNXTRAIN_MINIMAL_SOURCES ${CMAKE_BINARY_DIR}/generated/build_ops.cc)

# ---- the WebAssembly module instead of the library, under emcmake (cmake/web.cmake)
if(EMSCRIPTEN)
  include(${CMAKE_CURRENT_LIST_DIR}/web.cmake)
  return()
endif()

# ---- the library
find_package(OpenMP REQUIRED)
add_library(onnxtrain SHARED ${ONNXTRAIN_MINIMAL_SOURCES})
target_include_directories(onnxtrain PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
                           PRIVATE src ${CMAKE_BINARY_DIR}/generated)
# The same definitions as the full build (ONNX_* are unused here) keep every shared source's command
# line identical, so the compiler cache serves both builds.
target_compile_definitions(onnxtrain PUBLIC ONNX_ML=1 ONNX_NAMESPACE=onnx
                           PRIVATE ONNXTRAIN_VERSION_STRING="${PROJECT_VERSION}")
set_source_files_properties(src/data/npz.cc PROPERTIES COMPILE_DEFINITIONS ONNXTRAIN_NPZ_WITHOUT_ZLIB=1)
target_link_libraries(onnxtrain PUBLIC OpenMP::OpenMP_CXX)
# An excluded file still called from a kept one is a link error here, not a load-time surprise.
target_link_options(onnxtrain PRIVATE -Wl,--no-undefined)

# ---- what runs on it: the C++ and C digits examples, the C MLP example, and the runtime's tests
if(ONNXTRAIN_BUILD_EXAMPLES)
  add_executable(train_digits examples/cpp/train_digits.cc)
  target_link_libraries(train_digits PRIVATE onnxtrain)
  add_executable(train_digits_c examples/c/train_digits.c)
  set_target_properties(train_digits_c PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(train_digits_c PRIVATE -Wall -Wextra -Werror -pedantic)
  target_link_libraries(train_digits_c PRIVATE onnxtrain m)
  set_target_properties(train_digits train_digits_c PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/examples)
endif()

# The native side of the WebAssembly module's tests and benchmark (web/tests/*.test.mjs, bench/bench_web.mjs).
add_executable(web_native_steps web/tests/native_steps.c)
set_target_properties(web_native_steps PROPERTIES C_STANDARD 99 RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/web)
target_compile_options(web_native_steps PRIVATE -Wall -Wextra -Werror)
target_link_libraries(web_native_steps PRIVATE onnxtrain)

# Startup to the first train step from ONNX and pre-compiled artifacts (bench_minimal.py).
add_executable(startup bench/startup.cc)
target_link_libraries(startup PRIVATE onnxtrain)
set_target_properties(startup PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)

if(ONNXTRAIN_BUILD_TESTS)
  enable_testing()
  if(CMAKE_CROSSCOMPILING)
    # No target GoogleTest package: build it from the sources Debian's libgtest-dev ships.
    add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    set(_gtest_main gtest_main)
  else()
    find_package(GTest REQUIRED)
    set(_gtest_main GTest::gtest_main)
  endif()
  file(GLOB _minimal_tests CONFIGURE_DEPENDS tests/minimal/*.cc)
  # The SIMD math layer's ULP test (header-only), so the minimal and cross builds check the vector
  # code of their own ISA (NEON under qemu-aarch64) against the same bounds.
  list(APPEND _minimal_tests ${CMAKE_SOURCE_DIR}/tests/cpp/fast_math_test.cc)
  add_executable(onnxtrain_minimal_tests ${_minimal_tests})
  target_include_directories(onnxtrain_minimal_tests PRIVATE src)
  # The digits demo's artifacts, which the pre-compiled-artifact tests use when `make demo` wrote them.
  target_compile_definitions(onnxtrain_minimal_tests PRIVATE
                             ONNXTRAIN_DIGITS_ARTIFACTS="${CMAKE_SOURCE_DIR}/examples/out/digits_artifacts")
  target_link_libraries(onnxtrain_minimal_tests PRIVATE onnxtrain ${_gtest_main})
  # add_test runs targets through CMAKE_CROSSCOMPILING_EMULATOR (qemu-aarch64) when cross compiling.
  add_test(NAME minimal_backend COMMAND onnxtrain_minimal_tests)
  if(ONNXTRAIN_BUILD_EXAMPLES)
    # The digits demo's prepared artifacts (examples/demo.py, `make demo`) trained from C and C++ to
    # 97%; skipped (77) when the demo has not run.
    set(_digits ${CMAKE_SOURCE_DIR}/examples/out)
    foreach(_example train_digits_c train_digits)
      set(_data ${_digits}/digits_raw)
      if(_example STREQUAL "train_digits")
        set(_data ${_digits}/digits.npz)
      endif()
      # sh -c SCRIPT sh ARTIFACTS OUT [EMULATOR...] PROGRAM ARTIFACTS DATA: runs PROGRAM ... OUT 0.97
      add_test(NAME minimal_${_example}
               COMMAND sh -c "test -d \"$1\" || exit 77; out=$2; shift 2; mkdir -p \"$out\" && exec \"$@\" \"$out\" 0.97"
                       sh ${_digits}/digits_artifacts ${CMAKE_BINARY_DIR}/${_example}_out ${CMAKE_CROSSCOMPILING_EMULATOR}
                       $<TARGET_FILE:${_example}> ${_digits}/digits_artifacts ${_data})
      set_tests_properties(minimal_${_example} PROPERTIES SKIP_RETURN_CODE 77)
    endforeach()
    # The same two programs on the full build (ONNXTRAIN_FULL_BUILD_DIR) and on this one, 2 epochs:
    # their checkpoints must be byte-for-byte identical (scripts/check_minimal_digits.sh). Skipped
    # (77) without the demo's artifacts or a full build; not under an emulator (another ISA's
    # vector width sums in another order).
    if(NOT CMAKE_CROSSCOMPILING)
      set(ONNXTRAIN_FULL_BUILD_DIR "${CMAKE_SOURCE_DIR}/build" CACHE PATH
          "Minimal build: the full build whose digits checkpoints minimal_digits_match_full compares")
      add_test(NAME minimal_digits_match_full
               COMMAND sh -c "test -d \"$1/digits_artifacts\" && test -x \"$2/examples/train_digits_c\" || exit 77; exec \"$3\" \"$2\" \"$4\" 0 2"
                       sh ${_digits} ${ONNXTRAIN_FULL_BUILD_DIR} ${CMAKE_SOURCE_DIR}/scripts/check_minimal_digits.sh
                       ${CMAKE_BINARY_DIR})
      set_tests_properties(minimal_digits_match_full PROPERTIES SKIP_RETURN_CODE 77)
    endif()
  endif()
endif()

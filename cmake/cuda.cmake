# The CUDA backend (-DONNXTRAIN_CUDA=ON): src/backends/cuda into the library, the op files' CUDA
# kernels (OT_CUDA in ops/registry.h) switched on, cuBLASLt and the static CUDA runtime linked,
# and the GPU tests (tests/cuda) built. Code for sm_90 (H100, H200) plus its PTX, which the
# driver compiles for newer GPUs. Without the option nothing of it is compiled or linked.
# Included by CMakeLists.txt and cmake/minimal.cmake once the onnxtrain target exists.
if(NOT ONNXTRAIN_CUDA)
  return()
endif()
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)  # "90": sm_90 machine code and compute_90 PTX
endif()
if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
enable_language(CUDA)
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake before 3.26 knows no C++20 flag for nvcc
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
find_package(CUDAToolkit REQUIRED)

file(GLOB ONNXTRAIN_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/../src/backends/cuda/*.cc
     ${CMAKE_CURRENT_LIST_DIR}/../src/backends/cuda/*.cu)
target_sources(onnxtrain PRIVATE ${ONNXTRAIN_CUDA_SOURCES})
# Only the files that declare CUDA kernels (OT_CUDA, `#if ONNXTRAIN_CUDA`) see the define: the rest of the library compiles as in
# a build without CUDA and shares compiler-cache entries with one (a CUDA build beside the CPU
# build recompiles a dozen op files, not the library).
get_target_property(_library_sources onnxtrain SOURCES)
foreach(_f IN LISTS _library_sources)
  if(_f MATCHES "\\.cc$")
    if(NOT IS_ABSOLUTE "${_f}")
      set(_f ${CMAKE_CURRENT_SOURCE_DIR}/${_f})
    endif()
    file(STRINGS "${_f}" _uses REGEX "^#if ONNXTRAIN_CUDA|OT_CUDA\\(")
    if(_uses)
      set_property(SOURCE "${_f}" APPEND PROPERTY COMPILE_DEFINITIONS ONNXTRAIN_CUDA=1)
    endif()
  endif()
endforeach()
# The target exists already, so the CUDA properties CMake initialises at creation are set here.
set_target_properties(onnxtrain PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 20
                      CUDA_STANDARD_REQUIRED ON)
target_compile_options(onnxtrain PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>)
target_link_libraries(onnxtrain PRIVATE CUDA::cudart_static CUDA::cublasLt)
message(STATUS "onnxtrain: CUDA backend for sm_${CMAKE_CUDA_ARCHITECTURES} (${CUDAToolkit_VERSION})")

# The kernels against the card's ceilings (bench/cuda_kernels.cc; scripts/gpu_check.sh runs it).
add_executable(cuda_kernels_bench ${CMAKE_CURRENT_LIST_DIR}/../bench/cuda_kernels.cc)
target_include_directories(cuda_kernels_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src)
target_link_libraries(cuda_kernels_bench PRIVATE onnxtrain CUDA::cuda_driver)  # the driver: its events time it
set_target_properties(cuda_kernels_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
# Training steps of GPT-2 124M, BERT-base and ResNet-50 with a Module on the GPU (the GPU speed targets).
add_executable(cuda_training_bench ${CMAKE_CURRENT_LIST_DIR}/../bench/cuda_training.cc)
target_include_directories(cuda_training_bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src)
target_link_libraries(cuda_training_bench PRIVATE onnxtrain)
set_target_properties(cuda_training_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)

if(ONNXTRAIN_BUILD_TESTS)
  # Every CUDA kernel against the CPU kernel of its op, through an executor on each device; the
  # tests skip, naming the reason, on a machine without a GPU. GoogleTest from the sources
  # ONNXTRAIN_GTEST_SOURCE names where no package is installed (the lent GPU machines).
  set(ONNXTRAIN_GTEST_SOURCE "" CACHE PATH "GoogleTest sources to build when no GTest package is installed")
  if(NOT TARGET GTest::gtest_main AND NOT TARGET gtest_main)
    if(ONNXTRAIN_GTEST_SOURCE)
      add_subdirectory(${ONNXTRAIN_GTEST_SOURCE} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    else()
      find_package(GTest REQUIRED)
    endif()
  endif()
  set(_cuda_gtest $<IF:$<TARGET_EXISTS:GTest::gtest_main>,GTest::gtest_main,gtest_main>)
  file(GLOB _cuda_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/../tests/cuda/*.cc)
  add_executable(onnxtrain_cuda_tests ${_cuda_tests})
  target_include_directories(onnxtrain_cuda_tests PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../src)
  target_link_libraries(onnxtrain_cuda_tests PRIVATE onnxtrain ${_cuda_gtest})
  add_test(NAME cuda_kernels COMMAND onnxtrain_cuda_tests)
endif()

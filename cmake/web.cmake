# The WebAssembly module (web/, `make web`): the minimal runtime's sources (cmake/minimal.cmake chose
# them and the op set) with the C API, compiled by emscripten (emcmake) into
#   onnxtrain_web.js/.wasm           single-threaded, SIMD128
#   onnxtrain_web_threaded.js/.wasm  pthreads (SharedArrayBuffer; a cross-origin isolated page),
#                                    when ONNXTRAIN_WEB_THREADED is on (the default)
# which web/onnxtrain.mjs loads. Debian's emscripten 3.1.6 has clang 14 and libc++ 13: the
# library's missing C++20 pieces come from web/native/libcxx13_compat.h, forced into every file, and
# its missing OpenMP runtime from web/native/openmp_runtime.cc.
option(ONNXTRAIN_WEB_THREADED "WebAssembly build: also the pthreads module" ON)
set(ONNXTRAIN_WEB_POOL_SIZE 4 CACHE STRING "WebAssembly build: worker threads started with the threaded module")

set(_web ${CMAKE_CURRENT_SOURCE_DIR}/web)
# The C API is the module's whole interface: web/onnxtrain.mjs calls these through cwrap.
file(STRINGS ${CMAKE_CURRENT_SOURCE_DIR}/include/onnxtrain/c_api.h _api_lines REGEX "^OT_API ")
set(_exported _malloc _free)
foreach(_line IN LISTS _api_lines)
  if(_line MATCHES "(ot_[a-z0-9_]+)\\(")
    list(APPEND _exported _${CMAKE_MATCH_1})
  endif()
endforeach()
list(JOIN _exported "," _exported)

# -Wno-pass-failed: clang reports each `#pragma omp simd` loop it leaves scalar (GCC does not); those
# loops run correctly either way, and the build stays free of warnings that need no action.
set(_compile_options -msimd128 -fwasm-exceptions -include ${_web}/native/libcxx13_compat.h -Wno-pass-failed)
set(_link_options
  -fwasm-exceptions -msimd128 -Wno-version-check   # 3.1.6 warns that Debian's binaryen is newer
  -sMODULARIZE=1 -sALLOW_MEMORY_GROWTH=1 -sMAXIMUM_MEMORY=4GB -sTOTAL_STACK=1MB
  -sENVIRONMENT=web,worker,node -sFILESYSTEM=1 -sEXIT_RUNTIME=0
  -sWASM_BIGINT=1                                  # int64_t arguments as BigInt, not split in two
  "-sEXPORTED_FUNCTIONS=${_exported}"
  "-sEXPORTED_RUNTIME_METHODS=cwrap,FS,UTF8ToString,stringToUTF8,lengthBytesUTF8,HEAPU8,getValue,setValue")

function(onnxtrain_web_module name threaded)
  add_executable(${name} ${ONNXTRAIN_MINIMAL_SOURCES} ${_web}/native/openmp_runtime.cc)
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/include src ${CMAKE_BINARY_DIR}/generated
                             ${_web}/native)
  target_compile_definitions(${name} PRIVATE ONNX_ML=1 ONNX_NAMESPACE=onnx ONNXTRAIN_VERSION_STRING="${PROJECT_VERSION}")
  target_compile_options(${name} PRIVATE ${_compile_options})
  target_link_options(${name} PRIVATE ${_link_options})
  if(threaded)
    # clang's -fopenmp emits libomp's __kmpc_* calls, which openmp_runtime.cc answers with a team of
    # pthreads; the pool is started with the module, since a page's main thread cannot wait for a
    # new Worker.
    target_compile_options(${name} PRIVATE -pthread -fopenmp)
    # On the one file that reads it (both modules compile it with the value; only the threaded uses it).
    set_property(SOURCE ${_web}/native/openmp_runtime.cc APPEND PROPERTY COMPILE_DEFINITIONS
                 ONNXTRAIN_WEB_POOL_SIZE=${ONNXTRAIN_WEB_POOL_SIZE})
    # -Wno-pthreads-mem-growth: growing shared memory makes JS re-check its heap views; web/onnxtrain.mjs
    # takes a fresh view of the memory for every copy (heap()).
    target_link_options(${name} PRIVATE -pthread -sPTHREAD_POOL_SIZE=${ONNXTRAIN_WEB_POOL_SIZE} -Wno-pthreads-mem-growth
                        -sEXPORT_NAME=createOnnxtrainThreadedModule)
  else()
    target_compile_options(${name} PRIVATE -fopenmp-simd)
    target_link_options(${name} PRIVATE -sEXPORT_NAME=createOnnxtrainModule)
  endif()
  set_target_properties(${name} PROPERTIES SUFFIX ".js" RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/web)
endfunction()

set_source_files_properties(src/data/npz.cc PROPERTIES COMPILE_DEFINITIONS ONNXTRAIN_NPZ_WITHOUT_ZLIB=1)
onnxtrain_web_module(onnxtrain_web OFF)
if(ONNXTRAIN_WEB_THREADED)
  onnxtrain_web_module(onnxtrain_web_threaded ON)
endif()

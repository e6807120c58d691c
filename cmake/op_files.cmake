# onnxtrain_op_files(SOURCES OUT): for each op file among SOURCES (src/ops/<family>/*.cc) that
# registers ops, one entry "<file>=<Op1>,<Op2>,..." in OUT. An op is registered by a line that
# starts with ONNXTRAIN_OP(Name, ...) or with a file-local macro wrapping it (OT_COMPARE(Equal, ...));
# tests/python/test_minimal_build.py checks the result against the registry of a full build.
function(onnxtrain_op_files sources out)
  set(result "")
  foreach(file IN LISTS sources)
    if(NOT file MATCHES "/src/ops/[a-z_]+/[^/]+\\.cc$")
      continue()
    endif()
    # Not a line ending in a backslash (a macro's body): CMake would read the backslash as escaping
    # the list separator and glue the next registration to it.
    file(STRINGS "${file}" lines REGEX "^[ \t]*(ONNXTRAIN_OP|OT_[A-Z_]+)\\([A-Z][A-Za-z0-9_]*,.*[^\\]$")
    set(ops "")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*(ONNXTRAIN_OP|OT_[A-Z_]+)\\(([A-Za-z0-9_]+),.*" "\\2" op "${line}")
      if(NOT op STREQUAL "OP")  # the macro parameter inside a wrapping #define
        list(APPEND ops ${op})
      endif()
    endforeach()
    if(ops)
      list(REMOVE_DUPLICATES ops)
      list(JOIN ops "," joined)
      list(APPEND result "${file}=${joined}")
    endif()
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# `cmake -DSOURCE_DIR=... -P cmake/op_files.cmake`: prints "<op> <file>" lines (for the test).
if(CMAKE_SCRIPT_MODE_FILE AND SOURCE_DIR)
  file(GLOB_RECURSE _sources "${SOURCE_DIR}/src/ops/*.cc")
  onnxtrain_op_files("${_sources}" _entries)
  foreach(_entry IN LISTS _entries)
    string(REPLACE "=" ";" _pair "${_entry}")
    list(GET _pair 0 _file)
    list(GET _pair 1 _ops)
    string(REPLACE "," ";" _ops "${_ops}")
    file(RELATIVE_PATH _rel "${SOURCE_DIR}" "${_file}")
    foreach(_op IN LISTS _ops)
      message("${_op} ${_rel}")
    endforeach()
  endforeach()
endif()

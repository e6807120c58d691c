# Installation, two layouts of the same built files:
#   cmake --install build --prefix P        headers, libonnxtrain, the CLI and the CMake package
#                                            (find_package(onnxtrain CONFIG), target onnxtrain::onnxtrain)
#   cmake --install build --component python --prefix DIR
#                                            the Python package's compiled part, as setup.py puts it
#                                            in a wheel: DIR/onnxtrain/{_C*.so, lib/, bin/onnxtrain}
# Both keep the library in a lib/ beside bin/, so one RPATH serves the CLI in either layout.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ONNXTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/onnxtrain)
set_target_properties(onnxtrain_cli PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")

install(TARGETS onnxtrain EXPORT onnxtrainTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS onnxtrain_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/onnxtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT onnxtrainTargets NAMESPACE onnxtrain:: DESTINATION ${ONNXTRAIN_CMAKE_DIR})
configure_package_config_file(cmake/onnxtrainConfig.cmake.in ${CMAKE_BINARY_DIR}/onnxtrainConfig.cmake
                              INSTALL_DESTINATION ${ONNXTRAIN_CMAKE_DIR})
# 0.x: a new minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/onnxtrainConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/onnxtrainConfig.cmake ${CMAKE_BINARY_DIR}/onnxtrainConfigVersion.cmake
        DESTINATION ${ONNXTRAIN_CMAKE_DIR})

if(ONNXTRAIN_BUILD_PYTHON)
  set_target_properties(_C PROPERTIES INSTALL_RPATH "$ORIGIN/${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS _C LIBRARY DESTINATION onnxtrain COMPONENT python EXCLUDE_FROM_ALL)
  install(TARGETS onnxtrain LIBRARY DESTINATION onnxtrain/${CMAKE_INSTALL_LIBDIR}
          COMPONENT python EXCLUDE_FROM_ALL)
  install(TARGETS onnxtrain_cli RUNTIME DESTINATION onnxtrain/${CMAKE_INSTALL_BINDIR}
          COMPONENT python EXCLUDE_FROM_ALL)
endif()

# Not in sanitizer builds: their library needs the sanitizer runtime linked into every program.
if(ONNXTRAIN_BUILD_TESTS AND NOT ONNXTRAIN_SANITIZE)
  # Installs into build/install_test and builds the C++ and C examples against that prefix only.
  add_test(NAME install_package
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/install/check_install.sh ${CMAKE_COMMAND}
                   ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/install_test
                   ${CMAKE_INSTALL_LIBDIR} ${CMAKE_C_COMPILER} "${CMAKE_CXX_COMPILER_LAUNCHER}")
endif()

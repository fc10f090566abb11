# Install rules of the C++ package (component "cpp"): the static library, the headers
# under include/pqloader/ (every one but the tests' helpers), and the CMake package
# pqloader (target pqloader::pqloader). The package's config makes the two dependency
# targets again from this directory's files, shipped with it: Arrow C++ from a system
# Arrow 25 or the pyarrow 25 of Python_EXECUTABLE, and the system's libjpeg-turbo,
# libpng, zlib and xxHash, which whoever links the archive links too.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PQLOADER_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/pqloader")
install(TARGETS pqloader EXPORT pqloaderTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT cpp)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/cpp/src/pqloader" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT cpp FILES_MATCHING PATTERN "*.h" PATTERN "test_util.h" EXCLUDE)
install(EXPORT pqloaderTargets NAMESPACE pqloader:: DESTINATION "${PQLOADER_CMAKE_DIR}"
        COMPONENT cpp)
configure_package_config_file("${CMAKE_CURRENT_LIST_DIR}/pqloaderConfig.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/pqloaderConfig.cmake" INSTALL_DESTINATION "${PQLOADER_CMAKE_DIR}")
# 0.x: a minor version may change the API.
write_basic_package_version_file("${CMAKE_CURRENT_BINARY_DIR}/pqloaderConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}" COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/pqloaderConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/pqloaderConfigVersion.cmake"
              "${CMAKE_CURRENT_LIST_DIR}/ArrowFromPyarrow.cmake"
              "${CMAKE_CURRENT_LIST_DIR}/ThirdParty.cmake"
        DESTINATION "${PQLOADER_CMAKE_DIR}" COMPONENT cpp)

# Arrow C++ and Parquet C++: a system installation if CMake finds one, else the headers
# and shared libraries bundled in the pyarrow wheel (same C++ ABI as the wheel).
# Defines the interface target pqloader::arrow, PQLOADER_ARROW_LIBDIR (for RPATH) and
# PQLOADER_ARROW_LIBS (the shared libraries to bundle, when they come from pyarrow).

# The Arrow C++ major version pqloader is written and tested against (README, "From C++");
# Arrow's CMake packages accept the same major version only, so another system Arrow is
# passed over, and another pyarrow is refused below.
set(PQLOADER_ARROW_MAJOR 25)
find_package(Arrow ${PQLOADER_ARROW_MAJOR} CONFIG QUIET)
find_package(Parquet ${PQLOADER_ARROW_MAJOR} CONFIG QUIET)
add_library(pqloader_arrow INTERFACE)
add_library(pqloader::arrow ALIAS pqloader_arrow)

if(Arrow_FOUND AND Parquet_FOUND AND NOT PQLOADER_FORCE_PYARROW)
  message(STATUS "pqloader: using system Arrow ${Arrow_VERSION}")
  target_link_libraries(pqloader_arrow INTERFACE Arrow::arrow_shared Parquet::parquet_shared)
  # Arrow >= 18 keeps most compute kernels (those filters use) in libarrow_compute.
  find_package(ArrowCompute CONFIG QUIET)
  if(ArrowCompute_FOUND)
    target_link_libraries(pqloader_arrow INTERFACE ArrowCompute::arrow_compute_shared)
  endif()
  set(PQLOADER_ARROW_LIBDIR "")
  set(PQLOADER_ARROW_LIBS "")
else()
  find_package(Python 3.9 REQUIRED COMPONENTS Interpreter)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import pyarrow as pa; print(pa.get_include()); print(pa.get_library_dirs()[0]); print(pa.cpp_build_info.so_version); print(pa.__version__)"
    OUTPUT_VARIABLE _pa_out RESULT_VARIABLE _pa_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _pa_rc EQUAL 0)
    message(FATAL_ERROR "pqloader: no system Arrow C++ found and `import pyarrow` failed with "
                        "${Python_EXECUTABLE}; the build needs pyarrow==25.0.1 (its Arrow C++ "
                        "headers and libraries): pip install pyarrow==25.0.1, or build with pip's "
                        "default build isolation, which installs it")
  endif()
  string(REPLACE "\n" ";" _pa_out "${_pa_out}")
  list(GET _pa_out 0 _pa_include)
  list(GET _pa_out 1 _pa_libdir)
  list(GET _pa_out 2 _pa_so)
  list(GET _pa_out 3 _pa_version)
  if(NOT _pa_version MATCHES "^${PQLOADER_ARROW_MAJOR}\\.")
    message(FATAL_ERROR "pqloader: ${Python_EXECUTABLE} has pyarrow ${_pa_version}, whose Arrow "
                        "C++ (libarrow.so.${_pa_so}) is not the ${PQLOADER_ARROW_MAJOR} pqloader "
                        "builds against; pip install pyarrow==25.0.1 there, or build with pip's "
                        "default build isolation, which installs it")
  endif()
  message(STATUS "pqloader: using Arrow C++ from pyarrow ${_pa_version} in ${_pa_libdir}")
  target_include_directories(pqloader_arrow SYSTEM INTERFACE "${_pa_include}")
  # libarrow_compute: the compute kernels of filter expressions (comparisons, is_in).
  set(PQLOADER_ARROW_LIBS "${_pa_libdir}/libparquet.so.${_pa_so}"
      "${_pa_libdir}/libarrow_compute.so.${_pa_so}" "${_pa_libdir}/libarrow.so.${_pa_so}")
  target_link_libraries(pqloader_arrow INTERFACE ${PQLOADER_ARROW_LIBS})
  set(PQLOADER_ARROW_LIBDIR "${_pa_libdir}")
endif()

# The C/C++ libraries pqloader links besides Arrow: libjpeg-turbo (TurboJPEG API), libpng,
# zlib, xxHash, and the header-only Random123. All are looked for first, and a build that
# lacks any of them stops with one message listing every missing piece and the packages
# that provide it (a build from the sdist should not fail one library at a time).
#
# The wheel carries them as shared libraries under mangled sonames (auditwheel, and
# packaging/graft_libs.py for zlib, which auditwheel's policy leaves to the system).
# Debian's static archives cannot replace them: libturbojpeg.a and libpng16.a are built
# as PIE code (local-exec TLS, PC32 references to `stderr`), which a shared object
# cannot hold.
#
# Defines the interface target pqloader::third_party.

set(_pq_missing "")

function(pqloader_find_lib var description)
  find_library(${var} NAMES ${ARGN})
  if(NOT ${var})
    set(_pq_missing "${_pq_missing}\n  - ${description}" PARENT_SCOPE)
  endif()
endfunction()

function(pqloader_find_header var header description)
  find_path(${var} ${header})
  if(NOT ${var})
    set(_pq_missing "${_pq_missing}\n  - ${description} (header ${header})" PARENT_SCOPE)
  endif()
endfunction()

pqloader_find_header(PQ_RANDOM123_INCLUDE_DIR Random123/philox.h "Random123")
pqloader_find_header(PQ_TURBOJPEG_INCLUDE_DIR turbojpeg.h "libjpeg-turbo (TurboJPEG API)")
pqloader_find_lib(PQ_TURBOJPEG_LIBRARY "libjpeg-turbo (library libturbojpeg)" turbojpeg)
pqloader_find_header(PQ_PNG_INCLUDE_DIR png.h "libpng")
pqloader_find_lib(PQ_PNG_LIBRARY "libpng (library libpng16)" png16 png)
pqloader_find_header(PQ_ZLIB_INCLUDE_DIR zlib.h "zlib")
pqloader_find_lib(PQ_ZLIB_LIBRARY "zlib (library libz)" z)
pqloader_find_header(PQ_XXHASH_INCLUDE_DIR xxhash.h "xxHash")
pqloader_find_lib(PQ_XXHASH_LIBRARY "xxHash (library libxxhash)" xxhash)

if(_pq_missing)
  message(FATAL_ERROR
    "pqloader cannot be built from source: these libraries were not found:${_pq_missing}\n"
    "Install them and build again:\n"
    "  Debian/Ubuntu: apt-get install g++ librandom123-dev libturbojpeg0-dev libpng-dev zlib1g-dev libxxhash-dev\n"
    "  elsewhere: your distribution's development packages of the libraries above\n"
    "Libraries in another prefix: set CMAKE_PREFIX_PATH (for pip: "
    "-C cmake.define.CMAKE_PREFIX_PATH=/prefix). "
    "Or install the prebuilt wheel, which needs none of them: pip install --only-binary pqloader pqloader")
endif()

add_library(pqloader_third_party INTERFACE)
add_library(pqloader::third_party ALIAS pqloader_third_party)
target_include_directories(pqloader_third_party SYSTEM INTERFACE
  ${PQ_RANDOM123_INCLUDE_DIR} ${PQ_TURBOJPEG_INCLUDE_DIR} ${PQ_PNG_INCLUDE_DIR} ${PQ_ZLIB_INCLUDE_DIR}
  ${PQ_XXHASH_INCLUDE_DIR})
# libpng needs zlib: zlib after it.
target_link_libraries(pqloader_third_party INTERFACE
  ${PQ_TURBOJPEG_LIBRARY} ${PQ_PNG_LIBRARY} ${PQ_ZLIB_LIBRARY} ${PQ_XXHASH_LIBRARY} m)

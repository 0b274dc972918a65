# Finds oneDNN from its header and library, without its CMake package config.
#
# Debian's dnnl-config.cmake (oneDNN 2.6 in Debian 12, built with the OpenCL GPU runtime) calls
# find_package(OpenCL REQUIRED), which stops the whole configure on a machine without OpenCL
# headers; gradkit uses oneDNN's CPU engine only and never includes its OpenCL interop header.
# So the library is located directly, its version and CPU threading runtime are read from its
# headers, and a machine without oneDNN (or with a broken one) configures on, without it.
#
# Sets GRADKIT_DNNL_FOUND, GRADKIT_DNNL_VERSION, GRADKIT_DNNL_CPU_RUNTIME (OMP, TBB, SEQ, ...)
# and, when found, the imported target gradkit::dnnl.
set(GRADKIT_DNNL_FOUND OFF)
set(GRADKIT_DNNL_VERSION "")
set(GRADKIT_DNNL_CPU_RUNTIME "")

find_path(GRADKIT_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
find_library(GRADKIT_DNNL_LIBRARY NAMES dnnl)
mark_as_advanced(GRADKIT_DNNL_INCLUDE_DIR GRADKIT_DNNL_LIBRARY)

if(GRADKIT_DNNL_INCLUDE_DIR AND GRADKIT_DNNL_LIBRARY
   AND EXISTS "${GRADKIT_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h"
   AND EXISTS "${GRADKIT_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h")
  file(STRINGS "${GRADKIT_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _gk_dnnl_version_lines
       REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "DNNL_VERSION_${_part} +([0-9]+)" _ "${_gk_dnnl_version_lines}")
    set(_gk_dnnl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(GRADKIT_DNNL_VERSION "${_gk_dnnl_MAJOR}.${_gk_dnnl_MINOR}.${_gk_dnnl_PATCH}")

  file(STRINGS "${GRADKIT_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h" _gk_dnnl_runtime_line
       REGEX "#define DNNL_CPU_THREADING_RUNTIME ")
  string(REGEX MATCH "DNNL_RUNTIME_([A-Z_]+)" _ "${_gk_dnnl_runtime_line}")
  set(GRADKIT_DNNL_CPU_RUNTIME "${CMAKE_MATCH_1}")

  if(GRADKIT_DNNL_VERSION MATCHES "^[23]\\.")
    set(GRADKIT_DNNL_FOUND ON)
    add_library(gradkit::dnnl INTERFACE IMPORTED)
    set_target_properties(gradkit::dnnl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${GRADKIT_DNNL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${GRADKIT_DNNL_LIBRARY}")
    if(GRADKIT_DNNL_CPU_RUNTIME STREQUAL "OMP")
      find_package(OpenMP COMPONENTS CXX)
      if(OpenMP_CXX_FOUND)
        set_property(TARGET gradkit::dnnl APPEND PROPERTY INTERFACE_LINK_LIBRARIES OpenMP::OpenMP_CXX)
      else()
        # omp.h is what sets oneDNN's thread count per call; without it oneDNN is not used.
        set(GRADKIT_DNNL_FOUND OFF)
        set(_gk_dnnl_why "its OpenMP runtime has no usable omp.h")
      endif()
    endif()
  else()
    set(_gk_dnnl_why "version '${GRADKIT_DNNL_VERSION}' is not 2.x or 3.x")
  endif()
else()
  set(_gk_dnnl_why "no oneapi/dnnl/dnnl.hpp with libdnnl (Debian: libdnnl-dev)")
endif()

if(NOT GRADKIT_DNNL_FOUND AND _gk_dnnl_why)
  set(GRADKIT_DNNL_WHY_NOT "${_gk_dnnl_why}")
endif()
unset(_gk_dnnl_why)
unset(_gk_dnnl_version_lines)
unset(_gk_dnnl_runtime_line)

# What users get: `cmake --install <build> --prefix P` puts into P
#   lib/libgradkit.so.0 (libgradkit.a with BUILD_SHARED_LIBS=OFF), include/gradkit/*.h,
#   bin/gradkit, lib/cmake/gradkit/ (imported target gradkit::gradkit), lib/pkgconfig/gradkit.pc;
# `cpack -G DEB` packs the same files as a Debian package (the `deb` presets).
# (lib is lib/<multiarch> when the prefix is /usr on Debian: GNUInstallDirs.)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ---- libgradkit: the objects of `gradkit`, exporting only the C API --------------------------
add_library(gradkit_lib $<TARGET_OBJECTS:gradkit>)
add_library(gradkit::gradkit ALIAS gradkit_lib)
set_target_properties(gradkit_lib PROPERTIES
  OUTPUT_NAME gradkit EXPORT_NAME gradkit LINKER_LANGUAGE CXX
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
target_include_directories(gradkit_lib INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# Whatever `gradkit` links (Highway, fmt, oneDNN, OpenMP, threads: read here, after every part
# of the build added its own), libgradkit links privately: none of it is in the public headers,
# and a program linking the shared library names libgradkit alone.
get_target_property(_gk_deps gradkit LINK_LIBRARIES)
if(BUILD_SHARED_LIBS)
  target_link_libraries(gradkit_lib PRIVATE ${_gk_deps})
  if(NOT WIN32 AND NOT APPLE)
    target_link_options(gradkit_lib PRIVATE "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/gradkit.map")
    set_property(TARGET gradkit_lib APPEND PROPERTY LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/gradkit.map)
  endif()
else()
  target_compile_definitions(gradkit_lib INTERFACE GRADKIT_STATIC)  # GK_API without dllimport
  if(NOT WIN32 AND NOT APPLE)
    # A C program links libgradkit.a with the C driver, which leaves out the C++ runtime.
    target_link_libraries(gradkit_lib INTERFACE "$<$<LINK_LANGUAGE:C>:stdc++;m>")
  endif()
endif()

# ---- a static libgradkit.a leaves its dependencies to the program that links it ---------------
# gradkit::gradkit names them (packages that gradkitConfig.cmake finds again, or plain libraries
# and flags, so that a C project needs no C++ package); gradkit.pc for `pkg-config --static`.
set(GRADKIT_CONFIG_DEPENDENCIES "")
set(GRADKIT_PC_CFLAGS "")
set(GRADKIT_PC_REQUIRES_PRIVATE "")
set(GRADKIT_PC_LIBS_PRIVATE "")
if(NOT BUILD_SHARED_LIBS)
  set(_gk_find "")
  set(_gk_links "")
  set(_gk_requires "")
  set(_gk_libs "")
  foreach(_dep IN LISTS _gk_deps)
    if(_dep STREQUAL "Threads::Threads")
      list(APPEND _gk_find "find_dependency(Threads)")
      list(APPEND _gk_links Threads::Threads)
      list(APPEND _gk_libs "-pthread")
    elseif(_dep MATCHES "^hwy::(hwy|hwy_contrib)$")
      list(APPEND _gk_find "find_dependency(hwy)")
      list(APPEND _gk_links ${_dep})
      string(REPLACE "hwy::hwy_contrib" "libhwy-contrib" _pc "${_dep}")
      string(REPLACE "hwy::hwy" "libhwy" _pc "${_pc}")
      list(APPEND _gk_requires ${_pc})
    elseif(_dep STREQUAL "fmt::fmt")
      list(APPEND _gk_find "find_dependency(fmt)")
      list(APPEND _gk_links fmt::fmt)
      list(APPEND _gk_requires fmt)
    elseif(_dep MATCHES "^OpenMP::")
      list(APPEND _gk_links ${OpenMP_CXX_FLAGS})  # -fopenmp: the OpenMP runtime, from C too
      list(APPEND _gk_libs ${OpenMP_CXX_FLAGS})
    elseif(_dep STREQUAL "gradkit::dnnl")
      list(APPEND _gk_links ${GRADKIT_DNNL_LIBRARY})
      list(APPEND _gk_libs ${GRADKIT_DNNL_LIBRARY})
      if(GRADKIT_DNNL_CPU_RUNTIME STREQUAL "OMP")
        list(APPEND _gk_links ${OpenMP_CXX_FLAGS})
        list(APPEND _gk_libs ${OpenMP_CXX_FLAGS})
      endif()
    else()
      message(FATAL_ERROR "cmake/gradkit_install.cmake: libgradkit links '${_dep}'; say how the "
                          "users of a static libgradkit.a find it (package config and pkg-config)")
    endif()
  endforeach()
  list(APPEND _gk_libs -lstdc++ -lm)  # a C program links libgradkit.a's C++ runtime
  foreach(_list _gk_find _gk_links _gk_requires _gk_libs)
    list(REMOVE_DUPLICATES ${_list})
  endforeach()
  target_link_libraries(gradkit_lib PRIVATE ${_gk_links})
  list(JOIN _gk_find "\n" GRADKIT_CONFIG_DEPENDENCIES)
  list(JOIN _gk_requires ", " GRADKIT_PC_REQUIRES_PRIVATE)
  list(JOIN _gk_libs " " GRADKIT_PC_LIBS_PRIVATE)
  set(GRADKIT_PC_CFLAGS "-DGRADKIT_STATIC")
endif()

# ---- install rules -----------------------------------------------------------------------------
set(_gk_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/gradkit)
install(TARGETS gradkit_lib EXPORT gradkitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The CLI links `gradkit` (it uses internals: kernels, benchmarks), not libgradkit.so.
install(TARGETS gradkit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/gradkit ${PROJECT_BINARY_DIR}/include/gradkit
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

install(EXPORT gradkitTargets NAMESPACE gradkit:: DESTINATION ${_gk_cmake_dir})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/gradkitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/install/gradkitConfig.cmake INSTALL_DESTINATION ${_gk_cmake_dir})
# 0.x: a new minor version may change the API, so only the same MAJOR.MINOR is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/install/gradkitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/install/gradkitConfig.cmake
              ${PROJECT_BINARY_DIR}/install/gradkitConfigVersion.cmake
        DESTINATION ${_gk_cmake_dir})

# gradkit.pc names the prefix the files are installed to, known only at install time
# (`cmake --install --prefix P`); @GRADKIT_PC_PREFIX@ survives the first substitution.
set(GRADKIT_PC_PREFIX "@GRADKIT_PC_PREFIX@")
configure_file(${CMAKE_CURRENT_LIST_DIR}/gradkit.pc.in ${PROJECT_BINARY_DIR}/install/gradkit.pc.in @ONLY)
install(CODE "
  set(GRADKIT_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${PROJECT_BINARY_DIR}/install/gradkit.pc.in\" \"${PROJECT_BINARY_DIR}/install/gradkit.pc\" @ONLY)")
install(FILES ${PROJECT_BINARY_DIR}/install/gradkit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- the Debian package: cpack -G DEB (scripts/check-deb) ---------------------------------------
set(CPACK_PACKAGE_NAME gradkit)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "gradkit maintainers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "native backward operators for training (EluGradV2, fused MoE backward): C library and CLI")
set(CPACK_PACKAGE_DESCRIPTION
    "libgradkit.so.0 with its C API headers, CMake package config and pkg-config file, and the gradkit command-line tool.")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# DESTDIR staging: the install code above then sees the real prefix (/usr), not the staging dir.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Depends: computed by dpkg-shlibdeps (dpkg-dev) from the libraries the ELF files link.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
include(CPack)

unset(_gk_deps)
unset(_gk_cmake_dir)

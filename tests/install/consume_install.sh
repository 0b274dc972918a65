#!/usr/bin/env bash
# consume_install.sh BUILD_DIR SOURCE_DIR WORK_DIR C_COMPILER SHARED [SANITIZER_FLAGS]
# Installs the build into a fresh prefix under WORK_DIR, then builds examples/c_api against that
# prefix alone, as a user's project would: with CMake (find_package(gradkit)) and with pkg-config,
# and runs both programs. SHARED (ON/OFF) is the build's BUILD_SHARED_LIBS. SANITIZER_FLAGS: the
# build's -fsanitize=... (ASan refuses a program whose libraries are instrumented and it is not).
set -euo pipefail
build=$1 source=$2 work=$3 cc=$4 shared=$5 sanitize=${6:-}
prefix=$work/prefix
rm -rf "$work" && mkdir -p "$work"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir=$(cd "$prefix" && dirname "$(find . -name 'libgradkit.*' -print -quit)")
libdir=$prefix/${libdir#./}
for f in include/gradkit/gradkit.h include/gradkit/version.h bin/gradkit; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
[ -e "$libdir/cmake/gradkit/gradkitConfig.cmake" ] && [ -e "$libdir/cmake/gradkit/gradkitConfigVersion.cmake" ] \
  || { echo "no CMake package config in $libdir/cmake/gradkit" >&2; exit 1; }
if [ "$shared" = ON ]; then
  soname=$(readelf -d "$libdir/libgradkit.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  [ "$soname" = libgradkit.so.0 ] || { echo "SONAME is '$soname', not libgradkit.so.0" >&2; exit 1; }
  # Private dependencies stay out of the link interface: users link libgradkit alone.
  if grep -q INTERFACE_LINK_LIBRARIES "$libdir/cmake/gradkit/gradkitTargets.cmake"; then
    echo "gradkit::gradkit passes link dependencies to its users:" >&2
    grep -A3 INTERFACE_LINK_LIBRARIES "$libdir/cmake/gradkit/gradkitTargets.cmake" >&2
    exit 1
  fi
fi
"$prefix/bin/gradkit" --help >/dev/null

# The example is plain C99, strict: the public headers must need nothing else.
cflags="-std=c99 -Wall -Wextra -pedantic -Werror $sanitize"

echo "== CMake: find_package(gradkit) from $prefix"
cmake -S "$source/examples/c_api" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$sanitize" \
  -DCMAKE_BUILD_TYPE=Release >"$work/cmake-configure.log"
cmake --build "$work/cmake-build" >"$work/cmake-build.log"
"$work/cmake-build/gradkit_c_api_example"

echo "== pkg-config gradkit from $libdir/pkgconfig"
export PKG_CONFIG_PATH=$libdir/pkgconfig
static=""
[ "$shared" = ON ] || static=--static
pc_cflags=$(pkg-config --cflags $static gradkit)
pc_libs=$(echo $(pkg-config --libs $static gradkit))  # echo: trims the spaces
echo "cflags: $pc_cflags; libs: $pc_libs"
if [ "$shared" = ON ] && [ "$pc_libs" != "-L$libdir -lgradkit" ]; then
  echo "pkg-config --libs gradkit should name libgradkit alone" >&2
  exit 1
fi
# shellcheck disable=SC2086  # word splitting of the flags is intended
"$cc" $cflags $pc_cflags "$source/examples/c_api/main.c" -o "$work/pkgconfig-example" $pc_libs -lm $sanitize
LD_LIBRARY_PATH=$libdir "$work/pkgconfig-example"

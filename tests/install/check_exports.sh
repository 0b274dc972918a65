#!/usr/bin/env bash
# check_exports.sh LIBRARY INCLUDE_DIR
# libgradkit.so exports exactly the functions the public headers declare with GK_API: no
# internal symbol (gradkit's C++, Highway, fmt, libstdc++ instantiations), and none missing.
set -euo pipefail
lib=$1 include=$2
declared=$(sed -nE 's/^GK_API[^(]*[ *](gk[A-Za-z0-9_]*)\(.*/\1/p' "$include"/gradkit/*.h | sort -u)
exported=$(nm -D --defined-only "$lib" | awk 'NF == 3 { print $3 }' | sort -u)
[ -n "$declared" ] || { echo "no GK_API function found in $include/gradkit/*.h" >&2; exit 1; }
if [ "$declared" != "$exported" ]; then
  echo "exported by $lib but not declared with GK_API (>), or declared but not exported (<):" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  exit 1
fi
echo "$lib exports the $(echo "$declared" | wc -l) GK_API functions and nothing else"

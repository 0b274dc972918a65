// The C boundary: no exception may cross an extern "C" function (a C caller, or a C++ caller
// across a shared library built another way, cannot catch it; it ends in std::terminate). Every
// entry point runs its body through GuardCApi, which turns any exception into a status and a
// message for gkGetRecentErrMsg:
//   std::bad_alloc, std::length_error   GK_ERROR_RUNTIME   "out of memory ..."
//   any other exception                 GK_ERROR_INTERNAL  "internal error: <what()>"
#pragma once

#include <string_view>
#include <utility>

#include "gradkit/base.h"

namespace gk {

// Records the message for the exception being handled and returns its status. Call it only from
// inside a catch block; it never throws (when even the message cannot be allocated, a fixed one
// is recorded).
gkStatus StatusOfCurrentException(std::string_view api) noexcept;

// For entry points returning gkStatus:
//   extern "C" gkStatus gkFoo(...) { return GuardCApi("gkFoo", [&] { ...; return GK_SUCCESS; }); }
template <typename Body>
gkStatus GuardCApi(std::string_view api, Body&& body) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (...) {
    return StatusOfCurrentException(api);
  }
}

// For entry points returning something else (a pointer, a count): `on_exception` is returned
// after the message is recorded.
template <typename Result, typename Body>
Result GuardCApi(std::string_view api, Result on_exception, Body&& body) noexcept {
  try {
    return std::forward<Body>(body)();
  } catch (...) {
    StatusOfCurrentException(api);
    return on_exception;
  }
}

}  // namespace gk

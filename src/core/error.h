// Error reporting: a status code by class and a thread-local message that names the argument,
// its value and the rule broken.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "gradkit/base.h"

namespace gk {

void SetRecentError(std::string message);
void ClearRecentError();

// Records "<api>: <message>" for gkGetRecentErrMsg and returns status, so checks read as
//   return Fail(GK_ERROR_PARAM_INVALID, "gkFoo", "x has rank {}, the limit is 8", rank);
template <typename... Args>
gkStatus Fail(gkStatus status, std::string_view api, fmt::format_string<Args...> format,
              Args&&... args) {
  SetRecentError(fmt::format("{}: {}", api, fmt::format(format, std::forward<Args>(args)...)));
  return status;
}

// A setting of the caller's that gradkit cannot honour (an environment variable with a value it
// does not know), found where a status cannot be returned directly: the C boundary turns it into
// GK_ERROR_PARAM_INVALID with this message.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Evaluates a check returning gkStatus and returns from the caller when it failed.
#define GK_RETURN_IF_ERROR(expr)               \
  do {                                         \
    const gkStatus gk_status_ = (expr);        \
    if (gk_status_ != GK_SUCCESS) return gk_status_; \
  } while (0)

}  // namespace gk

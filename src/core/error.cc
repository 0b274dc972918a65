#include "core/error.h"

#include <exception>
#include <new>
#include <stdexcept>

#include "core/c_api_guard.h"

namespace gk {
namespace {
thread_local std::string recent_error;
// Set instead of recent_error when the message itself could not be allocated.
thread_local const char* recent_error_fixed = nullptr;
}  // namespace

void SetRecentError(std::string message) {
  recent_error = std::move(message);
  recent_error_fixed = nullptr;
}

void ClearRecentError() {
  recent_error.clear();
  recent_error_fixed = nullptr;
}

gkStatus StatusOfCurrentException(std::string_view api) noexcept {
  try {
    try {
      throw;
    } catch (const std::bad_alloc&) {
      return Fail(GK_ERROR_RUNTIME, api, "out of memory: a host allocation failed");
    } catch (const std::length_error& e) {
      return Fail(GK_ERROR_RUNTIME, api,
                  "out of memory: a size past what can be allocated was asked for ({})", e.what());
    } catch (const ConfigError& e) {
      return Fail(GK_ERROR_PARAM_INVALID, api, "{}", e.what());
    } catch (const std::exception& e) {
      return Fail(GK_ERROR_INTERNAL, api, "internal error: {}", e.what());
    } catch (...) {
      return Fail(GK_ERROR_INTERNAL, api, "internal error: an exception of unknown type");
    }
  } catch (...) {  // formatting the message failed: memory is that short
    recent_error_fixed = "out of memory (the error message itself could not be allocated)";
    return GK_ERROR_RUNTIME;
  }
}

}  // namespace gk

extern "C" const char* gkGetRecentErrMsg(void) {
  return gk::recent_error_fixed != nullptr ? gk::recent_error_fixed : gk::recent_error.c_str();
}

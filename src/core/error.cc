#include "core/error.h"

namespace gk {
namespace {
thread_local std::string recent_error;
}  // namespace

void SetRecentError(std::string message) { recent_error = std::move(message); }
void ClearRecentError() { recent_error.clear(); }

}  // namespace gk

extern "C" const char* gkGetRecentErrMsg(void) { return gk::recent_error.c_str(); }

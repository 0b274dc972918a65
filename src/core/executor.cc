#include "core/executor.h"

#include <exception>
#include <new>

#include "core/error.h"

namespace gk {

gkStatus RunExecutor(std::string_view api, std::string_view op_name, void* workspace,
                     uint64_t workspace_size, gkOpExecutor* executor) {
  if (executor == nullptr) {
    return Fail(GK_ERROR_NULLPTR, api, "executor is NULL; get one from {}GetWorkspaceSize", api);
  }
  if (executor->magic != gkOpExecutor::kMagic) {
    return Fail(GK_ERROR_PARAM_INVALID, api, "executor is not a live gradkit executor");
  }
  if (executor->op_name() != op_name) {
    return Fail(GK_ERROR_PARAM_INVALID, api, "executor was planned for {}, not {}",
                executor->op_name(), op_name);
  }
  if (executor->has_run && !executor->repeatable) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "executor has already run; plan again or call gkSetExecutorRepeatable first");
  }
  const uint64_t needed = executor->workspace_bytes();
  if (workspace_size < needed) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "workspaceSize is {} bytes, the plan needs {} bytes", workspace_size, needed);
  }
  if (needed > 0 && workspace == nullptr) {
    return Fail(GK_ERROR_NULLPTR, api, "workspace is NULL, the plan needs {} bytes", needed);
  }
  gkStatus status;
  try {
    status = executor->Run(workspace);
  } catch (const std::bad_alloc&) {
    return Fail(GK_ERROR_RUNTIME, api, "out of memory");
  } catch (const std::exception& e) {
    return Fail(GK_ERROR_INTERNAL, api, "internal error: {}", e.what());
  }
  executor->has_run = true;
  if (status == GK_SUCCESS) ClearRecentError();
  return status;
}

}  // namespace gk

extern "C" gkStatus gkDestroyExecutor(gkOpExecutor* executor) {
  if (executor == nullptr) return GK_SUCCESS;
  if (executor->magic != gkOpExecutor::kMagic) {
    return gk::Fail(GK_ERROR_PARAM_INVALID, "gkDestroyExecutor",
                    "executor is not a live gradkit executor");
  }
  executor->magic = 0;
  delete executor;
  return GK_SUCCESS;
}

extern "C" gkStatus gkSetExecutorRepeatable(gkOpExecutor* executor) {
  if (executor == nullptr) {
    return gk::Fail(GK_ERROR_NULLPTR, "gkSetExecutorRepeatable", "executor is NULL");
  }
  if (executor->magic != gkOpExecutor::kMagic) {
    return gk::Fail(GK_ERROR_PARAM_INVALID, "gkSetExecutorRepeatable",
                    "executor is not a live gradkit executor");
  }
  executor->repeatable = true;
  return GK_SUCCESS;
}

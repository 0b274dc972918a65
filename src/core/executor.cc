#include "core/executor.h"

#include "core/c_api_guard.h"
#include "core/error.h"
#include "core/live_handles.h"

namespace {
gk::LiveHandles<gkOpExecutor>& Registry() { return gk::LiveHandles<gkOpExecutor>::Get(); }
}  // namespace

gkOpExecutor::gkOpExecutor() { Registry().Add(this); }
gkOpExecutor::~gkOpExecutor() { Registry().Remove(this); }

namespace gk {

gkStatus RunExecutor(std::string_view api, std::string_view op_name, void* workspace,
                     uint64_t workspace_size, gkOpExecutor* executor) {
  if (executor == nullptr) {
    return Fail(GK_ERROR_NULLPTR, api, "executor is NULL; get one from {}GetWorkspaceSize", api);
  }
  if (!Registry().Contains(executor)) {
    return Fail(GK_ERROR_PARAM_INVALID, api,
                "executor is not a live gradkit executor (destroyed, or never returned by a "
                "GetWorkspaceSize call)");
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
  const gkStatus status = executor->Run(workspace);
  executor->has_run = true;
  if (status == GK_SUCCESS) ClearRecentError();
  return status;
}

}  // namespace gk

extern "C" gkStatus gkDestroyExecutor(gkOpExecutor* executor) {
  constexpr std::string_view kApi = "gkDestroyExecutor";
  return gk::GuardCApi(kApi, [&] {
    if (executor == nullptr) return GK_SUCCESS;
    if (!Registry().Contains(executor)) {
      return gk::Fail(GK_ERROR_PARAM_INVALID, kApi,
                      "executor is not a live gradkit executor (destroyed already, or never "
                      "returned by a GetWorkspaceSize call)");
    }
    delete executor;
    return GK_SUCCESS;
  });
}

extern "C" gkStatus gkSetExecutorRepeatable(gkOpExecutor* executor) {
  constexpr std::string_view kApi = "gkSetExecutorRepeatable";
  return gk::GuardCApi(kApi, [&] {
    if (executor == nullptr) return gk::Fail(GK_ERROR_NULLPTR, kApi, "executor is NULL");
    if (!Registry().Contains(executor)) {
      return gk::Fail(GK_ERROR_PARAM_INVALID, kApi, "executor is not a live gradkit executor");
    }
    executor->repeatable = true;
    return GK_SUCCESS;
  });
}

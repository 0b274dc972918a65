// The executor behind gkOpExecutor: what phase 1 planned, run by phase 2.
#pragma once

#include <cstdint>
#include <string_view>

#include "gradkit/base.h"

// Every executor is entered in a registry of live executors while it exists, so that phase 2 and
// gkDestroyExecutor can tell a live executor from a destroyed one (or from any other pointer)
// without reading the memory it points to.
struct gkOpExecutor {
  gkOpExecutor();
  virtual ~gkOpExecutor();
  gkOpExecutor(const gkOpExecutor&) = delete;
  gkOpExecutor& operator=(const gkOpExecutor&) = delete;

  virtual std::string_view op_name() const = 0;  // e.g. "EluGradV2"
  virtual uint64_t workspace_bytes() const = 0;
  // Runs the planned work. Every argument was checked in phase 1; workspace is at least
  // workspace_bytes() long. const: everything a run needs beyond the plan (pointers into the
  // workspace) is local to the call, so the executor holds no state between runs.
  virtual gkStatus Run(void* workspace) const = 0;

  bool repeatable = false;
  bool has_run = false;
};

namespace gk {

// Phase 2, shared by every operator: checks the executor and workspace, then runs the plan.
// `op_name` is the operator the caller meant; `api` names the entry point in messages.
// Exceptions propagate: the entry point's GuardCApi turns them into a status.
gkStatus RunExecutor(std::string_view api, std::string_view op_name, void* workspace,
                     uint64_t workspace_size, gkOpExecutor* executor);

}  // namespace gk

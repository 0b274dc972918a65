/* gradkit: native backward operators for training, with an aclnn-style two-phase C API.
 *
 * Every operator is called in two phases, as Ascend's aclnn does:
 *   1. gk<Op>GetWorkspaceSize(inputs..., outputs..., &workspaceSize, &executor)
 *      checks every argument, plans the work and reports the workspace it needs.
 *      Nothing the caller owns is written in this phase.
 *   2. gk<Op>(workspace, workspaceSize, executor, stream) runs the planned work.
 * The executor belongs to the caller: release it with gkDestroyExecutor. By default it runs once;
 * gkSetExecutorRepeatable lets it run again on the same tensors (their data may change).
 *
 * Threads: every function may be called from any thread. An executor is used by one thread at a
 * time (phase 2, gkSetExecutorRepeatable and gkDestroyExecutor on the same executor must not
 * overlap); different executors may run at the same time from different threads, each with its
 * own workspace. Using an executor after gkDestroyExecutor, or a tensor descriptor after
 * gkDestroyTensor, is refused (GK_ERROR_PARAM_INVALID; a second destroy too) while no new handle
 * has been given the same address; past that it is undefined, as for any freed handle.
 *
 * No C++ exception leaves a gradkit function: a failed allocation is GK_ERROR_RUNTIME ("out of
 * memory ..."), anything else unexpected GK_ERROR_INTERNAL, both with a message.
 *
 * Errors return a status code by class; gkGetRecentErrMsg() returns, for the calling thread, a
 * message naming the argument, its value and the rule it broke.
 *
 * Data pointers: each tensor's data (plus its offset) must be aligned to its element size (2
 * bytes for 16-bit types, 4 for GK_FLOAT and GK_INT32, 8 for GK_INT64 and GK_DOUBLE);
 * gkCreateTensor refuses one that is not. No further alignment is needed: the kernels load and
 * store unaligned vectors, and give the same bytes at any element-aligned address (aligning
 * large buffers to 64 bytes can still be faster). The workspace may start at any address. */
#ifndef GRADKIT_BASE_H_
#define GRADKIT_BASE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gradkit/version.h" /* GRADKIT_VERSION_MAJOR, _MINOR, _PATCH: the headers' version */

#ifdef __cplusplus
extern "C" {
#endif

/* GK_API marks the exported functions. Windows: dllexport while gradkit is built
 * (GRADKIT_BUILDING), dllimport for its users, nothing for a static library (GRADKIT_STATIC, set
 * by gradkit::gradkit and gradkit.pc when the library is static). Elsewhere: default visibility,
 * as libgradkit.so is built with hidden visibility and exports nothing else. */
#if defined(_WIN32) || defined(__CYGWIN__)
#if defined(GRADKIT_BUILDING)
#define GK_API __declspec(dllexport)
#elif defined(GRADKIT_STATIC)
#define GK_API
#else
#define GK_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define GK_API __attribute__((visibility("default")))
#else
#define GK_API
#endif

/* Status codes, grouped by class as aclnn groups them. */
typedef enum gkStatus {
  GK_SUCCESS = 0,
  GK_ERROR_NULLPTR = 161001,       /* a required pointer argument is NULL */
  GK_ERROR_PARAM_INVALID = 161002, /* an argument has a value the operator does not accept */
  GK_ERROR_RUNTIME = 361001,       /* the call is valid but cannot run now (e.g. out of memory) */
  GK_ERROR_INTERNAL = 561000,      /* a bug in gradkit: please report it */
} gkStatus;

/* Element types. The numeric values follow aclDataType. */
typedef enum gkDataType {
  GK_FLOAT = 0,
  GK_FLOAT16 = 1,
  GK_INT32 = 3,
  GK_INT64 = 9,
  GK_DOUBLE = 11,
  GK_BF16 = 27,
} gkDataType;

/* Tensor descriptors hold up to GK_MAX_DESCRIPTOR_DIMS dims; each operator states its own limit. */
#define GK_MAX_DESCRIPTOR_DIMS 16

typedef struct gkTensor gkTensor;
typedef struct gkOpExecutor gkOpExecutor;

/* Describes (does not own) a strided view: element (i0, ..., in-1) lives at
 *   (char*)data + (offset + sum_d i_d * strides[d]) * element_size.
 * dims: ndims sizes (>= 0); strides: ndims strides in elements, or NULL for C-contiguous.
 * Returns NULL (see gkGetRecentErrMsg) when an argument is out of range. */
GK_API gkTensor* gkCreateTensor(const int64_t* dims, uint64_t ndims, gkDataType dtype,
                                const int64_t* strides, int64_t offset, void* data);
/* Releases a descriptor (not its data). NULL is accepted. An executor made from it keeps its
 * own copy: the descriptor may be destroyed right after phase 1. */
GK_API gkStatus gkDestroyTensor(const gkTensor* tensor);

/* Releases an executor returned by a GetWorkspaceSize call. NULL is accepted. */
GK_API gkStatus gkDestroyExecutor(gkOpExecutor* executor);
/* Lets the executor run more than once (for repeated calls on the same tensors). */
GK_API gkStatus gkSetExecutorRepeatable(gkOpExecutor* executor);

/* The message of the last failed call on this thread ("" if none). Valid until the next call. */
GK_API const char* gkGetRecentErrMsg(void);

/* Threads used by operators planned after this call. 0 restores the default: the environment
 * variable GRADKIT_NUM_THREADS if set, else the cores this process may run on (its CPU affinity
 * mask, as set by taskset or a cpuset, bounded by its cgroup v2 CPU quota, cpu.max, rounded up).
 * Parallel work runs on OpenMP, shared with oneDNN; each calling thread gets its own team, and
 * workers compute in the caller's floating-point mode (flush-to-zero, denormals-are-zero,
 * rounding). Results are the same bytes for any thread count. A call from inside an active
 * OpenMP parallel region runs on the calling thread. In a forked child every operator runs on
 * the child's calling thread and gkGetNumThreads() returns 1 (OpenMP's workers do not survive
 * fork); a process started by exec is not affected. */
GK_API gkStatus gkSetNumThreads(int32_t numThreads);
GK_API int32_t gkGetNumThreads(void);

/* Library version ("MAJOR.MINOR.PATCH") and the SIMD target chosen at run time ("AVX3", "AVX2", ...). */
GK_API const char* gkGetVersion(void);
GK_API const char* gkGetCpuIsa(void);

#ifdef __cplusplus
}
#endif

#endif /* GRADKIT_BASE_H_ */

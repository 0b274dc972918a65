#include "core/thread_pool.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "core/c_api_guard.h"
#include "core/error.h"

namespace gk {
namespace {

constexpr int32_t kMaxThreads = 1024;

std::atomic<int32_t> requested_threads{0};

// ---- fork ---------------------------------------------------------------------------------------
// libgomp keeps its workers across regions; fork copies only the calling thread, and the child's
// next region would wait at a barrier for workers that do not exist. Whether the parent had
// workers cannot be asked of the runtime, and not only gradkit starts them (oneDNN, PyTorch, the
// application share the runtime), so every forked child runs on its calling thread (PyTorch does
// the same for its OpenMP backend). The handler is registered when the library is loaded, before
// any region can run.
std::atomic<bool> in_forked_child{false};

void OnForkInChild() { in_forked_child.store(true, std::memory_order_relaxed); }

[[maybe_unused]] const int fork_handler_registered = pthread_atfork(nullptr, nullptr, OnForkInChild);

// ---- floating-point mode --------------------------------------------------------------------------
// A worker computes in the caller's mode: flush-to-zero, denormals-are-zero and rounding decide
// the bits of every result with subnormals, and the library's workers were created by whichever
// thread first ran a region, in whatever mode that thread had.
class FloatMode {
 public:
  static FloatMode OfThisThread() {
    FloatMode mode;
#if defined(__x86_64__) || defined(__i386__)
    mode.bits_ = _mm_getcsr() & ~kMxcsrFlags;
#elif defined(__aarch64__)
    __asm__ volatile("mrs %0, fpcr" : "=r"(mode.bits_));
#endif
    return mode;
  }
  // Sets this thread's mode, keeping its sticky exception flags.
  void Apply() const {
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr((_mm_getcsr() & kMxcsrFlags) | static_cast<unsigned>(bits_));
#elif defined(__aarch64__)
    __asm__ volatile("msr fpcr, %0" : : "r"(bits_));
#endif
  }
  bool operator==(const FloatMode&) const = default;

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kMxcsrFlags = 0x3F;  // the exception flags, bits 0-5
#endif
  uint64_t bits_ = 0;
};

// Applies the caller's mode for a scope and restores the worker's own after it, so a worker
// shared with oneDNN or the application leaves each region as it entered.
class ScopedFloatMode {
 public:
  explicit ScopedFloatMode(const FloatMode& wanted) : saved_(FloatMode::OfThisThread()) {
    changed_ = !(saved_ == wanted);
    if (changed_) wanted.Apply();
  }
  ~ScopedFloatMode() {
    if (changed_) saved_.Apply();
  }
  ScopedFloatMode(const ScopedFloatMode&) = delete;
  ScopedFloatMode& operator=(const ScopedFloatMode&) = delete;

 private:
  FloatMode saved_;
  bool changed_;
};

// ---- exceptions -----------------------------------------------------------------------------------
// An exception must not leave an OpenMP region (std::terminate): each task is caught where it
// runs, the first exception kept, and the rest of the tasks not started.
class FirstException {
 public:
  void Capture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  void RethrowIfAny() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

// ---- the default thread count -------------------------------------------------------------------
std::optional<int32_t> EnvThreads() {
  const char* env = std::getenv("GRADKIT_NUM_THREADS");
  if (env == nullptr) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || value <= 0 || value > kMaxThreads) return std::nullopt;
  return static_cast<int32_t>(value);
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// The smallest quota from this process's cgroup up to the mount: a parent's limit binds its
// children too. v2 reads cpu.max; v1 cpu.cfs_quota_us and cpu.cfs_period_us.
std::optional<int32_t> QuotaThreadsUpFrom(const CgroupPlace& place) {
  if (place.directory.empty()) return std::nullopt;
  std::optional<int32_t> threads;
  std::string directory = place.directory;
  for (;;) {
    std::optional<int32_t> limit;
    if (place.v1) {
      limit = ThreadsFromCfsQuota(ReadFile(directory + "/cpu.cfs_quota_us"),
                                  ReadFile(directory + "/cpu.cfs_period_us"));
    } else {
      limit = ThreadsFromCpuMax(ReadFile(directory + "/cpu.max"));
    }
    if (limit) threads = std::min(threads.value_or(*limit), *limit);
    if (directory.size() <= place.mount_point.size()) break;
    directory.resize(directory.rfind('/'));
  }
  return threads;
}

// Both hierarchies are read: a hybrid system mounts v2 but keeps the cpu controller in v1.
std::optional<int32_t> CgroupQuotaThreads() {
  const std::string mountinfo = ReadFile("/proc/self/mountinfo");
  const std::string cgroups = ReadFile("/proc/self/cgroup");
  std::optional<int32_t> threads;
  for (const bool v1 : {false, true}) {
    if (const auto limit = QuotaThreadsUpFrom(FindCgroup(mountinfo, cgroups, v1))) {
      threads = std::min(threads.value_or(*limit), *limit);
    }
  }
  return threads;
}

int32_t DefaultThreads() {
  if (const auto env = EnvThreads()) return *env;
  int32_t threads = AffinityCores();
  if (const auto quota = CgroupQuotaThreads()) threads = std::min(threads, *quota);
  return std::clamp(threads, 1, kMaxThreads);
}

}  // namespace

int32_t AffinityCores() {
  // A cpu_set_t holds 1024 CPUs; larger machines need a larger mask, found by trying.
  for (int cpus = 1024; cpus <= (1 << 16); cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) break;
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    const bool ok = sched_getaffinity(0, bytes, set) == 0;
    const int count = ok ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (ok) return std::max(count, 1);
    if (errno != EINVAL) break;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int32_t>(std::min<long>(online, kMaxThreads)) : 1;
}

std::optional<int32_t> ThreadsFromCpuMax(std::string_view cpu_max) {
  while (!cpu_max.empty() && (cpu_max.back() == '\n' || cpu_max.back() == ' ')) {
    cpu_max.remove_suffix(1);
  }
  const size_t space = cpu_max.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view quota_text = cpu_max.substr(0, space);
  const std::string_view period_text = cpu_max.substr(space + 1);
  if (quota_text == "max") return std::nullopt;
  int64_t quota = 0, period = 0;
  const auto parse = [](std::string_view text, int64_t& value) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    return error == std::errc() && end == text.data() + text.size() && value > 0;
  };
  if (!parse(quota_text, quota) || !parse(period_text, period)) return std::nullopt;
  const int64_t threads = quota / period + (quota % period != 0);
  return static_cast<int32_t>(std::clamp<int64_t>(threads, 1, kMaxThreads));
}

std::optional<int32_t> ThreadsFromCfsQuota(std::string_view quota, std::string_view period) {
  const auto trim = [](std::string_view text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    return text;
  };
  quota = trim(quota);
  period = trim(period);
  if (quota.empty() || period.empty() || quota == "-1") return std::nullopt;  // -1: no limit
  return ThreadsFromCpuMax(std::string(quota) + " " + std::string(period));
}

CgroupPlace FindCgroup(std::string_view mountinfo, std::string_view proc_cgroup, bool v1) {
  const auto lines = [](std::string_view text) {
    std::vector<std::string_view> out;
    while (!text.empty()) {
      const size_t end = text.find('\n');
      out.push_back(text.substr(0, end));
      if (end == std::string_view::npos) break;
      text.remove_prefix(end + 1);
    }
    return out;
  };
  const auto split = [](std::string_view text, char separator) {
    std::vector<std::string_view> out;
    for (;;) {
      const size_t end = text.find(separator);
      out.push_back(text.substr(0, end));
      if (end == std::string_view::npos) return out;
      text.remove_prefix(end + 1);
    }
  };
  const auto has_cpu = [&](std::string_view list) {
    for (std::string_view item : split(list, ',')) {
      if (item == "cpu") return true;
    }
    return false;
  };
  // "<id> <parent> <major:minor> <root> <mount point> <options...> - <fstype> <source> <super>"
  std::string_view mount_root, mount_point;
  for (std::string_view line : lines(mountinfo)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const auto fields = split(line.substr(0, dash), ' ');
    const auto tail = split(line.substr(dash + 3), ' ');
    if (fields.size() < 5 || tail.empty()) continue;
    const bool match = v1 ? tail[0] == "cgroup" && tail.size() >= 3 && has_cpu(tail[2])
                          : tail[0] == "cgroup2";
    if (match) {
      mount_root = fields[3];
      mount_point = fields[4];
      break;
    }
  }
  if (mount_point.empty()) return {};
  // v2: "0::<path>"; v1: "<id>:<controllers>:<path>" with cpu among the controllers.
  for (std::string_view line : lines(proc_cgroup)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    if (v1 ? !has_cpu(controllers) : (line.substr(0, first) != "0" || !controllers.empty())) {
      continue;
    }
    std::string_view path = line.substr(second + 1);
    if (mount_root != "/" && path.substr(0, mount_root.size()) == mount_root) {
      path.remove_prefix(mount_root.size());
    }
    if (path.find("/..") != std::string_view::npos) return {};  // never walk out of the mount
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    return {std::string(mount_point), std::string(mount_point) + std::string(path), v1};
  }
  return {};
}

int32_t ConfiguredThreads() {
  if (in_forked_child.load(std::memory_order_relaxed)) return 1;
  const int32_t requested = requested_threads.load();
  if (requested > 0) return requested;
  static const int32_t default_threads = DefaultThreads();
  return default_threads;
}

void ParallelFor(int32_t threads, int64_t num_tasks, const std::function<void(int64_t)>& task) {
  if (num_tasks <= 0) return;
  const auto team = static_cast<int32_t>(std::min<int64_t>(threads, num_tasks));
  if (team <= 1 || omp_in_parallel() || in_forked_child.load(std::memory_order_relaxed)) {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  const FloatMode caller_mode = FloatMode::OfThisThread();
  std::atomic<int64_t> next_task{0};
  FirstException first_exception;
  // Tasks are handed out one at a time: a late or slow thread takes fewer, and the runtime may
  // give fewer threads than asked (OMP_THREAD_LIMIT, OMP_DYNAMIC) without changing any result.
#pragma omp parallel num_threads(team)
  {
    const ScopedFloatMode mode(caller_mode);
    while (!first_exception.failed()) {
      const int64_t i = next_task.fetch_add(1, std::memory_order_relaxed);
      if (i >= num_tasks) break;
      try {
        task(i);
      } catch (...) {
        first_exception.Capture();
      }
    }
  }
  first_exception.RethrowIfAny();
}

}  // namespace gk

#if defined(GRADKIT_OPENMP_ARCHER)
// ThreadSanitizer builds (the tsan preset): accesses inside the uninstrumented OpenMP runtime are
// not reported; Archer tells TSan what that runtime synchronizes. TSAN_OPTIONS still overrides.
extern "C" const char* __tsan_default_options();
extern "C" const char* __tsan_default_options() { return "ignore_noninstrumented_modules=1"; }
#endif

extern "C" gkStatus gkSetNumThreads(int32_t numThreads) {
  return gk::GuardCApi("gkSetNumThreads", [&] {
    if (numThreads < 0 || numThreads > gk::kMaxThreads) {
      return gk::Fail(GK_ERROR_PARAM_INVALID, "gkSetNumThreads",
                      "numThreads is {}, it must be in [0, {}] (0 = default)", numThreads,
                      gk::kMaxThreads);
    }
    gk::requested_threads.store(numThreads);
    return GK_SUCCESS;
  });
}

extern "C" int32_t gkGetNumThreads(void) {
  return gk::GuardCApi("gkGetNumThreads", int32_t{1}, [] { return gk::ConfiguredThreads(); });
}

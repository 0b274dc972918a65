// The set of live handles of one kind (tensor descriptors, executors) that the C API gave out.
// The C API checks a caller's handle against it before reading the handle at all, so that a
// destroyed handle (or one never created) is refused without touching freed memory, and a
// second destroy is an error, not a double free. One uncontended lock per lookup: nothing next
// to an operator call.
#pragma once

#include <mutex>
#include <unordered_set>

namespace gk {

template <class Handle>
class LiveHandles {
 public:
  // Never destroyed: handles may outlive static destruction (a caller's own static objects).
  static LiveHandles& Get() {
    static auto* live = new LiveHandles;
    return *live;
  }
  void Add(const Handle* h) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(h);
  }
  // False when h was not live.
  bool Remove(const Handle* h) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.erase(h) != 0;
  }
  bool Contains(const Handle* h) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.count(h) != 0;
  }

 private:
  std::mutex mutex_;
  std::unordered_set<const Handle*> live_;
};

}  // namespace gk

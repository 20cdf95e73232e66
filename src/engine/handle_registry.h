// Handles of the C ABI (contexts, plans): a handle is a token, never a pointer we follow, mapped to
// a shared object, so a destroyed, forged or doubly destroyed handle is an error, not a crash, and
// a call that looked an object up keeps it alive even if another thread destroys the handle.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <new>

namespace stria {

template <typename T, typename Handle>
class HandleRegistry {
 public:
  // Built on first use in static storage, never destroyed: no work in global constructors or at
  // exit, and std::map allocates nothing while empty, so a process that dlcloses libstria after
  // destroying its objects leaks nothing (LeakSanitizer checks this). Tokens start at `first`,
  // grow by 16 and are never reused.
  static HandleRegistry& Get(uintptr_t first) {
    alignas(HandleRegistry) static unsigned char storage[sizeof(HandleRegistry)];
    static HandleRegistry* r = new (storage) HandleRegistry(first);
    return *r;
  }

  Handle Register(std::shared_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    next_ += 16;
    live_.emplace(next_, std::move(object));
    return reinterpret_cast<Handle>(next_);
  }
  std::shared_ptr<T> Lookup(Handle handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(handle));
    return it == live_.end() ? nullptr : it->second;
  }
  std::shared_ptr<T> Unregister(Handle handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(handle));
    if (it == live_.end()) return nullptr;
    std::shared_ptr<T> object = std::move(it->second);
    live_.erase(it);
    return object;
  }

 private:
  explicit HandleRegistry(uintptr_t first) : next_(first) {}
  std::mutex mu_;
  std::map<uintptr_t, std::shared_ptr<T>> live_;
  uintptr_t next_;
};

}  // namespace stria

#include "engine/registry.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <new>

namespace stria {
namespace {

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, std::shared_ptr<Context>> live;
  uintptr_t next = 0x5717a000;  // tokens grow by 16 and are never reused
};

// Built on first use, never destroyed: no work in global constructors or at exit. It lives in
// static storage and uses std::map (which allocates nothing while empty) so that a process that
// dlcloses libstria after destroying its contexts leaks nothing (LeakSanitizer checks this).
Registry& Get() {
  alignas(Registry) static unsigned char storage[sizeof(Registry)];
  static Registry* r = new (storage) Registry();
  return *r;
}

}  // namespace

stria_context_t RegisterContext(std::shared_ptr<Context> ctx) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  r.next += 16;
  r.live.emplace(r.next, std::move(ctx));
  return reinterpret_cast<stria_context_t>(r.next);
}

std::shared_ptr<Context> LookupContext(stria_context_t handle) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uintptr_t>(handle));
  return it == r.live.end() ? nullptr : it->second;
}

std::shared_ptr<Context> UnregisterContext(stria_context_t handle) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uintptr_t>(handle));
  if (it == r.live.end()) return nullptr;
  std::shared_ptr<Context> ctx = std::move(it->second);
  r.live.erase(it);
  return ctx;
}

}  // namespace stria

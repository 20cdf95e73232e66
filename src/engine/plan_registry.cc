#include "engine/plan_registry.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <new>

namespace stria {
namespace {

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, std::shared_ptr<const Plan>> live;
  uintptr_t next = 0x91a40000;  // tokens grow by 16 and are never reused
};

// As the context registry: built on first use in static storage, never destroyed.
Registry& Get() {
  alignas(Registry) static unsigned char storage[sizeof(Registry)];
  static Registry* r = new (storage) Registry();
  return *r;
}

}  // namespace

stria_plan_t RegisterPlan(std::shared_ptr<const Plan> plan) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  r.next += 16;
  r.live.emplace(r.next, std::move(plan));
  return reinterpret_cast<stria_plan_t>(r.next);
}

std::shared_ptr<const Plan> LookupPlan(stria_plan_t handle) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uintptr_t>(handle));
  return it == r.live.end() ? nullptr : it->second;
}

std::shared_ptr<const Plan> UnregisterPlan(stria_plan_t handle) {
  Registry& r = Get();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.live.find(reinterpret_cast<uintptr_t>(handle));
  if (it == r.live.end()) return nullptr;
  std::shared_ptr<const Plan> plan = std::move(it->second);
  r.live.erase(it);
  return plan;
}

}  // namespace stria

#include "engine/plan_registry.h"

#include "engine/handle_registry.h"

namespace stria {
namespace {

using Plans = HandleRegistry<const Plan, stria_plan_t>;
Plans& Get() {
  return Plans::Get(0x91a40000);  // apart from the contexts' tokens: neither is taken for the other
}

}  // namespace

stria_plan_t RegisterPlan(std::shared_ptr<const Plan> plan) {
  return Get().Register(std::move(plan));
}

std::shared_ptr<const Plan> LookupPlan(stria_plan_t handle) {
  return Get().Lookup(handle);
}

std::shared_ptr<const Plan> UnregisterPlan(stria_plan_t handle) {
  return Get().Unregister(handle);
}

}  // namespace stria

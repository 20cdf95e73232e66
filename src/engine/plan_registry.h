// Plan handles, in a HandleRegistry like the contexts' (engine/handle_registry.h): a destroyed or
// made-up handle is an error, and a call that looked a plan up keeps it alive even if another
// thread destroys the handle meanwhile.
#pragma once

#include <memory>

#include "core/status.h"
#include "layout/plan.h"

namespace stria {

stria_plan_t RegisterPlan(std::shared_ptr<const Plan> plan);
std::shared_ptr<const Plan> LookupPlan(stria_plan_t handle);
std::shared_ptr<const Plan> UnregisterPlan(stria_plan_t handle);

}  // namespace stria

// Context handles (engine/handle_registry.h). A stria_context_t is a token (never a pointer we follow) mapped to a
// shared context, so a destroyed, forged or doubly destroyed handle is an error, not a crash; and a call in flight
// keeps its context alive even if another thread destroys the handle meanwhile.
#pragma once

#include <memory>

#include "engine/context.h"

namespace stria {

stria_context_t RegisterContext(std::shared_ptr<Context> ctx);
std::shared_ptr<Context> LookupContext(stria_context_t handle);
std::shared_ptr<Context> UnregisterContext(stria_context_t handle);

}  // namespace stria

#include "engine/registry.h"

#include "engine/handle_registry.h"

namespace stria {
namespace {

using Contexts = HandleRegistry<Context, stria_context_t>;
Contexts& Get() {
  return Contexts::Get(0x5717a000);
}

}  // namespace

stria_context_t RegisterContext(std::shared_ptr<Context> ctx) {
  return Get().Register(std::move(ctx));
}

std::shared_ptr<Context> LookupContext(stria_context_t handle) {
  return Get().Lookup(handle);
}

std::shared_ptr<Context> UnregisterContext(stria_context_t handle) {
  return Get().Unregister(handle);
}

}  // namespace stria

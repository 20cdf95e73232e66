// Transport selection: the in-process transport is built in; UCX and NCCL are modules.
#include "core/module.h"
#include "transport/module_abi.h"

namespace stria {
namespace {

Status LoadTransportModule(stria_transport_t kind, const TransportModule** out) {
  const char* name = kind == STRIA_TRANSPORT_UCX ? "ucx" : "nccl";
  const char* hint = kind == STRIA_TRANSPORT_UCX
                         ? "The UCX transport needs it beside libstria.so and UCX's libraries (Debian: libucx0); "
                           "it is built when CMake finds UCX (libucx-dev)."
                         : "The NCCL transport needs it beside libstria.so, with the CUDA runtime and NCCL; it is "
                           "built when CMake finds CUDA and NCCL.";
  const std::string symbol = Format("stria_%s_module_v%d", name, kTransportModuleAbiVersion);
  void* sym = nullptr;
  STRIA_RETURN_IF_ERROR(LoadModuleSymbol(name, symbol.c_str(), hint, &sym));
  const auto* module = static_cast<const TransportModule*>(sym);
  if (module->abi_version != kTransportModuleAbiVersion)
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s module speaks module ABI %d, this libstria %d", name,
                 module->abi_version, kTransportModuleAbiVersion);
  *out = module;
  return Status::Ok();
}

}  // namespace

Status CreateTransport(const stria_context_config_t& config, void* nccl_comm, double timeout_s,
                       std::unique_ptr<Transport>* out) {
  switch (config.transport) {
    case STRIA_TRANSPORT_LOCAL: {
      if (config.world_size != 1)
        return Error(STRIA_ERROR_INVALID_ARGUMENT,
                     "the local transport joins ranks of one process: use stria_context_create_local_group for "
                     "world_size %d (stria_context_create takes world_size 1 with it)",
                     config.world_size);
      auto group = CreateLocalGroup(1);
      *out = std::move(group[0]);
      return Status::Ok();
    }
    case STRIA_TRANSPORT_UCX:
    case STRIA_TRANSPORT_NCCL: {
      const TransportModule* module = nullptr;
      STRIA_RETURN_IF_ERROR(LoadTransportModule(config.transport, &module));
      Transport* t = nullptr;
      STRIA_RETURN_IF_ERROR(module->create(config, nccl_comm, timeout_s, &t));
      out->reset(t);
      return Status::Ok();
    }
  }
  return Error(STRIA_ERROR_INVALID_ARGUMENT, "unknown transport %d (expected 0 local, 1 ucx, 2 nccl)",
               static_cast<int>(config.transport));
}

Status GetUniqueId(stria_unique_id_t* id) {
  // Either module serves the rendezvous, and the id works for both transports (a module that did
  // not open the id's listener takes it over from the one that did): UCX where it is installed,
  // else NCCL.
  const TransportModule* module = nullptr;
  Status ucx = LoadTransportModule(STRIA_TRANSPORT_UCX, &module);
  if (!ucx.ok()) {
    Status nccl = LoadTransportModule(STRIA_TRANSPORT_NCCL, &module);
    if (!nccl.ok())
      return Status(ucx.code(),
                    "stria_get_unique_id needs the UCX or the NCCL module: " + ucx.message() + "; " + nccl.message());
  }
  return module->get_unique_id(id);
}

}  // namespace stria

// What a transport module (libstria-ucx.so, libstria-nccl.so) exports:
// `extern "C" const TransportModule stria_<name>_module_v<kTransportModuleAbiVersion>`.
#pragma once

#include "transport/transport.h"

namespace stria {

// 2: create takes the caller's NCCL communicator as an argument (it left the config struct); 3:
// Transport::AllGatherInPlace; 4: device ordering (Transport::OrdersOnDevice and its kin).
constexpr int kTransportModuleAbiVersion = 4;

struct TransportModule {
  int abi_version;  // kTransportModuleAbiVersion
  const char* name;
  // Opens rank 0's rendezvous and writes its address and secret into *id.
  Status (*get_unique_id)(stria_unique_id_t* id);
  // Joins the ring described by config (rank, world_size, unique_id, device). nccl_comm: the
  // caller's ncclComm_t (stria_context_create_with_nccl_comm), NULL otherwise; only the NCCL
  // module is ever given one.
  Status (*create)(const stria_context_config_t& config, void* nccl_comm, double timeout_s, Transport** out);
};

// The transport of a context made by stria_context_create.
Status CreateTransport(const stria_context_config_t& config, void* nccl_comm, double timeout_s,
                       std::unique_ptr<Transport>* out);
// stria_get_unique_id: the rendezvous is served by the UCX module, or the NCCL module where UCX's is
// missing; one id works for both transports (NCCL's own id travels inside the rendezvous).
Status GetUniqueId(stria_unique_id_t* id);

}  // namespace stria

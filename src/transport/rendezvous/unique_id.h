// What stria_unique_id_t carries for the UCX (and NCCL) transports: where rank 0's rendezvous
// listens and the job's secret. The 128 bytes are a versioned little format, so an id from
// another stria version or random bytes are refused with a message instead of misread.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace stria {

constexpr size_t kSecretBytes = 16;
constexpr size_t kMaxHostBytes = 63;

struct RendezvousId {
  std::string host;  // numeric address or name, at most kMaxHostBytes
  uint16_t port = 0;
  uint8_t secret[kSecretBytes] = {};
  // The inode of the listening socket stria_get_unique_id opened (0: none, e.g. an id from the
  // environment). Each transport module keeps its listeners in a table of its own; this lets rank
  // 0's module find, among this process's sockets, a listener that another module opened for the
  // id (the id from the UCX module serving an NCCL context). Meaningless in other processes.
  uint64_t listener = 0;
};

void EncodeId(const RendezvousId& id, stria_unique_id_t* out);
Status DecodeId(const stria_unique_id_t& in, RendezvousId* out);
bool IsZeroId(const stria_unique_id_t& id);

// "host:port", "[v6addr]:port". Port 0 is refused where a peer must connect to it.
Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port);

// STRIA_ROOT, parsed; *set is false (and host/port untouched) when it is unset or empty.
Status RootFromEnvironment(bool* set, std::string* host, uint16_t* port);

// The id of a launch driven by the environment (torchrun or mpirun style): STRIA_ROOT=host:port
// names rank 0's rendezvous and STRIA_SECRET (32 hex digits) the job's secret. Without
// STRIA_SECRET the secret is derived from STRIA_ROOT and the world size: jobs that collide on a
// port still refuse each other, but anyone who can reach the port can join (see README).
Status IdFromEnvironment(int world_size, RendezvousId* out);

// Cryptographically random bytes (getrandom).
Status RandomBytes(void* out, size_t bytes);

}  // namespace stria

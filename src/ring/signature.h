// The per-call signature every rank shares before any data moves. Ranks that were handed
// different shapes, dtypes, layouts or masks — or called different operations, or the same one
// out of order — then all fail with a message naming the rank that differs, instead of exchanging
// mismatched blocks (garbage) or waiting for messages that never come (a hang).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace stria {

enum class RingOp : uint32_t { kForward = 1, kBackward = 2 };

struct CallSignature {
  uint32_t magic;
  uint32_t op;    // RingOp
  uint64_t seq;   // calls made on this context so far
  int32_t valid;  // 0: this rank rejected its own arguments (reason below)
  int32_t layout;
  int32_t causal;
  float scale;  // resolved (never 0)
  int32_t dtype;
  uint32_t kv_wire;  // KVWireFormat of the rank's backend for this call
  int64_t B, L, Hq, Hkv, D;
  char reason[112];
};
static_assert(sizeof(CallSignature) == 192, "the signature is exchanged as raw bytes");

const char* RingOpName(RingOp op);
// Zeroes *sig and stamps its magic, operation and sequence number; valid = 1.
void InitSignature(RingOp op, uint64_t seq, CallSignature* sig);
// Fills the signature of a rank whose arguments failed validation.
void MarkInvalid(const Status& why, CallSignature* sig);
// Compares every rank's signature; the error names the first rank that differs from rank 0
// (or that rejected its arguments).
Status CheckAgreement(const CallSignature* all, int world_size, int self);

}  // namespace stria

// The per-call signature every rank shares before any data moves. Ranks that were handed
// different shapes, dtypes, layouts or masks — or called different operations, or the same one
// out of order — then all fail with a message naming the rank that differs, instead of exchanging
// mismatched blocks (garbage) or waiting for messages that never come (a hang). The caller's tag
// (stria_context_set_call_tag) tells apart calls whose shapes alone would match.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace stria {

enum class RingOp : uint32_t { kForward = 1, kBackward = 2, kDecode = 3, kPrefill = 4 };

struct CallSignature {
  uint32_t magic;
  uint32_t op;     // RingOp
  uint64_t seq;    // calls made on this context so far
  uint64_t tag;    // the caller's name for the call (0: none)
  int32_t status;  // STRIA_SUCCESS, or why this rank cannot take part (reason below)
  int32_t layout;
  int32_t causal;
  float scale;  // resolved (never 0)
  int32_t dtype;
  uint32_t kv_wire;  // KVWireFormat of the rank's backend for this call
  int64_t B, L, Hq, Hkv, D;
  uint64_t documents;   // Documents::Hash of the call's document mask (0: none)
  float softcap;        // 0: none
  int32_t sinks;        // whether the call has attention sinks
  int32_t grid;         // U of the context's grid (1: the plain ring)
  int32_t grid_chunks;  // the head chunks of a grid's forward or backward (grid.cc; 0: none)
  char reason[80];
};
static_assert(sizeof(CallSignature) == 192, "the signature is exchanged as raw bytes");

const char* RingOpName(RingOp op);
// Zeroes *sig and stamps its magic, operation, sequence number and tag; status STRIA_SUCCESS.
void InitSignature(RingOp op, uint64_t seq, uint64_t tag, CallSignature* sig);
// Fills the signature of a rank that cannot take part: its arguments failed validation, or it
// could not get what the call needs (its workspace on a full device, say).
void MarkFailed(const Status& why, CallSignature* sig);
// Compares every rank's signature. A rank that cannot take part comes first: the others get
// INVALID_ARGUMENT for its rejected arguments, and its own status for any other failure (every
// rank then sees the same kind of failure: an out-of-memory everywhere, for instance). Otherwise
// the error names the rank that differs from the signature most ranks share.
Status CheckAgreement(const CallSignature* all, int world_size, int self);

}  // namespace stria

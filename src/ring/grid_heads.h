// How a grid (DESIGN.md, "Hybrid grid") splits a call's heads over the U members of an
// all-to-all group: member u computes query heads [q0, q0 + q) for all of its group's tokens, with
// the K/V heads [kv0, kv0 + kv) they read. K/V heads split like the query heads when U divides
// them; when there are fewer K/V heads than members (U a multiple of Hkv: GQA with few K/V heads,
// MQA) each member takes the one K/V head its query heads read, shared with the U / Hkv - 1 other
// members that read it too, rather than every K/V head on every member.
#pragma once

#include "backend/backend.h"

namespace stria {

struct GridHeads {
  int64_t q0 = 0, q = 0;
  int64_t kv0 = 0, kv = 0;
};

inline GridHeads HeadsOfMember(int64_t Hq, int64_t Hkv, int U, int u) {
  GridHeads h;
  h.q = Hq / U;
  h.q0 = u * h.q;
  if (Hkv % U == 0) {
    h.kv = Hkv / U;
    h.kv0 = u * h.kv;
  } else {
    h.kv = 1;
    h.kv0 = u / (U / Hkv);
  }
  return h;
}

// What a call on a grid of all-to-all groups of U needs beyond a plain ring's: head counts that
// split (the rule in the message).
inline Status CheckGridHeads(int U, const AttentionShape& s) {
  if (s.Hq % U != 0 || (s.Hkv % U != 0 && U % s.Hkv != 0))
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "q has %lld heads and k %lld on a grid of all-to-all groups of %d: the group splits the heads, so U "
                 "must divide Hq, and divide Hkv or be a multiple of it",
                 static_cast<long long>(s.Hq), static_cast<long long>(s.Hkv), U);
  return Status::Ok();
}

}  // namespace stria

#include "ring/signature.h"

#include <cstring>

#include "backend/backend.h"
#include "core/dtype.h"
#include "layout/layout.h"

namespace stria {

// "STR7": the seventh form (the grid's head chunks; before them the grid, the softcap and whether
// there are sinks, the document mask's hash, the caller's tag, and a status in place of a valid
// flag), so that a rank of an older stria in the ring is named as such instead of being misread.
constexpr uint32_t kSignatureMagic = 0x53545237;

const char* RingOpName(RingOp op) {
  switch (op) {
    case RingOp::kForward:
      return "stria_attention_forward";
    case RingOp::kBackward:
      return "stria_attention_backward";
    case RingOp::kDecode:
      return "stria_attention_decode";
    case RingOp::kPrefill:
      return "stria_attention_prefill";
  }
  return "an unknown call";
}

void InitSignature(RingOp op, uint64_t seq, uint64_t tag, CallSignature* sig) {
  std::memset(sig, 0, sizeof(*sig));
  sig->magic = kSignatureMagic;
  sig->op = static_cast<uint32_t>(op);
  sig->seq = seq;
  sig->tag = tag;
  sig->status = STRIA_SUCCESS;
}

void MarkFailed(const Status& why, CallSignature* sig) {
  sig->status = why.code();
  std::strncpy(sig->reason, why.message().c_str(), sizeof(sig->reason) - 1);
  sig->reason[sizeof(sig->reason) - 1] = '\0';
}

static std::string Describe(const CallSignature& s) {
  return Format(
      "%s call #%llu (tag %#llx): %s %s, causal %d, scale %g, softcap %g, %s, q [%lld, %lld, %lld, %lld], kv heads "
      "%lld, K/V blocks as %s, grid %s, %s",
      RingOpName(static_cast<RingOp>(s.op)), static_cast<unsigned long long>(s.seq),
      static_cast<unsigned long long>(s.tag), DTypeName(static_cast<DType>(s.dtype)),
      LayoutName(static_cast<stria_layout_t>(s.layout)), s.causal, static_cast<double>(s.scale),
      static_cast<double>(s.softcap), s.sinks ? "sinks" : "no sinks", (long long)s.B, (long long)s.L, (long long)s.Hq,
      (long long)s.D, (long long)s.Hkv, KVWireFormatName(static_cast<KVWireFormat>(s.kv_wire)),
      s.grid <= 1 ? "none (a plain ring)"
                  : Format("of all-to-all groups of %d, %d head chunks", s.grid, s.grid_chunks).c_str(),
      s.op == static_cast<uint32_t>(RingOp::kDecode) || s.op == static_cast<uint32_t>(RingOp::kPrefill)
          ? Format("cache lengths, capacity and window hashed %#llx", static_cast<unsigned long long>(s.documents))
                .c_str()
      : s.documents == 0
          ? "no document mask or window"
          : Format("document boundaries and window hashed %#llx", static_cast<unsigned long long>(s.documents))
                .c_str());
}

static bool SameButTag(const CallSignature& a, const CallSignature& b) {
  return a.op == b.op && a.seq == b.seq && a.layout == b.layout && a.causal == b.causal && a.scale == b.scale &&
         a.dtype == b.dtype && a.B == b.B && a.L == b.L && a.Hq == b.Hq && a.Hkv == b.Hkv && a.D == b.D &&
         a.kv_wire == b.kv_wire && a.documents == b.documents && a.softcap == b.softcap && a.sinks == b.sinks &&
         a.grid == b.grid && a.grid_chunks == b.grid_chunks;
}

static bool Same(const CallSignature& a, const CallSignature& b) {
  return SameButTag(a, b) && a.tag == b.tag;
}

// A peer's fields are read only after this: values outside their enums (a corrupted or foreign
// signature with the right magic) would otherwise reach the messages and the returned status.
static bool WellFormed(const CallSignature& s) {
  return s.magic == kSignatureMagic && s.op >= static_cast<uint32_t>(RingOp::kForward) &&
         s.op <= static_cast<uint32_t>(RingOp::kPrefill) && s.status >= STRIA_SUCCESS &&
         s.status <= STRIA_ERROR_INTERNAL && s.layout >= STRIA_LAYOUT_CONTIGUOUS && s.layout <= STRIA_LAYOUT_ZIGZAG &&
         s.dtype >= static_cast<int32_t>(DType::kF32) && s.dtype <= static_cast<int32_t>(DType::kBF16) &&
         s.kv_wire <= static_cast<uint32_t>(KVWireFormat::kCudaE4m3);
}

// A tag as the messages print it.
static std::string TagText(uint64_t tag) {
  return tag == 0 ? std::string("untagged") : Format("tagged %#llx", static_cast<unsigned long long>(tag));
}

Status CheckAgreement(const CallSignature* all, int world_size, int self) {
  for (int r = 0; r < world_size; ++r) {
    if (!WellFormed(all[r]))
      return Error(STRIA_ERROR_TRANSPORT,
                   "rank %d sent a malformed call signature (is it running another version of stria?)", r);
  }
  // The reason is a peer's bytes: printed with its bound, whether or not it ends in a NUL.
  const int reason_max = static_cast<int>(sizeof(all[0].reason));
  for (int r = 0; r < world_size; ++r) {
    const auto code = static_cast<stria_status_t>(all[r].status);
    if (code == STRIA_SUCCESS || r == self) continue;
    const char* op = RingOpName(static_cast<RingOp>(all[r].op));
    if (code == STRIA_ERROR_INVALID_ARGUMENT || code == STRIA_ERROR_UNSUPPORTED)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "rank %d rejected its arguments to %s: %.*s", r, op, reason_max,
                   all[r].reason);
    return Error(code, "rank %d could not start %s: %.*s", r, op, reason_max, all[r].reason);
  }
  // The reference is the signature most ranks share (lowest rank on a tie), so the message names
  // the odd one out rather than whoever disagrees with rank 0.
  int ref = 0, ref_votes = 0;
  for (int r = 0; r < world_size; ++r) {
    int votes = 0;
    for (int o = 0; o < world_size; ++o) votes += Same(all[r], all[o]) ? 1 : 0;
    if (votes > ref_votes) {
      ref = r;
      ref_votes = votes;
    }
  }
  for (int r = 0; r < world_size; ++r) {
    if (SameButTag(all[r], all[ref]) && all[r].tag != all[ref].tag)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "ranks paired different calls: %s call #%llu is %s on rank %d but %s on rank %d (%d of the %d "
                   "ranks made that one): the ranks made these calls from different places of their programs, or in "
                   "different orders, or one set no tag; no block was exchanged (in a compiled program, make each "
                   "call depend on the one before)",
                   RingOpName(static_cast<RingOp>(all[r].op)), static_cast<unsigned long long>(all[r].seq),
                   TagText(all[r].tag).c_str(), r, TagText(all[ref].tag).c_str(), ref, ref_votes, world_size);
    if (!Same(all[r], all[ref]))
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "ranks disagree: rank %d made %s; rank %d (and %d rank(s) in all) made %s", r,
                   Describe(all[r]).c_str(), ref, ref_votes, Describe(all[ref]).c_str());
  }
  return Status::Ok();
}

}  // namespace stria

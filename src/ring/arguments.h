// Local validation of a collective's arguments, before any rank communicates.
#pragma once

#include <memory>
#include "backend/backend.h"

#include "layout/documents.h"
#include "layout/plan.h"
#include "ring/ring.h"
#include "ring/signature.h"

namespace stria {

struct ValidatedCall {
  AttentionShape shape;
  stria_layout_t layout = STRIA_LAYOUT_STRIPED;
  bool causal = true;
  Documents documents;  // the document mask (packed sequences), if any, on a layout
  // The call's document plan (params->plan), if any: the layout then is not used, and the mask is
  // the plan's documents cut by `mask` (the call's causal flag and window).
  std::shared_ptr<const Plan> plan;
  MaskSpec mask;
  TensorView q, k, v, out, lse, dout, dq, dk, dv;
  // Attention sinks (params->sinks, [Hq] float32) and, in a backward, their gradient's output.
  bool sinks_given = false, dsinks_given = false;
  TensorView sinks, dsinks;
  void* stream = nullptr;
  // What else ranks must agree on, hashed (0: nothing): a decode call's cache (lengths, capacity,
  // kind), window and whether it appends.
  uint64_t call_hash = 0;
  // A forward whose float8_e4m3fn inputs were widened (fp8_inputs.h): params' descales are then
  // the widening's, and accepted.
  bool fp8_inputs = false;
  // Which of the rings of one call this is (a grid's head chunks run one ring each): their messages
  // are tagged apart (RingTag).
  int lane = 0;
};

// Reads params: its layout, causal flag, plan, softcap and sinks into *c, and its mask (documents
// and window) into *mask, merged with the one a _documents or _window call passes as arguments.
Status CheckParams(const stria_attention_params_t* p, const DocumentsArg& args, ValidatedCall* c, DocumentsArg* mask);
// params->sinks and, in a backward, params->dsinks: float32 [Hq] (c->shape.Hq) in the context's memory.
Status CheckSinks(Context& ctx, const stria_attention_params_t* p, bool backward, ValidatedCall* c);
// What a call writes: not a broadcast view (tensor.h, CheckNoBroadcast), for outputs.
enum class Role { kInput, kOutput };
// INVALID_ARGUMENT naming `name`, its shape and `what` it should be, unless its shape is `want`.
Status ExpectShape(const TensorView& v, const char* name, std::initializer_list<int64_t> want, const char* what);
// INVALID_ARGUMENT unless `name` has q's dtype `want`.
Status ExpectDType(const TensorView& v, const char* name, DType want);
Status CheckWritable(const TensorView& v, const char* name, Role role);

// The mask of rank q_rank's queries against rank k_rank's block in this call: the layout's, cut
// by the call's documents (whose per-query bounds go into *bounds, which must outlive the mask).
BlockMask MaskOfBlock(const ValidatedCall& c, int world_size, int q_rank, int k_rank, Documents::Bounds* bounds);

// The ring steps the call needs: world_size, or fewer where documents or a sliding window leave
// the blocks of every later step empty on every rank (with the contiguous layout, a causal window
// within a block, or documents that cross at most one rank boundary, need the own and the previous
// block only). It depends only on what the ranks agreed on (the call signature), so every rank gets
// the same number.
int RingSteps(const ValidatedCall& c, int world_size);

// One ring message: the whole one, or, in a document plan's call, only the pieces of it that a
// rank further along the ring sees (Plan::RowsStillNeeded), gathered back to back. Every rank
// derives the same message from the plan, so sender and receiver agree on its size.
struct RingMessage {
  bool whole = true;
  size_t bytes = 0;               // what travels
  std::vector<WirePiece> pieces;  // the pieces of the whole message it carries, in order (whole: one)
};
// The K/V message that carries holder's block on from the rank that holds it at `step`.
RingMessage KVMessage(const ValidatedCall& c, const Backend& be, bool backward, size_t wire_bytes, int holder,
                      int step);
// The dK/dV partial of holder's block: at every hop the rows some other rank sees (no other rank
// adds to the rest).
RingMessage DKVMessage(const ValidatedCall& c, int holder, size_t dkv_bytes);

Status ValidateForward(Context& ctx, const ForwardCall& call, ValidatedCall* out);
Status ValidateBackward(Context& ctx, const BackwardCall& call, ValidatedCall* out);
// Exchanges the signature of this call with every rank and checks that all agree. `local` is this
// rank's own result so far (its validation, then its workspace): a rank that failed still takes
// part, so its peers fail with its reason instead of waiting for it.
Status AgreeOnCall(Context& ctx, RingOp op, const Status& local, const ValidatedCall& call, uint64_t* seq);

}  // namespace stria

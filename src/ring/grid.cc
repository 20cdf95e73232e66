// A call on a grid: the all-to-all in, the ring of R on the group's heads (ForwardSteps,
// BackwardSteps, the same schedule as a plain ring's), the all-to-all out.
//
// The group's tensors (its tokens, this member's heads) live in one arena of the context's memory,
// reused across calls like the ring buffers. Everything is got before the agreement, as in the
// plain ring; the backend's Begin call reads the exchanged queries, so it comes after the
// all-to-all, and a failure there goes through ctx.Fail like any other after the agreement.
#include "ring/grid.h"

#include <cstring>

#include "ring/grid_exchange.h"
#include "ring/grid_heads.h"
#include "ring/ring_common.h"

namespace stria {
namespace {

constexpr int kGridSendSlot = 13, kGridReceiveSlot = 14, kGridArenaSlot = 15;
constexpr int kPhaseIn = 0, kPhaseOut = 1;

// Carves the group's tensors out of one buffer, each 64-byte aligned.
class Arena {
 public:
  // First pass (base null): counts; second: hands out views.
  explicit Arena(char* base) : base_(base) {}
  Box Take(DType dtype, std::initializer_list<int64_t> dims) {
    Box b = CompactBox(base_ == nullptr ? nullptr : base_ + used_, dtype, dims);
    used_ += (BoxBytes(b) + 63) / 64 * 64;
    return b;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// The group's view of a call: `rc` is the ring's call (the group's tokens, this member's heads).
struct GridCall {
  ValidatedCall rc;
  GridHeads mine;
  std::vector<GridHeads> member;  // every member's heads
};

// The ring's call: shapes of the group, the call's mask and scores, this member's sinks.
void RingCallOf(const Context& ctx, const ValidatedCall& c, GridCall* g) {
  const int U = ctx.ulysses_size();
  for (int m = 0; m < U; ++m) g->member.push_back(HeadsOfMember(c.shape.Hq, c.shape.Hkv, U, m));
  g->mine = g->member[static_cast<size_t>(ctx.group_rank())];
  g->rc = c;
  AttentionShape& s = g->rc.shape;
  s.L = c.shape.L * U;
  s.Hq = g->mine.q;
  s.Hkv = g->mine.kv;
  if (c.sinks_given) g->rc.sinks = SubBox(c.sinks, 0, g->mine.q0, g->mine.q);
  if (c.dsinks_given) g->rc.dsinks = SubBox(c.dsinks, 0, g->mine.q0, g->mine.q);
}

Status CheckGridDevice(Context& ctx) {
  Status st = ctx.backend().CheckGridSupported();
  if (st.ok()) return st;
  return Error(st.code(), "%s: set the grid to 1 on this context (stria_context_set_grid)", st.message().c_str());
}

// Staging for both phases: the larger of each side.
Status Staging(Context& ctx, const Exchange& in, const Exchange& out, void** send, void** receive) {
  Status st = ctx.RingBuffer(kGridSendSlot, std::max<size_t>(1, std::max(in.SendBytes(), out.SendBytes())), send);
  if (st.ok())
    st =
        ctx.RingBuffer(kGridReceiveSlot, std::max<size_t>(1, std::max(in.ReceiveBytes(), out.ReceiveBytes())), receive);
  return st;
}

// Query-shaped tensors: the call's [B, L, Hq, D] (member m's heads) go to the group's [B, U·L, q, D]
// (member m's tokens) and back.
Box Heads(const TensorView& t, const GridHeads& h, bool kv) {
  return SubBox(t, 2, kv ? h.kv0 : h.q0, kv ? h.kv : h.q);
}
Box Tokens(const Box& group, int64_t L, int m) {
  return SubBox(group, 1, m * L, L);
}
// LSE: the call's [B, Hq, L] and the group's [B, q, U·L].
Box LseHeads(const TensorView& t, const GridHeads& h) {
  return SubBox(t, 1, h.q0, h.q);
}
Box LseTokens(const Box& group, int64_t L, int m) {
  return SubBox(group, 2, m * L, L);
}

// The exchange out, and the call's end: an asynchronous backend's unpacking must be done before
// the next call's exchange reuses the staging (the ring's own buffers are handed over by the
// backend's Begin call; these are not).
Status FinishExchange(Context& ctx, uint64_t seq, const char* what, const Exchange& x, void* send, void* receive,
                      void* stream) {
  STRIA_RETURN_IF_ERROR(RunExchange(ctx, seq, kPhaseOut, what, x, send, receive, stream));
  Status st = ctx.backend().SyncStream(stream);
  return st.ok() ? st : ctx.Fail(st);
}

// What both directions prepare before the agreement: the ring's call of the group, its tensors
// carved from the arena (carve(arena) takes them into g->rc, counted first, then placed), each
// member's boxes of both exchanges (boxes(m, heads of m, in, out)), and the staging. The ring's
// own buffers the caller gets.
template <typename Carve, typename Boxes>
Status PrepareGrid(Context& ctx, const ValidatedCall& c, GridCall* g, Exchange* in, Exchange* out, void** send,
                   void** receive, Carve carve, Boxes boxes) {
  STRIA_RETURN_IF_ERROR(CheckGridDevice(ctx));
  RingCallOf(ctx, c, g);
  Arena count(nullptr);
  carve(count);
  void* arena = nullptr;
  STRIA_RETURN_IF_ERROR(ctx.RingBuffer(kGridArenaSlot, count.used(), &arena));
  Arena a(static_cast<char*>(arena));
  carve(a);
  for (int m = 0; m < ctx.ulysses_size(); ++m) {
    const size_t mm = static_cast<size_t>(m);
    boxes(m, g->member[mm], &in->to[mm], &in->from[mm], &out->to[mm], &out->from[mm]);
  }
  return Staging(ctx, *in, *out, send, receive);
}

using BoxList = std::vector<Box>;

}  // namespace

Status GridForward(Context& ctx, const ValidatedCall& c, Status local) {
  const int U = ctx.ulysses_size();
  const RingGroup ring = RingGroup::Of(ctx);
  GridCall g;
  Exchange in(U), out(U);
  ForwardBuffers b;
  void *send = nullptr, *receive = nullptr;
  if (local.ok()) {
    const int64_t L = c.shape.L;
    local = PrepareGrid(
        ctx, c, &g, &in, &out, &send, &receive,
        [&](Arena& a) {
          const AttentionShape& s = g.rc.shape;
          g.rc.q = a.Take(s.dtype, {s.B, s.L, s.Hq, s.D});
          g.rc.k = a.Take(s.dtype, {s.B, s.L, s.Hkv, s.D});
          g.rc.v = a.Take(s.dtype, {s.B, s.L, s.Hkv, s.D});
          g.rc.out = a.Take(s.dtype, {s.B, s.L, s.Hq, s.D});
          g.rc.lse = a.Take(DType::kF32, {s.B, s.Hq, s.L});
        },
        [&](int m, const GridHeads& h, BoxList* in_to, BoxList* in_from, BoxList* out_to, BoxList* out_from) {
          *in_to = {Heads(c.q, h, false), Heads(c.k, h, true), Heads(c.v, h, true)};
          *in_from = {Tokens(g.rc.q, L, m), Tokens(g.rc.k, L, m), Tokens(g.rc.v, L, m)};
          *out_to = {Tokens(g.rc.out, L, m), LseTokens(g.rc.lse, L, m)};
          *out_from = {Heads(c.out, h, false), LseHeads(c.lse, h)};
        });
    if (local.ok()) local = ForwardWorkspace(ctx, ring, g.rc, &b);
  }
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kForward, local, c, &seq));
  ctx.traffic() = Traffic();
  STRIA_RETURN_IF_ERROR(
      RunExchange(ctx, seq, kPhaseIn, "the all-to-all of q, k and v", in, send, receive, g.rc.stream));
  Status st = ctx.backend().ForwardBegin(g.rc.shape, g.rc.q, g.rc.stream);
  if (!st.ok()) return ctx.Fail(st);
  STRIA_RETURN_IF_ERROR(ForwardSteps(ctx, ring, g.rc, seq, b));
  return FinishExchange(ctx, seq, "the all-to-all of out and lse", out, send, receive, g.rc.stream);
}

Status GridBackward(Context& ctx, const ValidatedCall& c, Status local) {
  const int U = ctx.ulysses_size();
  const RingGroup ring = RingGroup::Of(ctx);
  GridCall g;
  Exchange in(U), out(U);
  BackwardBuffers b;
  void *send = nullptr, *receive = nullptr;
  if (local.ok()) {
    const int64_t L = c.shape.L;
    local = PrepareGrid(
        ctx, c, &g, &in, &out, &send, &receive,
        [&](Arena& a) {
          const AttentionShape& s = g.rc.shape;
          for (TensorView* t : {&g.rc.q, &g.rc.out, &g.rc.dout, &g.rc.dq}) *t = a.Take(s.dtype, {s.B, s.L, s.Hq, s.D});
          for (TensorView* t : {&g.rc.k, &g.rc.v, &g.rc.dk, &g.rc.dv}) *t = a.Take(s.dtype, {s.B, s.L, s.Hkv, s.D});
          g.rc.lse = a.Take(DType::kF32, {s.B, s.Hq, s.L});
        },
        [&](int m, const GridHeads& h, BoxList* in_to, BoxList* in_from, BoxList* out_to, BoxList* out_from) {
          *in_to = {Heads(c.q, h, false),   Heads(c.k, h, true),     Heads(c.v, h, true),
                    Heads(c.out, h, false), Heads(c.dout, h, false), LseHeads(c.lse, h)};
          *in_from = {Tokens(g.rc.q, L, m),   Tokens(g.rc.k, L, m),    Tokens(g.rc.v, L, m),
                      Tokens(g.rc.out, L, m), Tokens(g.rc.dout, L, m), LseTokens(g.rc.lse, L, m)};
          // Members that share a K/V head each send their part of its gradient: summed on arrival.
          *out_to = {Tokens(g.rc.dq, L, m), Tokens(g.rc.dk, L, m), Tokens(g.rc.dv, L, m)};
          *out_from = {Heads(c.dq, h, false), Heads(c.dk, h, true), Heads(c.dv, h, true)};
        });
    if (local.ok()) local = BackwardWorkspace(ctx, ring, g.rc, &b);
  }
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kBackward, local, c, &seq));
  ctx.traffic() = Traffic();
  STRIA_RETURN_IF_ERROR(
      RunExchange(ctx, seq, kPhaseIn, "the all-to-all of q, k, v, out, dout and lse", in, send, receive, g.rc.stream));
  Status st = ctx.backend().BackwardBegin(g.rc.shape, g.rc.q, g.rc.out, g.rc.lse, g.rc.dout, g.rc.stream);
  if (!st.ok()) return ctx.Fail(st);
  STRIA_RETURN_IF_ERROR(BackwardSteps(ctx, ring, g.rc, seq, b));
  if (c.dsinks_given) {
    // This rank's part of the sinks' gradient covers its heads (over its group's tokens): the
    // others' entries are 0 (a sum of no parts), so that the ranks' parts still add up.
    const int64_t ends[2][2] = {{0, g.mine.q0}, {g.mine.q0 + g.mine.q, c.shape.Hq}};
    for (const auto& e : ends) {
      if (e[1] <= e[0]) continue;
      st = ctx.backend().SumIntoBox(nullptr, 0, 0, SubBox(c.dsinks, 0, e[0], e[1] - e[0]), g.rc.stream);
      if (!st.ok()) return ctx.Fail(st);
    }
  }
  return FinishExchange(ctx, seq, "the all-to-all of dq, dk and dv", out, send, receive, g.rc.stream);
}

}  // namespace stria

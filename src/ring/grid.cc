// A call on a grid: the all-to-all in, the ring of R on the group's heads (ForwardSteps,
// BackwardSteps, the same schedule as a plain ring's), the all-to-all out.
//
// The member's heads go in chunks (whole K/V heads with the query heads that read them), one
// ring each, so that the exchanges overlap the compute: every chunk's inputs are posted at the
// start, a chunk's ring starts once its own inputs are in, and its outputs leave while the next
// chunk computes. What stays exposed is the first chunk's inputs and the last one's outputs.
//
// The group's tensors (its tokens, this member's heads, chunk by chunk) live in one arena of the
// context's memory, reused across calls like the ring buffers. Everything is got before the
// agreement, as in the plain ring; the backend's Begin call reads the exchanged queries, so it
// comes after the chunk's exchange, and a failure there goes through ctx.Fail like any other
// after the agreement.
#include "ring/grid.h"

#include <cstdlib>
#include <cstring>

#include "ring/grid_exchange.h"
#include "ring/grid_heads.h"
#include "ring/ring_common.h"

namespace stria {
namespace {

constexpr int kInSendSlot = 13, kInReceiveSlot = 14, kGridArenaSlot = 15, kOutSendSlot = 16, kOutReceiveSlot = 17;

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

// At most this many chunks a call (STRIA_GRID_CHUNKS, 1 to 16; default 2): each is a ring of its
// own, whose per-step costs (a launch, a message) a call pays once per chunk.
int MaxChunks() {
  const char* env = std::getenv("STRIA_GRID_CHUNKS");
  if (env == nullptr || *env == '\0') return 2;
  const int n = std::atoi(env);
  return n < 1 ? 1 : n > 16 ? 16 : n;
}

// How many chunks the member's heads make: a divisor of its K/V heads (so that every chunk has the
// same shape, and one workspace serves them all), at most MaxChunks. A K/V head shared between
// members (fewer K/V heads than members) is one chunk: split, its K/V would travel the ring twice.
int ChunkCount(const GridHeads& h, int64_t Hkv, int U) {
  if (Hkv % U != 0) return 1;
  for (int64_t c = std::min<int64_t>(MaxChunks(), h.kv); c > 1; --c)
    if (h.kv % c == 0) return static_cast<int>(c);
  return 1;
}

GridHeads ChunkOf(const GridHeads& h, int chunks, int k) {
  GridHeads c;
  c.q = h.q / chunks;
  c.q0 = h.q0 + k * c.q;
  c.kv = h.kv / chunks;
  c.kv0 = h.kv0 + k * c.kv;
  return c;
}

// The group's view of a call: chunk k's ring call rc[k] (the group's tokens, chunk k of this
// member's heads), member[k][m] chunk k of member m's heads, and chunk k's exchanges.
struct GridCall {
  int chunks = 1;
  GridHeads mine;  // this member's heads, all chunks
  std::vector<ValidatedCall> rc;
  std::vector<std::vector<GridHeads>> member;
  std::vector<Exchange> in, out;
};

// The ring calls: shapes of the group and the chunk, the call's mask and scores, the chunk's sinks.
void RingCallsOf(const Context& ctx, const ValidatedCall& c, GridCall* g) {
  const int U = ctx.ulysses_size();
  g->mine = HeadsOfMember(c.shape.Hq, c.shape.Hkv, U, ctx.group_rank());
  g->chunks = GridChunkCount(ctx, c.shape);
  for (int k = 0; k < g->chunks; ++k) {
    std::vector<GridHeads> members;
    for (int m = 0; m < U; ++m) members.push_back(ChunkOf(HeadsOfMember(c.shape.Hq, c.shape.Hkv, U, m), g->chunks, k));
    const GridHeads& mine = members[static_cast<size_t>(ctx.group_rank())];
    ValidatedCall rc = c;
    rc.shape.L = c.shape.L * U;
    rc.shape.Hq = mine.q;
    rc.shape.Hkv = mine.kv;
    if (c.sinks_given) rc.sinks = SubBox(c.sinks, 0, mine.q0, mine.q);
    if (c.dsinks_given) rc.dsinks = SubBox(c.dsinks, 0, mine.q0, mine.q);
    rc.lane = k;
    g->rc.push_back(rc);
    g->member.push_back(std::move(members));
    g->in.emplace_back(U);
    g->out.emplace_back(U);
  }
}

Status CheckGridDevice(Context& ctx) {
  Status st = ctx.backend().CheckGridSupported();
  if (st.ok()) return st;
  return Error(st.code(), "%s: set the grid to 1 on this context (stria_context_set_grid)", st.message().c_str());
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

// The staging of every chunk's exchanges, each in a region of its own: the inputs' messages are
// all in flight at once, and a chunk's outputs beside the next chunks' inputs.
struct Staging {
  char *in_send = nullptr, *in_receive = nullptr, *out_send = nullptr, *out_receive = nullptr;
  std::vector<size_t> in_send_at, in_receive_at, out_send_at, out_receive_at;
  std::vector<PendingExchange> in_pending, out_pending;
};

Status GetStaging(Context& ctx, const GridCall& g, Staging* s) {
  size_t in_send = 0, in_receive = 0, out_send = 0, out_receive = 0;
  for (int k = 0; k < g.chunks; ++k) {
    const size_t kk = static_cast<size_t>(k);
    s->in_send_at.push_back(in_send);
    s->in_receive_at.push_back(in_receive);
    s->out_send_at.push_back(out_send);
    s->out_receive_at.push_back(out_receive);
    in_send += g.in[kk].SendBytes();
    in_receive += g.in[kk].ReceiveBytes();
    out_send += g.out[kk].SendBytes();
    out_receive += g.out[kk].ReceiveBytes();
  }
  s->in_pending.resize(static_cast<size_t>(g.chunks));
  s->out_pending.resize(static_cast<size_t>(g.chunks));
  void* p[4] = {};
  const int slots[4] = {kInSendSlot, kInReceiveSlot, kOutSendSlot, kOutReceiveSlot};
  const size_t bytes[4] = {in_send, in_receive, out_send, out_receive};
  for (int i = 0; i < 4; ++i) STRIA_RETURN_IF_ERROR(ctx.RingBuffer(slots[i], std::max<size_t>(1, bytes[i]), &p[i]));
  s->in_send = static_cast<char*>(p[0]);
  s->in_receive = static_cast<char*>(p[1]);
  s->out_send = static_cast<char*>(p[2]);
  s->out_receive = static_cast<char*>(p[3]);
  return Status::Ok();
}

// Every chunk's inputs packed, the transfers ordered after the packing once, then posted (chunk
// k's as phase k). The phases go up in the order a member posts them to its peers (the inputs,
// then each chunk's outputs as phase chunks + k), as a transport that matches messages in posting
// order checks (NCCL's).
Status PostInputs(Context& ctx, RingOrder& order, uint64_t seq, const GridCall& g, Staging* s, void* stream) {
  for (size_t k = 0; k < g.in.size(); ++k)
    STRIA_RETURN_IF_ERROR(
        PackExchange(ctx, g.in[k], s->in_send + s->in_send_at[k], s->in_receive + s->in_receive_at[k], stream));
  const Status st = order.BeforePosting();
  if (!st.ok()) return ctx.Fail(st);
  for (size_t k = 0; k < g.in.size(); ++k)
    STRIA_RETURN_IF_ERROR(PostExchange(ctx, seq, static_cast<int>(k), g.in[k], s->in_send + s->in_send_at[k],
                                       s->in_receive + s->in_receive_at[k], &s->in_pending[k]));
  return Status::Ok();
}

Status FinishInputs(Context& ctx, RingOrder& order, const char* what, const GridCall& g, int k, const Staging& s,
                    void* stream) {
  const size_t kk = static_cast<size_t>(k);
  return FinishExchange(ctx, order, what, g.in[kk], s.in_pending[kk], s.in_receive + s.in_receive_at[kk], stream);
}

// Chunk k's outputs, once its ring is done: packed behind its compute, then posted (phase
// chunks + k).
Status PostOutputs(Context& ctx, RingOrder& order, uint64_t seq, const GridCall& g, int k, Staging* s, void* stream) {
  const size_t kk = static_cast<size_t>(k);
  char* send = s->out_send + s->out_send_at[kk];
  char* receive = s->out_receive + s->out_receive_at[kk];
  STRIA_RETURN_IF_ERROR(PackExchange(ctx, g.out[kk], send, receive, stream));
  const Status st = order.BeforePosting();
  if (!st.ok()) return ctx.Fail(st);
  return PostExchange(ctx, seq, g.chunks + k, g.out[kk], send, receive, &s->out_pending[kk]);
}

// Every chunk's outputs in, and the call's end once the host has seen every transfer complete. The
// unpacking may still be queued on the stream, like any call's work: the next call's exchange,
// which reuses the staging, follows it (its packing follows everything this call queued, on the
// backend's order of calls, and its transfers follow its packing).
Status FinishOutputs(Context& ctx, RingOrder& order, const char* what, const GridCall& g, const Staging& s,
                     void* stream) {
  for (size_t k = 0; k < g.out.size(); ++k)
    STRIA_RETURN_IF_ERROR(
        FinishExchange(ctx, order, what, g.out[k], s.out_pending[k], s.out_receive + s.out_receive_at[k], stream));
  const Status st = order.Finish();
  return st.ok() ? st : ctx.Fail(st);
}

// Each ring writes the call's step times afresh: the call's are their sums, step by step.
void AddStepTimes(Context& ctx, std::vector<StepTime>* sum) {
  const std::vector<StepTime>& t = ctx.step_times();
  if (sum->size() < t.size()) sum->resize(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    (*sum)[i].compute_s += t[i].compute_s;
    (*sum)[i].compute_cpu_s += t[i].compute_cpu_s;
    (*sum)[i].wait_s += t[i].wait_s;
  }
}

// What both directions run after the agreement: every chunk's inputs posted; per chunk, its inputs
// in, its ring (ring(rc, &order): the backend's Begin and the ring's steps, whose host waits first
// wait for the inputs), its outputs posted. The call's step times are the chunks' sums. The
// outputs are finished by the caller.
//
// `order` keeps the exchanges' order as the ring keeps its steps' (ring_order.h): on the device the
// transfers wait for the packing's event and the stream for the transfers, and the host queues the
// whole call without waiting for the stream.
template <typename Ring>
Status RunChunks(Context& ctx, RingOrder& order, uint64_t seq, const GridCall& g, Staging* s, void* stream,
                 const char* what_in, Ring ring) {
  STRIA_RETURN_IF_ERROR(PostInputs(ctx, order, seq, g, s, stream));
  std::vector<StepTime> times;
  for (int k = 0; k < g.chunks; ++k) {
    order.Step(k);
    STRIA_RETURN_IF_ERROR(FinishInputs(ctx, order, what_in, g, k, *s, stream));
    STRIA_RETURN_IF_ERROR(ring(g.rc[static_cast<size_t>(k)], &order));
    AddStepTimes(ctx, &times);
    STRIA_RETURN_IF_ERROR(PostOutputs(ctx, order, seq, g, k, s, stream));
  }
  ctx.step_times() = times;
  return Status::Ok();
}

// What both directions prepare before the agreement: the chunks' ring calls, their tensors carved
// from the arena (carve(arena, rc) takes them into rc, counted first, then placed), each chunk's
// and member's boxes of both exchanges (boxes(chunk, m, chunk k of m's heads, rc, in, out)), and
// the staging. The ring's own buffers the caller gets.
template <typename Carve, typename Boxes>
Status PrepareGrid(Context& ctx, const ValidatedCall& c, GridCall* g, Staging* s, Carve carve, Boxes boxes) {
  STRIA_RETURN_IF_ERROR(CheckGridDevice(ctx));
  RingCallsOf(ctx, c, g);
  Arena count(nullptr);
  for (ValidatedCall& rc : g->rc) carve(count, rc);
  void* arena = nullptr;
  STRIA_RETURN_IF_ERROR(ctx.RingBuffer(kGridArenaSlot, count.used(), &arena));
  Arena a(static_cast<char*>(arena));
  for (ValidatedCall& rc : g->rc) carve(a, rc);
  for (size_t k = 0; k < g->rc.size(); ++k)
    for (int m = 0; m < ctx.ulysses_size(); ++m) {
      const size_t mm = static_cast<size_t>(m);
      boxes(m, g->member[k][mm], g->rc[k], &g->in[k].to[mm], &g->in[k].from[mm], &g->out[k].to[mm],
            &g->out[k].from[mm]);
    }
  return GetStaging(ctx, *g, s);
}

using BoxList = std::vector<Box>;

}  // namespace

int GridChunkCount(const Context& ctx, const AttentionShape& s) {
  const int U = ctx.ulysses_size();
  return ChunkCount(HeadsOfMember(s.Hq, s.Hkv, U, ctx.group_rank()), s.Hkv, U);
}

Status GridForward(Context& ctx, const ValidatedCall& c, Status local) {
  const RingGroup ring = RingGroup::Of(ctx);
  GridCall g;
  Staging stage;
  ForwardBuffers b;
  if (local.ok()) {
    const int64_t L = c.shape.L;
    local = PrepareGrid(
        ctx, c, &g, &stage,
        [&](Arena& a, ValidatedCall& rc) {
          const AttentionShape& s = rc.shape;
          rc.q = a.Take(s.dtype, {s.B, s.L, s.Hq, s.D});
          rc.k = a.Take(s.dtype, {s.B, s.L, s.Hkv, s.D});
          rc.v = a.Take(s.dtype, {s.B, s.L, s.Hkv, s.D});
          rc.out = a.Take(s.dtype, {s.B, s.L, s.Hq, s.D});
          rc.lse = a.Take(DType::kF32, {s.B, s.Hq, s.L});
        },
        [&](int m, const GridHeads& h, const ValidatedCall& rc, BoxList* in_to, BoxList* in_from, BoxList* out_to,
            BoxList* out_from) {
          *in_to = {Heads(c.q, h, false), Heads(c.k, h, true), Heads(c.v, h, true)};
          *in_from = {Tokens(rc.q, L, m), Tokens(rc.k, L, m), Tokens(rc.v, L, m)};
          *out_to = {Tokens(rc.out, L, m), LseTokens(rc.lse, L, m)};
          *out_from = {Heads(c.out, h, false), LseHeads(c.lse, h)};
        });
    if (local.ok()) local = ForwardWorkspace(ctx, ring, g.rc[0], &b);
  }
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kForward, local, c, &seq));
  ctx.traffic() = Traffic();
  void* stream = c.stream;
  RingOrder order(ctx.backend(), ctx.transport(), ctx.timeout_s(), stream);
  STRIA_RETURN_IF_ERROR(RunChunks(ctx, order, seq, g, &stage, stream, "the all-to-all of q, k and v",
                                  [&](const ValidatedCall& rc, RingOrder* earlier) {
                                    const Status st = ctx.backend().ForwardBegin(rc.shape, rc.q, stream);
                                    return st.ok() ? ForwardSteps(ctx, ring, rc, seq, b, earlier) : ctx.Fail(st);
                                  }));
  return FinishOutputs(ctx, order, "the all-to-all of out and lse", g, stage, stream);
}

Status GridBackward(Context& ctx, const ValidatedCall& c, Status local) {
  const RingGroup ring = RingGroup::Of(ctx);
  GridCall g;
  Staging stage;
  BackwardBuffers b;
  if (local.ok()) {
    const int64_t L = c.shape.L;
    local = PrepareGrid(
        ctx, c, &g, &stage,
        [&](Arena& a, ValidatedCall& rc) {
          const AttentionShape& s = rc.shape;
          for (TensorView* t : {&rc.q, &rc.out, &rc.dout, &rc.dq}) *t = a.Take(s.dtype, {s.B, s.L, s.Hq, s.D});
          for (TensorView* t : {&rc.k, &rc.v, &rc.dk, &rc.dv}) *t = a.Take(s.dtype, {s.B, s.L, s.Hkv, s.D});
          rc.lse = a.Take(DType::kF32, {s.B, s.Hq, s.L});
        },
        [&](int m, const GridHeads& h, const ValidatedCall& rc, BoxList* in_to, BoxList* in_from, BoxList* out_to,
            BoxList* out_from) {
          *in_to = {Heads(c.q, h, false),   Heads(c.k, h, true),     Heads(c.v, h, true),
                    Heads(c.out, h, false), Heads(c.dout, h, false), LseHeads(c.lse, h)};
          *in_from = {Tokens(rc.q, L, m),   Tokens(rc.k, L, m),    Tokens(rc.v, L, m),
                      Tokens(rc.out, L, m), Tokens(rc.dout, L, m), LseTokens(rc.lse, L, m)};
          // Members that share a K/V head each send their part of its gradient: summed on arrival.
          *out_to = {Tokens(rc.dq, L, m), Tokens(rc.dk, L, m), Tokens(rc.dv, L, m)};
          *out_from = {Heads(c.dq, h, false), Heads(c.dk, h, true), Heads(c.dv, h, true)};
        });
    if (local.ok()) local = BackwardWorkspace(ctx, ring, g.rc[0], &b);
  }
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kBackward, local, c, &seq));
  ctx.traffic() = Traffic();
  void* stream = c.stream;
  RingOrder order(ctx.backend(), ctx.transport(), ctx.timeout_s(), stream);
  STRIA_RETURN_IF_ERROR(RunChunks(ctx, order, seq, g, &stage, stream, "the all-to-all of q, k, v, out, dout and lse",
                                  [&](const ValidatedCall& rc, RingOrder* earlier) {
                                    const Status st =
                                        ctx.backend().BackwardBegin(rc.shape, rc.q, rc.out, rc.lse, rc.dout, stream);
                                    return st.ok() ? BackwardSteps(ctx, ring, rc, seq, b, earlier) : ctx.Fail(st);
                                  }));
  if (c.dsinks_given) {
    // This rank's part of the sinks' gradient covers its heads (over its group's tokens): the
    // others' entries are 0 (a sum of no parts), so that the ranks' parts still add up.
    const int64_t ends[2][2] = {{0, g.mine.q0}, {g.mine.q0 + g.mine.q, c.shape.Hq}};
    for (const auto& e : ends) {
      if (e[1] <= e[0]) continue;
      Status st = ctx.backend().SumIntoBox(nullptr, 0, 0, SubBox(c.dsinks, 0, e[0], e[1] - e[0]), stream);
      if (!st.ok()) return ctx.Fail(st);
    }
  }
  return FinishOutputs(ctx, order, "the all-to-all of dq, dk and dv", g, stage, stream);
}

}  // namespace stria

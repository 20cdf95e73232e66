// The backward ring. Q, dO, LSE and rowsum(dO∘O) stay; K/V rotate as in the forward, and each
// block's dK/dV partial sum (float32, so error does not grow with the rank count) travels one
// hop behind it: a rank computes its contribution into a fresh buffer while the partial of the
// same block arrives from the previous rank, adds the two, and passes the sum on. After N steps
// the partial arrives at the block's owner complete. dQ accumulates locally.
//
// Where documents or a sliding window leave the later steps without work on every rank (RingSteps), the ring
// stops after T < N steps: the partial is complete at the rank that held the block last, T - 1
// hops after its owner, and goes straight back to the owner (for T = N, the next rank).
//
// A document plan's call trims its messages (RingMessage): K/V as in the forward, and the partials
// to the rows some other rank sees. For that the owner keeps its own contribution home (the only
// one that covers every row) and adds the partial of the others when it returns; the partial then
// starts at the block's first hop, and a block no other rank sees sends nothing at all.
#include "ring/arguments.h"
#include "ring/grid.h"
#include "ring/ring_common.h"
#include "ring/ring_order.h"

namespace stria {

Status BackwardWorkspace(Context& ctx, const RingGroup& g, const ValidatedCall& c, BackwardBuffers* b) {
  Backend& be = ctx.backend();
  const int n = g.n;
  const bool trimmed = c.plan != nullptr && n > 1;
  b->kv_bytes = be.KVWireFor(c.shape, true).bytes;
  b->dkv_bytes = DKVWireFloats(c.shape) * sizeof(float);
  Status st = ctx.RingBuffer(0, b->kv_bytes, &b->kv[0]);
  if (st.ok()) st = ctx.RingBuffer(2, b->dkv_bytes, &b->dkv[0]);
  if (st.ok() && n > 1) st = ctx.RingBuffer(1, b->kv_bytes, &b->kv[1]);
  if (st.ok() && n > 1) st = ctx.RingBuffer(3, b->dkv_bytes, &b->dkv[1]);
  if (st.ok() && n > 1) st = ctx.RingBuffer(4, b->dkv_bytes, &b->dkv_in);
  if (st.ok() && trimmed) st = StagingBuffers(ctx, KVStagingBytes(c, be, true, b->kv_bytes, n, g.r), b->stage);
  if (st.ok() && trimmed) st = ctx.RingBuffer(kDKVStagingSlot, b->dkv_bytes, &b->dkv_stage);
  if (st.ok() && trimmed) st = ctx.RingBuffer(kOwnDKVSlot, b->dkv_bytes, &b->own);
  b->home_begin = HomeBeginOf(c, be, n, g.r);
  if (st.ok() && b->home_begin >= 0) st = ctx.RingBuffer(kLocalKVSlot, b->kv_bytes, &b->local);
  return st;
}

Status RingBackward(Context& ctx, const BackwardCall& call) {
  STRIA_RETURN_IF_ERROR(ctx.Usable());
  ValidatedCall c;
  Status local = ValidateBackward(ctx, call, &c);
  if (ctx.ulysses_size() > 1) return GridBackward(ctx, c, local);
  const RingGroup g = RingGroup::Of(ctx);
  // The workspace before the agreement, every later failure through ctx.Fail (as in the forward).
  BackwardBuffers b;
  if (local.ok()) local = BackwardWorkspace(ctx, g, c, &b);
  if (local.ok()) local = ctx.backend().BackwardBegin(c.shape, c.q, c.out, c.lse, c.dout, c.stream);
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kBackward, local, c, &seq));
  ctx.traffic() = Traffic();
  return BackwardSteps(ctx, g, c, seq, b);
}

Status BackwardSteps(Context& ctx, const RingGroup& g, const ValidatedCall& c, uint64_t seq, const BackwardBuffers& b,
                     RingOrder* earlier) {
  const int n = g.n, r = g.r, next = g.Next(), prev = g.Prev();
  Backend& be = ctx.backend();
  Transport& tr = ctx.transport();
  const AttentionShape& s = c.shape;
  const bool trimmed = c.plan != nullptr && n > 1;
  const size_t kv_bytes = b.kv_bytes, dkv_bytes = b.dkv_bytes;
  void* const* stage = b.stage;
  void* const* dkv = b.dkv;
  void* const dkv_in = b.dkv_in;
  void* const dkv_stage = b.dkv_stage;
  void* const own = b.own;
  JoinDetachedOnExit join(be);
  RingOrder order(be, tr, ctx.timeout_s());
  order.After(earlier);
  // Packing the local block is step 0's work (a backend may do some of it in the block call).
  StepTimer pack_timer(be);
  pack_timer.ComputeBegin();
  Status packed = be.PackKV(s, c.k, c.v, b.Held(0), n > 1);
  if (packed.ok()) packed = ctx.CheckNotAborted();  // an abort may cut the packing short: send none of it
  if (!packed.ok()) return ctx.Fail(packed);
  pack_timer.ComputeEnd();
  const StepTime pack_time = pack_timer.Finish();

  Documents::Bounds bounds;  // the document mask of the block at hand, if the call has one
  const int steps = RingSteps(c, n);
  // Where the last step's complete partial goes (the block's owner), and whence ours comes home.
  const int home_to = g.Peer((r - (steps - 1) + n) % n), home_from = g.Peer((r + steps - 1) % n);
  // The steps whose partial this rank passes on, and from which it receives one: every step, or
  // (trimmed) from the first hop on, the owner's contribution staying home.
  const int first_sent = trimmed ? 1 : 0;
  auto& times = ctx.step_times();
  times.assign(static_cast<size_t>(steps), StepTime());
  RequestId dkv_send = 0;                                   // the partial sent at the previous step
  std::vector<int64_t> dkv_rows(static_cast<size_t>(s.B));  // the rows of a trimmed partial (BackwardStep)
  for (int step = 0; step < steps; ++step) {
    order.Step(step);
    const int holder = (r - step + n) % n;
    RequestId kv_send = 0, kv_recv = 0, dkv_recv = 0;
    const bool forward_block = step < steps - 1;
    const bool sends_partial = steps > 1 && step >= first_sent, gets_partial = step > first_sent;
    // The block's mask first: with documents it is host work, which this way overlaps an
    // asynchronous backend's previous step instead of following the fence.
    const BlockMask mask = MaskOfBlock(c, n, r, holder, &bounds);
    RingMessage out, in;  // the K/V block this rank passes on, and the one it gets
    const RingMessage partial = DKVMessage(c, holder, dkv_bytes);
    Status st;
    if (forward_block) {
      out = KVMessage(c, be, true, kv_bytes, holder, step);
      in = KVMessage(c, be, true, kv_bytes, (holder - 1 + n) % n, step);
      if (!out.whole) st = be.CopyPieces(stage[0], b.Held(step), out.pieces, true);
    }
    // Asynchronous backends: the K/V block to send is packed (or gathered) and the buffers we
    // receive into (the other K/V slot or the staging, dkv_in) are no longer read by the previous
    // step's compute.
    if (st.ok() && steps > 1) st = order.BeforePosting();
    if (st.ok() && forward_block) {
      st = tr.Irecv(prev, RingTag(seq, step, MessageKind::kKV, c.lane), in.whole ? b.Into(step) : stage[1], in.bytes,
                    &kv_recv);
      if (st.ok())
        st = tr.Isend(next, RingTag(seq, step, MessageKind::kKV, c.lane), out.whole ? b.Held(step) : stage[0],
                      out.bytes, &kv_send);
      if (st.ok()) CountSent(out.bytes, true, &ctx.traffic());
    }
    if (st.ok() && gets_partial)
      st = tr.Irecv(prev, RingTag(seq, step, MessageKind::kDKV, c.lane), dkv_in, partial.bytes, &dkv_recv);
    if (!st.ok()) return ctx.Fail(st);

    StepTimer timer(be);
    timer.ComputeBegin();
    float* mine = static_cast<float*>(trimmed && step == 0 ? own : dkv[step % 2]);
    BackwardStep where;
    where.local = step == 0;
    if (steps == 1) {  // nothing is added to this partial or sent on: it is the call's dK/dV
      where.dk = &c.dk;
      where.dv = &c.dv;
    }
    if (trimmed && step > 0) {  // only the partial's pieces are read: the rows other ranks see
      c.plan->RowsStillNeeded(holder, 0, c.mask, dkv_rows.data());
      where.dkv_rows = dkv_rows.data();
    }
    if (step == 0) where.home_begin = b.home_begin;
    st = be.BackwardBlock(b.Held(step), mask, mine, where);
    if (st.ok()) st = ctx.CheckNotAborted();
    if (!st.ok()) return ctx.Fail(st);
    timer.ComputeEnd();

    const std::string what = Format("dK/dV partial of ring step %d", step);
    if (gets_partial) {
      st = order.Arrived(dkv_recv, what);
      if (st.ok()) st = be.AccumulateDKV(mine, static_cast<const float*>(dkv_in), partial.pieces);
      // The partial sent last step lives in the buffer we fill next (or the staging): it must have left.
      if (st.ok()) st = order.Arrived(dkv_send, what);
      if (!st.ok()) return ctx.Fail(st);
    }
    if (sends_partial) {
      // The partial we send must be complete, and not cut short by an abort. The last step's is
      // complete, and goes home.
      const int to = step == steps - 1 ? home_to : next;
      if (!partial.whole) st = be.CopyPieces(dkv_stage, mine, partial.pieces, true);
      if (st.ok()) st = order.BeforePosting();
      if (st.ok()) st = ctx.CheckNotAborted();
      if (st.ok())
        st = tr.Isend(to, RingTag(seq, step + 1, MessageKind::kDKV, c.lane), partial.whole ? mine : dkv_stage,
                      partial.bytes, &dkv_send);
      if (st.ok()) CountSent(partial.bytes, false, &ctx.traffic());
      if (!st.ok()) return ctx.Fail(st);
    }
    if (forward_block) {
      const std::string kv_what = Format("K/V block of ring step %d", step);
      st = order.Arrived(kv_recv, kv_what);
      if (st.ok()) st = order.Arrived(kv_send, kv_what);
      // After this step's compute in the backend's order, into the block the next step reads.
      if (st.ok() && !in.whole) st = be.CopyPieces(b.Into(step), stage[1], in.pieces, false);
      if (!st.ok()) return ctx.Fail(st);
    }
    // Ordered on the device, the host waits for the previous step's transfers while this one's
    // work runs.
    if (st = order.Retire(); !st.ok()) return ctx.Fail(st);
    times[static_cast<size_t>(step)] = timer.Finish();
    if (step == 0) AddCompute(pack_time, &times[0]);
  }

  const float* done = static_cast<const float*>(trimmed ? own : dkv[0]);
  if (steps > 1) {
    // Our own block's partial comes home after the last step (from the previous rank for N steps).
    const RingMessage home = DKVMessage(c, r, dkv_bytes);
    RequestId final_recv = 0;
    order.Step(steps);
    Status st = tr.Irecv(home_from, RingTag(seq, steps, MessageKind::kDKV, c.lane), dkv_in, home.bytes, &final_recv);
    if (st.ok()) st = order.Arrived(final_recv, "the final dK/dV of this rank's block");
    if (st.ok()) st = order.Arrived(dkv_send, "the last dK/dV partial");
    if (st.ok() && trimmed)  // the others' part joins the contribution kept home
      st = be.AccumulateDKV(static_cast<float*>(own), static_cast<const float*>(dkv_in), home.pieces);
    if (!st.ok()) return ctx.Fail(st);
    if (!trimmed) done = static_cast<const float*>(dkv_in);
  }
  Status st = be.BackwardEnd(c.dq, done, c.dk, c.dv);
  if (st.ok() && c.dsinks_given) st = be.SinksGradient(c.sinks, c.dsinks);
  if (st.ok()) st = order.Finish();  // the last transfers, while the device finishes
  if (st.ok()) st = be.JoinDetached();
  if (st.ok()) st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria

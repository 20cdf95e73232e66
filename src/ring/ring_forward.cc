// The forward ring. Each step merges one K/V block into the running softmax state (row max, row
// sum, unnormalised output: online softmax across blocks), so no per-block output or LSE needs a
// separate merge pass and a row that sees no key in a block simply leaves its state unchanged.
//
// A document plan's call sends each block trimmed (RingMessage): only the rows that ranks further
// along the ring see, gathered from the whole block into a staging buffer and scattered back into
// a whole one by the receiver, so the kernels always read whole blocks.
#include "ring/arguments.h"
#include "ring/fp8_inputs.h"
#include "ring/grid.h"
#include "ring/ring_common.h"
#include "ring/ring_order.h"

namespace stria {

Status ForwardWorkspace(Context& ctx, const RingGroup& g, const ValidatedCall& c, ForwardBuffers* b) {
  Backend& be = ctx.backend();
  b->kv_bytes = be.KVWireFor(c.shape, false).bytes;
  Status st = ctx.RingBuffer(0, b->kv_bytes, &b->kv[0]);
  if (st.ok() && g.n > 1) st = ctx.RingBuffer(1, b->kv_bytes, &b->kv[1]);
  if (st.ok() && g.n > 1 && c.plan != nullptr)
    st = StagingBuffers(ctx, KVStagingBytes(c, be, false, b->kv_bytes, g.n, g.r), b->stage);
  b->home_begin = HomeBeginOf(c, be, g.n, g.r);
  if (st.ok() && b->home_begin >= 0) st = ctx.RingBuffer(kLocalKVSlot, b->kv_bytes, &b->local);
  return st;
}

Status RingForward(Context& ctx, const ForwardCall& call) {
  STRIA_RETURN_IF_ERROR(ctx.Usable());
  // FP8 inputs become inputs of out's dtype first; a failure there fails the call on every rank
  // like any bad argument.
  WidenedInputs widened;
  ForwardCall widened_call;
  Status local = WidenFp8Inputs(ctx, call, &widened, &widened_call);
  ValidatedCall c;
  if (local.ok()) local = ValidateForward(ctx, widened_call, &c);
  if (ctx.ulysses_size() > 1) return GridForward(ctx, c, local);
  const RingGroup g = RingGroup::Of(ctx);
  // What the call needs (ring buffers, the backend's state) is got before the agreement: a failure
  // there (a full device) then reaches every rank in the signature, and the group stays usable.
  // After the agreement every failure goes through ctx.Fail, which aborts this rank's transport,
  // so that peers waiting for it fail at once rather than at their timeout.
  ForwardBuffers b;
  if (local.ok()) local = ForwardWorkspace(ctx, g, c, &b);
  if (local.ok()) local = ctx.backend().ForwardBegin(c.shape, c.q, c.stream);
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kForward, local, c, &seq));
  ctx.traffic() = Traffic();
  return ForwardSteps(ctx, g, c, seq, b);
}

Status ForwardSteps(Context& ctx, const RingGroup& g, const ValidatedCall& c, uint64_t seq, const ForwardBuffers& b,
                    RingOrder* earlier) {
  const int n = g.n, r = g.r, next = g.Next(), prev = g.Prev();
  Backend& be = ctx.backend();
  Transport& tr = ctx.transport();
  const AttentionShape& s = c.shape;
  const size_t kv_bytes = b.kv_bytes;
  void* const* stage = b.stage;
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
  // Documents or a sliding window may leave the later steps without work on every rank: they are
  // not run.
  const int steps = RingSteps(c, n);
  auto& times = ctx.step_times();
  times.assign(static_cast<size_t>(steps), StepTime());
  for (int step = 0; step < steps; ++step) {
    order.Step(step);
    const int holder = (r - step + n) % n;  // whose K/V this rank holds now
    RequestId send = 0, recv = 0;
    const bool forward_block = step < steps - 1;
    // The block's mask first: with documents it is host work, which this way overlaps an
    // asynchronous backend's previous step instead of following the fence.
    const BlockMask mask = MaskOfBlock(c, n, r, holder, &bounds);
    RingMessage out, in;  // the block this rank passes on, and the one it gets
    if (forward_block) {
      out = KVMessage(c, be, false, kv_bytes, holder, step);
      in = KVMessage(c, be, false, kv_bytes, (holder - 1 + n) % n, step);
      Status st = out.whole ? Status::Ok() : be.CopyPieces(stage[0], b.Held(step), out.pieces, true);
      // The block we send must be packed (step 0) or gathered, and the one we receive into no
      // longer read by the previous step's compute.
      if (st.ok()) st = order.BeforePosting();
      if (st.ok())
        st = tr.Irecv(prev, RingTag(seq, step, MessageKind::kKV, c.lane), in.whole ? b.Into(step) : stage[1], in.bytes,
                      &recv);
      if (st.ok())
        st = tr.Isend(next, RingTag(seq, step, MessageKind::kKV, c.lane), out.whole ? b.Held(step) : stage[0],
                      out.bytes, &send);
      if (!st.ok()) return ctx.Fail(st);
      CountSent(out.bytes, true, &ctx.traffic());
    }
    StepTimer timer(be);
    timer.ComputeBegin();
    if (!mask.empty()) {
      ForwardStep where;
      where.local = step == 0;
      if (step == steps - 1) {
        where.out = &c.out;
        where.lse = &c.lse;
      }
      if (step == 0 && b.home_begin >= 0) {
        where.home_begin = b.home_begin;
        where.home_out = &c.out;
        where.home_lse = &c.lse;
      }
      Status st = be.ForwardBlock(b.Held(step), mask, where);
      if (st.ok()) st = ctx.CheckNotAborted();
      if (!st.ok()) return ctx.Fail(st);
    }
    timer.ComputeEnd();
    if (forward_block) {
      const std::string what = Format("K/V block of ring step %d", step);
      Status st = order.Arrived(recv, what);
      if (st.ok()) st = order.Arrived(send, what);
      // After this step's compute in the backend's order, into the block the next step reads.
      if (st.ok() && !in.whole) st = be.CopyPieces(b.Into(step), stage[1], in.pieces, false);
      if (!st.ok()) return ctx.Fail(st);
    }
    // Ordered on the device, the host waits for the previous step's transfers while this one's
    // work runs.
    if (Status st = order.Retire(); !st.ok()) return ctx.Fail(st);
    times[static_cast<size_t>(step)] = timer.Finish();
    if (step == 0) AddCompute(pack_time, &times[0]);
  }
  Status st = be.ForwardEnd(c.out, c.lse);
  // The sinks join each finished row once, whatever the ring: after every block's merge.
  if (st.ok() && c.sinks_given) st = be.ApplySinks(c.sinks, c.out, c.lse);
  if (st.ok()) st = order.Finish();  // the last transfers, while the device finishes
  if (st.ok()) st = be.JoinDetached();
  if (st.ok()) st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria

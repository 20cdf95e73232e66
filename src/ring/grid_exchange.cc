#include "ring/grid_exchange.h"

#include <map>
#include <string>

#include "ring/ring_common.h"

namespace stria {
namespace {

DLDataType DLOf(DType t) {
  switch (t) {
    case DType::kF16:
      return DLDataType{kDLFloat, 16, 1};
    case DType::kBF16:
      return DLDataType{kDLBfloat, 16, 1};
    case DType::kF32:
      break;
  }
  return DLDataType{kDLFloat, 32, 1};
}

size_t ListBytes(const std::vector<Box>& boxes) {
  size_t n = 0;
  for (const Box& b : boxes) n += BoxBytes(b);
  return n;
}

}  // namespace

Box CompactBox(void* data, DType dtype, std::initializer_list<int64_t> dims) {
  Box b;
  b.data = data;
  b.dtype = dtype;
  b.dl_dtype = DLOf(dtype);
  b.ndim = static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) b.shape[i++] = d;
  int64_t stride = 1;
  for (int d = b.ndim - 1; d >= 0; --d) {
    b.strides[d] = stride;
    stride *= b.shape[d];
  }
  return b;
}

Box SubBox(const Box& box, int dim, int64_t begin, int64_t count) {
  Box b = box;
  b.data = static_cast<char*>(box.data) + begin * box.strides[dim] * box.elem_bytes();
  b.shape[dim] = count;
  return b;
}

size_t BoxBytes(const Box& box) {
  return static_cast<size_t>(box.numel() * box.elem_bytes());
}

size_t Exchange::SendBytes() const {
  size_t n = 0;
  for (const auto& boxes : to) n += ListBytes(boxes);
  return n;
}

size_t Exchange::ReceiveBytes() const {
  size_t n = 0;
  for (const auto& boxes : from) n += ListBytes(boxes);
  return n;
}

namespace {

// Where each member's message starts in the send and the receive buffer.
struct Offsets {
  std::vector<size_t> send, receive;
};
Offsets OffsetsOf(const Exchange& x) {
  Offsets o;
  size_t s = 0, r = 0;
  for (size_t m = 0; m < x.to.size(); ++m) {
    o.send.push_back(s);
    o.receive.push_back(r);
    s += ListBytes(x.to[m]);
    r += ListBytes(x.from[m]);
  }
  return o;
}

}  // namespace

Status PackExchange(Context& ctx, const Exchange& x, void* send, void* receive, void* stream) {
  const int U = ctx.ulysses_size(), u = ctx.group_rank();
  const Offsets at = OffsetsOf(x);
  Status st;
  for (int m = 0; m < U && st.ok(); ++m) {
    const size_t mm = static_cast<size_t>(m);
    char* dst = m == u ? static_cast<char*>(receive) + at.receive[mm] : static_cast<char*>(send) + at.send[mm];
    for (const Box& b : x.to[mm]) {
      if (st.ok()) st = ctx.backend().PackBox(b, dst, stream);
      dst += BoxBytes(b);
    }
  }
  return st.ok() ? st : ctx.Fail(st);
}

Status PostExchange(Context& ctx, uint64_t seq, int phase, const Exchange& x, void* send, void* receive,
                    PendingExchange* pending) {
  const int U = ctx.ulysses_size(), u = ctx.group_rank(), base = ctx.ring_rank() * U;
  Transport& tr = ctx.transport();
  const int64_t tag = RingTag(seq, phase, MessageKind::kGrid);
  const Offsets at = OffsetsOf(x);
  pending->recvs.assign(static_cast<size_t>(U), 0);
  pending->sends.assign(static_cast<size_t>(U), 0);
  // In rounds: at round i every member receives from the member i before it and sends to the one i
  // after it, a shift of the group, posted as a pair. So no one member's link takes every first
  // message, and a transport that launches a receive together with a send (NCCL: one group per
  // pair, the ring's own pattern) never holds a send that a peer's posted receive waits for.
  Status st;
  for (int i = 1; i < U && st.ok(); ++i) {
    const size_t from = static_cast<size_t>((u - i + U) % U), to = static_cast<size_t>((u + i) % U);
    st = tr.Irecv(base + static_cast<int>(from), tag, static_cast<char*>(receive) + at.receive[from],
                  ListBytes(x.from[from]), &pending->recvs[from]);
    const size_t bytes = ListBytes(x.to[to]);
    if (st.ok()) st = ctx.CheckNotAborted();
    if (st.ok())
      st = tr.Isend(base + static_cast<int>(to), tag, static_cast<char*>(send) + at.send[to], bytes,
                    &pending->sends[to]);
    if (st.ok()) {
      ctx.traffic().all_to_all_bytes += bytes;
      ++ctx.traffic().messages;
    }
  }
  return st.ok() ? st : ctx.Fail(st);
}

Status FinishExchange(Context& ctx, RingOrder& order, const char* what, const Exchange& x,
                      const PendingExchange& pending, void* receive, void* stream) {
  const int U = ctx.ulysses_size(), u = ctx.group_rank(), base = ctx.ring_rank() * U;
  Status st;
  for (int m = 0; m < U && st.ok(); ++m) {
    if (m == u) continue;
    st = order.Arrived(pending.recvs[static_cast<size_t>(m)], Format("%s from rank %d", what, base + m));
  }
  for (int m = 0; m < U && st.ok(); ++m) {
    if (m == u) continue;
    st = order.Arrived(pending.sends[static_cast<size_t>(m)], Format("%s to rank %d", what, base + m));
  }
  if (!st.ok()) return ctx.Fail(st);
  // Unpack, member by member; a box that several members fill (a shared K/V head's gradient) once,
  // with their sum in member order. Every member's message has the same layout (the members hold
  // equal shares of heads and tokens), so the parts of one box lie one message apart.
  const Offsets at = OffsetsOf(x);
  std::map<const void*, std::vector<const char*>> sums;
  std::vector<const Box*> boxes;  // in the order first met
  for (int m = 0; m < U; ++m) {
    const char* src = static_cast<const char*>(receive) + at.receive[static_cast<size_t>(m)];
    for (const Box& b : x.from[static_cast<size_t>(m)]) {
      auto& list = sums[b.data];
      if (list.empty()) boxes.push_back(&b);
      list.push_back(src);
      src += BoxBytes(b);
    }
  }
  for (const Box* b : boxes) {
    const auto& srcs = sums[b->data];
    const size_t step = srcs.size() > 1 ? static_cast<size_t>(srcs[1] - srcs[0]) : 0;
    for (size_t k = 2; k < srcs.size(); ++k)
      if (static_cast<size_t>(srcs[k] - srcs[k - 1]) != step)
        return ctx.Fail(Error(STRIA_ERROR_INTERNAL, "a grid's exchange summed parts at uneven strides"));
    st = ctx.backend().SumIntoBox(srcs[0], step, static_cast<int>(srcs.size()), *b, stream);
    if (!st.ok()) return ctx.Fail(st);
  }
  st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria

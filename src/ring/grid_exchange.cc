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

Status RunExchange(Context& ctx, uint64_t seq, int phase, const char* what, const Exchange& x, void* send,
                   void* receive, void* stream) {
  const int U = ctx.ulysses_size(), u = ctx.group_rank(), base = ctx.ring_rank() * U;
  Transport& tr = ctx.transport();
  Backend& be = ctx.backend();
  const int64_t tag = RingTag(seq, phase, MessageKind::kGrid);
  std::vector<size_t> send_at(static_cast<size_t>(U)), receive_at(static_cast<size_t>(U));
  size_t s = 0, r = 0;
  for (int m = 0; m < U; ++m) {
    send_at[static_cast<size_t>(m)] = s;
    receive_at[static_cast<size_t>(m)] = r;
    s += ListBytes(x.to[static_cast<size_t>(m)]);
    r += ListBytes(x.from[static_cast<size_t>(m)]);
  }
  char* out = static_cast<char*>(send);
  char* in = static_cast<char*>(receive);
  std::vector<RequestId> recvs(static_cast<size_t>(U)), sends(static_cast<size_t>(U));
  // Every message packed first (its own share straight to where it is unpacked from), then one
  // fence: an asynchronous backend packs on the call's stream, and the transport reads the buffers.
  Status st;
  for (int m = 0; m < U && st.ok(); ++m) {
    const size_t mm = static_cast<size_t>(m);
    char* dst = m == u ? in + receive_at[mm] : out + send_at[mm];
    for (const Box& b : x.to[mm]) {
      if (st.ok()) st = be.PackBox(b, dst, stream);
      dst += BoxBytes(b);
    }
  }
  if (st.ok()) st = be.SyncStream(stream);
  // In rounds: at round i every member receives from the member i before it and sends to the one i
  // after it, a shift of the group, posted as a pair. So no one member's link takes every first
  // message, and a transport that launches a receive together with a send (NCCL: one group per
  // pair, the ring's own pattern) never holds a send that a peer's posted receive waits for.
  for (int i = 1; i < U && st.ok(); ++i) {
    const size_t from = static_cast<size_t>((u - i + U) % U), to = static_cast<size_t>((u + i) % U);
    st = tr.Irecv(base + static_cast<int>(from), tag, in + receive_at[from], ListBytes(x.from[from]), &recvs[from]);
    const size_t bytes = ListBytes(x.to[to]);
    if (st.ok()) st = ctx.CheckNotAborted();
    if (st.ok()) st = tr.Isend(base + static_cast<int>(to), tag, out + send_at[to], bytes, &sends[to]);
    if (st.ok()) {
      ctx.traffic().all_to_all_bytes += bytes;
      ++ctx.traffic().messages;
    }
  }
  for (int m = 0; m < U && st.ok(); ++m) {
    if (m == u) continue;
    const std::string text = Format("%s from rank %d", what, base + m);
    st = tr.Wait(recvs[static_cast<size_t>(m)], ctx.timeout_s(), text.c_str());
  }
  for (int m = 0; m < U && st.ok(); ++m) {
    if (m == u) continue;
    const std::string text = Format("%s to rank %d", what, base + m);
    st = tr.Wait(sends[static_cast<size_t>(m)], ctx.timeout_s(), text.c_str());
  }
  if (!st.ok()) return ctx.Fail(st);
  // Unpack, member by member; a box that several members fill (a shared K/V head's gradient) once,
  // with their sum in member order. Every member's message has the same layout (the members hold
  // equal shares of heads and tokens), so the parts of one box lie one message apart.
  std::map<const void*, std::vector<const char*>> sums;
  std::vector<const Box*> order;
  for (int m = 0; m < U; ++m) {
    const char* src = in + receive_at[static_cast<size_t>(m)];
    for (const Box& b : x.from[static_cast<size_t>(m)]) {
      auto& list = sums[b.data];
      if (list.empty()) order.push_back(&b);
      list.push_back(src);
      src += BoxBytes(b);
    }
  }
  for (const Box* b : order) {
    const auto& srcs = sums[b->data];
    const size_t step = srcs.size() > 1 ? static_cast<size_t>(srcs[1] - srcs[0]) : 0;
    for (size_t k = 2; k < srcs.size(); ++k)
      if (static_cast<size_t>(srcs[k] - srcs[k - 1]) != step)
        return ctx.Fail(Error(STRIA_ERROR_INTERNAL, "a grid's exchange summed parts at uneven strides"));
    st = be.SumIntoBox(srcs[0], step, static_cast<int>(srcs.size()), *b, stream);
    if (!st.ok()) return ctx.Fail(st);
  }
  st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria

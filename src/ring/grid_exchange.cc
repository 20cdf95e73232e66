#include "ring/grid_exchange.h"

#include <cstring>
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

// Calls f(row pointer) for each innermost row of `box`, in row-major order; rows are contiguous
// (an attention tensor's last dimension always is).
template <typename F>
void ForEachRow(const Box& box, F f) {
  const int outer = box.ndim - 1;
  int64_t rows = 1;
  for (int d = 0; d < outer; ++d) rows *= box.shape[d];
  const int64_t elem = box.elem_bytes();
  int64_t index[kMaxDims] = {};
  for (int64_t i = 0; i < rows; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < outer; ++d) offset += index[d] * box.strides[d];
    f(static_cast<char*>(box.data) + offset * elem);
    for (int d = outer - 1; d >= 0; --d) {
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
  }
}

size_t RowBytes(const Box& box) {
  return static_cast<size_t>(box.shape[box.ndim - 1] * box.elem_bytes());
}

void PackBox(const Box& box, char* dst) {
  const size_t row = RowBytes(box);
  ForEachRow(box, [&](const char* p) {
    std::memcpy(dst, p, row);
    dst += row;
  });
}

void UnpackBox(const char* src, const Box& box) {
  const size_t row = RowBytes(box);
  ForEachRow(box, [&](char* p) {
    std::memcpy(p, src, row);
    src += row;
  });
}

float Load(DType t, const char* p) {
  uint16_t h;
  switch (t) {
    case DType::kF16:
      std::memcpy(&h, p, 2);
      return F16ToF32(h);
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return BF16ToF32(h);
    case DType::kF32:
      break;
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

void Store(DType t, float f, char* p) {
  uint16_t h;
  switch (t) {
    case DType::kF16:
      h = F32ToF16(f);
      std::memcpy(p, &h, 2);
      return;
    case DType::kBF16:
      h = F32ToBF16(f);
      std::memcpy(p, &h, 2);
      return;
    case DType::kF32:
      break;
  }
  std::memcpy(p, &f, 4);
}

// box = the sum of the compact copies at srcs, in their order (the same bits on every run).
void SumIntoBox(const std::vector<const char*>& srcs, const Box& box) {
  const int64_t width = box.shape[box.ndim - 1], elem = box.elem_bytes();
  size_t packed = 0;
  std::vector<float> acc(static_cast<size_t>(width));
  ForEachRow(box, [&](char* p) {
    for (int64_t j = 0; j < width; ++j) acc[static_cast<size_t>(j)] = 0.f;
    for (const char* s : srcs)
      for (int64_t j = 0; j < width; ++j) acc[static_cast<size_t>(j)] += Load(box.dtype, s + packed + j * elem);
    for (int64_t j = 0; j < width; ++j) Store(box.dtype, acc[static_cast<size_t>(j)], p + j * elem);
    packed += static_cast<size_t>(width * elem);
  });
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
                   void* receive) {
  const int U = ctx.ulysses_size(), u = ctx.group_rank(), base = ctx.ring_rank() * U;
  Transport& tr = ctx.transport();
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
  Status st;
  for (int m = 0; m < U && st.ok(); ++m) {
    if (m == u) continue;
    st = tr.Irecv(base + m, tag, in + receive_at[static_cast<size_t>(m)], ListBytes(x.from[static_cast<size_t>(m)]),
                  &recvs[static_cast<size_t>(m)]);
  }
  // Each member starts with the member after itself, so that no one member's link takes every
  // first message; its own share goes straight to where it is unpacked from.
  for (int i = 0; i < U && st.ok(); ++i) {
    const int m = (u + i) % U;
    const size_t mm = static_cast<size_t>(m);
    char* dst = m == u ? in + receive_at[mm] : out + send_at[mm];
    for (const Box& b : x.to[mm]) {
      PackBox(b, dst);
      dst += BoxBytes(b);
    }
    if (m == u) continue;
    const size_t bytes = ListBytes(x.to[mm]);
    st = ctx.CheckNotAborted();
    if (st.ok()) st = tr.Isend(base + m, tag, out + send_at[mm], bytes, &sends[mm]);
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
  // with their sum in member order.
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
    if (srcs.size() == 1)
      UnpackBox(srcs[0], *b);
    else
      SumIntoBox(srcs, *b);
  }
  Status done = ctx.CheckNotAborted();
  return done.ok() ? done : ctx.Fail(done);
}

}  // namespace stria

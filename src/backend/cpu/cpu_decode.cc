// Decode on the CPU: the queries of one K/V head's group are packed once (all their rows read each
// key block the kernel converts), and the rank's keys are cut into work items of about equal size
// over the sequences, so that one long sequence still spreads over every thread (the split of
// flash-decoding); an item takes every K/V head of its keys. Each item keeps its own softmax state
// per head; the states of a sequence's items are then merged in item order, so the result does not
// depend on which thread ran what.
#include "backend/cpu/cpu_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/decode_split.h"

namespace stria {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kDimPad = 16;  // a multiple of every kernel build's vector width
// Query rows a kernel call takes at most where a head's rows are many: a chunk's queries, states and
// scores (about 320 KB at D 128) stay in the core's caches over the item's keys.
constexpr int64_t kRowChunk = 256;

int64_t RoundUp(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Element (b, t, h, 0) of a [B, T, H, D] view.
const char* Row4(const TensorView& v, int64_t b, int64_t t, int64_t h) {
  return static_cast<const char*>(v.data) + (b * v.strides[0] + t * v.strides[1] + h * v.strides[2]) * v.elem_bytes();
}

// Asks for keys [j0, j0 + n) of `seg`, every head's row (K and V), to be brought into the cache
// while the block before them is converted and computed, so that the block's reads overlap the
// work before them.
void PrefetchKeyBlock(const CacheSegment& seg, int64_t j0, int64_t n, int64_t heads, int64_t row_bytes) {
  constexpr int64_t kLine = 64;
  for (int64_t j = j0; j < j0 + n; ++j)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t b = 0; b < row_bytes; b += kLine) {
        __builtin_prefetch(seg.k + h * seg.k_head + j * seg.k_row + b);
        __builtin_prefetch(seg.v + h * seg.v_head + j * seg.v_row + b);
      }
}

}  // namespace

void CpuStoreTokens(const DecodeShape& s, const std::vector<CacheAppend>& appends) {
  const size_t row = static_cast<size_t>(s.D * DTypeSize(s.dtype));
  for (const CacheAppend& a : appends)
    for (int64_t h = 0; h < s.Hkv; ++h) {
      std::memcpy(a.k_dst + h * a.k_dst_head, a.k_src + h * a.k_src_head, row);
      std::memcpy(a.v_dst + h * a.v_dst_head, a.v_src + h * a.v_src_head, row);
    }
}

Status CpuDecode(ThreadPool& pool, const cpu::KernelTable& kern, const DecodeWork& w, float* partial,
                 CpuDecodeBuffers* bufs) {
  const DecodeShape& s = w.shape;
  const int64_t group = s.Hq / s.Hkv, rows = s.T * group, dp = RoundUp(s.D, kDimPad);
  // The new tokens this rank holds go into the cache first: the queries see them.
  CpuStoreTokens(s, w.appends);

  // Queries, [B][Hkv][rows][dp], scaled into the kernel's log2 domain.
  const size_t qfloats = static_cast<size_t>(s.B * s.Hkv * rows * dp);
  STRIA_RETURN_IF_ERROR(bufs->q.Reserve(qfloats * 4, "packed decode queries"));
  float* qp = bufs->q.f32();
  const float qmul = s.scale * cpu::kLog2e;
  pool.ParallelFor(s.B * s.Hkv, [&](int64_t bg, int) {
    const int64_t b = bg / s.Hkv, g0 = bg % s.Hkv * group;
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = qp + (bg * rows + r) * dp;
      kern.load_row(Row4(w.q, b, r / group, g0 + r % group), static_cast<int>(s.dtype), s.D, qmul, dst);
      std::fill(dst + s.D, dst + dp, 0.f);
    }
  });

  const int64_t keys = DecodeKeyCount(w);
  // About four items per thread, but never so short that the per-item work (the state's setup and
  // merge) shows: 256 keys at least.
  const int64_t per_call = 4 * static_cast<int64_t>(pool.size());
  const int64_t target = std::max<int64_t>(256, (keys + per_call - 1) / per_call);
  std::vector<DecodeKeyPiece> pieces;
  std::vector<DecodeWorkItem> items;
  PlanDecodeItems(w, target, &pieces, &items);

  const int64_t state = rows * (dp + 2);  // m, l, acc of one item and head
  const int64_t nstates = static_cast<int64_t>(items.size()) * s.Hkv;
  STRIA_RETURN_IF_ERROR(bufs->states.Reserve(static_cast<size_t>(std::max<int64_t>(nstates * state, 1)) * 4,
                                             "decode work items' softmax states"));
  // An item walks its keys a block at a time with every K/V head inside where the heads' queries
  // and states are small (decode: a few rows a head). A cache row holds a key's heads side by side
  // ([.., Hkv, D]), so the block is converted to float32 for every head at once, reading its rows
  // in order (the next block asked for ahead), and each head's kernel takes its rows from there: a
  // head at a time would read a row's slice and stride over the others, a pattern the hardware's
  // prefetchers follow badly, and decode is bound by these reads. Where the heads' rows are many
  // (a prefill's), the item walks one head at a time, its rows in chunks of whole tokens that stay
  // in the core's caches over the item's keys (the products bound the time there, not the reads).
  constexpr int64_t kHeadsInsideBytes = 1 << 20;
  const bool heads_inside = s.Hkv * rows * dp * 8 <= kHeadsInsideBytes;
  const int64_t chunk = heads_inside ? rows : std::min(rows, std::max<int64_t>(1, kRowChunk / group) * group);
  const int64_t scratch_floats = RoundUp(cpu::DecodeScratchFloats(chunk, dp), 16);
  STRIA_RETURN_IF_ERROR(
      bufs->scratch.Reserve(static_cast<size_t>(pool.size() * scratch_floats) * 4, "decode key blocks"));
  const int64_t staged_floats = heads_inside ? 2 * s.Hkv * cpu::kDecodeKeys * dp : 0;  // K then V, [Hkv][keys][dp]
  if (heads_inside)
    STRIA_RETURN_IF_ERROR(
        bufs->staged.Reserve(static_cast<size_t>(pool.size() * staged_floats) * 4, "decode key blocks of every head"));
  float* states = bufs->states.f32();
  const float softcap2 = s.softcap > 0.f ? s.softcap * cpu::kLog2e : 0.f;
  const int64_t row_bytes = s.D * DTypeSize(s.dtype);
  pool.ParallelFor(static_cast<int64_t>(items.size()), [&](int64_t i, int tid) {
    const DecodeWorkItem& item = items[static_cast<size_t>(i)];
    cpu::DecodeChunkArgs a{};
    a.group = group;
    a.dtype = static_cast<int>(s.dtype);
    a.d = s.D;
    a.dp = dp;
    a.causal = s.causal;
    a.window_left = s.window_left;
    a.softcap2 = softcap2;
    a.scratch = bufs->scratch.f32() + tid * scratch_floats;
    // Rows [r0, r0 + n) of head hkv: their queries, positions and states.
    auto rows_of = [&](int64_t hkv, int64_t r0, int64_t n) {
      float* st = states + (i * s.Hkv + hkv) * state;
      a.rows = n;
      a.q = qp + ((item.b * s.Hkv + hkv) * rows + r0) * dp;
      a.q_pos = w.q_pos.data() + item.b * s.T + r0 / group;
      a.m = st + r0;
      a.l = st + rows + r0;
      a.acc = st + 2 * rows + r0 * dp;
    };
    if (heads_inside) {
      float* staged_k = bufs->staged.f32() + tid * staged_floats;
      float* staged_v = staged_k + staged_floats / 2;
      for (int64_t p = item.first; p < item.last; ++p) {
        const DecodeKeyPiece& piece = pieces[static_cast<size_t>(p)];
        const CacheSegment& seg = w.segments[static_cast<size_t>(piece.seg)];
        a.pos_stride = seg.pos_stride;
        for (int64_t j = 0; j < piece.count; j += cpu::kDecodeKeys) {
          const int64_t j0 = piece.j0 + j, n = std::min(cpu::kDecodeKeys, piece.count - j);
          PrefetchKeyBlock(seg, j0 + n, std::min(cpu::kDecodeKeys, piece.count - j - n), s.Hkv, row_bytes);
          for (int64_t r = 0; r < n; ++r)
            for (int64_t h = 0; h < s.Hkv; ++h) {
              float* kd = staged_k + (h * cpu::kDecodeKeys + r) * dp;
              float* vd = staged_v + (h * cpu::kDecodeKeys + r) * dp;
              kern.load_row(seg.k + h * seg.k_head + (j0 + r) * seg.k_row, static_cast<int>(s.dtype), s.D, 1.0f, kd);
              kern.load_row(seg.v + h * seg.v_head + (j0 + r) * seg.v_row, static_cast<int>(s.dtype), s.D, 1.0f, vd);
              std::fill(kd + s.D, kd + dp, 0.f);
              std::fill(vd + s.D, vd + dp, 0.f);
            }
          a.count = n;
          a.pos0 = seg.pos0 + j0 * seg.pos_stride;
          a.init = p == item.first && j == 0;
          for (int64_t hkv = 0; hkv < s.Hkv; ++hkv) {
            rows_of(hkv, 0, rows);
            a.k32 = staged_k + hkv * cpu::kDecodeKeys * dp;
            a.v32 = staged_v + hkv * cpu::kDecodeKeys * dp;
            kern.decode_chunk(a);
          }
        }
      }
      return;
    }
    for (int64_t hkv = 0; hkv < s.Hkv; ++hkv)
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        rows_of(hkv, r0, std::min(chunk, rows - r0));
        for (int64_t p = item.first; p < item.last; ++p) {
          const DecodeKeyPiece& piece = pieces[static_cast<size_t>(p)];
          const CacheSegment& seg = w.segments[static_cast<size_t>(piece.seg)];
          a.k = seg.k + hkv * seg.k_head + piece.j0 * seg.k_row;
          a.v = seg.v + hkv * seg.v_head + piece.j0 * seg.v_row;
          a.k_stride = seg.k_row;
          a.v_stride = seg.v_row;
          a.count = piece.count;
          a.pos0 = seg.pos0 + piece.j0 * seg.pos_stride;
          a.pos_stride = seg.pos_stride;
          a.init = p == item.first;
          kern.decode_chunk(a);
        }
      }
  });

  // Merge each sequence's items in order into the rank's partial records (a sequence without keys
  // here: output 0, LSE -inf).
  std::vector<int64_t> first_item(static_cast<size_t>(s.B + 1), 0);
  for (const DecodeWorkItem& item : items) ++first_item[static_cast<size_t>(item.b + 1)];
  for (int64_t b = 0; b < s.B; ++b) first_item[static_cast<size_t>(b + 1)] += first_item[static_cast<size_t>(b)];
  const int64_t rec = s.D + 1;
  pool.ParallelFor(s.B * s.Hkv, [&](int64_t bg, int) {
    const int64_t b = bg / s.Hkv, hkv = bg % s.Hkv;
    const int64_t i0 = first_item[static_cast<size_t>(b)], i1 = first_item[static_cast<size_t>(b + 1)];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r / group, h = hkv * group + r % group;
      float* out = partial + ((b * s.T + t) * s.Hq + h) * rec;
      float mx = kNegInf;
      bool nan = false;
      for (int64_t i = i0; i < i1; ++i) {
        const float m = states[(i * s.Hkv + hkv) * state + r];
        nan |= m != m;
        mx = std::max(mx, m);
      }
      if (nan) mx = std::numeric_limits<float>::quiet_NaN();
      std::fill(out, out + s.D, 0.f);
      if (mx == kNegInf) {
        out[s.D] = kNegInf;
        continue;
      }
      float l = 0.f;
      for (int64_t i = i0; i < i1; ++i) {
        const float* st = states + (i * s.Hkv + hkv) * state;
        if (st[r] == kNegInf) continue;
        const float c = std::exp2(st[r] - mx);
        l += st[rows + r] * c;
        const float* acc = st + 2 * rows + r * dp;
        for (int64_t d = 0; d < s.D; ++d) out[d] += acc[d] * c;
      }
      const float inv = 1.0f / l;
      for (int64_t d = 0; d < s.D; ++d) out[d] *= inv;
      out[s.D] = (mx + std::log2(l)) * cpu::kLn2;
    }
  });
  return Status::Ok();
}

Status CpuDecodeMerge(ThreadPool& pool, const cpu::KernelTable& kern, const DecodeWork& w, const float* all,
                      int world_size, const TensorView* sinks, const TensorView& out, const TensorView* lse) {
  const DecodeShape& s = w.shape;
  const int64_t rec = s.D + 1;
  const size_t stride = DecodePartialFloats(s);
  const int64_t esize = DTypeSize(s.dtype);
  pool.ParallelFor(s.B * s.T, [&](int64_t bt, int) {
    const int64_t b = bt / s.T, t = bt % s.T;
    std::vector<float> o(static_cast<size_t>(s.D));
    for (int64_t h = 0; h < s.Hq; ++h) {
      double z = 0.0;
      if (sinks != nullptr) z = static_cast<const float*>(sinks->data)[h * sinks->strides[0]];
      const double lse_row = MergeDecodeRecord(all, stride, world_size, s.D, static_cast<size_t>((bt * s.Hq + h) * rec),
                                               sinks != nullptr ? &z : nullptr, o.data());
      char* dst = static_cast<char*>(out.data) + (b * out.strides[0] + t * out.strides[1] + h * out.strides[2]) * esize;
      kern.store_row(o.data(), s.D, 1.0f, static_cast<int>(s.dtype), dst);
      if (lse != nullptr)
        static_cast<float*>(lse->data)[b * lse->strides[0] + h * lse->strides[1] + t * lse->strides[2]] =
            static_cast<float>(lse_row);
    }
  });
  return Status::Ok();
}

}  // namespace stria

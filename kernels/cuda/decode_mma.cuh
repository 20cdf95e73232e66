// Decode on the tensor cores (mma.sync m16n8k16): the contract of DecodeKernel (decode.cuh), for
// 16-bit caches whose K and V rows are whole 16-byte chunks (DecodePiece::rows16) at the
// tensor-core head dims.
//
// Decode reads each cached key once and does little arithmetic per byte, so what sets its speed is
// how many bytes are in flight. A CTA takes one work item for one K/V head and a chunk of its query
// rows (the head's GQA group times the new tokens), and streams the item's keys through shared
// memory in tiles of 64 with cp.async, kStages tiles deep, so that the next tiles' loads run while
// the warps work on this one. Scores and products run on the tensor cores straight from the 16-bit
// tiles (ldmatrix), with nothing converted in shared memory. Two forms:
//  - narrow (up to 16 rows, one m16 tile, its unused rows zero: a token or two of a GQA group): the
//    four warps split each tile's keys (16 each) and keep a softmax state of their own over the
//    whole item: no warp waits for another within a tile, and their states meet once, at the end;
//  - wide (more rows: several new tokens, a prefill's step, a wide group): 64 rows, an m16 tile per
//    warp, each warp over all 64 keys of every tile, so that a tile read once serves four times the
//    rows (a head with many rows would otherwise read its keys once per 16 rows); each warp's state
//    is its rows' own, written as it is.
#pragma once

#include "cuda/decode_params.h"
#include "cuda/decode_span.cuh"
#include "cuda/elem_access.cuh"
#include "cuda/mma_common.cuh"

namespace stria {
namespace cuda {

template <int D, bool kWide>
struct DecodeMmaTile {
  static constexpr int kThreads = 128, kWarps = 4;
  static constexpr int kRows = kWide ? kDecodeMmaWideRows : kDecodeMmaRows;  // query rows per CTA
  static constexpr int kKeys = 64;                                           // keys per tile
  static constexpr int kWarpKeys = kWide ? kKeys : kKeys / kWarps;           // a warp's keys of a tile
  static_assert(kRows == (kWide ? 16 * kWarps : 16), "an m16 tile per warp, or one for the CTA");
  static constexpr int kStages = 3;
  static constexpr int kStride = SmemRow<D>::kStride;
  static constexpr int kTileElems = kKeys * kStride;  // one K (or V) tile of 16-bit values
  static constexpr int kStageBytes = 2 * kTileElems * 2;
  // The narrow form's warp states at the end (maximum, sum, D outputs per row), over the stages.
  static constexpr int kMergeBytes = kWide ? 0 : kWarps * kRows * (D + 2) * 4;
  static constexpr int kSmemBytes = kStages * kStageBytes > kMergeBytes ? kStages* kStageBytes : kMergeBytes;
};

// Where a CTA is in its item's keys: piece p, keys from j0 (a tile is up to kKeys of them).
struct DecodeCursor {
  int64_t p, j0;
};

// The first tile at or after *c that some row sees (c->p == item.last: none left).
template <int kKeys>
STRIA_DEVICE void SeekSeenTile(const DecodeArgs& a, const DecodeItem& item, const DecodeSpan& span, DecodeCursor* c) {
  while (c->p < item.last) {
    const DecodePiece& pc = a.pieces[c->p];
    if (c->j0 < pc.count) {
      const int n = static_cast<int>(pc.count - c->j0 < kKeys ? pc.count - c->j0 : kKeys);
      int lo, hi;
      span.SeenKeys(a, pc.pos0 + c->j0 * pc.pos_stride, pc.pos_stride, n, &lo, &hi);
      if (lo < hi) return;
      c->j0 += kKeys;
    } else {
      ++c->p;
      c->j0 = 0;
    }
  }
}

template <typename T, int D, bool kWide>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128) DecodeMmaKernel(DecodeArgs a) {
  using Tile = DecodeMmaTile<D, kWide>;
  constexpr int kKeys = Tile::kKeys, kStages = Tile::kStages, kStride = Tile::kStride, kThreads = Tile::kThreads;
  constexpr int kWarpKeys = Tile::kWarpKeys, kNt = kWarpKeys / 8;
  STRIA_DYNAMIC_SMEM(smem);
  uint16_t* tiles = reinterpret_cast<uint16_t*>(smem);  // stage st: K at 2 st kTileElems, then V

  const int group = a.Hq / a.Hkv, rows = a.T * group;
  const int64_t item_index = blockIdx.x;
  const int hkv = static_cast<int>(blockIdx.y), r0 = static_cast<int>(blockIdx.z) * Tile::kRows;
  const int nr = rows - r0 < Tile::kRows ? rows - r0 : Tile::kRows;
  const DecodeItem item = a.items[item_index];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // The warp's m16 tile of the CTA's rows, and its keys of each tile.
  const int row0 = kWide ? 16 * warp : 0, key0 = kWide ? 0 : kWarpKeys * warp;

  // This thread's two rows (g, g + 8) of the warp's m16 tile: their query positions, and Q as A
  // fragments (rows past nr are zero and see nothing).
  int64_t qpos[2];
  bool row_in[2];
  for (int e = 0; e < 2; ++e) {
    const int r = row0 + g + 8 * e;
    row_in[e] = r < nr;
    qpos[e] = row_in[e] ? a.q_pos[item.b * a.T + (r0 + r) / group] : 0;
  }
  uint32_t qa[D / 16][4];
  STRIA_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    STRIA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int e = i & 1, col = 16 * kk + 8 * (i >> 1) + 2 * t4;
      float lo = 0.f, hi = 0.f;
      if (row_in[e]) {
        const int row = r0 + row0 + g + 8 * e, t = row / group, h = hkv * group + row % group;
        const int64_t at = item.b * a.qb + t * a.qt + h * a.qh + col;
        lo = LoadElem<T>(a.q, at);
        hi = LoadElem<T>(a.q, at + 1);
      }
      qa[kk][i] = pack2<T>(lo, hi);
    }
  }
  // The CTA's span, from every row's position (the same for every thread).
  DecodeSpan span{INT64_MAX, INT64_MIN};
  for (int r = 0; r < nr; ++r) {
    const int64_t p = a.q_pos[item.b * a.T + (r0 + r) / group];
    span.q_first = p < span.q_first ? p : span.q_first;
    span.q_last = p > span.q_last ? p : span.q_last;
  }

  // Tile loads: every thread a share of the tile's 16-byte chunks. Keys past the piece's end and
  // keys no row sees (DecodeSpan::SeenKeys) are zero-filled and never read: their scores are
  // masked, and a zero row keeps NaN out of P V, where their probability of 0 meets V.
  auto load_tile = [&](const DecodeCursor& c, int st) {
    const DecodePiece& pc = a.pieces[c.p];
    const int n = static_cast<int>(pc.count - c.j0 < kKeys ? pc.count - c.j0 : kKeys);
    int lo, hi;
    span.SeenKeys(a, pc.pos0 + c.j0 * pc.pos_stride, pc.pos_stride, n, &lo, &hi);
    const char* kb = pc.k + hkv * pc.k_head + c.j0 * pc.k_row;
    const char* vb = pc.v + hkv * pc.v_head + c.j0 * pc.v_row;
    uint16_t* ks = tiles + 2 * st * Tile::kTileElems;
    uint16_t* vs = ks + Tile::kTileElems;
    constexpr int kChunks = D / 8;
    for (int x = tid; x < kKeys * kChunks; x += kThreads) {
      const int j = x / kChunks, col = (x % kChunks) * 8;
      const bool valid = lo <= j && j < hi;
      const int64_t jj = valid ? j : 0;
      cp_async_16(ks + j * kStride + col, kb + jj * pc.k_row + col * 2, valid);
      cp_async_16(vs + j * kStride + col, vb + jj * pc.v_row + col * 2, valid);
    }
  };
  auto advance = [&](DecodeCursor* c) {
    c->j0 += kKeys;
    SeekSeenTile<kKeys>(a, item, span, c);
  };

  DecodeCursor load{item.first, 0};
  SeekSeenTile<kKeys>(a, item, span, &load);
  DecodeCursor comp = load;
  // kStages - 1 tiles ahead; a group is committed for every slot, loaded or not, so that the
  // count of groups in flight says which tile has landed.
  for (int st = 0; st < kStages - 1; ++st) {
    if (load.p < item.last) {
      load_tile(load, st);
      advance(&load);
    }
    cp_async_commit();
  }

  float o[D / 8][4];
  STRIA_UNROLL
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {NegInf(), NegInf()}, l_run[2] = {0.f, 0.f};  // l: this lane's columns only

  for (int t = 0; comp.p < item.last; ++t) {
    cp_async_wait<kStages - 2>();
    block_sync();  // tile t landed for every thread; every warp is done with tile t - 1's stage
    if (load.p < item.last) {
      load_tile(load, (t + kStages - 1) % kStages);
      advance(&load);
    }
    cp_async_commit();

    const uint16_t* ks = tiles + 2 * (t % kStages) * Tile::kTileElems;
    const uint16_t* vs = ks + Tile::kTileElems;
    const DecodePiece& pc = a.pieces[comp.p];
    const int64_t n = pc.count - comp.j0 < kKeys ? pc.count - comp.j0 : kKeys;
    const int64_t pos_first = pc.pos0 + comp.j0 * pc.pos_stride, pos_stride = pc.pos_stride;
    advance(&comp);

    // S (the warp's 16 rows x its keys of the tile) = Q K^T.
    float s[kNt][4];
    STRIA_UNROLL
    for (int nt = 0; nt < kNt; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    STRIA_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
      STRIA_UNROLL
      for (int kt = 0; kt < kNt / 2; ++kt) {
        uint32_t kb[4];
        LoadBFromRowsN<kStride>(kb, ks, key0 + 16 * kt, 16 * kk);
        mma_16816<T>(s[2 * kt], qa[kk], kb);
        mma_16816<T>(s[2 * kt + 1], qa[kk], kb + 2);
      }
    }
    // Scaled (and capped) scores, masked: keys past the tile's end, rows past nr, the causal and
    // window bounds. Element c of n-tile nt: row g + 8 (c >> 1), key key0 + 8 nt + 2 t4 + (c & 1).
    WithSoftcap(a.softcap, [&](auto cap) {
      constexpr bool kCapped = decltype(cap)::kCapped;
      STRIA_UNROLL
      for (int nt = 0; nt < kNt; ++nt) {
        STRIA_UNROLL
        for (int c = 0; c < 4; ++c) {
          const int e = c >> 1, j = key0 + 8 * nt + 2 * t4 + (c & 1);
          const int64_t kpos = pos_first + j * pos_stride;
          const bool hidden = j >= n || !row_in[e] || (a.causal && kpos > qpos[e]) ||
                              (a.window_left >= 0 && qpos[e] - kpos > a.window_left);
          s[nt][c] = hidden ? NegInf() : Log2ScoreOf<kCapped>(s[nt][c], a.scale_log2, a.softcap);
        }
      }
    });
    // The online softmax of this warp's state (OnlineMaxStep: the 4 lanes of a row agree).
    float alpha[2], base[2];
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) {
      float mx = NegInf();
      STRIA_UNROLL
      for (int nt = 0; nt < kNt; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * e], s[nt][2 * e + 1]));
      alpha[e] = OnlineMaxStep(mx, &m_run[e], &base[e]);
      l_run[e] *= alpha[e];
    }
    STRIA_UNROLL
    for (int nt = 0; nt < kNt; ++nt) {
      STRIA_UNROLL
      for (int c = 0; c < 4; ++c) {
        s[nt][c] = fast_exp2(s[nt][c] - base[c >> 1]);
        l_run[c >> 1] += s[nt][c];
      }
    }
    STRIA_UNROLL
    for (int i = 0; i < D / 8; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }
    // O += P V: P (16 rows x 16 keys at a time) as the A fragment, V's rows of those keys as B.
    STRIA_UNROLL
    for (int kt = 0; kt < kNt / 2; ++kt) {
      uint32_t pa[4];
      AccToA<T>(pa, s[2 * kt], s[2 * kt + 1]);
      STRIA_UNROLL
      for (int dt = 0; dt < D / 16; ++dt) {
        uint32_t vb[4];
        LoadBFromRowsK<kStride>(vb, vs, key0 + 16 * kt, 16 * dt);
        mma_16816<T>(o[2 * dt], pa, vb);
        mma_16816<T>(o[2 * dt + 1], pa, vb + 2);
      }
    }
  }
  if constexpr (kWide) {
    // Each warp's rows are its own: their states go out as they are. A NaN score leaves the row's
    // sum NaN, maybe beside a maximum of -inf: the whole state is NaN then, as the narrow form's
    // merge writes it, so that the items' merge cannot take the row for one that saw nothing.
    cp_async_wait<0>();
    float* st = a.states + ((item_index * a.Hkv + hkv) * rows + r0) * static_cast<int64_t>(D + 2);
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) {
      float l = l_run[e];
      l += shfl_xor(l, 1);
      l += shfl_xor(l, 2);
      const int r = row0 + g + 8 * e;
      if (r >= nr) continue;
      const bool nan = l != l || m_run[e] != m_run[e];
      float* row = st + r * static_cast<int64_t>(D + 2);
      if (t4 == 0) {
        row[0] = nan ? NaN() : m_run[e];
        row[1] = nan ? NaN() : l;
      }
      STRIA_UNROLL
      for (int i = 0; i < D / 8; ++i) {
        row[2 + 8 * i + 2 * t4] = nan ? NaN() : o[i][2 * e];
        row[2 + 8 * i + 2 * t4 + 1] = nan ? NaN() : o[i][2 * e + 1];
      }
    }
  } else {
    cp_async_wait<0>();
    block_sync();  // every warp is done with the stages: the states take their space

    // The warps' states meet: per warp and row the maximum, the sum and the D outputs.
    float* ms = reinterpret_cast<float*>(smem);   // [kWarps][kRows]
    float* ls = ms + Tile::kWarps * Tile::kRows;  // [kWarps][kRows]
    float* os = ls + Tile::kWarps * Tile::kRows;  // [kWarps][kRows][D]
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) {
      float l = l_run[e];
      l += shfl_xor(l, 1);
      l += shfl_xor(l, 2);
      const int r = g + 8 * e;
      if (t4 == 0) {
        ms[warp * Tile::kRows + r] = m_run[e];
        ls[warp * Tile::kRows + r] = l;
      }
      STRIA_UNROLL
      for (int i = 0; i < D / 8; ++i) {
        float* dst = os + (warp * Tile::kRows + r) * D + 8 * i + 2 * t4;
        dst[0] = o[i][2 * e];
        dst[1] = o[i][2 * e + 1];
      }
    }
    block_sync();
    float* st = a.states + ((item_index * a.Hkv + hkv) * rows + r0) * static_cast<int64_t>(D + 2);
    for (int x = tid; x < nr * D; x += kThreads) {
      const int r = x / D, d = x % D;
      float mx = NegInf();
      bool nan = false;  // a NaN score leaves its warp's sum NaN, maybe beside a maximum of -inf
      for (int w = 0; w < Tile::kWarps; ++w) {
        const float mw = ms[w * Tile::kRows + r], lw = ls[w * Tile::kRows + r];
        nan |= mw != mw || lw != lw;
        mx = fmaxf(mx, mw);
      }
      float acc = 0.f, sum = 0.f;
      if (nan) {
        mx = acc = sum = NaN();
      } else if (mx != NegInf()) {
        for (int w = 0; w < Tile::kWarps; ++w) {
          const float mw = ms[w * Tile::kRows + r];
          if (mw == NegInf()) continue;  // a warp none of whose keys this row sees
          const float c = fast_exp2(mw - mx);
          acc += c * os[(w * Tile::kRows + r) * D + d];
          sum += c * ls[w * Tile::kRows + r];
        }
      }
      st[r * static_cast<int64_t>(D + 2) + 2 + d] = acc;
      if (d == 0) {
        st[r * static_cast<int64_t>(D + 2)] = mx;
        st[r * static_cast<int64_t>(D + 2) + 1] = sum;
      }
    }
  }
}

}  // namespace cuda
}  // namespace stria

// Hopper backward tile kernel for head dim 256 (Gemma's), wgmma.mma_async, sm_90a: the contract
// of wgmma_backward.cuh (one ring block's dK/dV in fp32 and its dQ share added into dq_acc), with
// the work split another way, because at D 256 a warpgroup cannot hold dK and dV of its 64 keys
// over every column (2 x 128 accumulators a thread, past the 255 registers a thread may have).
//
// A CTA of two warpgroups owns 64 keys of one K/V head; warpgroup w owns columns 128 w .. of
// their dK and dV (64 + 64 accumulators a thread) and of the dQ it adds. Per query tile of 64
// queries, with P^T = exp2(K Q^T * scale_log2 - lse2):
//   S^T = K Q^T, dP^T = V dO^T   warpgroup w: all 64 keys x its 32 queries (N 32), every column;
//   P^T, dS^T                    in registers, then stored to shared memory (keys x queries), so
//                                that after one barrier each warpgroup reads the whole of both;
//   dV += P^T dO, dK += dS^T Q   A from shared memory (K-major), B MN-major, the warpgroup's 128
//                                columns of dO and Q;
//   dQ = dS K                    dS^T read MN-major, K's columns of the warpgroup, 64 at a time,
//                                added to dq_acc with float atomics (not in the deterministic
//                                backward's dK/dV pass, kDq false: its dQ pass is a kernel of its
//                                own, wgmma_backward_dq.cuh).
// No product is computed twice: S^T and dP^T are split by queries between the warpgroups, the
// three others by columns. Shared memory (210 KB): K and V (32 KB each), Q and dO in two stages
// (the next query tile's cp.async runs under this one's products), P^T and dS^T (8 KB each), lse2
// and delta in two stages.
#pragma once

#include "cuda/mma_common.cuh"
#include "cuda/wgmma_api.cuh"
#include "cuda/wgmma_backward.cuh"

namespace stria {
namespace cuda {

template <int D>
struct WgmmaWideBwdTile {
  static constexpr int kThreads = 256, kN = 64, kM = 64;
  static constexpr int kCols = D / 2;  // the columns of dK, dV and dQ each warpgroup owns
  static constexpr int kKvBytes = kN * D * 2, kQBytes = kM * D * 2, kPBytes = kN * kM * 2;
  // K, V; Q and dO in two stages; P^T and dS^T; lse2 and delta in two stages; the alignment slack.
  static constexpr int kSmemBytes = 2 * kKvBytes + 4 * kQBytes + 2 * kPBytes + 4 * kM * 4 + kSwizzleAtomBytes;
};

#if STRIA_HAS_WGMMA  // WideBackwardStep issues wgmma: sm_90a (and the emulator) only
// One query tile (64 queries from i0) of warpgroup `wg`: see the top of the file. The tiles are in
// shared memory at the given window addresses (K, V: kN rows; Q, dO: kM rows; P^T, dS^T: kN rows of
// kM queries, `pts` and `dss`), the tile's lse2 and delta rows at `lse2`, `delta`. The caller's
// barrier before the step orders it after every read of P^T and dS^T by the step before.
template <typename T, int D, bool kDocs, bool kDq>
STRIA_DEVICE void WideBackwardStep(const BwdParams& p, const MaskArgs& mask, int64_t bh, int64_t j0, int wg, int64_t i0,
                                   uint32_t k_addr, uint32_t v_addr, uint32_t q_addr, uint32_t do_addr,
                                   unsigned char* pts, unsigned char* dss, const float* lse2, const float* delta,
                                   const int64_t key[2], float (&dk)[D / 4], float (&dv)[D / 4]) {
  using Tile = WgmmaWideBwdTile<D>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kCols = Tile::kCols, kQ = kM / 2;
  const int warp = (static_cast<int>(threadIdx.x) >> 5) & 3, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t pt_addr = smem_addr(pts), ds_addr = smem_addr(dss);

  // S^T and dP^T: every key, this warpgroup's queries kQ wg.. (rows kQ wg.. of Q and dO, K-major B).
  float sT[kQ / 2], dpT[kQ / 2];
  // The first k step's descriptors; each later one is a constant on (DescPlus).
  const uint64_t k_desc = SwizzledDesc(k_addr, 16, kSwizzleAtomBytes),
                 v_desc = SwizzledDesc(v_addr, 16, kSwizzleAtomBytes);
  const uint64_t q_desc = SwizzledDesc(q_addr + kQ * wg * kSwizzleBytes, 16, kSwizzleAtomBytes);
  const uint64_t do_desc = SwizzledDesc(do_addr + kQ * wg * kSwizzleBytes, 16, kSwizzleAtomBytes);
  wgmma_fence();
  STRIA_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    // Column block kk / 4 (64 values: rows x 128 bytes), then 32 bytes per 16 columns.
    const uint32_t kcol = static_cast<uint32_t>((kk & 3) * 32);
    const uint32_t kv_at = (kk >> 2) * kN * kSwizzleBytes + kcol, q_at = (kk >> 2) * kM * kSwizzleBytes + kcol;
    wgmma_ss<T, kQ>(sT, DescPlus(k_desc, kv_at), DescPlus(q_desc, q_at), kk > 0);
    wgmma_ss<T, kQ>(dpT, DescPlus(v_desc, kv_at), DescPlus(do_desc, q_at), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(sT);
  wgmma_fence_operand(dpT);

  // P^T and dS^T (accumulator element i: key row 16 warp + g + 8 ((i & 3) >> 1), query
  // kQ wg + 8 (i >> 2) + 2 t4 + (i & 1)) into shared memory, keys as rows.
  // As BackwardStep: the mask compiled out of whole tiles, each query's lse2 and delta loaded once.
  const bool whole = FullyVisible<kDocs>(mask, i0, i0 + kM, j0, j0 + kN);
  Window seen[2] = {Window{0, kM}, Window{0, kM}};
  if (!whole) {
    for (int e = 0; e < 2; ++e) seen[e] = SeeingQueries<kDocs>(mask, key[e], i0, kM);
  }
  WithSoftcap(p.softcap, [&](auto cap) {  // the test once per tile (softcap.cuh)
    constexpr bool kCapped = decltype(cap)::kCapped;
    WithWholeTile(whole, [&](auto all) {
      STRIA_UNROLL
      for (int i = 0; i < kQ / 2; i += 4) {
        const QueryPair l = QueryPairOf(lse2 + kQ * wg, i, t4), dl = QueryPairOf(delta + kQ * wg, i, t4);
        STRIA_UNROLL
        for (int c = 0; c < 4; ++c) {
          const int qi = kQ * wg + 8 * (i >> 2) + 2 * t4 + (c & 1);
          const bool vis = decltype(all)::kAll || In(seen[c >> 1], qi);
          float slope;
          const float pr =
              vis ? fast_exp2(Log2ScoreOf<kCapped>(sT[i + c], p.scale_log2, p.softcap, &slope) - (c & 1 ? l.hi : l.lo))
                  : 0.f;
          sT[i + c] = pr;
          dpT[i + c] = vis ? pr * (dpT[i + c] - (c & 1 ? dl.hi : dl.lo)) * slope : 0.f;
        }
      }
    });
  });
  STRIA_UNROLL
  for (int i = 0; i < kQ / 2; i += 2) {
    const int col = kQ * wg + 8 * (i >> 2) + 2 * t4, row = 16 * warp + g + 8 * ((i & 3) >> 1);
    *reinterpret_cast<uint32_t*>(pts + SwizzledOffset(kN, row, col)) = pack2<T>(sT[i], sT[i + 1]);
    *reinterpret_cast<uint32_t*>(dss + SwizzledOffset(kN, row, col)) = pack2<T>(dpT[i], dpT[i + 1]);
  }
  fence_proxy_async();
  block_sync();  // both warpgroups' halves of P^T and dS^T written and visible to wgmma

  // dV += P^T dO and dK += dS^T Q over this warpgroup's columns: A (keys x 16 queries) K-major at
  // 32 bytes per 16 queries; B (16 queries x kCols columns) MN-major from column block
  // kCols wg / 64, 2048 bytes per 16 rows, LBO the next 64 columns.
  const uint32_t col_at = (kCols * wg / 64) * kM * kSwizzleBytes;
  wgmma_fence_operand(dv);
  wgmma_fence_operand(dk);
  const uint64_t pt_desc = SwizzledDesc(pt_addr, 16, kSwizzleAtomBytes),
                 ds_desc = SwizzledDesc(ds_addr, 16, kSwizzleAtomBytes);
  const uint64_t do_cols = SwizzledDesc(do_addr + col_at, kM * kSwizzleBytes, kSwizzleAtomBytes);
  const uint64_t q_cols = SwizzledDesc(q_addr + col_at, kM * kSwizzleBytes, kSwizzleAtomBytes);
  wgmma_fence();
  STRIA_UNROLL
  for (int kq = 0; kq < kM / 16; ++kq) {
    const uint32_t a_at = kq * 32, b_at = kq * 16 * kSwizzleBytes;
    wgmma_ss_tb<T, kCols>(dv, DescPlus(pt_desc, a_at), DescPlus(do_cols, b_at), true);
    wgmma_ss_tb<T, kCols>(dk, DescPlus(ds_desc, a_at), DescPlus(q_cols, b_at), true);
  }
  wgmma_commit();
  if constexpr (!kDq) {
    wgmma_wait<0>();
    wgmma_fence_operand(dv);
    wgmma_fence_operand(dk);
  } else {
    // dQ (64 queries x 64 columns at a time) = dS (all kN keys) K (columns 64 cb..): A is dS^T
    // read MN-major, B is K's column block cb read MN-major. The first chunk's wait completes dV
    // and dK.
    STRIA_UNROLL
    for (int c = 0; c < kCols / 64; ++c) {
      const int cb = kCols * wg / 64 + c;
      float dq[32];
      IssueDsK<T, kN>(dq, ds_addr, k_addr, 0, cb);
      wgmma_wait<0>();
      wgmma_fence_operand(dq);
      wgmma_fence_operand(dv);
      wgmma_fence_operand(dk);
      AddDqAtomics<D>(p, bh, i0, dq, 0, cb);
    }
  }
}
#endif

template <typename T, int D, bool kDocs = false, bool kDq = true>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(256) WgmmaWideBackwardKernel(const BwdParams p) {
#if STRIA_HAS_WGMMA
  using Tile = WgmmaWideBwdTile<D>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kThreads = Tile::kThreads, kCols = Tile::kCols;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* ks = AlignToSwizzleAtom(smem_raw);
  unsigned char* vs = ks + Tile::kKvBytes;
  unsigned char* qs = vs + Tile::kKvBytes;      // stage st at qs + st * kQBytes
  unsigned char* dos = qs + 2 * Tile::kQBytes;  // likewise
  unsigned char* pts = dos + 2 * Tile::kQBytes;
  unsigned char* dss = pts + Tile::kPBytes;
  float* lse2s = reinterpret_cast<float*>(dss + Tile::kPBytes);  // [2][kM]
  float* deltas = lse2s + 2 * kM;                                // [2][kM]
  const uint32_t k_addr = smem_addr(ks), v_addr = smem_addr(vs);

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bhk = static_cast<int>(cta.head), b = bhk / d.Hkv, hk = bhk % d.Hkv;
  const int group = d.Hq / d.Hkv;
  const int64_t j0 = p.key_begin + static_cast<int64_t>(cta.tile) * kN;
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is.
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const TileRun queries = QueryTilesOf<kDocs>(mask, j0, MinI(j0 + kN, d.L), kM);
  if (queries.count == 0)
    return ZeroKeyGrads<T>(p, b, hk, j0, kN, Tile::kThreads);  // the whole CTA, before any barrier
  const int64_t i_first = queries.first;
  const int q_tiles = queries.count, steps = q_tiles * group;

  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const uint16_t* kg = static_cast<const uint16_t*>(p.k) + (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  const uint16_t* vg = static_cast<const uint16_t*>(p.v) + (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  LoadSwizzled<D, kThreads>(ks, kg, kv_row, j0, kN, d.L);
  LoadSwizzled<D, kThreads>(vs, vg, kv_row, j0, kN, d.L);

  // Step `s` is query tile s % q_tiles of query head hk * group + s / q_tiles: its Q and dO rows
  // into stage s & 1 (cp.async), and its lse2 and delta (plain stores, visible after a barrier).
  auto load_step = [&](int s) {
    const int h = hk * group + s / q_tiles, st = s & 1;
    const int64_t i0 = i_first + static_cast<int64_t>(s % q_tiles) * kM;
    const int64_t bh = static_cast<int64_t>(b) * d.Hq + h;
    LoadSwizzled<D, kThreads>(qs + st * Tile::kQBytes, static_cast<const uint16_t*>(p.q.data) + b * p.q.sb + h * p.q.sh,
                              p.q.sl, i0, kM, d.L);
    LoadSwizzled<D, kThreads>(dos + st * Tile::kQBytes,
                              static_cast<const uint16_t*>(p.dout.data) + b * p.dout.sb + h * p.dout.sh, p.dout.sl, i0,
                              kM, d.L);
    cp_async_commit();
    for (int r = tid; r < kM; r += kThreads) {
      const bool in = i0 + r < d.L;
      // +inf makes exp2(s - lse2) = 0 for rows past the end.
      lse2s[st * kM + r] = in ? p.lse2[bh * d.L + i0 + r] : PosInf();
      deltas[st * kM + r] = in ? p.delta[bh * d.L + i0 + r] : 0.f;
    }
  };
  load_step(0);

  // This thread's two keys (accumulator rows; both warpgroups hold the same 64 keys) and its dK/dV
  // over the warpgroup's columns (element 4 i + c: column kCols wg + 8 i + 2 t4 + (c & 1)).
  int64_t key[2];
  for (int e = 0; e < 2; ++e) key[e] = j0 + 16 * warp + g + 8 * e;
  float dk[kCols / 2], dv[kCols / 2];
  STRIA_UNROLL
  for (int i = 0; i < kCols / 2; ++i) dk[i] = dv[i] = 0.f;

  for (int s = 0; s < steps; ++s) {
    const int st = s & 1, h = hk * group + s / q_tiles;
    const int64_t i0 = i_first + static_cast<int64_t>(s % q_tiles) * kM;
    const int64_t bh = static_cast<int64_t>(b) * d.Hq + h;
    cp_async_wait<0>();
    fence_proxy_async();
    block_sync();  // this step's tiles landed; every reader of the other stage, P^T and dS^T is done
    if (s + 1 < steps) load_step(s + 1);
    WideBackwardStep<T, D, kDocs, kDq>(p, mask, bh, j0, wg, i0, k_addr, v_addr, smem_addr(qs) + st * Tile::kQBytes,
                                       smem_addr(dos) + st * Tile::kQBytes, pts, dss, lse2s + st * kM, deltas + st * kM,
                                       key, dk, dv);
  }

  StoreKeyGrads<T, kCols>(p, b, hk, key, t4, dk, dv, kCols * wg);
#else
  (void)p;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria

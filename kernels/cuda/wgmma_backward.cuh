// Hopper backward tile kernel (wgmma.mma_async, sm_90a): the same contract as mma_backward.cuh
// (one ring block's dK/dV in fp32 and its dQ share added into dq_acc), with warpgroup MMAs.
//
// A CTA of two warpgroups owns 128 keys of one K/V head (64 per warpgroup, the M of every key-row
// product) and walks the query tiles of every query head that shares it (GQA) and sees any of
// them. Per query tile of kM rows, with P^T = exp2(K Q^T * scale_log2 - lse2):
//   S^T = K Q^T, dP^T = V dO^T   both operands from shared memory (K-major descriptors);
//   dS^T = P^T (dP^T - delta)    in registers, where the accumulators are the next A operand;
//   dV += P^T dO, dK += dS^T Q   A from registers, B (dO, Q) MN-major from shared memory, with
//                                dK/dV accumulating in registers for the whole walk;
//   dQ = dS K                    dS^T goes to shared memory and is read back transposed (A
//                                MN-major), K as MN-major B; each warpgroup computes a 64 x 64
//                                half of the tile's dQ (query rows at D 64, head-dim columns at
//                                D 128) and adds it to dq_acc with float atomics.
// Q and dO tiles are double-buffered: the next tile's cp.async runs during this tile's products.
// Every step runs the same straight-line sequence of products in both warpgroups, with no skip
// for a warpgroup none of whose keys the tile's queries see (its masked P and dS are zero): such a
// step happens at most once per key tile and head (on a causal diagonal), and branches around
// wgmma make ptxas serialise them (warpgroup.arrive injection) on every step.
#pragma once

#include "cuda/mma_common.cuh"
#include "cuda/wgmma_api.cuh"

namespace stria {
namespace cuda {

template <int D>
struct WgmmaBwdTile {
  static constexpr int kThreads = 256, kN = 128;  // keys per CTA: 64 per warpgroup
  // Queries per step: S^T and dP^T (64 x kM per warpgroup) live in registers beside dK and dV
  // (64 x D each), so the larger head dim takes the shorter step.
  static constexpr int kM = D <= 64 ? 128 : 64;
  static constexpr int kKvBytes = kN * D * 2, kQBytes = kM * D * 2, kDsBytes = kN * kM * 2;
  // K, V; Q and dO in two stages; dS^T; lse2 and delta in two stages; the alignment slack.
  static constexpr int kSmemBytes = 2 * kKvBytes + 4 * kQBytes + kDsBytes + 4 * kM * 4 + kSwizzleAtomBytes;
};

// A thread's dK (times the softmax scale) and dV rows, from the accumulator layout of kCols
// columns from col0, into the block's partials or the call's result (key_grads.cuh).
template <typename T, int kCols>
STRIA_DEVICE void StoreKeyGrads(const BwdParams& p, int b, int hk, const int64_t key[2], int t4,
                                const float (&dk)[kCols / 2], const float (&dv)[kCols / 2], int col0 = 0) {
  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) {
    if (key[e] >= p.dims.L) continue;
    STRIA_UNROLL
    for (int nt = 0; nt < kCols / 8; ++nt) {
      const int c = col0 + 8 * nt + 2 * t4;
      StoreKeyGrad<T>(p, b, hk, key[e], c, dk[4 * nt + 2 * e] * p.scale, dv[4 * nt + 2 * e]);
      StoreKeyGrad<T>(p, b, hk, key[e], c + 1, dk[4 * nt + 2 * e + 1] * p.scale, dv[4 * nt + 2 * e + 1]);
    }
  }
}

#if STRIA_HAS_WGMMA  // BackwardStep issues wgmma: sm_90a (and the emulator) only
// dQ (64 x 64) = dS (rows 64 qb.., all kN keys) K (columns 64 cb..), issued and committed, not
// waited for: A is dS^T's column block qb (keys as rows, at `ds_addr`) read MN-major, B is K's
// column block cb (at `k_addr`) read MN-major.
template <typename T, int kN>
STRIA_DEVICE void IssueDsK(float (&dq)[32], uint32_t ds_addr, uint32_t k_addr, int qb, int cb) {
  const uint64_t da = SwizzledDesc(ds_addr + qb * kN * kSwizzleBytes, kN * kSwizzleBytes, kSwizzleAtomBytes);
  const uint64_t db = SwizzledDesc(k_addr + cb * kN * kSwizzleBytes, kN * kSwizzleBytes, kSwizzleAtomBytes);
  wgmma_fence();
  STRIA_UNROLL
  for (int kk = 0; kk < kN / 16; ++kk)
    wgmma_ss_tt<T, 64>(dq, DescPlus(da, kk * 16 * kSwizzleBytes), DescPlus(db, kk * 16 * kSwizzleBytes), kk > 0);
  wgmma_commit();
}

// Whether every (query, key) pair of a warpgroup's tile is visible, as a type: BackwardStep's score
// loops are compiled once with the element mask and once without (WithWholeTile), as WithSoftcap
// compiles them with and without the cap, the test made once per tile. Under a causal mask all but
// the tiles on the diagonal are whole, and the mask's two comparisons and select a score, in both
// the P^T and the dS^T pass, were about a tenth of a step's instructions (sm_90a SASS, D 128).
template <bool kWhole>
struct WholeTag {
  static constexpr bool kAll = kWhole;
};
template <typename F>
STRIA_DEVICE void WithWholeTile(bool whole, F&& f) {
  if (whole)
    f(WholeTag<true>{});
  else
    f(WholeTag<false>{});
}

// A thread's lse2 (or delta) values for accumulator elements i .. i + 3 (i a multiple of 4) of a
// 64-key tile: queries 8 (i / 4) + 2 t4 and the next (both of the thread's keys take the pair), in
// one 8-byte shared-memory load where each element used to load its own.
struct alignas(8) QueryPair {
  float lo, hi;
};
STRIA_DEVICE QueryPair QueryPairOf(const float* rows, int i, int t4) {
  return *reinterpret_cast<const QueryPair*>(rows + 8 * (i >> 2) + 2 * t4);
}

// One query tile of a backward CTA, for warpgroup `wg` (keys j0 + 64 wg ..): S^T and dP^T, P^T and
// dS^T in registers, dS^T to shared memory (`dss`) for dQ, dV += P^T dO and dK += dS^T Q, and
// dQ = dS K. The tiles are in shared memory at the given window addresses (K, V: kN rows; Q, dO:
// kM rows), the tile's lse2 and delta rows at `lse2`, `delta`.
// The elementwise work runs beside the products where registers allow, as FlashAttention-3's
// backward orders them: P^T's exponentials while the tensor cores compute dP^T (S^T and dP^T are
// committed as two groups), the warpgroups' meeting over dS^T while they compute dV, and the
// store of dQ while they compute dK (issued after dQ). Waiting for both score products before the
// softmax, and for every product before the store, left the tensor cores idle through both.
// (Issuing dV before dS^T is computed would overlap that too, but keeps P^T's A fragments alive
// beside S^T and dP^T: 16 to 32 registers more a thread than the consumers have, and spills.)
// The CTA's synchronisation comes from the caller: `before_ds` runs before this warpgroup writes
// dS^T (the other warpgroup's dQ products of the previous tile must be done reading it),
// `published` after (every warpgroup's dS^T written and fenced for wgmma), `done` once every
// product of the tile, the last readers of Q and dO, has completed. `store_dq(dq, qb, cb)` takes the
// warpgroup's 64 x 64 block of the tile's dQ (query rows 64 qb.., head-dim columns 64 cb.., in the
// accumulator layout) into dq_acc: AddDqAtomics, or the TMA kernel's bulk reductions. With kDq false
// the step leaves dQ out (the deterministic backward computes it in a pass of its own:
// mma_backward_dq.cuh), and with it dS^T's trip through shared memory and the callbacks around it.
//
// With a softcap, kEarlyTanh takes the tanh of the scores into the pass that runs beside dP^T's
// product and leaves the exponentials and the slopes to the dS^T pass; without it, all of a capped
// score's work waits for dP^T. The two forms leave ptxas with different register pressure, and no
// one form spills least in every kernel (design/cuda.md, "The capped path's tanh"): each kernel
// takes the form its ptxas report favours.
template <typename T, int D, int kM, int kN, bool kDocs, bool kDq, bool kEarlyTanh, typename BeforeDs,
          typename Published, typename Done, typename StoreDq>
STRIA_DEVICE void BackwardStep(const BwdParams& p, const MaskArgs& mask, int64_t j0, int wg, int64_t i0,
                               uint32_t k_addr, uint32_t v_addr, uint32_t q_addr, uint32_t do_addr, unsigned char* dss,
                               const float* lse2, const float* delta, const int64_t key[2], float (&dk)[D / 2],
                               float (&dv)[D / 2], BeforeDs before_ds, Published published, Done done,
                               StoreDq store_dq) {
  const int warp = (static_cast<int>(threadIdx.x) >> 5) & 3, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const uint32_t ds_addr = smem_addr(dss);
  // dQ: warpgroup wg takes query rows 64 qb.. and head-dim columns 64 cb.. of the tile.
  const int qb = kM == 128 ? wg : 0, cb = kM == 128 ? 0 : wg;
  float sT[kM / 2], dpT[kM / 2];
  // S^T = K Q^T, then dP^T = V dO^T (A: this warpgroup's 64 keys, B: the tile's queries, both
  // K-major), in two groups, so that P^T's exponentials run while the tensor cores compute dP^T.
  auto issue_scores = [&](float(&acc)[kM / 2], uint32_t a_addr, uint32_t b_addr) {
    const uint64_t a0 = SwizzledDesc(a_addr + 64 * wg * kSwizzleBytes, 16, kSwizzleAtomBytes);
    const uint64_t b0 = SwizzledDesc(b_addr, 16, kSwizzleAtomBytes);
    STRIA_UNROLL
    for (int kk = 0; kk < D / 16; ++kk) {
      // Column block kk / 4 (64 values: rows x 128 bytes), then 32 bytes per 16 columns.
      const uint32_t kcol = static_cast<uint32_t>((kk & 3) * 32);
      wgmma_ss<T, kM>(acc, DescPlus(a0, (kk >> 2) * kN * kSwizzleBytes + kcol),
                      DescPlus(b0, (kk >> 2) * kM * kSwizzleBytes + kcol), kk > 0);
    }
    wgmma_commit();
  };
  wgmma_fence();
  issue_scores(sT, k_addr, q_addr);
  issue_scores(dpT, v_addr, do_addr);

  // The queries of this tile that see each of this thread's two keys (all of them unless the
  // tile needs the element mask): one window per key, two comparisons per element. Computed while
  // the products run.
  const bool whole = FullyVisible<kDocs>(mask, i0, i0 + kM, j0 + 64 * wg, j0 + 64 * wg + 64);
  Window seen[2] = {Window{0, kM}, Window{0, kM}};
  if (!whole) {
    for (int e = 0; e < 2; ++e) seen[e] = SeeingQueries<kDocs>(mask, key[e], i0, kM);
  }
  // Accumulator element i: query column 8 (i >> 2) + 2 t4 + (i & 1) of this thread's key
  // (i & 3) >> 1; in a whole tile (WholeTag) every one is visible.
  auto visible = [&](auto all, int i) {
    return decltype(all)::kAll || In(seen[(i & 3) >> 1], 8 * (i >> 2) + 2 * t4 + (i & 1));
  };
  const float scale_log2 = p.scale_log2;

  // P^T in place while the tensor cores compute dP^T. With a softcap and kEarlyTanh, the tanh of
  // every score instead (t, in place: the costly part of a capped score, a dozen instructions); P^T
  // and the slope its dS^T needs, 1 - t², follow from t once dP^T is in (keeping the slopes across
  // the wait would cost a register per score, which the kernel does not have). Invisible scores
  // are left to the next pass's mask.
  wgmma_wait<1>();  // S^T
  wgmma_fence_operand(sT);
  WithSoftcap(p.softcap, [&](auto cap) {  // the test once per tile (softcap.cuh)
    if constexpr (!decltype(cap)::kCapped) {
      WithWholeTile(whole, [&](auto all) {
        STRIA_UNROLL
        for (int i = 0; i < kM / 2; i += 4) {
          const QueryPair l = QueryPairOf(lse2, i, t4);
          STRIA_UNROLL
          for (int c = 0; c < 4; ++c)
            sT[i + c] = visible(all, i + c) ? fast_exp2(sT[i + c] * scale_log2 - (c & 1 ? l.hi : l.lo)) : 0.f;
        }
      });
    } else if constexpr (kEarlyTanh) {
      STRIA_UNROLL
      for (int i = 0; i < kM / 2; ++i) sT[i] = RationalTanh(sT[i] * p.softcap.cap_in);
    }
  });
  wgmma_wait<0>();  // dP^T
  wgmma_fence_operand(sT);
  wgmma_fence_operand(dpT);

  // Per 16 queries (accumulator chunks 2 kq and 2 kq + 1): dS^T = P^T (dP^T - delta) (times the
  // softcap's slope), into shared memory for dQ (rows: all 128 keys, columns: queries), and P^T
  // and dS^T as A fragments. One pass, so each chunk of S^T and dP^T dies as soon as it is packed.
  if (kDq) before_ds();
  const int row0 = 64 * wg + 16 * warp + g;
  uint32_t pa[kM / 16][4], sa[kM / 16][4];
  WithSoftcap(p.softcap, [&](auto cap) {
    constexpr bool kCapped = decltype(cap)::kCapped;
    WithWholeTile(whole, [&](auto all) {
      STRIA_UNROLL
      for (int kq = 0; kq < kM / 16; ++kq) {
        STRIA_UNROLL
        for (int i = 8 * kq; i < 8 * kq + 8; i += 4) {
          const QueryPair dl = QueryPairOf(delta, i, t4);
          const QueryPair l = kCapped ? QueryPairOf(lse2, i, t4) : QueryPair{};
          (void)l;  // read only with a cap
          STRIA_UNROLL
          for (int c = 0; c < 4; ++c) {
            const bool vis = visible(all, i + c);
            float slope = 1.f;
            if constexpr (kCapped && kEarlyTanh) {
              const float t = sT[i + c];  // the previous pass's tanh
              slope = 1.f - t * t;
              sT[i + c] = vis ? fast_exp2(p.softcap.cap_log2 * t - (c & 1 ? l.hi : l.lo)) : 0.f;
            } else if constexpr (kCapped) {
              sT[i + c] =
                  vis ? fast_exp2(Log2ScoreOf<true>(sT[i + c], scale_log2, p.softcap, &slope) - (c & 1 ? l.hi : l.lo))
                      : 0.f;
            }
            dpT[i + c] = vis ? sT[i + c] * (dpT[i + c] - (c & 1 ? dl.hi : dl.lo)) * slope : 0.f;
          }
        }
        STRIA_UNROLL
        for (int i = 8 * kq; i < 8 * kq + 8; i += 2) {
          const int col = 8 * (i >> 2) + 2 * t4, row = row0 + 8 * ((i & 3) >> 1);
          if (kDq) *reinterpret_cast<uint32_t*>(dss + SwizzledOffset(kN, row, col)) = pack2<T>(dpT[i], dpT[i + 1]);
        }
        AccToA<T>(pa[kq], sT + 8 * kq, sT + 8 * kq + 4);
        AccToA<T>(sa[kq], dpT + 8 * kq, dpT + 8 * kq + 4);
      }
    });
  });
  wgmma_fence_operand(pa);
  wgmma_fence_operand(sa);
  wgmma_fence_operand(dv);
  wgmma_fence_operand(dk);

  // dV += P^T dO (B: dO read MN-major; queries 16 kq.. are rows 16 kq.. of dO, 2048 bytes per 16
  // rows; LBO: the next 64 head-dim columns): it runs while the warpgroups meet over dS^T.
  const uint64_t do_desc = SwizzledDesc(do_addr, kM * kSwizzleBytes, kSwizzleAtomBytes);
  wgmma_fence();
  STRIA_UNROLL
  for (int kq = 0; kq < kM / 16; ++kq) wgmma_rs_tb<T, D>(dv, pa[kq], DescPlus(do_desc, kq * 16 * kSwizzleBytes), true);
  wgmma_commit();

  // dK += dS^T Q (B: Q read MN-major, as dO above).
  auto issue_dk = [&] {
    const uint64_t q_desc = SwizzledDesc(q_addr, kM * kSwizzleBytes, kSwizzleAtomBytes);
    wgmma_fence();
    STRIA_UNROLL
    for (int kq = 0; kq < kM / 16; ++kq) wgmma_rs_tb<T, D>(dk, sa[kq], DescPlus(q_desc, kq * 16 * kSwizzleBytes), true);
    wgmma_commit();
  };
  if (!kDq) {
    issue_dk();
    wgmma_wait<0>();
    wgmma_fence_operand(pa);
    wgmma_fence_operand(sa);
    wgmma_fence_operand(dv);
    wgmma_fence_operand(dk);
    done();
    return;
  }
  published();

  // dQ (64 x 64) = dS (rows 64 qb.., all kN keys) K (columns 64 cb..), issued before dK, so that
  // its store leaves while the tensor cores compute dK.
  float dq[32];
  IssueDsK<T, kN>(dq, ds_addr, k_addr, qb, cb);
  issue_dk();
  wgmma_wait<1>();  // dV and dQ; dK may still run
  wgmma_fence_operand(dq);
  wgmma_fence_operand(pa);
  wgmma_fence_operand(dv);
  store_dq(dq, qb, cb);
  wgmma_wait<0>();
  wgmma_fence_operand(sa);
  wgmma_fence_operand(dk);
  done();
}

// A warpgroup's 64 x 64 block of a tile's dQ (rows 64 qb.. of the tile at i0, columns 64 cb..; the
// accumulator layout) added into dq_acc with two-wide float atomics, rows outside the block's
// queries left alone (dS is 0 there).
template <int D>
STRIA_DEVICE void AddDqAtomics(const BwdParams& p, int64_t bh, int64_t i0, const float (&dq)[32], int qb, int cb) {
  const int warp = (static_cast<int>(threadIdx.x) >> 5) & 3, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t4 = lane & 3;
  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) {
    const int64_t i = i0 + 64 * qb + 16 * warp + g + 8 * e;
    if (i < p.mask.q_begin || i >= p.mask.q_end) continue;  // dS is 0 there
    float* dst = p.dq_acc + (bh * p.dims.L + i) * D + 64 * cb + 2 * t4;
    STRIA_UNROLL
    for (int nt = 0; nt < 8; ++nt) atomic_add2(dst + 8 * nt, dq[4 * nt + 2 * e], dq[4 * nt + 2 * e + 1]);
  }
}

#endif

template <typename T, int D, bool kDocs = false, bool kDq = true>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(256) WgmmaBackwardKernel(const BwdParams p) {
#if STRIA_HAS_WGMMA
  using Tile = WgmmaBwdTile<D>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kThreads = Tile::kThreads;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* ks = AlignToSwizzleAtom(smem_raw);
  unsigned char* vs = ks + Tile::kKvBytes;
  unsigned char* qs = vs + Tile::kKvBytes;      // stage st at qs + st * kQBytes
  unsigned char* dos = qs + 2 * Tile::kQBytes;  // likewise
  unsigned char* dss = dos + 2 * Tile::kQBytes;
  float* lse2s = reinterpret_cast<float*>(dss + Tile::kDsBytes);  // [2][kM]
  float* deltas = lse2s + 2 * kM;                                 // [2][kM]
  const uint32_t k_addr = smem_addr(ks), v_addr = smem_addr(vs);

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bhk = static_cast<int>(cta.head), b = bhk / d.Hkv, hk = bhk % d.Hkv;
  const int group = d.Hq / d.Hkv;
  const int64_t j0 = p.key_begin + static_cast<int64_t>(cta.tile) * kN;
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is
  // (kDocs false compiles the clamp out: these kernels' registers are tight).
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

  // This thread's keys (accumulator rows) and its dK/dV: element 4 i + c is row (c >> 1) * 8,
  // column 8 i + 2 t4 + (c & 1) of the warp's 16 rows.
  int64_t key[2];
  for (int e = 0; e < 2; ++e) key[e] = j0 + 64 * wg + 16 * warp + g + 8 * e;
  float dk[D / 2], dv[D / 2];
  STRIA_UNROLL
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  for (int s = 0; s < steps; ++s) {
    const int st = s & 1, h = hk * group + s / q_tiles;
    const int64_t i0 = i_first + static_cast<int64_t>(s % q_tiles) * kM;
    const int64_t bh = static_cast<int64_t>(b) * d.Hq + h;
    cp_async_wait<0>();
    fence_proxy_async();
    block_sync();  // this step's tiles landed; every reader of the other stage and of dS^T is done
    if (s + 1 < steps) load_step(s + 1);
    const uint32_t q_addr = smem_addr(qs) + st * Tile::kQBytes, do_addr = smem_addr(dos) + st * Tile::kQBytes;
    const float* lse2 = lse2s + st * kM;
    const float* delta = deltas + st * kM;

    BackwardStep<T, D, kM, kN, kDocs, kDq, false>(
        p, mask, j0, wg, i0, k_addr, v_addr, q_addr, do_addr, dss, lse2, delta, key, dk, dv, [] {},
        [] {
          fence_proxy_async();
          block_sync();  // dS^T of both warpgroups written and visible to wgmma
        },
        [] {}, [&](const float(&dq)[32], int qb, int cb) { AddDqAtomics<D>(p, bh, i0, dq, qb, cb); });
  }

  StoreKeyGrads<T, D>(p, b, hk, key, t4, dk, dv);
#else
  (void)p;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria

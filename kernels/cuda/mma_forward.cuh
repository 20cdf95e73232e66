// Tensor-core forward tile kernel (mma.sync m16n8k16, bf16/fp16 in, fp32 accumulate): one CTA of
// 4 warps (8 at head dim 256) owns 128 queries of one head (32 rows per warp, 16 at 256) and
// merges one ring block's keys into their running softmax state (row max m, row sum l,
// unnormalised output acc, all fp32 in global memory). Keeping the state across ring steps is the
// LSE merge of ring attention done in place: no per-block output or LSE is written and merged later.
//
// Pipeline: the K tile of step n+1 loads (cp.async) while P V of step n runs, and the V tile of
// step n while Q K^T of step n runs. Tiles wholly outside the block's mask are never visited; the
// element mask is applied only to tiles the diagonal or the rectangle's edge cuts.
#pragma once

#include "cuda/mma_common.cuh"

namespace stria {
namespace cuda {

template <int D>
struct FwdTile {
  // Each warp owns kMT m16 tiles (32 rows), so every K or V fragment loaded from shared memory
  // feeds kMT tensor-core products: with one m-tile per warp, ldmatrix bandwidth and not the
  // tensor cores bounds the kernel. At head dim 256 a warp's output rows alone would take 256
  // registers a thread with two m-tiles: there 8 warps own one each (the same 128 queries), over
  // 32-key tiles, so that Q and two K/V tiles fit the 99 KB that Ampere's smaller SMs allow.
  static constexpr bool kWide = D > 128;
  static constexpr int kWarps = kWide ? 8 : 4, kThreads = 32 * kWarps, kMT = kWide ? 1 : 2;
  static constexpr int kWarpRows = 16 * kMT, kM = kWarps * kWarpRows, kN = kWide ? 32 : 64;
  static constexpr int kStride = SmemRow<D>::kStride;
  static constexpr int kSmemBytes = (kM + 2 * kN) * kStride * 2;
};

// kEnds: the build for the call's first and last blocks (FwdParams::first, ::out; forward_state.cuh).
// The blocks between them take the build without (kEnds false): at D 128 this kernel holds 255
// registers, and the ends' code, there in a build that never runs it, made ptxas spill in the loop.
template <typename T, int D, bool kDocs = false, bool kEnds = true>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(FwdTile<D>::kThreads) MmaForwardKernel(const FwdParams p) {
  using Tile = FwdTile<D>;
  constexpr int S = Tile::kStride, kM = Tile::kM, kN = Tile::kN, kMT = Tile::kMT, kR = 2 * kMT;
  constexpr int kThreads = Tile::kThreads, kDTiles = D / 8, kKSteps = D / 16, kNTiles = kN / 8;
  STRIA_DYNAMIC_SMEM(smem_raw);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* ks = qs + kM * S;
  uint16_t* vs = ks + kN * S;

  const Dims& d = p.dims;
  const int warp = warp_id(), lane = lane_id(), g = lane >> 2, t4 = lane & 3;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bh = static_cast<int>(cta.head);
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is
  // (kDocs false compiles the clamp out: these kernels' registers are tight).
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, bh / d.Hq) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kM, cta.tile, gridDim.x);
  const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
  if (keys.count == 0) {  // the whole CTA, before any barrier
    if (kEnds) IdleRows<T>(p, mask, bh, i0, kM, kThreads);
    return;
  }
  const int64_t j_first = keys.first;
  const int n_tiles = keys.count;
  // This warp's rows and the keys they may see: on the diagonal a warp skips the key tiles that
  // only the CTA's later rows see (a warp-uniform branch; no warp waits on another's products).
  const int w0 = warp * Tile::kWarpRows;
  const int64_t wi0 = i0 + w0, wi1 = wi0 + Tile::kWarpRows;
  int64_t wk_lo, wk_hi;
  KeyRange<kDocs>(mask, wi0, MinI(wi1, d.L), &wk_lo, &wk_hi);

  const HeadRows hr = ForwardHeadRows(p, bh);

  LoadRows<D, kThreads>(qs, hr.q, p.q.sl, i0, kM, d.L);
  LoadRows<D, kThreads>(ks, hr.k, hr.kv_row, j_first, kN, d.L);
  cp_async_commit();

  // This lane's rows (r = 2 * m-tile + half) and its share of their running state.
  int64_t row[kR];
  bool live[kR];
  float m_run[kR], l_run[kR];
  float o[kMT][4 * kDTiles];  // per m-tile, the C fragments of its kDTiles n8 tiles, 4 floats each
  STRIA_UNROLL
  for (int r = 0; r < kR; ++r) {
    const int mt = r >> 1, e = r & 1;
    row[r] = wi0 + mt * 16 + g + e * 8;
    live[r] = row[r] >= mask.q_begin && row[r] < mask.q_end;
    LoadRowState<D, kEnds>(p, static_cast<int64_t>(bh) * d.L + row[r], t4, live[r], &m_run[r], &l_run[r],
                           &o[mt][2 * e]);
  }

  for (int n = 0; n < n_tiles; ++n) {
    const int64_t j0 = j_first + static_cast<int64_t>(n) * kN;
    cp_async_wait<0>();
    block_sync();  // K tile n (and Q) landed; every warp is done reading V tile n-1
    LoadRows<D, kThreads>(vs, hr.v, hr.kv_row, j0, kN, d.L);
    cp_async_commit();
    const bool active = j0 < wk_hi && j0 + kN > wk_lo;

    float s[kMT][kNTiles][4];
    if (active) {
      STRIA_UNROLL
      for (int mt = 0; mt < kMT; ++mt) {
        STRIA_UNROLL
        for (int nt = 0; nt < kNTiles; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
      }
      STRIA_UNROLL
      for (int kk = 0; kk < kKSteps; ++kk) {
        // Q fragments are re-read from shared memory: holding all of them would cost D/2
        // registers per m-tile, which the accumulators of a 32-row warp cannot spare.
        uint32_t qa[kMT][4];
        STRIA_UNROLL
        for (int mt = 0; mt < kMT; ++mt) LoadA<S>(qa[mt], qs, w0 + mt * 16, kk * 16);
        STRIA_UNROLL
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t bf[4];
          LoadBFromRowsN<S>(bf, ks, np * 16, kk * 16);
          STRIA_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<T>(s[mt][2 * np], qa[mt], bf);
            mma_16816<T>(s[mt][2 * np + 1], qa[mt], bf + 2);
          }
        }
      }

      // The scores raw (uncapped) or capped in log2 units (RawOrCapped, softcap.cuh: the scale
      // joins the exponential's multiply-add); the element mask only in tiles that need it, each
      // row's visible keys as one window (tile_mask.cuh), in a loop of its own so the other tiles
      // pay nothing for it; likewise the softcap, whose test takes in the whole softmax: with the
      // exponential's factor a constant there, ptxas spills less (design/cuda.md).
      const bool element_mask = !FullyVisible<kDocs>(mask, wi0, wi1, j0, j0 + kN);
      float alpha[kR];
      WithSoftcap(p.softcap, [&](auto cap) {
        constexpr bool kCapped = decltype(cap)::kCapped;
        if (element_mask) {
          Window w[kR];
          STRIA_UNROLL
          for (int r = 0; r < kR; ++r) w[r] = VisibleKeys<kDocs>(mask, row[r], j0, kN);
          STRIA_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            STRIA_UNROLL
            for (int nt = 0; nt < kNTiles; ++nt) {
              STRIA_UNROLL
              for (int c = 0; c < 4; ++c) {
                const bool vis = In(w[2 * mt + (c >> 1)], nt * 8 + 2 * t4 + (c & 1));
                s[mt][nt][c] = vis ? RawOrCapped<kCapped>(s[mt][nt][c], p.softcap) : NegInf();
              }
            }
          }
        } else if constexpr (kCapped) {
          STRIA_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            STRIA_UNROLL
            for (int nt = 0; nt < kNTiles; ++nt) {
              STRIA_UNROLL
              for (int c = 0; c < 4; ++c) s[mt][nt][c] = RawOrCapped<true>(s[mt][nt][c], p.softcap);
            }
          }
        }
        const float in_log2 = kCapped ? 1.f : p.scale_log2;  // the factor into the log2 domain
        float mx[kR];
        STRIA_UNROLL
        for (int r = 0; r < kR; ++r) mx[r] = NegInf();
        STRIA_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          STRIA_UNROLL
          for (int nt = 0; nt < kNTiles; ++nt) {
            STRIA_UNROLL
            for (int c = 0; c < 4; ++c) mx[2 * mt + (c >> 1)] = fmaxf(mx[2 * mt + (c >> 1)], s[mt][nt][c]);
          }
        }
        float base[kR];
        STRIA_UNROLL
        for (int r = 0; r < kR; ++r) alpha[r] = OnlineMaxStep(mx[r] * in_log2, &m_run[r], &base[r]);
        float sum[kR];
        STRIA_UNROLL
        for (int r = 0; r < kR; ++r) sum[r] = 0.f;
        STRIA_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          STRIA_UNROLL
          for (int nt = 0; nt < kNTiles; ++nt) {
            STRIA_UNROLL
            for (int c = 0; c < 4; ++c) {
              const int r = 2 * mt + (c >> 1);
              const float pv = fast_exp2(fmaf(s[mt][nt][c], in_log2, -base[r]));
              s[mt][nt][c] = pv;
              sum[r] += pv;
            }
          }
        }
        STRIA_UNROLL
        for (int r = 0; r < kR; ++r) l_run[r] = l_run[r] * alpha[r] + sum[r];
      });
      STRIA_UNROLL
      for (int mt = 0; mt < kMT; ++mt) {
        STRIA_UNROLL
        for (int nt = 0; nt < kDTiles; ++nt) {
          o[mt][4 * nt + 0] *= alpha[2 * mt];
          o[mt][4 * nt + 1] *= alpha[2 * mt];
          o[mt][4 * nt + 2] *= alpha[2 * mt + 1];
          o[mt][4 * nt + 3] *= alpha[2 * mt + 1];
        }
      }
    }

    cp_async_wait<0>();
    block_sync();  // V tile n landed; every warp is done reading K tile n
    if (n + 1 < n_tiles) {
      LoadRows<D, kThreads>(ks, hr.k, hr.kv_row, j0 + kN, kN, d.L);
      cp_async_commit();
    }
    if (!active) continue;
    STRIA_UNROLL
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t pa[kMT][4];
      STRIA_UNROLL
      for (int mt = 0; mt < kMT; ++mt) AccToA<T>(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
      STRIA_UNROLL
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t bf[4];
        LoadBFromRowsK<S>(bf, vs, kk * 16, dp * 16);
        STRIA_UNROLL
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<T>(o[mt] + 8 * dp, pa[mt], bf);
          mma_16816<T>(o[mt] + 8 * dp + 4, pa[mt], bf + 2);
        }
      }
    }
  }

  STRIA_UNROLL
  for (int r = 0; r < kR; ++r) {
    const int mt = r >> 1, e = r & 1;
    StoreRowState<T, D, kEnds>(p, bh, row[r], t4, live[r], m_run[r], l_run[r], &o[mt][2 * e]);
  }
}

}  // namespace cuda
}  // namespace stria

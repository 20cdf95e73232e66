// The TMA forward on float8_e4m3fn inputs (sm_90a), head dim 128: tma_forward.cuh's kernel with
// its products in e4m3 (wgmma_fp8.cuh), at twice the 16-bit tensor-core rate and half the bytes
// per tile. The same contract (one ring block's keys merged into the fp32 running state of 128
// queries of one head), producer and consumer warpgroups, two-stage K/V ring, intra-warpgroup
// overlap and ping-pong between the consumers. What differs:
//  - Q and K are e4m3 rows of 128 bytes (one 128-byte swizzle row each): one TMA box per tile;
//  - V comes transposed (Vt: D rows of the block's keys, packed by TransposeVE4m3Kernel), since an
//    8-bit B operand must be K-major, with the keys of every 16 in E4m3PvKey's order;
//  - the scores are multiplied by the head's q and k descales before the softmax (the descales of
//    q, k and v are the caller's: stria.h, params->q_descale);
//  - P is packed to e4m3 (PackPE4m3), the row sums taken before the rounding (the LSE is as exact
//    as the 16-bit kernels'); the output stays in units of v's codes until the call's outputs are
//    scaled by v's descale (elementwise.cuh's ScaleRowsByHeadKernel, once per call, after the finishing).
// The barrier setup, the turns and the loop's order repeat tma_forward.cuh's rather than sharing
// them through another template layer: the products, tile bytes and the descale step differ in
// most lines of it, and the 16-bit kernel, whose register allocation is measured on the GPU, is
// left as it was.
#pragma once

#include "cuda/elem_access.cuh"
#include "cuda/tma_api.cuh"
#include "cuda/wgmma_forward.cuh"
#include "cuda/wgmma_fp8.cuh"

namespace stria {
namespace cuda {

struct TmaFp8FwdTile {
  static constexpr int D = 128;
  static constexpr int kConsumers = 2, kThreads = 128 * (kConsumers + 1), kM = 64 * kConsumers, kN = 128;
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kM * D, kKBytes = kN * D, kVBytes = D * kN;
  static constexpr int kBarriers = 1 + 4 * kStages;  // Q full, then per stage K full, K empty, V full, V empty
  static constexpr int kSmemBytes = kQBytes + kStages * (kKBytes + kVBytes) + 8 * kBarriers + kSwizzleAtomBytes;
};

// The block's parameters, the maps of its Q (the caller's e4m3 view), K (the wire's compact e4m3
// rows) and Vt (the wire's transposed V), and the descales: NULL or float32 with one value
// (step 0) or one per head (step 1).
struct TmaFp8FwdParams {
  FwdParams p;
  TensorMap q_map, k_map, vt_map;
  const float* q_descale;
  const float* k_descale;
  int q_descale_step, k_descale_step;
};

// TMA sees e4m3 rows as 16-bit ones of half the width (64 "columns" of 128 bytes): the boxes land
// byte for byte, and the swizzle works on 16-byte chunks whatever the element. False where the
// halved strides are not whole.
inline bool EncodeBytesMap(TensorMap* map, const void* base, int B, int rows, int H, int width, int64_t sb, int64_t sr,
                           int64_t sh, int box_rows) {
  if (width % 2 != 0 || sb % 2 != 0 || sr % 2 != 0 || sh % 2 != 0) return false;
  return EncodeRowsMap(map, base, B, rows, H, width / 2, sb / 2, sr / 2, sh / 2, box_rows);
}

// The kernel's parameters for block p (p.k: the e4m3 message, K rows then Vt; p.v unused) and
// the descales; false where TMA cannot describe q.
inline bool Fp8ForwardParams(const FwdParams& p, const float* q_descale, int q_step, const float* k_descale, int k_step,
                             TmaFp8FwdParams* tp);

#if STRIA_HAS_WGMMA
// S = Q K^T in e4m3 for one warpgroup's 64 rows of Q (from row 64 group) against a 128-key tile:
// four products of K 32, each 32 bytes further along the swizzled rows.
STRIA_DEVICE void IssueScoresE4m3(float (&s)[64], uint32_t q_addr, uint32_t k_addr, int group) {
  const uint64_t qa = SwizzledDesc(q_addr + 64 * group * kSwizzleBytes, 16, kSwizzleAtomBytes);
  const uint64_t kb = SwizzledDesc(k_addr, 16, kSwizzleAtomBytes);
  STRIA_UNROLL
  for (int kk = 0; kk < 4; ++kk) wgmma_ss_e4m3<128>(s, DescPlus(qa, 32 * kk), DescPlus(kb, 32 * kk), kk > 0);
  wgmma_commit();
}
// O += P V: P's e4m3 fragments against the Vt tile (128 rows of d, 128 keys each).
STRIA_DEVICE void IssuePVE4m3(float (&o)[64], const uint32_t (&pa)[4][4], uint32_t vt_addr) {
  const uint64_t vt = SwizzledDesc(vt_addr, 16, kSwizzleAtomBytes);
  STRIA_UNROLL
  for (int kk = 0; kk < 4; ++kk) wgmma_rs_e4m3<128>(o, pa[kk], DescPlus(vt, 32 * kk), true);
  wgmma_commit();
}
#endif

// T: the output's storage dtype (the state is float32 whatever it is).
template <typename T, bool kDocs = false>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(384) WgmmaTmaFp8ForwardKernel(const STRIA_GRID_CONSTANT TmaFp8FwdParams tp) {
#if STRIA_HAS_WGMMA
  using Tile = TmaFp8FwdTile;
  constexpr int D = Tile::D, kM = Tile::kM, kN = Tile::kN, kStages = Tile::kStages;
  constexpr int kConsumerThreads = 128 * Tile::kConsumers;
  const FwdParams& p = tp.p;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = qs + Tile::kQBytes;  // stage st at ks + st * kKBytes
  unsigned char* vs = ks + kStages * Tile::kKBytes;
  uint64_t* q_full = reinterpret_cast<uint64_t*>(vs + kStages * Tile::kVBytes);
  uint64_t* k_full = q_full + 1;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bh = static_cast<int>(cta.head);
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, bh / d.Hq) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kM, cta.tile, gridDim.x);
  const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
  if (keys.count == 0) return IdleRows<T>(p, mask, bh, i0, kM, Tile::kThreads);
  const int64_t j_first = keys.first;
  const int n_tiles = keys.count;
  const int b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&k_full[st], 1);
      mbar_init(&v_full[st], 1);
      mbar_init(&k_empty[st], kConsumerThreads);
      mbar_init(&v_empty[st], kConsumerThreads);
    }
    fence_barrier_init();
  }
  block_sync();

  if (wg == 0) {
    // The producer, as tma_forward.cuh's: Q once, then K and Vt tiles through the stages. The
    // maps see the e4m3 rows as 16-bit ones of half the width: a box of 64 "columns" is 128 bytes.
    setmaxnreg_dec<24>();
    if (tid != 0) return;
    prefetch_tensor_map(&tp.q_map);
    prefetch_tensor_map(&tp.k_map);
    prefetch_tensor_map(&tp.vt_map);
    mbar_arrive_expect_tx(q_full, Tile::kQBytes);
    tma_load_4d(qs, &tp.q_map, 0, h, static_cast<int>(i0), b, q_full);
    for (int n = 0; n < n_tiles; ++n) {
      const int st = n % kStages, parity = (n / kStages) & 1;
      const int j = static_cast<int>(j_first + int64_t{kN} * n);
      mbar_wait(&k_empty[st], parity ^ 1);
      mbar_arrive_expect_tx(&k_full[st], Tile::kKBytes);
      tma_load_4d(ks + st * Tile::kKBytes, &tp.k_map, 0, hk, j, b, &k_full[st]);
      mbar_wait(&v_empty[st], parity ^ 1);
      mbar_arrive_expect_tx(&v_full[st], Tile::kVBytes);
      tma_load_4d(vs + st * Tile::kVBytes, &tp.vt_map, j / 2, hk, 0, b, &v_full[st]);  // keys j.. of every d
    }
    return;
  }

  setmaxnreg_inc<240>();
  const int group = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t gi0 = i0 + 64 * group, gi1 = gi0 + 64;
  const uint32_t q_addr = smem_addr(qs), k_addr = smem_addr(ks), v_addr = smem_addr(vs);
  auto stage_of = [](int n) { return n % kStages; };
  auto parity_of = [](int n) { return (n / kStages) & 1; };
  // The scores in units of the codes' products, times this to be q . k.
  const float qk_descale = (tp.q_descale != nullptr ? tp.q_descale[h * tp.q_descale_step] : 1.f) *
                           (tp.k_descale != nullptr ? tp.k_descale[hk * tp.k_descale_step] : 1.f);

  int64_t row[2];
  bool live[2];
  float m_run[2], l_run[2];
  float o[D / 2];
  LoadWarpgroupRows<D>(p, bh, gi0, warp, g, t4, row, live, m_run, l_run, o);

  auto my_turn = [&] {
    if (group == 0)
      named_barrier_sync(1, kConsumerThreads);
    else
      named_barrier_sync(2, kConsumerThreads);
  };
  auto your_turn = [&] {
    if (group == 0)
      named_barrier_arrive(2, kConsumerThreads);
    else
      named_barrier_arrive(1, kConsumerThreads);
  };
  if (group == 1) your_turn();

  float s[kN / 2];
  float alpha[2];
  uint32_t pa[kN / 32][4];
  auto pin_pv_operands = [&] {
    wgmma_fence_operand(o);
    wgmma_fence_operand(pa);
  };
  // After a tile's S: its scores descaled and their softmax (while the previous P V may run).
  auto softmax = [&](int64_t j0) {
    STRIA_UNROLL
    for (int i = 0; i < kN / 2; ++i) s[i] *= qk_descale;
    WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j0, j0 + kN), row, j0, t4, m_run, l_run,
                            alpha);
  };
  // Once that P V is done: the old rows rescaled, and P packed for the next one.
  auto rescale_and_pack = [&] {
    STRIA_UNROLL
    for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i & 3) >> 1];
    PackPE4m3<kN>(s, pa);
  };
  mbar_wait(q_full, 0);
  mbar_wait(&k_full[0], 0);
  my_turn();
  wgmma_fence();
  IssueScoresE4m3(s, q_addr, k_addr, group);
  your_turn();
  wgmma_wait<0>();
  wgmma_fence_operand(s);
  mbar_arrive(&k_empty[0]);
  softmax(j_first);
  rescale_and_pack();

  for (int n = 0; n + 1 < n_tiles; ++n) {
    const int kst = stage_of(n + 1), vst = stage_of(n);
    mbar_wait(&k_full[kst], parity_of(n + 1));
    mbar_wait(&v_full[vst], parity_of(n));
    my_turn();
    pin_pv_operands();
    wgmma_fence();
    IssueScoresE4m3(s, q_addr, k_addr + kst * Tile::kKBytes, group);
    IssuePVE4m3(o, pa, v_addr + vst * Tile::kVBytes);
    your_turn();
    wgmma_wait<1>();  // S(n+1) done: its K stage is free
    wgmma_fence_operand(s);
    mbar_arrive(&k_empty[kst]);
    softmax(j_first + int64_t{kN} * (n + 1));
    wgmma_wait<0>();  // P(n) V(n) done: its V stage, o and pa are free
    pin_pv_operands();
    mbar_arrive(&v_empty[vst]);
    rescale_and_pack();
  }
  const int vst = stage_of(n_tiles - 1);
  mbar_wait(&v_full[vst], parity_of(n_tiles - 1));
  my_turn();
  pin_pv_operands();
  wgmma_fence();
  IssuePVE4m3(o, pa, v_addr + vst * Tile::kVBytes);
  your_turn();
  wgmma_wait<0>();
  wgmma_fence_operand(o);

  StoreWarpgroupRows<T, D>(p, bh, t4, row, live, m_run, l_run, o);
#else
  (void)tp;
#endif
}

// The e4m3 K/V ring message of a block: K's rows compact ([B, L, Hkv, 128] bytes), then V
// transposed per (batch, K/V head) ([B, Hkv, 128, Lp] bytes, Lp = L rounded up to 128: a TMA box
// of Vt is 128 keys) with the keys of every 16 in E4m3PvKey's order and zeros past L. k and v: the
// caller's views (strides in elements, which are bytes).
struct PackKvE4m3Args {
  int B, L, Hkv, Lp;
  const unsigned char* k;
  int64_t ksb, ksl, ksh;
  const unsigned char* v;
  int64_t vsb, vsl, vsh;
  unsigned char* wire;
};
STRIA_HD int64_t PackedKBytes(int B, int L, int Hkv) {
  return static_cast<int64_t>(B) * L * Hkv * 128;
}
STRIA_HD int PaddedKeys(int L) {
  return (L + 127) / 128 * 128;
}
STRIA_HD int64_t PackedKvE4m3Bytes(int B, int L, int Hkv) {
  return PackedKBytes(B, L, Hkv) + static_cast<int64_t>(B) * Hkv * 128 * PaddedKeys(L);
}

inline bool Fp8ForwardParams(const FwdParams& p, const float* q_descale, int q_step, const float* k_descale, int k_step,
                             TmaFp8FwdParams* tp) {
  using Tile = TmaFp8FwdTile;
  const Dims& d = p.dims;
  *tp = TmaFp8FwdParams{};
  tp->p = p;
  tp->q_descale = q_descale;
  tp->q_descale_step = q_step;
  tp->k_descale = k_descale;
  tp->k_descale_step = k_step;
  const int lp = PaddedKeys(d.L);
  const unsigned char* kd = static_cast<const unsigned char*>(p.k);
  const unsigned char* vt = kd + PackedKBytes(d.B, d.L, d.Hkv);
  return d.D == Tile::D &&
         EncodeBytesMap(&tp->q_map, p.q.data, d.B, d.L, d.Hq, Tile::D, p.q.sb, p.q.sl, p.q.sh, Tile::kM) &&
         EncodeBytesMap(&tp->k_map, kd, d.B, d.L, d.Hkv, Tile::D, int64_t{d.L} * d.Hkv * Tile::D,
                        int64_t{d.Hkv} * Tile::D, Tile::D, Tile::kN) &&
         EncodeBytesMap(&tp->vt_map, vt, d.B, Tile::D, d.Hkv, lp, int64_t{d.Hkv} * Tile::D * lp, lp,
                        int64_t{Tile::D} * lp, Tile::D);
}

// K's half of the message: one thread per 16 bytes of a row (consecutive threads, consecutive
// bytes: the reads and writes coalesce).
[[maybe_unused]] static STRIA_GLOBAL void PackKE4m3Kernel(PackKvE4m3Args a) {
  const int64_t chunks = static_cast<int64_t>(a.B) * a.L * a.Hkv * 8;
  for (int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; x < chunks;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = x % 8, row = x / 8, hk = row % a.Hkv, j = (row / a.Hkv) % a.L, bb = row / (int64_t{a.Hkv} * a.L);
    const unsigned char* src = a.k + bb * a.ksb + j * a.ksl + hk * a.ksh + 16 * c;
    unsigned char* dst = a.wire + row * 128 + 16 * c;
    for (int e = 0; e < 16; ++e) dst[e] = src[e];
  }
}

// V's half: a CTA (256 threads) per 128 keys of one (batch, K/V head), grid (Lp / 128, B * Hkv).
// The keys' rows land in shared memory as they lie (each thread 16 consecutive bytes of a row),
// then every d's 128 keys leave as one row of Vt in E4m3PvKey's order (each thread 16 of them);
// rows of 132 bytes put one d of consecutive keys in different banks. Keys past L are zeros.
constexpr int kVtTileStride = 132;
constexpr int kVtTileSmemBytes = 128 * kVtTileStride;
[[maybe_unused]] static STRIA_GLOBAL void TransposeVE4m3Kernel(PackKvE4m3Args a) {
  STRIA_DYNAMIC_SMEM(tile);
  const int64_t j0 = int64_t{blockIdx.x} * 128;
  const int bh = static_cast<int>(blockIdx.y), bb = bh / a.Hkv, hk = bh % a.Hkv;
  const int tid = static_cast<int>(threadIdx.x);
  for (int x = tid; x < 128 * 8; x += 256) {
    const int key = x / 8, c = x % 8;
    const int64_t j = j0 + key;
    unsigned char* dst = tile + key * kVtTileStride + 16 * c;
    if (j < a.L) {
      const unsigned char* src = a.v + bb * a.vsb + j * a.vsl + hk * a.vsh + 16 * c;
      for (int e = 0; e < 16; ++e) dst[e] = src[e];
    } else {
      for (int e = 0; e < 16; ++e) dst[e] = 0;
    }
  }
  block_sync();
  unsigned char* vt = a.wire + PackedKBytes(a.B, a.L, a.Hkv) + (int64_t{bb} * a.Hkv + hk) * 128 * a.Lp + j0;
  for (int x = tid; x < 128 * 8; x += 256) {
    const int dd = x / 8, grp = x % 8;
    unsigned char* dst = vt + int64_t{dd} * a.Lp + 16 * grp;
    for (int pos = 0; pos < 16; ++pos) dst[pos] = tile[(16 * grp + E4m3PvKey(pos)) * kVtTileStride + dd];
  }
}

}  // namespace cuda
}  // namespace stria

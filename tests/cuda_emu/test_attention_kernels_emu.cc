// The CUDA attention kernels themselves, run on the CPU by the warp-level emulator (cuda_emu.h):
// the tensor-core forward/backward kernels (fp16/bf16, D = 64 and 128) and the SIMT kernels
// (f32 and other head dims), each against a float64 reference of the same ring blocks. A "case"
// is one rank's queries against one or two K/V blocks with the masks the layouts produce (dense,
// diagonal with several offsets, rectangles cut by the zigzag halves), merged through the running
// softmax state exactly as the ring merges them; the backward adds dQ across the blocks and
// writes dK/dV per block. This is what proves the fragment layouts, tile masks, online softmax
// and GQA indexing before any GPU has run them.
#include <gtest/gtest.h>

#include <array>
#include <sstream>

#include "test_util.h"
// After the test headers: the emulator defines threadIdx & co. as macros.
#include "cuda/elementwise.cuh"
#include "cuda/mma_backward.cuh"
#include "cuda/mma_forward.cuh"
#include "cuda/tma_backward.cuh"
#include "cuda/tma_backward_persistent.cuh"
#include "cuda/tma_forward.cuh"
#include "cuda/tma_forward_persistent.cuh"
#include "cuda/wgmma_backward.cuh"
#include "cuda/wgmma_backward_wide.cuh"
#include "cuda/wgmma_forward.cuh"

using namespace stria_test;
namespace sc = stria::cuda;
namespace emu = stria::cuda::emu;

namespace {

struct Block {
  sc::MaskArgs mask;
  uint64_t seed;
};

// Which kernels run: SIMT, the mma.sync forward and backward, the wgmma (sm_90a) ones, the TMA
// warp-specialised ones (sm_90a), the TMA family's persistent kernels (at head dim 256 the
// backward is the wgmma family's, as for kTma), or the TMA forward and the TMA backward with its
// dQ added in the order of the key tiles (ordered_dq.cuh; at head dim 256 as kTma), or the TMA
// forwards with three consumer warpgroups (192-row query tiles, STRIA_CUDA_TMA_FORWARD_ROWS=192:
// head dim 64 only, elsewhere as kTma and kTmaPersistent) with those paths' backwards.
enum class Path { kSimt, kMma, kWgmma, kTma, kTmaPersistent, kTmaOrdered, kTmaThree, kTmaThreePersistent };

struct Case {
  std::string name;
  Dt dt;
  Path path;
  int B, L, Hq, Hkv, D;
  std::vector<Block> blocks;
  float softcap = 0.f;  // > 0: logit softcapping (softcap.cuh)
  double q_std = 1.0;   // the spread of Q's random values (scores grow with it)
  // The heads of a group whose CTAs start together (CtaSlotAt; a launcher sizes groups by the L2,
  // head_groups.cuh); 0: every head at once. The tensor-core kernels' order of CTAs and of a
  // persistent kernel's work items.
  uint32_t head_group = 0;
};

bool RefVisible(const sc::MaskArgs& m, int64_t i, int64_t j) {  // the test's own copy of the rule
  if (i < m.q_begin || i >= m.q_end || j < m.k_begin || j >= m.k_end) return false;
  return !m.diagonal || j <= i + m.offset;
}

// The kernels' softcap parameters for the case (zeros without one), as the CUDA backend makes them.
sc::Softcap Softcap(const Case& c, double scale) {
  if (c.softcap <= 0) return sc::Softcap{0.f, 0.f};
  return sc::Softcap{static_cast<float>(c.softcap * 1.4426950408889634), static_cast<float>(scale / c.softcap)};
}

unsigned CeilDiv(int64_t a, int64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

// A forward kernel over the block's query tiles, as the launchers of kernels/cuda run it.
template <typename Tile>
void ForwardTiles(const sc::FwdParams& p, void (*kernel)(sc::FwdParams)) {
  emu::Launch(emu::Dim3{sc::QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(p.dims.B * p.dims.Hq), 1},
              emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes, [&] { kernel(p); });
}
template <typename T, int D>
void MmaBackward(const sc::BwdParams& p) {
  using Tile = sc::BwdTile<D>;
  emu::Launch(emu::Dim3{CeilDiv(p.dims.L, Tile::kN), static_cast<unsigned>(p.dims.B * p.dims.Hkv), 1},
              emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes, [&] { sc::MmaBackwardKernel<T, D>(p); });
}
template <typename T, int D>
void WgmmaBackward(const sc::BwdParams& p) {
  using Tile = sc::WgmmaBwdTile<D>;
  emu::Launch(emu::Dim3{CeilDiv(p.dims.L, Tile::kN), static_cast<unsigned>(p.dims.B * p.dims.Hkv), 1},
              emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes, [&] { sc::WgmmaBackwardKernel<T, D>(p); });
}
// The TMA forward, as LaunchTmaForward runs it: maps of the compact K/V block and of Q.
template <typename T, int D>
void WideBackward(const sc::BwdParams& p) {
  using Tile = sc::WgmmaWideBwdTile<D>;
  emu::Launch(emu::Dim3{CeilDiv(p.dims.L, Tile::kN), static_cast<unsigned>(p.dims.B * p.dims.Hkv), 1},
              emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes, [&] { sc::WgmmaWideBackwardKernel<T, D>(p); });
}
// The TMA kernels' parameters as their launchers make them: maps of Q (and dO) in boxes of the
// tile's query rows, and of the compact K/V block in boxes of its key rows. False: a view TMA
// cannot describe.
template <typename Tile>
bool TmaMaps(const sc::FwdParams& p, sc::TmaFwdParams* tp) {
  const sc::Dims& d = p.dims;
  tp->p = p;
  return sc::EncodeViewMap(&tp->q_map, p.q, d, d.Hq, Tile::kM) &&
         sc::EncodeBlockMaps(&tp->k_map, &tp->v_map, p.k, p.v, d, Tile::kN);
}
template <typename Tile>
bool TmaMaps(const sc::BwdParams& p, sc::TmaBwdParams* tp) {
  const sc::Dims& d = p.dims;
  tp->p = p;
  return sc::EncodeViewMap(&tp->q_map, p.q, d, d.Hq, Tile::kM) &&
         sc::EncodeViewMap(&tp->do_map, p.dout, d, d.Hq, Tile::kM) &&
         sc::EncodeBlockMaps(&tp->k_map, &tp->v_map, p.k, p.v, d, Tile::kN);
}
template <typename T, int D, int kConsumers = 2>
void TmaForward(const sc::FwdParams& p) {
  using Tile = sc::TmaFwdTile<D, kConsumers>;
  const sc::Dims& d = p.dims;
  sc::TmaFwdParams tp{};
  ASSERT_TRUE(TmaMaps<Tile>(p, &tp));
  emu::Launch(emu::Dim3{sc::QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(d.B * d.Hq), 1},
              emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes,
              [&] { sc::WgmmaTmaForwardKernel<T, D, false, kConsumers>(tp); });
}
// The persistent TMA kernels (tma_forward_persistent.cuh, tma_backward_persistent.cuh) on a grid of
// two CTAs, where their launchers take one per SM: every CTA walks several items (idle ones too),
// so the barriers' phases and the consumers' turns carry across items.
template <typename T, int D, int kConsumers = 2>
void TmaPersistentForward(const sc::FwdParams& p) {
  using Tile = sc::TmaPersistentFwdTile<D, kConsumers>;
  const sc::Dims& d = p.dims;
  sc::TmaFwdParams tp{};
  ASSERT_TRUE(TmaMaps<Tile>(p, &tp));
  const unsigned items =
      sc::ForwardItems{sc::QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(d.B * d.Hq), 0u}.count();
  emu::Launch(emu::Dim3{std::min(items, 2u), 1, 1}, emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes,
              [&] { sc::WgmmaTmaPersistentForwardKernel<T, D, false, kConsumers>(tp); });
}
// The backward's dQ by the dQ warp's bulk reductions (the launcher's default) where the case's L is
// even, by the consumers' atomics where it is odd.
template <typename T, int D>
void TmaPersistentBackward(const sc::BwdParams& p) {
  using Tile = sc::TmaPersistentBwdTile<D, true>;
  const sc::Dims& d = p.dims;
  sc::TmaBwdParams tp{};
  ASSERT_TRUE(TmaMaps<Tile>(p, &tp));
  const unsigned items = sc::BackwardItems{CeilDiv(d.L, Tile::kN), static_cast<unsigned>(d.B * d.Hkv), 0u}.count();
  const bool bulk = d.L % 2 == 0;
  emu::Launch(emu::Dim3{std::min(items, 2u), 1, 1}, emu::Dim3{Tile::kThreads, 1, 1},
              bulk ? Tile::kSmemBytes : sc::TmaPersistentBwdTile<D>::kSmemBytes, [&] {
                if (bulk)
                  sc::WgmmaTmaPersistentBackwardKernel<T, D, false, true, true>(tp);
                else
                  sc::WgmmaTmaPersistentBackwardKernel<T, D>(tp);
              });
}
// The TMA backward, as LaunchTmaBackward runs it.
template <typename T, int D>
void TmaBackward(const sc::BwdParams& p) {
  using Tile = sc::TmaBwdTile<D>;
  const sc::Dims& d = p.dims;
  sc::TmaBwdParams tp{};
  ASSERT_TRUE(TmaMaps<Tile>(p, &tp));
  emu::Launch(emu::Dim3{CeilDiv(d.L, Tile::kN), static_cast<unsigned>(d.B * d.Hkv), 1}, emu::Dim3{Tile::kThreads, 1, 1},
              Tile::kSmemBytes, [&] { sc::WgmmaTmaBackwardKernel<T, D>(tp); });
}
// The TMA backward with the ordered dQ, as LaunchTmaBackwardOrdered runs it: counters zeroed, then
// every count left where the linked key tiles put it (each released it once).
template <typename T, int D>
void TmaOrderedBackward(const sc::BwdParams& p) {
  using Tile = sc::TmaBwdTile<D, true, true>;
  const sc::Dims& d = p.dims;
  std::vector<int> order(static_cast<size_t>(sc::OrderedDqInts(d)), 0);
  sc::TmaBwdParams tp{};
  tp.p = p;
  tp.p.dq_order = order.data();
  ASSERT_TRUE(TmaMaps<Tile>(tp.p, &tp));
  const unsigned tiles = sc::KeyTileCount(p, Tile::kN), slots = static_cast<unsigned>(d.B * d.Hkv);
  if (tiles == 0) return;
  emu::Launch(emu::Dim3{tiles, slots, 1}, emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes,
              [&] { sc::WgmmaTmaBackwardKernel<T, D, false, true, true, true>(tp); });
  EXPECT_EQ(order[0], static_cast<int>(tiles * slots)) << "tickets";
  const int64_t m_tiles = (d.L + Tile::kM - 1) / Tile::kM;
  for (unsigned slot = 0; slot < slots; ++slot)
    for (int64_t m = 0; m < m_tiles; ++m) {
      int linked = 0;
      for (unsigned t = 0; t < tiles; ++t)
        linked += sc::LinkedPlace<false>(p.mask, m * Tile::kM, Tile::kM, p.key_begin, Tile::kN, t) >= 0;
      ASSERT_EQ(order[static_cast<size_t>(1 + slot * m_tiles + m)], linked) << "slot " << slot << ", query tile " << m;
    }
}
template <typename T>
void SimtForward(const sc::FwdParams& p) {
  emu::Launch(emu::Dim3{sc::QueryTileCount(p.mask, sc::kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hq), 1},
              emu::Dim3{128, 1, 1}, static_cast<size_t>(sc::SimtForwardSmemFloats(p.dims.D)) * 4,
              [&] { sc::SimtForwardKernel<T>(p); });
}
template <typename T>
void SimtBackward(const sc::BwdParams& p) {
  emu::Launch(emu::Dim3{sc::QueryTileCount(p.mask, sc::kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hq), 1},
              emu::Dim3{128, 1, 1}, static_cast<size_t>(sc::SimtDqSmemFloats(p.dims.D)) * 4,
              [&] { sc::SimtBackwardDqKernel<T>(p); });
  emu::Launch(emu::Dim3{CeilDiv(p.dims.L, sc::kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hkv), 1},
              emu::Dim3{128, 1, 1}, static_cast<size_t>(sc::SimtDkvSmemFloats(p.dims.D)) * 4,
              [&] { sc::SimtBackwardDkvKernel<T>(p); });
}

// The paths of the three-consumer forwards, for the other passes and head dims.
Path TwoConsumers(Path path) {
  return path == Path::kTmaThree ? Path::kTma : path == Path::kTmaThreePersistent ? Path::kTmaPersistent : path;
}

template <typename T>
void Forward(Path path, const sc::FwdParams& p) {
  if (path == Path::kSimt) return SimtForward<T>(p);
  if constexpr (!std::is_same<T, sc::Float>::value) {
    if (path == Path::kTmaThree && p.dims.D == 64) return TmaForward<T, 64, 3>(p);
    if (path == Path::kTmaThreePersistent && p.dims.D == 64) return TmaPersistentForward<T, 64, 3>(p);
    path = TwoConsumers(path);
    if (path == Path::kTmaPersistent && p.dims.D == 64) return TmaPersistentForward<T, 64>(p);
    if (path == Path::kTmaPersistent && p.dims.D == 128) return TmaPersistentForward<T, 128>(p);
    if (path == Path::kTmaPersistent && p.dims.D == 256) return TmaPersistentForward<T, 256>(p);
    const bool tma = path == Path::kTma || path == Path::kTmaOrdered;
    if (tma && p.dims.D == 64) return TmaForward<T, 64>(p);
    if (tma && p.dims.D == 128) return TmaForward<T, 128>(p);
    if (path == Path::kWgmma && p.dims.D == 64)
      return ForwardTiles<sc::WgmmaFwdTile<64>>(p, sc::WgmmaForwardKernel<T, 64>);
    if (path == Path::kWgmma && p.dims.D == 128)
      return ForwardTiles<sc::WgmmaFwdTile<128>>(p, sc::WgmmaForwardKernel<T, 128>);
    if (tma && p.dims.D == 256) return TmaForward<T, 256>(p);
    if (path == Path::kWgmma && p.dims.D == 256)
      return ForwardTiles<sc::WgmmaFwdTile<256>>(p, sc::WgmmaForwardKernel<T, 256>);
    // mma.sync: the build the launcher takes, with the call's ends or without (mma_launch.cuh).
    const bool ends = p.first != 0 || p.out.data != nullptr;
    if (p.dims.D == 64)
      return ForwardTiles<sc::FwdTile<64>>(
          p, ends ? sc::MmaForwardKernel<T, 64, false, true> : sc::MmaForwardKernel<T, 64, false, false>);
    if (p.dims.D == 128)
      return ForwardTiles<sc::FwdTile<128>>(
          p, ends ? sc::MmaForwardKernel<T, 128, false, true> : sc::MmaForwardKernel<T, 128, false, false>);
    if (p.dims.D == 256)
      return ForwardTiles<sc::FwdTile<256>>(
          p, ends ? sc::MmaForwardKernel<T, 256, false, true> : sc::MmaForwardKernel<T, 256, false, false>);
  }
  FAIL() << "no tensor-core kernel for this case";
}
template <typename T>
void Backward(Path path, const sc::BwdParams& p) {
  path = TwoConsumers(path);
  if (path == Path::kSimt) return SimtBackward<T>(p);
  if constexpr (!std::is_same<T, sc::Float>::value) {
    if (path == Path::kTmaPersistent && p.dims.D == 64) return TmaPersistentBackward<T, 64>(p);
    if (path == Path::kTmaPersistent && p.dims.D == 128) return TmaPersistentBackward<T, 128>(p);
    if (path == Path::kTma && p.dims.D == 64) return TmaBackward<T, 64>(p);
    if (path == Path::kTma && p.dims.D == 128) return TmaBackward<T, 128>(p);
    if (path == Path::kTmaOrdered && p.dims.D == 64) return TmaOrderedBackward<T, 64>(p);
    if (path == Path::kTmaOrdered && p.dims.D == 128) return TmaOrderedBackward<T, 128>(p);
    if (path == Path::kWgmma && p.dims.D == 64) return WgmmaBackward<T, 64>(p);
    if (path == Path::kWgmma && p.dims.D == 128) return WgmmaBackward<T, 128>(p);
    // Head dim 256: both Hopper families run the wgmma kernel that splits the columns between its
    // warpgroups; mma.sync's splits them between two warps per 16 keys.
    if (path != Path::kMma && p.dims.D == 256) return WideBackward<T, 256>(p);
    if (p.dims.D == 256) return MmaBackward<T, 256>(p);
    if (p.dims.D == 64) return MmaBackward<T, 64>(p);
    if (p.dims.D == 128) return MmaBackward<T, 128>(p);
  }
  FAIL() << "no tensor-core kernel for this case";
}

// One grid-stride launch of an elementwise kernel.
void Elementwise(int64_t n, const std::function<void()>& body) {
  emu::Launch(emu::Dim3{std::max(1u, std::min(CeilDiv(n, 256), 64u)), 1, 1}, emu::Dim3{256, 1, 1}, 0, body);
}

template <typename T>
void RunCase(const Case& c) {
  const int64_t B = c.B, L = c.L, Hq = c.Hq, Hkv = c.Hkv, D = c.D, nb = static_cast<int64_t>(c.blocks.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937_64 rng(c.L * 31 + c.D);
  Tensor q({B, L, Hq, D}, c.dt), dout({B, L, Hq, D}, c.dt);
  q.FillRandom(rng, c.q_std);
  dout.FillRandom(rng);
  std::vector<Tensor> ks, vs;
  for (const Block& blk : c.blocks) {
    std::mt19937_64 r2(blk.seed);
    ks.emplace_back(std::vector<int64_t>{B, L, Hkv, D}, c.dt);
    vs.emplace_back(std::vector<int64_t>{B, L, Hkv, D}, c.dt);
    ks.back().FillRandom(r2);
    vs.back().FillRandom(r2);
  }

  // float64 reference over the union of the blocks' visible keys, on the inputs converted once.
  const int64_t group = Hq / Hkv;
  const std::vector<double> qd = q.ToDouble(), dod = dout.ToDouble();
  std::vector<std::vector<double>> kd, vd;
  for (int64_t x = 0; x < nb; ++x) {
    kd.push_back(ks[static_cast<size_t>(x)].ToDouble());
    vd.push_back(vs[static_cast<size_t>(x)].ToDouble());
  }
  auto Q = [&](int64_t i) { return qd[static_cast<size_t>(i)]; };
  auto dO = [&](int64_t i) { return dod[static_cast<size_t>(i)]; };
  std::vector<double> out_ref(static_cast<size_t>(B * L * Hq * D), 0.0), lse_ref(static_cast<size_t>(B * Hq * L));
  std::vector<double> dq_ref(out_ref.size(), 0.0);
  std::vector<std::vector<double>> dk_ref(static_cast<size_t>(nb),
                                          std::vector<double>(static_cast<size_t>(B * L * Hkv * D), 0.0));
  auto dv_ref = dk_ref;
  auto at4 = [&](int64_t b, int64_t i, int64_t h, int64_t H, int64_t d) { return ((b * L + i) * H + h) * D + d; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t hk = h / group;
        std::vector<std::array<int64_t, 2>> keys;
        std::vector<double> s;
        for (int64_t x = 0; x < nb; ++x)
          for (int64_t j = 0; j < L; ++j) {
            if (!RefVisible(c.blocks[static_cast<size_t>(x)].mask, i, j)) continue;
            double acc = 0;
            for (int64_t d = 0; d < D; ++d)
              acc += Q(at4(b, i, h, Hq, d)) * kd[static_cast<size_t>(x)][static_cast<size_t>(at4(b, j, hk, Hkv, d))];
            keys.push_back({x, j});
            s.push_back(c.softcap > 0 ? c.softcap * std::tanh(acc * scale / c.softcap) : acc * scale);
          }
        const size_t row = static_cast<size_t>((b * Hq + h) * L + i);
        if (keys.empty()) {
          lse_ref[row] = -INFINITY;
          continue;
        }
        double mx = -INFINITY, sum = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double x : s) sum += std::exp(x - mx);
        const double lse = mx + std::log(sum);
        lse_ref[row] = lse;
        std::vector<double> p(s.size());
        for (size_t n = 0; n < s.size(); ++n) p[n] = std::exp(s[n] - lse);
        double delta = 0;
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (size_t n = 0; n < s.size(); ++n)
            o += p[n] * vd[static_cast<size_t>(keys[n][0])][static_cast<size_t>(at4(b, keys[n][1], hk, Hkv, d))];
          out_ref[static_cast<size_t>(at4(b, i, h, Hq, d))] = o;
          delta += o * dO(at4(b, i, h, Hq, d));
        }
        for (size_t n = 0; n < s.size(); ++n) {
          const std::vector<double>& K = kd[static_cast<size_t>(keys[n][0])];
          const std::vector<double>& V = vd[static_cast<size_t>(keys[n][0])];
          const int64_t j = keys[n][1];
          double dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += dO(at4(b, i, h, Hq, d)) * V[static_cast<size_t>(at4(b, j, hk, Hkv, d))];
          // Through the softcap: the capped score's slope, 1 - tanh² (s[n] / cap = tanh).
          const double slope = c.softcap > 0 ? 1.0 - (s[n] / c.softcap) * (s[n] / c.softcap) : 1.0;
          const double ds = p[n] * (dp - delta) * scale * slope;
          for (int64_t d = 0; d < D; ++d) {
            dq_ref[static_cast<size_t>(at4(b, i, h, Hq, d))] += ds * K[static_cast<size_t>(at4(b, j, hk, Hkv, d))];
            dk_ref[static_cast<size_t>(keys[n][0])][static_cast<size_t>(at4(b, j, hk, Hkv, d))] +=
                ds * Q(at4(b, i, h, Hq, d));
            dv_ref[static_cast<size_t>(keys[n][0])][static_cast<size_t>(at4(b, j, hk, Hkv, d))] +=
                p[n] * dO(at4(b, i, h, Hq, d));
          }
        }
      }

  // Forward, both ways the backend runs it: the running state through every block, then the
  // finish kernel; and fused, where a block that covers every row and is the call's first starts
  // the state empty, and one that is its last writes out and LSE itself (forward_state.cuh). The
  // state starts as NaN in the fused run, so a first block that read it would fail.
  const sc::Dims dims{c.B, c.L, c.Hq, c.Hkv, c.D};
  const int64_t rows = B * Hq * L;
  const sc::RowsArg qa{q.dl.data, L * Hq * D, Hq * D, D};
  const double tol = c.dt == Dt::kF32 ? 1e-5 : 2e-2;
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused first and last blocks" : "state, then the finish kernel");
    const float start = fused ? NAN : 0.f;
    std::vector<float> acc(static_cast<size_t>(rows * D), start), m(static_cast<size_t>(rows), start),
        l(static_cast<size_t>(rows), start);
    auto clear_state = [&] {
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.f);
    };
    if (!fused) clear_state();
    Tensor out({B, L, Hq, D}, c.dt), lse({B, Hq, L}, Dt::kF32);
    out.Poison();
    lse.Poison();
    const sc::RowsOut oa{out.dl.data, L * Hq * D, Hq * D, D};
    std::vector<int64_t> work;  // the blocks the engine hands to the backend: the non-empty ones
    for (int64_t x = 0; x < nb; ++x) {
      const sc::MaskArgs& mk = c.blocks[static_cast<size_t>(x)].mask;
      if (mk.q_begin < mk.q_end && mk.k_begin < mk.k_end && !(mk.diagonal && mk.q_end - 1 + mk.offset < mk.k_begin))
        work.push_back(x);
    }
    bool finished = false;
    for (size_t w = 0; w < work.size(); ++w) {
      const int64_t x = work[w];
      sc::FwdParams p{};
      p.dims = dims;
      p.q = qa;
      p.k = ks[static_cast<size_t>(x)].dl.data;
      p.v = vs[static_cast<size_t>(x)].dl.data;
      p.acc = acc.data();
      p.m = m.data();
      p.l = l.data();
      p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
      p.softcap = Softcap(c, scale);
      p.mask = c.blocks[static_cast<size_t>(x)].mask;
      p.head_group = c.head_group;
      const bool covers = sc::CoversEveryRow(p.mask, L);
      if (fused && w == 0) {
        if (covers)
          p.first = 1;
        else
          clear_state();
      }
      if (fused && w + 1 == work.size() && covers) {
        p.out = oa;
        p.lse = static_cast<float*>(lse.dl.data);
        p.lb = Hq * L;
        p.lh = L;
        p.li = 1;
        finished = true;
      }
      Forward<T>(c.path, p);
    }
    if (fused && work.empty()) clear_state();
    if (!finished)
      Elementwise(rows * D, [&] {
        sc::ForwardFinishKernel<T>(dims, acc.data(), m.data(), l.data(), oa, static_cast<float*>(lse.dl.data), Hq * L,
                                   L, 1);
      });
    EXPECT_LT(RelError(out.ToDouble(), out_ref), tol) << "out";
    EXPECT_LT(RelError(lse.ToDouble(), lse_ref), c.dt == Dt::kF32 ? 1e-5 : 1e-3) << "lse";
  }

  // Backward from the reference's own output and LSE (as the ring's backward gets the forward's).
  Tensor o_in({B, L, Hq, D}, c.dt), lse_in({B, Hq, L}, Dt::kF32);
  for (int64_t x = 0; x < o_in.numel(); ++x) o_in.Set(x, out_ref[static_cast<size_t>(x)]);
  for (int64_t x = 0; x < lse_in.numel(); ++x) lse_in.Set(x, lse_ref[static_cast<size_t>(x)]);
  std::vector<float> lse2(static_cast<size_t>(rows)), delta(static_cast<size_t>(rows));
  std::vector<float> dq_acc(static_cast<size_t>(rows * D), 0.f);
  const sc::RowsArg oin{o_in.dl.data, L * Hq * D, Hq * D, D}, doa{dout.dl.data, L * Hq * D, Hq * D, D};
  emu::Launch(emu::Dim3{CeilDiv(rows, 8), 1, 1}, emu::Dim3{256, 1, 1}, 0, [&] {
    sc::BackwardPrepKernel<T>(dims, oin, doa, static_cast<const float*>(lse_in.dl.data), Hq * L, L, 1, lse2.data(),
                              delta.data());
  });
  Tensor dq({B, L, Hq, D}, c.dt);
  dq.Poison();
  for (int64_t x = 0; x < nb; ++x) {
    // NaN, not zeros: the kernels write every row of the partials (key_grads.cuh).
    std::vector<float> dkv(static_cast<size_t>(2 * B * L * Hkv * D), NAN);
    sc::BwdParams p{};
    p.dims = dims;
    p.q = qa;
    p.dout = doa;
    p.k = ks[static_cast<size_t>(x)].dl.data;
    p.v = vs[static_cast<size_t>(x)].dl.data;
    p.lse2 = lse2.data();
    p.delta = delta.data();
    p.dq_acc = dq_acc.data();
    p.dk = dkv.data();
    p.dv = dkv.data() + B * L * Hkv * D;
    p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
    p.scale = static_cast<float>(scale);
    p.softcap = Softcap(c, scale);
    p.mask = c.blocks[static_cast<size_t>(x)].mask;
    p.head_group = c.head_group;
    Backward<T>(c.path, p);
    Tensor dk({B, L, Hkv, D}, c.dt), dv({B, L, Hkv, D}, c.dt);
    dk.Poison();
    dv.Poison();
    const sc::RowsOut dka{dk.dl.data, L * Hkv * D, Hkv * D, D}, dva{dv.dl.data, L * Hkv * D, Hkv * D, D};
    Elementwise(B * L * Hkv * D, [&] { sc::KvGradFinishKernel<T>(dims, p.dk, dka); });
    Elementwise(B * L * Hkv * D, [&] { sc::KvGradFinishKernel<T>(dims, p.dv, dva); });
    EXPECT_LT(RelError(dk.ToDouble(), dk_ref[static_cast<size_t>(x)]), tol) << "dk of block " << x;
    EXPECT_LT(RelError(dv.ToDouble(), dv_ref[static_cast<size_t>(x)]), tol) << "dv of block " << x;

    // Again, as a world of one runs its only block: dK and dV straight into the caller's tensors
    // (key_grads.cuh), here [B, Hkv, L, D] memory viewed as [B, L, Hkv, D], over NaN partials
    // that nothing may read; its dQ share into a scratch accumulator.
    Tensor dk_t({B, Hkv, L, D}, c.dt), dv_t({B, Hkv, L, D}, c.dt);
    dk_t.Poison();
    dv_t.Poison();
    std::fill(dkv.begin(), dkv.end(), NAN);
    std::vector<float> dq_scratch(dq_acc.size(), 0.f);
    p.dq_acc = dq_scratch.data();
    p.dk_out = sc::RowsOut{dk_t.dl.data, Hkv * L * D, D, L * D};
    p.dv_out = sc::RowsOut{dv_t.dl.data, Hkv * L * D, D, L * D};
    Backward<T>(c.path, p);
    auto rows_order = [&](const Tensor& t) {  // [B, Hkv, L, D] memory in [B, L, Hkv, D] order
      std::vector<double> r(static_cast<size_t>(t.numel()));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < L; ++j)
          for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t d = 0; d < D; ++d)
              r[static_cast<size_t>(at4(b, j, h, Hkv, d))] = t.Get(((b * Hkv + h) * L + j) * D + d);
      return r;
    };
    EXPECT_LT(RelError(rows_order(dk_t), dk_ref[static_cast<size_t>(x)]), tol) << "dk written whole, block " << x;
    EXPECT_LT(RelError(rows_order(dv_t), dv_ref[static_cast<size_t>(x)]), tol) << "dv written whole, block " << x;
  }
  const sc::RowsOut dqa{dq.dl.data, L * Hq * D, Hq * D, D};
  Elementwise(rows * D, [&] { sc::DqFinishKernel<T>(dims, dq_acc.data(), static_cast<float>(scale), dqa); });
  EXPECT_LT(RelError(dq.ToDouble(), dq_ref), tol) << "dq";
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class KernelsVsReference : public ::testing::TestWithParam<Case> {};
TEST_P(KernelsVsReference, ForwardAndBackward) {
  const Case& c = GetParam();
  switch (c.dt) {
    case Dt::kF32:
      return RunCase<sc::Float>(c);
    case Dt::kF16:
      return RunCase<sc::Half>(c);
    case Dt::kBF16:
      return RunCase<sc::BFloat>(c);
  }
}

sc::MaskArgs Dense(int64_t L) {
  return sc::MaskArgs{0, L, 0, L, 0, 0};
}
sc::MaskArgs Diagonal(int64_t L, int64_t offset) {
  return sc::MaskArgs{0, L, 0, L, 1, offset};
}

std::vector<Case> Cases() {
  std::vector<Case> cs;
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kSimt,
                    Path::kTmaThree, Path::kTmaThreePersistent})
    for (Dt dt : {Dt::kBF16, Dt::kF16})
      for (int D : {64, 128}) {
        if (D != 64 && TwoConsumers(path) != path) continue;
        // The own block of a causal striped/contiguous rank, and the dense block before it.
        cs.push_back(Case{"causal_then_dense", dt, path, 1, 80, 4, 2, D, {{Diagonal(80, 0), 1}, {Dense(80), 2}}});
        // Striped: a later rank's block (j <= i - 1), so query 0 sees nothing in it.
        cs.push_back(Case{"striped_later_block", dt, path, 1, 70, 2, 1, D, {{Diagonal(70, -1), 3}}});
        // Zigzag halves: every query x the first half of the keys; the second half of the queries
        // x every key.
        cs.push_back(Case{"zigzag_halves",
                          dt,
                          path,
                          2,
                          96,
                          2,
                          2,
                          D,
                          {{sc::MaskArgs{0, 96, 0, 48, 0, 0}, 4}, {sc::MaskArgs{48, 96, 0, 96, 0, 0}, 5}}});
      }
  // Shapes the tiles cut unevenly: 1 and 2 tokens, 130 (three 64-wide tiles), GQA 4:1, D 128.
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kTmaThree,
                    Path::kTmaThreePersistent}) {
    cs.push_back(Case{"one_token", Dt::kBF16, path, 1, 1, 2, 1, 64, {{Diagonal(1, 0), 6}}});
    cs.push_back(Case{"two_tokens_offset", Dt::kF16, path, 1, 2, 2, 2, 128, {{Diagonal(2, -1), 7}, {Dense(2), 8}}});
    cs.push_back(Case{"three_tiles_gqa", Dt::kBF16, path, 1, 130, 4, 1, 64, {{Diagonal(130, 0), 9}}});
    cs.push_back(
        Case{"three_tiles_d128", Dt::kBF16, path, 1, 130, 2, 1, 128, {{Diagonal(130, 5), 10}, {Dense(130), 11}}});
    // Three 128-query CTAs over several key tiles: on the striped diagonal each warp (warpgroup)
    // skips the key tiles only the CTA's later rows see; the last CTA is mostly past the end.
    cs.push_back(Case{"three_ctas_striped", Dt::kF16, path, 1, 290, 2, 1, 64, {{Diagonal(290, -1), 15}}});
  }
  // CTAs whose rows see no key of a block (rows 0-199 under j <= i - 200): in the call's first or
  // last block they still own their rows (forward_state.cuh, IdleRows), as the only block, the
  // last after one that set the state, and the first before one that reads it.
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kSimt,
                    Path::kTmaThree, Path::kTmaThreePersistent}) {
    const sc::MaskArgs far = Diagonal(290, -200);
    cs.push_back(Case{"idle_ctas_alone", Dt::kBF16, path, 1, 290, 2, 1, 64, {{far, 19}}});
    cs.push_back(Case{"idle_ctas_last", Dt::kF16, path, 1, 290, 2, 1, 64, {{Dense(290), 20}, {far, 21}}});
    cs.push_back(Case{"idle_ctas_first", Dt::kBF16, path, 1, 290, 2, 1, 128, {{far, 22}, {Dense(290), 23}}});
  }
  // Five key tiles per query tile: the wgmma forward's double-buffered K/V pipeline wraps around
  // its buffers twice (the TMA kernels' stages flip their barrier parities twice); the backward
  // walks five query tiles per key tile.
  for (Path path : {Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kTmaThree,
                    Path::kTmaThreePersistent}) {
    cs.push_back(Case{"three_ctas_d128", Dt::kBF16, path, 1, 300, 2, 2, 128, {{Diagonal(300, 3), 16}}});
    cs.push_back(Case{"five_key_tiles", Dt::kBF16, path, 1, 560, 1, 1, 64, {{Dense(560), 18}}});
  }
  // The wgmma backward's key warpgroups: under GQA each query head restarts the causal walk, so
  // the second warpgroup of a key tile sits out the first query tile of every head (its dS^T
  // in shared memory is the previous head's) while the first one works.
  for (Path path : {Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered})
    cs.push_back(Case{"gqa_restarts_d128", Dt::kF16, path, 1, 200, 3, 1, 128, {{Diagonal(200, 0), 17}}});
  // Logit softcapping on every family, forward and backward, over a diagonal and a dense block (a cap of 2
  // bends scores of this size well away from the identity).
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kSimt,
                    Path::kTmaThree, Path::kTmaThreePersistent})
    for (int D : {64, 128}) {
      if (D != 64 && TwoConsumers(path) != path) continue;
      Case capped{"softcap", D == 64 ? Dt::kBF16 : Dt::kF16,          path, 1, 80, 4, 2,
                  D,         {{Diagonal(80, 0), 24}, {Dense(80), 25}}};
      capped.softcap = 2.f;
      cs.push_back(capped);
    }
  // Gemma 2's cap of 30 with scores of tens (Q's values spread 40 times wider): most capped logits
  // sit near the cap, where the tensor-core kernels' tanh (the special-function unit's, emulated
  // at its documented precision) errs most.
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaThree}) {
    const int D = path == Path::kTmaThree ? 64 : 128;
    Case capped{"softcap_near_the_cap", Dt::kBF16, path, 1, 150, 2, 1, D, {{Diagonal(150, 0), 27}, {Dense(150), 28}}};
    capped.softcap = 30.f;
    capped.q_std = 40.0;
    cs.push_back(capped);
  }
  // Head dim 256 on every family (the Hopper forwards' 64-key tiles, o of 128 floats a thread;
  // mma.sync's forward with a warp per 16 rows): four key tiles a CTA (the K/V buffers and stages
  // wrap twice), causal offsets, GQA, two CTAs over two batch rows, softcap, idle CTAs of a last
  // block; the backward's 64-key CTAs walk up to five query tiles (the Q/dO stages wrap; mma.sync's
  // 16-query steps, thirteen) and, under GQA, each head's.
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent}) {
    cs.push_back(
        Case{"d256_causal_then_dense", Dt::kBF16, path, 1, 200, 4, 2, 256, {{Diagonal(200, 0), 30}, {Dense(200), 31}}});
    cs.push_back(Case{"d256_two_ctas_striped", Dt::kF16, path, 2, 150, 2, 1, 256, {{Diagonal(150, -1), 32}}});
    cs.push_back(
        Case{"d256_idle_ctas_last", Dt::kBF16, path, 1, 290, 1, 1, 256, {{Dense(290), 34}, {Diagonal(290, -200), 35}}});
    Case capped{"d256_softcap", Dt::kBF16, path, 1, 90, 2, 2, 256, {{Diagonal(90, 5), 33}}};
    capped.softcap = 2.f;
    cs.push_back(capped);
  }
  // Heads in groups (CtaSlotAt): 12 query heads in groups of 5 (the last one of 2) and their 4 K/V
  // heads in groups of 5 (one group) over several tiles, causal; and a group of one head.
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kTmaThree,
                    Path::kTmaThreePersistent}) {
    Case grouped{"head_groups", Dt::kBF16, path, 2, 300, 6, 2, 64, {{Diagonal(300, 0), 40}}};
    grouped.head_group = 5;
    cs.push_back(grouped);
    if (TwoConsumers(path) != path) continue;
    Case single{"head_groups_of_one", Dt::kF16, path, 1, 200, 4, 4, 128, {{Diagonal(200, 3), 41}, {Dense(200), 42}}};
    single.head_group = 1;
    cs.push_back(single);
  }
  Case capped_f32{"softcap_simt_f32", Dt::kF32, Path::kSimt, 1, 37, 2, 1, 24, {{Diagonal(37, -1), 26}}};
  capped_f32.softcap = 1.5f;
  cs.push_back(capped_f32);
  // SIMT only: float32 and head dims without tensor-core kernels.
  for (int D : {1, 24, 64, 100, 256})
    cs.push_back(Case{"simt_f32", Dt::kF32, Path::kSimt, 1, 37, 2, 1, D, {{Diagonal(37, 0), 12}, {Dense(37), 13}}});
  cs.push_back(Case{"simt_bf16_d40", Dt::kBF16, Path::kSimt, 2, 33, 4, 2, 40, {{Diagonal(33, -1), 14}}});
  return cs;
}

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::ostringstream os;
  const char* path = c.path == Path::kSimt                 ? "_simt"
                     : c.path == Path::kMma                ? "_tc"
                     : c.path == Path::kTma                ? "_tma"
                     : c.path == Path::kTmaPersistent      ? "_tma_persistent"
                     : c.path == Path::kTmaOrdered         ? "_tma_ordered"
                     : c.path == Path::kTmaThree           ? "_tma_three"
                     : c.path == Path::kTmaThreePersistent ? "_tma_three_persistent"
                                                           : "_wgmma";
  os << c.name << "_" << DtName(c.dt) << path << "_L" << c.L << "_D" << c.D;
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(Emulated, KernelsVsReference, ::testing::ValuesIn(Cases()), Name);

// Random shapes and masks beyond the hand-picked ones, for both tensor-core families: lengths
// that cut tiles anywhere, GQA groups of 1 to 3, and per block a random rectangle of queries and
// keys with or without a diagonal at a random offset (empty blocks included), as no layout
// produces them but the kernels' contract allows; half of them take every query row, so that the
// fused first and last blocks meet them too. Seeded, so a failure reproduces.
std::vector<Case> RandomCases() {
  std::vector<Case> cs;
  std::mt19937_64 rng(20261123);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  // The three-consumer forwards last, so that the cases before them keep their draws; at head dim
  // 64 (their only one), fewer, as their backwards are the paths before.
  for (Path path : {Path::kMma, Path::kWgmma, Path::kTma, Path::kTmaPersistent, Path::kTmaOrdered, Path::kTmaThree,
                    Path::kTmaThreePersistent})
    for (int i = 0; i < (path == Path::kMma || path == Path::kWgmma ? 16 : TwoConsumers(path) != path ? 6 : 8); ++i) {
      const int L = static_cast<int>(pick(1, 260)), Hkv = static_cast<int>(pick(1, 2));
      const int Hq = Hkv * static_cast<int>(pick(1, 3)), B = static_cast<int>(pick(1, 2));
      Case c{"random" + std::to_string(i),
             pick(0, 1) ? Dt::kBF16 : Dt::kF16,
             path,
             B,
             L,
             Hq,
             Hkv,
             pick(0, 1) ? 64 : 128,
             {}};
      if (TwoConsumers(path) != path) c.D = 64;
      c.head_group = static_cast<uint32_t>(i % 3);  // no groups, groups of one head, of two
      const int blocks = static_cast<int>(pick(1, 2));
      for (int x = 0; x < blocks; ++x) {
        sc::MaskArgs m{};
        const bool every_row = pick(0, 1);  // a block the fused first/last forward may take
        m.q_begin = every_row ? 0 : pick(0, L - 1);
        m.q_end = every_row ? L : pick(m.q_begin + 1, L);
        m.k_begin = pick(0, L - 1);
        m.k_end = pick(m.k_begin + 1, L);
        m.diagonal = static_cast<int>(pick(0, 1));
        m.offset = m.diagonal ? pick(-L / 2, L / 2) : 0;
        c.blocks.push_back(Block{m, static_cast<uint64_t>(100 + 10 * i + x)});
      }
      cs.push_back(c);
    }
  return cs;
}
INSTANTIATE_TEST_SUITE_P(Random, KernelsVsReference, ::testing::ValuesIn(RandomCases()), Name);

// The tensor-core kernels' tanh (softcap.cuh): within 4e-7 of tanh, absolute and relative, over
// every float step of 1e-5 in [-20, 20] (past the clamp at 9 too), odd, and NaN through.
TEST(Softcap, RationalTanhWithinFloatPrecision) {
  double worst_abs = 0, worst_rel = 0;
  for (int i = -2000000; i <= 2000000; ++i) {
    const float x = static_cast<float>(i) * 1e-5f;
    const double t = sc::RationalTanh(x), ref = std::tanh(static_cast<double>(x));
    worst_abs = std::max(worst_abs, std::fabs(t - ref));
    if (x != 0.f) worst_rel = std::max(worst_rel, std::fabs(t - ref) / std::fabs(ref));
    ASSERT_EQ(sc::RationalTanh(-x), -sc::RationalTanh(x)) << x;
  }
  EXPECT_LE(worst_abs, 4e-7);
  EXPECT_LE(worst_rel, 4e-7);
  EXPECT_EQ(sc::RationalTanh(1e-30f), 1e-30f);
  EXPECT_NEAR(sc::RationalTanh(std::numeric_limits<float>::infinity()), 1.f, 4e-7f);
  EXPECT_NEAR(sc::RationalTanh(-std::numeric_limits<float>::infinity()), -1.f, 4e-7f);
  EXPECT_TRUE(std::isnan(sc::RationalTanh(std::numeric_limits<float>::quiet_NaN())));
}

// The ordered dQ's links (ordered_dq.cuh): every query tile a backward CTA walks (QueryTilesOf) is
// linked to its key tile, or its adds would never be admitted; and the key tiles linked to a query
// tile are consecutive, their places 0, 1, 2, ... in key order, or a wait would never be met. On
// random rectangles, diagonals, key_begin and document bounds (non-decreasing per row, as the
// kernels' bisections assume), at both query tile sizes the TMA backward takes.
// The order of CTAs with heads in groups (CtaSlotAt): every (tile, head) slot once; a group's CTAs
// before the next group's; within a group tile-major (its heads' first tiles first); and a head's
// tiles in order, which the ordered dQ's waits need (a key tile's CTA waits for the tile before).
TEST(CtaSlots, GroupsCoverEverySlotOnceInOrder) {
  for (unsigned tiles : {1u, 3u, 8u})
    for (unsigned heads : {1u, 2u, 7u, 12u})
      for (unsigned group : {0u, 1u, 2u, 5u, 12u, 40u}) {
        SCOPED_TRACE(std::to_string(tiles) + " tiles, " + std::to_string(heads) + " heads, group " +
                     std::to_string(group));
        std::vector<int> seen(static_cast<size_t>(tiles * heads), 0);
        std::vector<int> last_tile(heads, -1);
        unsigned last_group = 0;
        const unsigned g = group == 0 || group >= heads ? heads : group;
        for (uint64_t linear = 0; linear < uint64_t{tiles} * heads; ++linear) {
          const sc::CtaSlot s = sc::CtaSlotAt(linear, tiles, heads, group);
          ASSERT_LT(s.tile, tiles);
          ASSERT_LT(s.head, heads);
          ++seen[static_cast<size_t>(s.tile * heads + s.head)];
          EXPECT_GT(static_cast<int>(s.tile), last_tile[s.head]) << "a head's tiles out of order";
          last_tile[s.head] = static_cast<int>(s.tile);
          EXPECT_GE(s.head / g, last_group) << "a group started before the one before it ended";
          last_group = s.head / g;
          const unsigned first = (s.head / g) * g, in_group = std::min(g, heads - first);
          EXPECT_EQ(linear - uint64_t{first} * tiles, uint64_t{s.tile} * in_group + (s.head - first)) << "tile-major";
        }
        for (int n : seen) EXPECT_EQ(n, 1);
      }
}

TEST(OrderedDq, WalkedTilesAreLinkedAndPlacesConsecutive) {
  std::mt19937_64 rng(20261201);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  constexpr int kN = 128;
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t L = pick(1, 1200);
    sc::MaskArgs m{};
    m.q_begin = pick(0, L - 1);
    m.q_end = pick(m.q_begin + 1, L);
    m.k_begin = pick(0, L - 1);
    m.k_end = pick(m.k_begin + 1, L);
    m.diagonal = static_cast<int>(pick(0, 1));
    m.offset = m.diagonal ? pick(-L, L) : 0;
    std::vector<int64_t> lo(static_cast<size_t>(L)), hi(static_cast<size_t>(L));
    const bool docs = pick(0, 1) != 0;
    if (docs) {
      // Documents over the keys, each row in one of them in key order, or seeing nothing (empty
      // bounds where the last row's end, as a plan's padding rows have).
      std::vector<int64_t> cuts{0, L};
      for (int64_t c = pick(0, 8); c > 0; --c) cuts.push_back(pick(0, L));
      std::sort(cuts.begin(), cuts.end());
      size_t doc = 0;
      const int64_t empty_odds = pick(0, 4);  // none, or one row in 2 to 5 on average
      for (int64_t i = 0; i < L; ++i) {
        while (doc + 2 < cuts.size() && pick(0, 9) == 0) ++doc;
        const int64_t last_lo = i > 0 ? lo[static_cast<size_t>(i - 1)] : 0;
        const int64_t last_hi = i > 0 ? hi[static_cast<size_t>(i - 1)] : 0;
        if (empty_odds > 0 && pick(0, empty_odds) == 0) {
          lo[static_cast<size_t>(i)] = hi[static_cast<size_t>(i)] = std::max(last_lo, last_hi);
        } else {
          lo[static_cast<size_t>(i)] = std::max(cuts[doc], last_lo);
          hi[static_cast<size_t>(i)] = std::max(cuts[doc + 1], last_hi);
        }
      }
      m.doc_lo = lo.data();
      m.doc_hi = hi.data();
    }
    const int64_t key_begin = kN * pick(0, (L - 1) / kN);
    const int64_t tiles = (L - key_begin + kN - 1) / kN;
    for (int kM : {64, 128}) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ", kM " + std::to_string(kM));
      const int64_t m_tiles = (L + kM - 1) / kM;
      std::vector<std::vector<int>> places(static_cast<size_t>(m_tiles));
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t j0 = key_begin + t * kN;
        const sc::TileRun walked = sc::QueryTilesOf<true>(m, j0, std::min(j0 + kN, L), kM);
        for (int64_t q = walked.first / kM; q < walked.first / kM + walked.count; ++q)
          ASSERT_GE(sc::LinkedPlace<true>(m, q * kM, kM, key_begin, kN, t), 0)
              << "key tile " << t << ", query tile " << q;
        for (int64_t q = 0; q < m_tiles; ++q) {
          const int place = sc::LinkedPlace<true>(m, q * kM, kM, key_begin, kN, t);
          if (place >= 0) places[static_cast<size_t>(q)].push_back(place);
        }
      }
      for (int64_t q = 0; q < m_tiles; ++q)
        for (size_t x = 0; x < places[static_cast<size_t>(q)].size(); ++x)
          ASSERT_EQ(places[static_cast<size_t>(q)][x], static_cast<int>(x)) << "query tile " << q;
    }
  }
}

// The ordered dQ gives the same bits whatever order the CTAs run in (the emulator's block orders:
// ascending, descending, shuffled), over a causal diagonal with GQA 3:1 and two batch rows, where
// four key tiles add into most query tiles.
TEST(OrderedDq, SameBitsInEveryBlockOrder) {
  const int B = 2, L = 500, Hq = 3, Hkv = 1, D = 64;
  std::mt19937_64 rng(12);
  Tensor q({B, L, Hq, D}, Dt::kBF16), dout({B, L, Hq, D}, Dt::kBF16), k({B, L, Hkv, D}, Dt::kBF16),
      v({B, L, Hkv, D}, Dt::kBF16);
  for (Tensor* t : {&q, &dout, &k, &v}) t->FillRandom(rng);
  std::vector<float> lse2(static_cast<size_t>(B * Hq * L)), delta(lse2.size());
  for (size_t i = 0; i < lse2.size(); ++i) {
    lse2[i] = 4.f + static_cast<float>(i % 7) * 0.25f;
    delta[i] = static_cast<float>(i % 5) * 0.1f - 0.2f;
  }
  const sc::Dims dims{B, L, Hq, Hkv, D};
  std::vector<std::vector<float>> runs;
  const std::pair<emu::Schedule, uint64_t> orders[] = {{emu::Schedule::kWarpsAscending, 0},
                                                       {emu::Schedule::kWarpsDescending, 0},
                                                       {emu::Schedule::kWarpsShuffled, 7},
                                                       {emu::Schedule::kWarpsShuffled, 8}};
  for (const auto& [schedule, seed] : orders) {
    emu::SetSchedule(schedule, seed);
    std::vector<float> dq(static_cast<size_t>(B * Hq * L * D), 0.f), dkv(static_cast<size_t>(2 * B * L * Hkv * D));
    sc::BwdParams p{};
    p.dims = dims;
    p.q = sc::RowsArg{q.dl.data, L * Hq * D, Hq * D, D};
    p.dout = sc::RowsArg{dout.dl.data, L * Hq * D, Hq * D, D};
    p.k = k.dl.data;
    p.v = v.dl.data;
    p.lse2 = lse2.data();
    p.delta = delta.data();
    p.dq_acc = dq.data();
    p.dk = dkv.data();
    p.dv = dkv.data() + B * L * Hkv * D;
    p.scale_log2 = 0.18f;
    p.scale = 0.125f;
    p.mask = Diagonal(L, 0);
    TmaOrderedBackward<sc::BFloat, D>(p);
    runs.push_back(dq);
  }
  emu::ResetSchedule();
  for (size_t r = 1; r < runs.size(); ++r)
    ASSERT_EQ(std::memcmp(runs[0].data(), runs[r].data(), runs[0].size() * 4), 0) << "block order " << r;
}

// The persistent kernels' schedule: every item on exactly one CTA, and under a causal mask's
// evenly falling lengths, from three rounds on, every CTA's sum within a tenth of the longest item
// of the mean (a plain round robin: a quarter to a third of it above; with one or two rounds the
// CTA with the longest item is above the mean by about half of it, whatever the order).
TEST(PersistentItems, EveryItemOnceAndBalanced) {
  for (unsigned count : {1u, 2u, 7u, 131u, 132u, 133u, 512u, 1000u})
    for (unsigned ctas : {1u, 2u, 3u, 132u}) {
      if (ctas > count) continue;
      std::vector<int> taken(count, 0);
      std::vector<double> sum(ctas, 0.0);
      for (unsigned c = 0; c < ctas; ++c) {
        const sc::PersistentItems s{count, c, ctas};
        for (unsigned k = 0; s.HasRound(k); ++k) {
          const unsigned w = s.At(k);
          if (w >= count) continue;
          ++taken[w];
          sum[c] += count - w;  // item w's length: the longest first, falling evenly
        }
      }
      for (unsigned w = 0; w < count; ++w) ASSERT_EQ(taken[w], 1) << "item " << w << " of " << count << ", " << ctas;
      const double mean = static_cast<double>(count) * (count + 1) / 2 / ctas;
      if ((count + ctas - 1) / ctas < 3) continue;
      for (unsigned c = 0; c < ctas; ++c)
        EXPECT_LE(sum[c], mean + 0.1 * count) << "CTA " << c << " of " << ctas << ", " << count << " items";
    }
}

// The shard kernel against the library's host shard/unshard, every layout, a strided full tensor
// (seq_dim 1 of [2, S, 3, 5] viewed through a transposed-heads layout) and a compact local one.
TEST(EmulatedElementwise, ShardMatchesHostShard) {
  const int N = 4;
  const int64_t S = 16, L = S / N;
  Tensor full({2, S, 3, 5}, Dt::kBF16);
  std::mt19937_64 rng(3);
  full.FillRandom(rng);
  for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
    for (int r = 0; r < N; ++r) {
      Tensor want({2, L, 3, 5}, Dt::kBF16), got({2, L, 3, 5}, Dt::kBF16), back({2, S, 3, 5}, Dt::kBF16);
      ASSERT_EQ(stria_shard(lay, N, r, 1, &full.dl, &want.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
      got.Poison();
      sc::ShardArgs a{};
      a.ndim = 4;
      a.seq_dim = 1;
      a.layout = static_cast<int>(lay);
      a.world = N;
      a.rank = r;
      a.L = L;
      for (int i = 0; i < 4; ++i) {
        a.shape[i] = got.shape[static_cast<size_t>(i)];
        a.local_strides[i] = got.strides[static_cast<size_t>(i)];
        a.full_strides[i] = full.strides[static_cast<size_t>(i)];
      }
      a.local = static_cast<char*>(got.dl.data);
      a.full = static_cast<char*>(full.dl.data);
      a.elem_bytes = 2;
      a.to_local = 1;
      Elementwise(got.numel(), [&] { sc::ShardKernel(a); });
      EXPECT_EQ(got.storage, want.storage) << LayoutName(lay) << " rank " << r;
      // And back into a poisoned full tensor: this rank's positions come back, the rest stay NaN.
      back.Poison();
      a.full = static_cast<char*>(back.dl.data);
      a.to_local = 0;
      Elementwise(got.numel(), [&] { sc::ShardKernel(a); });
      int64_t copied = 0;
      for (int64_t x = 0; x < back.numel(); ++x)
        if (!std::isnan(back.Get(x))) {
          EXPECT_EQ(back.Get(x), full.Get(x));
          ++copied;
        }
      EXPECT_EQ(copied, got.numel());
    }
}

// Packing a strided K (head views of a packed tensor) into the compact ring message.
TEST(EmulatedElementwise, PackRowsFollowsStrides) {
  const int64_t B = 2, L = 5, H = 3, D = 8, Htot = 7;
  Tensor packed({B, L, Htot, D}, Dt::kF16);
  std::mt19937_64 rng(8);
  packed.FillRandom(rng);
  const int64_t h0 = 2;
  std::vector<uint16_t> wire(static_cast<size_t>(B * L * H * D), 0xFFFF);
  const sc::RowsArg src{static_cast<const uint16_t*>(packed.dl.data) + h0 * D, L * Htot * D, Htot * D, D};
  const sc::Dims dims{static_cast<int>(B), static_cast<int>(L), static_cast<int>(H), static_cast<int>(H),
                      static_cast<int>(D)};
  Elementwise(B * L * H * D, [&] { sc::PackRowsKernel<2>(dims, static_cast<int>(H), src, wire.data()); });
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          uint16_t want;
          std::memcpy(&want, packed.Ptr(((b * L + i) * Htot + h0 + h) * D + d), 2);
          ASSERT_EQ(wire[static_cast<size_t>(((b * L + i) * H + h) * D + d)], want);
        }
}

}  // namespace

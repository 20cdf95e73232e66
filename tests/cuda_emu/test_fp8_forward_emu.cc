// The FP8 forward (kernels/cuda/tma_forward_fp8.cuh) on the emulator, against a float64 reference on
// the values the e4m3 codes stand for: each block's message packed by PackKE4m3Kernel and TransposeVE4m3Kernel (K rows,
// V transposed with its keys permuted), the kernel over the blocks of a ring step sequence, the state finished by
// ForwardFinishKernel or by the last block itself, the outputs scaled by v's descale (ScaleRowsByHeadKernel). Causal
// and full blocks, a document mask, lengths that are not multiples of the tiles, GQA, per-head and per-tensor descales,
// each output dtype.
//
// The probabilities are rounded to e4m3 for P V, as on the GPU, so the output carries FP8's own
// error (up to 2^-4 relative per probability; 2.1-2.2% of the output, relative L2, in these cases),
// not a 16-bit kernel's: the bound here is 4e-2 on the output. The LSE comes from the
// probabilities before that rounding and stays within 1e-5 (4e-8 here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/elementwise.cuh"
#include "cuda/tma_forward_fp8.cuh"
#include "cuda_emu.h"
#include "fp8_inputs.h"

namespace sc = stria::cuda;
namespace emu = stria::cuda::emu;
using namespace stria_test;

namespace {

struct Block {
  sc::MaskArgs mask;
  int docs = 0;  // > 0: this many documents per batch row cut the block (bounds per query row)
};

struct Case {
  std::string name;
  Dt out;
  int B, L, Hq, Hkv;
  Descale descale;
  std::vector<Block> blocks;
};

constexpr int D = 128;

bool Visible(const sc::MaskArgs& m, const std::vector<int64_t>* lo, const std::vector<int64_t>* hi, int64_t b,
             int64_t L, int64_t i, int64_t j) {
  if (i < m.q_begin || i >= m.q_end || j < m.k_begin || j >= m.k_end) return false;
  if (m.diagonal && j > i + m.offset) return false;
  if (lo != nullptr && (j < (*lo)[static_cast<size_t>(b * L + i)] || j >= (*hi)[static_cast<size_t>(b * L + i)]))
    return false;
  return true;
}

template <typename T>
void RunCase(const Case& c) {
  SCOPED_TRACE(c.name);
  const int B = c.B, L = c.L, Hq = c.Hq, Hkv = c.Hkv, nb = static_cast<int>(c.blocks.size());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::mt19937_64 rng(static_cast<uint64_t>(L) * 7 + nb);
  Fp8Input q({B, L, Hq, D}, c.descale, 1.0, rng);
  std::vector<std::unique_ptr<Fp8Input>> ks, vs;
  for (int x = 0; x < nb; ++x) {
    // One descale for every block: K and V of one tensor, sharded over the ring.
    ks.push_back(std::make_unique<Fp8Input>(std::vector<int64_t>{B, L, Hkv, D}, c.descale, 1.0, rng));
    vs.push_back(std::make_unique<Fp8Input>(std::vector<int64_t>{B, L, Hkv, D}, c.descale, 1.0, rng));
    ks.back()->scales = ks.front()->scales;
    vs.back()->scales = vs.front()->scales;
  }
  // Document bounds per block: cuts at fixed random places, each query row sees its own document.
  std::vector<std::vector<int64_t>> lo(static_cast<size_t>(nb)), hi(static_cast<size_t>(nb));
  for (int x = 0; x < nb; ++x) {
    if (c.blocks[static_cast<size_t>(x)].docs == 0) continue;
    std::uniform_int_distribution<int64_t> cut(1, L - 1);
    for (int b = 0; b < B; ++b) {
      std::vector<int64_t> cuts{0, L};
      for (int n = 1; n < c.blocks[static_cast<size_t>(x)].docs; ++n) cuts.push_back(cut(rng));
      std::sort(cuts.begin(), cuts.end());
      for (int i = 0; i < L; ++i) {
        const auto up = std::upper_bound(cuts.begin(), cuts.end(), i);
        lo[static_cast<size_t>(x)].push_back(*(up - 1));
        hi[static_cast<size_t>(x)].push_back(*up);
      }
    }
  }

  // float64 reference over the union of the blocks' visible keys.
  const std::vector<double> qv = q.Values();
  std::vector<std::vector<double>> kv, vv;
  for (int x = 0; x < nb; ++x) {
    kv.push_back(ks[static_cast<size_t>(x)]->Values());
    vv.push_back(vs[static_cast<size_t>(x)]->Values());
  }
  auto at4 = [&](int64_t b, int64_t i, int64_t h, int64_t H, int64_t d) { return ((b * L + i) * H + h) * D + d; };
  std::vector<double> out_ref(static_cast<size_t>(B) * L * Hq * D, 0.0), lse_ref(static_cast<size_t>(B) * Hq * L);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t hk = h / (Hq / Hkv);
        std::vector<std::pair<int, int64_t>> keys;
        std::vector<double> s;
        for (int x = 0; x < nb; ++x) {
          const bool docs = c.blocks[static_cast<size_t>(x)].docs > 0;
          for (int64_t j = 0; j < L; ++j) {
            if (!Visible(c.blocks[static_cast<size_t>(x)].mask, docs ? &lo[static_cast<size_t>(x)] : nullptr,
                         docs ? &hi[static_cast<size_t>(x)] : nullptr, b, L, i, j))
              continue;
            double acc = 0;
            for (int64_t d = 0; d < D; ++d)
              acc += qv[static_cast<size_t>(at4(b, i, h, Hq, d))] *
                     kv[static_cast<size_t>(x)][static_cast<size_t>(at4(b, j, hk, Hkv, d))];
            keys.emplace_back(x, j);
            s.push_back(acc * scale);
          }
        }
        const size_t row = static_cast<size_t>((b * Hq + h) * L + i);
        if (keys.empty()) {
          lse_ref[row] = -INFINITY;
          continue;
        }
        double mx = -INFINITY, sum = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double x : s) sum += std::exp(x - mx);
        lse_ref[row] = mx + std::log(sum);
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (size_t n = 0; n < s.size(); ++n)
            o += std::exp(s[n] - lse_ref[row]) *
                 vv[static_cast<size_t>(keys[n].first)][static_cast<size_t>(at4(b, keys[n].second, hk, Hkv, d))];
          out_ref[static_cast<size_t>(at4(b, i, h, Hq, d))] = o;
        }
      }

  // The descales as the kernels read them.
  auto step = [&](const Fp8Input& t) { return t.scales.size() > 1 ? 1 : 0; };
  const float* q_ds = q.scales.empty() ? nullptr : q.scales.data();
  const float* k_ds = ks[0]->scales.empty() ? nullptr : ks[0]->scales.data();
  const float* v_ds = vs[0]->scales.empty() ? nullptr : vs[0]->scales.data();
  const sc::Dims dims{B, L, Hq, Hkv, D};
  const int64_t rows = int64_t{B} * Hq * L;
  const sc::RowsArg qa{q.codes.data(), int64_t{L} * Hq * D, int64_t{Hq} * D, D};
  for (bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused first and last blocks" : "state, then the finish kernel");
    std::vector<float> acc(static_cast<size_t>(rows * D), 0.f), m(static_cast<size_t>(rows), -INFINITY),
        l(static_cast<size_t>(rows), 0.f);
    if (fused) {  // a first block that reads the state would read NaN
      std::fill(acc.begin(), acc.end(), NAN);
      std::fill(m.begin(), m.end(), NAN);
      std::fill(l.begin(), l.end(), NAN);
    }
    Tensor out({B, L, Hq, D}, c.out), lse({B, Hq, L}, Dt::kF32);
    out.Poison();
    lse.Poison();
    const sc::RowsOut oa{out.dl.data, int64_t{L} * Hq * D, int64_t{Hq} * D, D};
    bool finished = false;
    for (int x = 0; x < nb; ++x) {
      std::vector<unsigned char> wire(static_cast<size_t>(sc::PackedKvE4m3Bytes(B, L, Hkv)), 0xff);
      sc::PackKvE4m3Args pk{B,
                            L,
                            Hkv,
                            sc::PaddedKeys(L),
                            ks[static_cast<size_t>(x)]->codes.data(),
                            int64_t{L} * Hkv * D,
                            int64_t{Hkv} * D,
                            D,
                            vs[static_cast<size_t>(x)]->codes.data(),
                            int64_t{L} * Hkv * D,
                            int64_t{Hkv} * D,
                            D,
                            wire.data()};
      emu::Launch(emu::Dim3{8, 1, 1}, emu::Dim3{256, 1, 1}, 0, [&] { sc::PackKE4m3Kernel(pk); });
      emu::Launch(emu::Dim3{static_cast<unsigned>(pk.Lp / 128), static_cast<unsigned>(B * Hkv), 1},
                  emu::Dim3{256, 1, 1}, sc::kVtTileSmemBytes, [&] { sc::TransposeVE4m3Kernel(pk); });
      sc::FwdParams p{};
      p.dims = dims;
      p.q = qa;
      p.k = wire.data();
      p.acc = acc.data();
      p.m = m.data();
      p.l = l.data();
      p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
      p.mask = c.blocks[static_cast<size_t>(x)].mask;
      if (c.blocks[static_cast<size_t>(x)].docs > 0) {
        p.mask.doc_lo = lo[static_cast<size_t>(x)].data();
        p.mask.doc_hi = hi[static_cast<size_t>(x)].data();
        p.mask.doc_stride = L;
      }
      const bool covers = sc::CoversEveryRow(p.mask, L);
      if (fused && x == 0) {
        ASSERT_TRUE(covers) << "a fused case's first block covers every row";
        p.first = 1;
      }
      if (fused && x + 1 == nb && covers) {
        p.out = oa;
        p.lse = static_cast<float*>(lse.dl.data);
        p.lb = int64_t{Hq} * L;
        p.lh = L;
        p.li = 1;
        finished = true;
      }
      sc::TmaFp8FwdParams tp;
      ASSERT_TRUE(sc::Fp8ForwardParams(p, q_ds, step(q), k_ds, step(*ks[0]), &tp));
      using Tile = sc::TmaFp8FwdTile;
      emu::Launch(emu::Dim3{sc::QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(B * Hq), 1},
                  emu::Dim3{Tile::kThreads, 1, 1}, Tile::kSmemBytes, [&] {
                    if (p.mask.doc_lo != nullptr)
                      sc::WgmmaTmaFp8ForwardKernel<T, true>(tp);
                    else
                      sc::WgmmaTmaFp8ForwardKernel<T, false>(tp);
                  });
    }
    if (!finished)
      emu::Launch(emu::Dim3{64, 1, 1}, emu::Dim3{256, 1, 1}, 0, [&] {
        sc::ForwardFinishKernel<T>(dims, acc.data(), m.data(), l.data(), oa, static_cast<float*>(lse.dl.data),
                                   int64_t{Hq} * L, L, 1);
      });
    if (v_ds != nullptr)
      emu::Launch(emu::Dim3{64, 1, 1}, emu::Dim3{256, 1, 1}, 0,
                  [&] { sc::ScaleRowsByHeadKernel<T>(dims, v_ds, step(*vs[0]), oa); });
    EXPECT_LT(RelError(out.ToDouble(), out_ref), 4e-2) << "out";
    EXPECT_LT(RelError(lse.ToDouble(), lse_ref), 1e-5) << "lse";
  }
}

sc::MaskArgs Dense(int64_t L) {
  return sc::MaskArgs{0, L, 0, L, 0, 0};
}
sc::MaskArgs Diagonal(int64_t L, int64_t offset) {
  return sc::MaskArgs{0, L, 0, L, 1, offset};
}

std::vector<Case> Cases() {
  return {
      // A causal ring step sequence: the own block's diagonal, then a whole earlier block.
      Case{"causal_bf16_headscale", Dt::kBF16, 1, 256, 2, 1, Descale::kHead, {{Diagonal(256, 0)}, {Dense(256)}}},
      // Not multiples of the tiles (keys past L: zero fill and the transposed V's padding), GQA.
      Case{"ragged_f16_tensorscale", Dt::kF16, 2, 200, 4, 2, Descale::kTensor, {{Dense(200)}, {Diagonal(200, -1)}}},
      // A block seen by only some rows (the state, then the finish kernel) and no descale.
      Case{"partial_f32_nodescale",
           Dt::kF32,
           1,
           150,
           2,
           2,
           Descale::kNone,
           {{Dense(150)}, {sc::MaskArgs{40, 150, 0, 90, 0, 0}}}},
      // Documents.
      Case{"documents_bf16", Dt::kBF16, 2, 130, 2, 1, Descale::kHead, {{Diagonal(130, 0), 4}, {Dense(130), 3}}},
  };
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class Fp8ForwardKernel : public ::testing::TestWithParam<Case> {};
TEST_P(Fp8ForwardKernel, MatchesDenseReference) {
  const Case& c = GetParam();
  switch (c.out) {
    case Dt::kF32:
      return RunCase<sc::Float>(c);
    case Dt::kF16:
      return RunCase<sc::Half>(c);
    case Dt::kBF16:
      return RunCase<sc::BFloat>(c);
  }
}
INSTANTIATE_TEST_SUITE_P(Blocks, Fp8ForwardKernel, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace

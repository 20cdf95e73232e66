// A ring's order kept on the device, checked the same way over every transport that has it (NCCL,
// a local group on GPUs): the host queues a step while the device runs the one before and never
// waits for the compute stream within a call (the CUDA runtime model counts such waits:
// synchronizations, events, copies with pageable memory), where the host's order
// (STRIA_RING_ORDER=host) waits at every step. Both orders give the same bits, which match the
// reference: causal, documents (their bounds go up at every step), GQA. On a grid (`ulysses` > 1)
// the all-to-all exchanges around the ring keep the same order: two head chunks, so that a chunk's
// ring runs while the other's exchanges are in flight.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_util.h"
#include "ring_results.h"

namespace stria_test {

// ctx: a world of ranks; device_of(r): rank r's CUDA device; ulysses: the grid's all-to-all groups
// (1: a plain ring). Each rank runs on a stream of its own.
inline void ExpectRingOrderedOnTheDevice(const std::vector<stria_context_t>& ctx,
                                         const std::function<int(int)>& device_of, int ulysses = 1) {
  const int world = static_cast<int>(ctx.size());
  ASSERT_GE(world, 2);
  ASSERT_EQ(world % ulysses, 0);
  // On a grid, two K/V heads a member: two chunks.
  const int64_t Hkv = ulysses > 1 ? 2 * ulysses : 2, Hq = 2 * Hkv;
  const int64_t B = 1, L = 64, D = 64, S = L * world;
  const int docs = 3;
  std::mt19937_64 rng(31);
  const std::vector<int64_t> documents = RandomDocuments(B, S, docs, rng);
  Tensor q({B, S, Hq, D}, Dt::kBF16), k({B, S, Hkv, D}, Dt::kBF16), v({B, S, Hkv, D}, Dt::kBF16);
  Tensor dout({B, S, Hq, D}, Dt::kBF16);
  for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.layout = STRIA_LAYOUT_STRIPED;
  p.causal = true;

  // Per order: each rank's results and the host's waits for its stream in its second forward
  // and backward (the first grow the workspaces, which waits).
  struct Rank {
    std::vector<Tensor> results;
    uint64_t forward_waits = 0, backward_waits = 0;
    std::string error;
  };
  auto run = [&](const char* order, std::vector<Rank>* ranks) {
    if (order != nullptr)
      setenv("STRIA_RING_ORDER", order, 1);
    else
      unsetenv("STRIA_RING_ORDER");
    ranks->clear();
    ranks->resize(static_cast<size_t>(world));
    RunRanks(world, [&](int r) {
      cudaSetDevice(device_of(r));
      cudaStream_t stream = nullptr;  // the rank's own: ranks may share a device
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      Rank& me = (*ranks)[static_cast<size_t>(r)];
      auto shard = [&](const Tensor& t) {
        Tensor local({B, L, t.shape[2], D}, t.dt);
        EXPECT_EQ(ulysses > 1 ? stria_grid_shard(STRIA_LAYOUT_STRIPED, world, ulysses, r, 1, &t.dl, &local.dl, nullptr)
                              : stria_shard(STRIA_LAYOUT_STRIPED, world, r, 1, &t.dl, &local.dl, nullptr),
                  STRIA_SUCCESS);
        return local;
      };
      Tensor ql = shard(q), kl = shard(k), vl = shard(v), dol = shard(dout);
      me.results.emplace_back(std::vector<int64_t>{B, L, Hq, D}, Dt::kBF16);
      me.results.emplace_back(std::vector<int64_t>{B, Hq, L}, Dt::kF32);
      me.results.emplace_back(std::vector<int64_t>{B, L, Hq, D}, Dt::kBF16);
      me.results.emplace_back(std::vector<int64_t>{B, L, Hkv, D}, Dt::kBF16);
      me.results.emplace_back(std::vector<int64_t>{B, L, Hkv, D}, Dt::kBF16);
      DeviceTensor q_d(ql), k_d(kl), v_d(vl), do_d(dol), out_d(me.results[0]), lse_d(me.results[1]),
          dq_d(me.results[2]), dk_d(me.results[3]), dv_d(me.results[4]);
      const stria_context_t c = ctx[static_cast<size_t>(r)];
      EXPECT_EQ(stria_context_set_grid(c, ulysses), STRIA_SUCCESS);
      for (int call = 0; call < 2 && me.error.empty(); ++call) {
        for (DeviceTensor* t : {&out_d, &lse_d, &dq_d, &dk_d, &dv_d}) t->Poison();
        const uint64_t before = stria_cuda_runtime_model_host_waits(stream);
        if (AttentionForward(c, &p, documents, docs, &q_d.dl, &k_d.dl, &v_d.dl, &out_d.dl, &lse_d.dl, stream) !=
            STRIA_SUCCESS)
          me.error += std::string("forward: ") + stria_get_last_error();
        const uint64_t between = stria_cuda_runtime_model_host_waits(stream);
        if (AttentionBackward(c, &p, documents, docs, &q_d.dl, &k_d.dl, &v_d.dl, &out_d.dl, &lse_d.dl, &do_d.dl,
                              &dq_d.dl, &dk_d.dl, &dv_d.dl, stream) != STRIA_SUCCESS)
          me.error += std::string(" backward: ") + stria_get_last_error();
        me.forward_waits = between - before;
        me.backward_waits = stria_cuda_runtime_model_host_waits(stream) - between;
      }
      if (cudaStreamSynchronize(stream) != cudaSuccess) me.error += " cudaStreamSynchronize failed";
      cudaStreamDestroy(stream);
      EXPECT_EQ(stria_context_set_grid(c, 1), STRIA_SUCCESS);
      out_d.CopyTo(&me.results[0]);
      lse_d.CopyTo(&me.results[1]);
      dq_d.CopyTo(&me.results[2]);
      dk_d.CopyTo(&me.results[3]);
      dv_d.CopyTo(&me.results[4]);
    });
  };
  std::vector<Rank> device, host;
  run(nullptr, &device);
  run("host", &host);
  unsetenv("STRIA_RING_ORDER");

  GatheredResults full(STRIA_LAYOUT_STRIPED, world, B, S, Hq, Hkv, D, Dt::kBF16);
  full.UseGrid(ulysses);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Rank &d = device[static_cast<size_t>(r)], &h = host[static_cast<size_t>(r)];
    ASSERT_EQ(d.error, "");
    ASSERT_EQ(h.error, "");
    EXPECT_EQ(d.forward_waits, 0u);
    EXPECT_EQ(d.backward_waits, 0u);
    // The host's order fences before each of the forward's two transfers, and twice a step in
    // the backward; on a grid before each phase of the exchanges (the inputs and each chunk's
    // outputs) besides.
    EXPECT_GE(h.forward_waits, ulysses > 1 ? 3u : 2u);
    EXPECT_GE(h.backward_waits, ulysses > 1 ? 3u : 4u);
    for (size_t i = 0; i < d.results.size(); ++i)
      EXPECT_EQ(d.results[i].storage, h.results[i].storage) << "result " << i;
    full.Gather(r, d.results[0], d.results[1], d.results[2], d.results[3], d.results[4]);
  }
  const auto dd = dout.ToDouble();
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dd, B, S, Hq, Hkv, D, true,
                                       1.0 / std::sqrt(static_cast<double>(D)), &documents);
  full.ExpectMatches(ref, 2e-2, 1e-3);
}

}  // namespace stria_test

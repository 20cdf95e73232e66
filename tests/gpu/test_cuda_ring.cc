// The GPU ring against the float64 dense reference of the whole sequence: N = 1..8 CUDA ranks on
// one GPU (a local group passing blocks device to device) or spread over two, every layout, causal and not, float16
// and bfloat16 on the tensor-core kernels (D = 64 and 128, GQA, partial tiles), float32 and other
// head dims on the SIMT kernels, packed-QKV views, the caller's own stream, document masks, sliding windows. Device
// outputs are poisoned (NaN) before each run. Skips, saying why, where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <tuple>

#include "gpu/ring_order_check.h"
#include "gpu_util.h"
#include "ring_results.h"

using namespace stria_test;

namespace {

struct Case {
  int world;
  stria_layout_t layout;
  bool causal;
  Dt dt;
  int64_t B, L, Hq, Hkv, D;
  const char* kernels = nullptr;  // STRIA_CUDA_KERNELS for the run: "simt", "wgmma" or "tma" (sm_90 only)
  bool stream = false;            // run on a stream of our own instead of the default stream
  bool strided = false;           // q/k/v as head views of one packed [B, L, Hq + 2 Hkv, D] tensor
  bool spread = false;            // rank r on GPU r % 2 (stria_context_create_local_group_on_devices)
  int docs = 0;                   // > 0: a document mask of this many documents per batch row (random cuts)
  bool device_docs = false;       // the boundaries in device memory, written on the call's stream just before it
  Window window{};                // a sliding window (stria_attention_forward_window)
  bool deterministic = false;     // stria_context_set_deterministic, and a second backward that must repeat the bits
  int64_t plan_tile = 0;          // > 0: on a document plan of this tile (with docs), S = L * world - 1 for world > 1
  bool sinks = false;             // attention sinks (params->sinks, in device memory) and their gradient
  float softcap = 0.f;            // > 0: logit softcapping (params->softcap)
  int ulysses = 1;                // > 1: a grid of all-to-all groups of this many ranks (stria_context_set_grid)
  // On a plan whose ranks keep documents of their own past a kernel tile or more: their part of the
  // local block runs apart from the ring's (ForwardStep::home_begin), on the runtime model's
  // least-priority stream for the tensor-core families, which the case then counts.
  bool home = false;
  // With plan_tile: these boundaries ([B][docs + 1]; S is their last) instead of random ones.
  std::vector<int64_t> given{};
  int seed = -1;  // >= 0: drawn by RandomCases from this seed
};

std::string Name(const Case& c) {
  std::ostringstream os;
  os << "N" << c.world << "_" << LayoutName(c.layout) << (c.causal ? "_causal" : "_full") << "_" << DtName(c.dt) << "_B"
     << c.B << "L" << c.L << "H" << c.Hq << "x" << c.Hkv << "D" << c.D
     << (c.kernels ? std::string("_") + c.kernels : "") << (c.stream ? "_stream" : "") << (c.strided ? "_strided" : "")
     << (c.spread ? "_2gpus" : "") << (c.docs > 0 ? "_docs" + std::to_string(c.docs) : "")
     << (c.device_docs ? "_ondevice" : "") << (c.window.active() ? "_window" + WindowName(c.window) : "")
     << (c.deterministic ? "_deterministic" : "") << (c.plan_tile > 0 ? "_plan" + std::to_string(c.plan_tile) : "")
     << (c.home ? "_home" : "") << (c.sinks ? "_sinks" : "")
     << (c.softcap > 0 ? "_softcap" + std::to_string(static_cast<int>(c.softcap)) : "")
     << (c.ulysses > 1 ? "_grid" + std::to_string(c.ulysses) : "") << (c.given.empty() ? "" : "_given")
     << (c.seed >= 0 ? "_seed" + std::to_string(c.seed) : "");
  return os.str();
}

// What ctest shows beside a case's name (gtest_discover_tests): the case, not its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << Name(c);
}

// The rank's tokens by the layout, or by `plan` (local_len slots), on the case's grid.
Tensor ShardHost(const Tensor& full, const Case& c, int rank, stria_plan_t plan, int64_t local_len) {
  Tensor local({full.shape[0], local_len, full.shape[2], full.shape[3]}, full.dt);
  stria_status_t st;
  if (plan != nullptr && c.ulysses > 1)
    st = stria_plan_grid_shard(plan, c.ulysses, rank, 1, &full.dl, &local.dl, nullptr);
  else if (plan != nullptr)
    st = stria_plan_shard(plan, rank, 1, &full.dl, &local.dl, nullptr);
  else if (c.ulysses > 1)
    st = stria_grid_shard(c.layout, c.world, c.ulysses, rank, 1, &full.dl, &local.dl, nullptr);
  else
    st = stria_shard(c.layout, c.world, rank, 1, &full.dl, &local.dl, nullptr);
  EXPECT_EQ(st, STRIA_SUCCESS) << stria_get_last_error();
  return local;
}

DLTensor HeadView(const DeviceTensor& packed, int64_t h0, std::vector<int64_t>* shape) {
  DLTensor v = packed.dl;
  v.shape = shape->data();
  v.byte_offset = static_cast<uint64_t>(h0 * packed.shape[3] * (packed.dl.dtype.bits / 8));
  return v;
}

void RunCase(const Case& c) {
  STRIA_REQUIRE_GPU();
  SCOPED_TRACE(Name(c));
  // A case without a family of its own runs the library's default (TMA on compute capability 9.0,
  // mma.sync elsewhere), or STRIA_TEST_KERNELS: the GPU run and the emulator's CI runs pass "mma"
  // so that the sweep of the default cases covers mma.sync on a Hopper device too.
  const char* family = c.kernels != nullptr ? c.kernels : std::getenv("STRIA_TEST_KERNELS");
  if (family != nullptr && *family != '\0')
    setenv("STRIA_CUDA_KERNELS", family, 1);
  else
    unsetenv("STRIA_CUDA_KERNELS");
  // A plan takes any S: one token short of whole blocks leaves some rank padding.
  const int64_t S = !c.given.empty() ? c.given.back() : c.L * c.world - (c.plan_tile > 0 && c.world > 1 ? 1 : 0);
  std::mt19937_64 rng(99 + c.world * 7 + c.layout * 131 + c.D + c.L);
  Tensor q({c.B, S, c.Hq, c.D}, c.dt), k({c.B, S, c.Hkv, c.D}, c.dt), v({c.B, S, c.Hkv, c.D}, c.dt);
  Tensor dout({c.B, S, c.Hq, c.D}, c.dt);
  // Under a softcap, larger scores: the cap then bends them well away from the identity.
  for (Tensor* t : {&q, &k}) t->FillRandom(rng, c.softcap > 0 ? 2.0 : 1.0);
  for (Tensor* t : {&v, &dout}) t->FillRandom(rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto dod = dout.ToDouble();
  const std::vector<int64_t> documents = !c.given.empty() ? c.given
                                         : c.home         ? HomeDocuments(c.B, S, c.docs, rng)
                                         : c.docs > 0     ? RandomDocuments(c.B, S, c.docs, rng)
                                                          : std::vector<int64_t>();
  // Sink logits around the rows' LSE, so that they matter; -inf (no sink) for head 1.
  std::vector<double> sinks(static_cast<size_t>(c.Hq));
  Tensor z({c.Hq}, Dt::kF32);
  for (int64_t h = 0; h < c.Hq; ++h) {
    sinks[static_cast<size_t>(h)] = h == 1 ? -INFINITY : 0.5 + 0.75 * static_cast<double>(h);
    z.Set(h, sinks[static_cast<size_t>(h)]);
  }
  ScoreMods mods;
  mods.sinks = c.sinks ? &sinks : nullptr;
  mods.softcap = c.softcap;
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dod, c.B, S, c.Hq, c.Hkv, c.D,
                                       c.causal, scale, c.docs > 0 ? &documents : nullptr, c.window, mods);
  std::vector<double> dsinks(static_cast<size_t>(c.Hq), 0.0);
  std::mutex dsinks_mu;

  GatheredResults full(c.layout, c.world, c.B, S, c.Hq, c.Hkv, c.D, c.dt);
  full.UseGrid(c.ulysses);
  stria_plan_t plan = nullptr;  // destroyed at the end of the case
  int64_t Ll = c.L;             // each rank's tokens (slots)
  if (c.plan_tile > 0) {
    // On a grid the plan is for the ring of groups, each group's slots cut into U pieces.
    stria_plan_config_t pc;
    stria_plan_config_init(&pc);
    pc.world_size = c.world / c.ulysses;
    pc.causal = c.causal;
    pc.tile = c.plan_tile;
    stria_plan_info_t info;
    info.struct_size = sizeof info;
    for (int made = 0; made < 2; ++made) {
      if (plan != nullptr) stria_plan_destroy(plan);
      ASSERT_EQ(stria_plan_create(&pc, documents.data(), c.docs, c.B, S, &plan), STRIA_SUCCESS)
          << stria_get_last_error();
      ASSERT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS);
      if (info.local_len % c.ulysses == 0) break;
      pc.local_len = (info.local_len + c.ulysses - 1) / c.ulysses * c.ulysses;
    }
    Ll = info.local_len / c.ulysses;
    full.UsePlan(plan);
  }
  struct PlanDestroyer {
    stria_plan_t p;
    ~PlanDestroyer() {
      if (p) stria_plan_destroy(p);
    }
  } destroy_plan{plan};

  std::vector<int> ordinals(static_cast<size_t>(c.world), 0);
  if (c.spread) {
    int gpus = 0;
    ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
    if (gpus < 2) GTEST_SKIP() << "needs two CUDA devices, " << gpus << " here";
    for (int r = 0; r < c.world; ++r) ordinals[static_cast<size_t>(r)] = r % 2;
  }
  CudaGroup group = c.spread ? CudaGroup(ordinals) : CudaGroup(c.world);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  for (stria_context_t ctx : group.ctx) ASSERT_EQ(stria_context_set_grid(ctx, c.ulysses), STRIA_SUCCESS);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = c.layout;
  params.causal = c.causal;
  params.plan = plan;
  params.softcap = c.softcap;

  // On the runtime model, CTAs in a random order that changes at every launch (as a GPU's may): the
  // deterministic backward's second run must still repeat the first one's bits.
  ShuffledBlocks shuffled(c.deterministic);
  std::vector<stria_status_t> fwd(static_cast<size_t>(c.world)), bwd(static_cast<size_t>(c.world));
  std::vector<std::string> errors(static_cast<size_t>(c.world)), repeat(static_cast<size_t>(c.world));
  std::vector<uint64_t> sent_whole(static_cast<size_t>(c.world)), sent_planned(static_cast<size_t>(c.world));
  const ModelCounts before = ModelCounts::Available() ? ModelCounts::Now() : ModelCounts();
  RunRanks(c.world, [&](int r) {
    cudaSetDevice(ordinals[static_cast<size_t>(r)]);  // the rank's tensors and stream live there
    Tensor ql = ShardHost(q, c, r, plan, Ll), kl = ShardHost(k, c, r, plan, Ll), vl = ShardHost(v, c, r, plan, Ll);
    Tensor dol = ShardHost(dout, c, r, plan, Ll);
    Tensor out({c.B, Ll, c.Hq, c.D}, c.dt), lse({c.B, c.Hq, Ll}, Dt::kF32);
    Tensor dq({c.B, Ll, c.Hq, c.D}, c.dt), dk({c.B, Ll, c.Hkv, c.D}, c.dt), dv({c.B, Ll, c.Hkv, c.D}, c.dt);
    DeviceTensor dq_d(dq), dk_d(dk), dv_d(dv), out_d(out), lse_d(lse), do_d(dol), z_d(z), dz_d(z);
    for (DeviceTensor* t : {&dq_d, &dk_d, &dv_d, &out_d, &lse_d, &dz_d}) t->Poison();
    stria_attention_params_t rank_params = params;  // with the rank's own sinks tensors
    if (c.sinks) {
      rank_params.sinks = &z_d.dl;
      rank_params.dsinks = &dz_d.dl;
    }
    Tensor packed = c.strided ? PackQKV(ql, kl, vl) : Tensor({1}, c.dt);
    DeviceTensor packed_d(packed), q_d(ql), k_d(kl), v_d(vl);
    std::vector<int64_t> qs{c.B, Ll, c.Hq, c.D}, ks{c.B, Ll, c.Hkv, c.D};
    DLTensor qv = q_d.dl, kv = k_d.dl, vv = v_d.dl;
    if (c.strided) {
      qv = HeadView(packed_d, 0, &qs);
      kv = HeadView(packed_d, c.Hq, &ks);
      vv = HeadView(packed_d, c.Hq + c.Hkv, &ks);
    }
    cudaStream_t stream = nullptr;
    if (c.stream) {
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    }
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    std::string err;
    // On a plan: first a call on a layout with NaN everywhere, of the same local shape, which
    // leaves NaN in every ring buffer and sends whole blocks. The plan's messages carry only the
    // rows later ranks see: the rest of a buffer must never reach a result, and they must be
    // shorter where the blocks hold such rows.
    stria_traffic_t whole{sizeof(stria_traffic_t), 0, 0, 0, 0}, planned = whole;
    if (c.plan_tile > 0 && c.world > 1) {
      DeviceTensor nq(ql), nk(kl), nv(vl), nout(out), nlse(lse), ndq(ql), ndk(kl), ndv(kl);
      for (DeviceTensor* t : {&nq, &nk, &nv, &nout, &nlse}) t->Poison();
      stria_attention_params_t lp;
      stria_attention_params_init(&lp);
      lp.causal = c.causal;
      if (stria_attention_forward(ctx, &lp, &nq.dl, &nk.dl, &nv.dl, &nout.dl, &nlse.dl, stream) != STRIA_SUCCESS ||
          stria_context_get_traffic(ctx, &whole) != STRIA_SUCCESS ||
          stria_attention_backward(ctx, &lp, &nq.dl, &nk.dl, &nv.dl, &nout.dl, &nlse.dl, &nout.dl, &ndq.dl, &ndk.dl,
                                   &ndv.dl, stream) != STRIA_SUCCESS)
        err += std::string("the NaN call on a layout: ") + stria_get_last_error();
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    if (c.deterministic) {
      EXPECT_EQ(stria_context_set_deterministic(ctx, 1), STRIA_SUCCESS) << stria_get_last_error();
    }
    if (c.home) {
      // A call first that gets every buffer the plan's calls use: a buffer's first allocation
      // frees a smaller one (cudaFree waits for every stream of the device), which would order
      // the home part before whatever follows and hide a missing join.
      if (AttentionForward(ctx, &rank_params, documents, c.docs, &qv, &kv, &vv, &out_d.dl, &lse_d.dl, stream,
                           c.window) != STRIA_SUCCESS ||
          AttentionBackward(ctx, &rank_params, documents, c.docs, &qv, &kv, &vv, &out_d.dl, &lse_d.dl, &do_d.dl,
                            &dq_d.dl, &dk_d.dl, &dv_d.dl, stream, c.window) != STRIA_SUCCESS)
        err += std::string("the first plan call: ") + stria_get_last_error();
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (DeviceTensor* t : {&dq_d, &dk_d, &dv_d, &out_d, &lse_d}) t->Poison();
    }
    auto backward = [&] {
      return AttentionBackward(ctx, &rank_params, documents, c.docs, &qv, &kv, &vv, &out_d.dl, &lse_d.dl, &do_d.dl,
                               &dq_d.dl, &dk_d.dl, &dv_d.dl, stream, c.window);
    };
    if (c.device_docs) {
      // Garbage first (all ones: -1, which stria refuses), then the boundaries, queued on the
      // call's stream: stria must read them after the copy, not before.
      DeviceInt64s docs_d(documents.size());
      int64_t* cu = docs_d.ptr;
      const size_t bytes = documents.size() * sizeof(int64_t);
      // On the stream too: a plain cudaMemset goes to the legacy default stream, which a
      // non-blocking stream does not wait for, and on the H200 it once landed after the copy.
      EXPECT_EQ(cudaMemsetAsync(cu, 0xff, bytes, stream), cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(cu, documents.data(), bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
      fwd[static_cast<size_t>(r)] =
          stria_attention_forward_documents(ctx, &rank_params, cu, c.docs, &qv, &kv, &vv, &out_d.dl, &lse_d.dl, stream);
      err = stria_get_last_error();
      bwd[static_cast<size_t>(r)] =
          stria_attention_backward_documents(ctx, &rank_params, cu, c.docs, &qv, &kv, &vv, &out_d.dl, &lse_d.dl,
                                             &do_d.dl, &dq_d.dl, &dk_d.dl, &dv_d.dl, stream);
      err += stria_get_last_error();
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // before docs_d is freed
    } else {
      fwd[static_cast<size_t>(r)] = AttentionForward(ctx, &rank_params, documents, c.docs, &qv, &kv, &vv, &out_d.dl,
                                                     &lse_d.dl, static_cast<void*>(stream), c.window);
      err += stria_get_last_error();
      if (c.plan_tile > 0 && c.world > 1) {
        EXPECT_EQ(stria_context_get_traffic(ctx, &planned), STRIA_SUCCESS);
        EXPECT_LE(planned.kv_bytes, whole.kv_bytes) << "rank " << r;
        sent_whole[static_cast<size_t>(r)] = whole.kv_bytes;
        sent_planned[static_cast<size_t>(r)] = planned.kv_bytes;
      }
      bwd[static_cast<size_t>(r)] = backward();
      err += stria_get_last_error();
    }
    const cudaError_t sync = cudaStreamSynchronize(stream);
    if (sync != cudaSuccess) err += std::string(" stream sync: ") + cudaGetErrorString(sync);
    errors[static_cast<size_t>(r)] = err;
    out_d.CopyTo(&out);
    lse_d.CopyTo(&lse);
    dq_d.CopyTo(&dq);
    dk_d.CopyTo(&dk);
    dv_d.CopyTo(&dv);
    if (c.deterministic && bwd[static_cast<size_t>(r)] == STRIA_SUCCESS) {
      for (DeviceTensor* t : {&dq_d, &dk_d, &dv_d}) t->Poison();
      const stria_status_t again = backward();
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      Tensor dq2(dq.shape, c.dt), dk2(dk.shape, c.dt), dv2(dv.shape, c.dt);
      dq_d.CopyTo(&dq2);
      dk_d.CopyTo(&dk2);
      dv_d.CopyTo(&dv2);
      if (again != STRIA_SUCCESS) repeat[static_cast<size_t>(r)] = std::string("failed: ") + stria_get_last_error();
      for (auto [name, a, b] :
           {std::make_tuple("dq", &dq, &dq2), std::make_tuple("dk", &dk, &dk2), std::make_tuple("dv", &dv, &dv2)})
        if (a->storage != b->storage) repeat[static_cast<size_t>(r)] += std::string(name) + " differs; ";
    }
    if (stream) cudaStreamDestroy(stream);
    full.Gather(r, out, lse, dq, dk, dv);
    if (c.sinks) {
      Tensor dz(z.shape, Dt::kF32);
      dz_d.CopyTo(&dz);
      std::lock_guard<std::mutex> lock(dsinks_mu);
      for (int64_t h = 0; h < c.Hq; ++h) dsinks[static_cast<size_t>(h)] += dz.Get(h);
    }
  });
  if (c.home && ModelCounts::Available()) {
    // Each rank's home part is one launch forward and one (or two: deterministic) backward, on the
    // least-priority stream; the ring's work from there on goes to the greatest. SIMT kernels and a
    // persistent schedule keep the block whole.
    const ModelCounts queued = ModelCounts::Now() - before;
    const char* schedule = std::getenv("STRIA_CUDA_TMA_SCHEDULE");
    const bool persistent = schedule != nullptr && std::string(schedule) == "persistent";
    const std::string family = c.kernels != nullptr ? c.kernels : "";
    const bool apart = family != "simt" && !(family == "tma" && persistent);
    if (apart) {
      EXPECT_GE(queued.least, 2u) << "no home part ran apart";
      EXPECT_GT(queued.greatest, 0u) << "the ring's work stayed on the caller's stream";
    } else {
      EXPECT_EQ(queued.least, 0u) << "a home part ran apart on the SIMT kernels";
    }
  }
  if (c.plan_tile > 0 && c.world > 1 && c.L >= 256) {  // blocks of more than two kernel tiles: some rows stay home
    uint64_t whole = 0, planned = 0;
    for (int r = 0; r < c.world; ++r) {
      whole += sent_whole[static_cast<size_t>(r)];
      planned += sent_planned[static_cast<size_t>(r)];
    }
    EXPECT_LT(planned, whole);
  }
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(fwd[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << errors[static_cast<size_t>(r)];
    ASSERT_EQ(bwd[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << errors[static_cast<size_t>(r)];
    EXPECT_EQ(repeat[static_cast<size_t>(r)], "") << "rank " << r << ": the second deterministic backward";
  }
  const double tol = c.dt == Dt::kF32 ? 1e-5 : 2e-2;
  full.ExpectMatches(ref, tol, c.dt == Dt::kF32 ? 1e-5 : 1e-3);
  // The sinks' gradient sums terms of either sign computed from the rounded outputs: measured
  // against their magnitudes. In float32 too: the sum can cancel to a small fraction of its
  // terms, and the GPU's float32 (fused multiply-adds, another order) then misses a bar relative to
  // the sum by a hair (1.08e-5 on an H200) where the emulator's arithmetic does not.
  if (c.sinks)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const size_t i = static_cast<size_t>(h);
      const double bar = tol * ref.dsinks_terms[i] + 1e-12;
      EXPECT_LE(std::abs(dsinks[i] - ref.dsinks[i]), bar) << "dsinks of head " << h;
    }
}

class CudaRingVsReference : public ::testing::TestWithParam<Case> {};
TEST_P(CudaRingVsReference, ForwardAndBackward) {
  RunCase(GetParam());
}

// Tensor cores: every rank count, layout, mask and 16-bit dtype; GQA 2:1; 80 tokens per rank
// (a full and a partial 64-token tile).
std::vector<Case> TensorCoreSweep() {
  std::vector<Case> cases;
  for (int n = 1; n <= 8; ++n)
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false})
        for (Dt dt : {Dt::kBF16, Dt::kF16}) cases.push_back(Case{n, lay, causal, dt, 1, 80, 4, 2, 64});
  return cases;
}

// The Hopper wgmma kernels (opt-in, STRIA_CUDA_KERNELS=wgmma; on other GPUs the variable is
// ignored and these rerun mma.sync): rank counts, layouts, masks, dtypes, GQA, D 64 and 128, and
// blocks of several 128-query tiles.
std::vector<Case> WgmmaSweep() {
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 5, 8})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false})
        for (Dt dt : {Dt::kBF16, Dt::kF16}) {
          Case c{n, lay, causal, dt, 1, 80, 4, 2, 64};
          c.kernels = "wgmma";
          cases.push_back(c);
        }
  for (int n : {1, 3, 8})
    for (stria_layout_t lay : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
      Case c{n, lay, true, Dt::kBF16, 2, 264, 4, 1, 128};
      c.kernels = "wgmma";
      cases.push_back(c);
    }
  Case wide{2, STRIA_LAYOUT_ZIGZAG, true, Dt::kF16, 1, 136, 2, 1, 256};  // D 256: the forward's 64-key tiles
  wide.kernels = "wgmma";
  cases.push_back(wide);
  return cases;
}

// The TMA kernels (STRIA_CUDA_KERNELS=tma, sm_90 only like wgmma): rank counts, layouts, masks,
// dtypes, GQA, D 64, 128 and 256, several tiles per CTA, and q/k/v as head views of a packed QKV
// tensor (the tensor maps' strides are the views').
std::vector<Case> TmaSweep() {
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 8})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{n, lay, causal, causal ? Dt::kBF16 : Dt::kF16, 1, 80, 4, 2, 64};
        c.kernels = "tma";
        cases.push_back(c);
      }
  for (int n : {1, 3}) {
    Case c{n, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 264, 4, 1, 128};
    c.kernels = "tma";
    cases.push_back(c);
  }
  Case packed{3, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 2, 48, 4, 2, 64};
  packed.kernels = "tma";
  packed.strided = true;
  cases.push_back(packed);
  // Head dim 256 (the Hopper forwards' 64-key tiles, the backward's kernel that splits the columns
  // between its warpgroups): blocks of two query tiles and three key tiles, causal and not,
  // documents, and the deterministic backward.
  for (bool causal : {true, false}) {
    Case c{3,  causal ? STRIA_LAYOUT_STRIPED : STRIA_LAYOUT_ZIGZAG, causal, causal ? Dt::kBF16 : Dt::kF16, 1, 136, 4, 2,
           256};
    c.kernels = "tma";
    cases.push_back(c);
  }
  Case wide_docs{2, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 72, 2, 1, 256};
  wide_docs.kernels = "tma";
  wide_docs.docs = 4;
  cases.push_back(wide_docs);
  Case wide_det{2, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kBF16, 1, 72, 2, 1, 256};
  wide_det.kernels = "tma";
  wide_det.deterministic = true;
  cases.push_back(wide_det);
  return cases;
}

std::vector<Case> ShapesAndPaths() {
  std::vector<Case> cases;
  // D = 128 (32-query backward tiles), MQA and MHA, batch 2, several tiles per block.
  for (int n : {1, 3, 8})
    for (stria_layout_t lay : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG, STRIA_LAYOUT_CONTIGUOUS}) {
      cases.push_back(Case{n, lay, true, Dt::kBF16, 2, 136, 4, 1, 128});
      cases.push_back(Case{n, lay, false, Dt::kF16, 1, 136, 2, 2, 128});
    }
  // D = 256 on the family the cases take here (mma.sync: its forward, and its backward with two
  // warps per 16 keys): a block of five 16-query steps and two key tiles, GQA; documents.
  cases.push_back(Case{2, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 72, 2, 1, 256});
  cases.push_back(Case{3, STRIA_LAYOUT_ZIGZAG, false, Dt::kF16, 2, 88, 4, 2, 256});
  // The SIMT kernels: float32, head dims the tensor cores do not take, and forced for bf16.
  for (int n : {1, 2, 5, 8})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      cases.push_back(Case{n, lay, n % 2 == 0, Dt::kF32, 1, 40, 4, 2, 64});
  // Above 256 the SIMT kernels' wide build (Gemma 4's full-attention layers are 512 wide).
  for (int64_t d : {1, 24, 72, 100, 256, 300, 512})
    cases.push_back(Case{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 34, 2, 1, d});
  for (int64_t d : {40, 96, 512}) cases.push_back(Case{4, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 1, 34, 2, 1, d});
  Case simt{4, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 66, 4, 2, 64};
  simt.kernels = "simt";
  cases.push_back(simt);
  // Tiny blocks: 1 and 2 tokens per rank.
  for (int n : {2, 7}) cases.push_back(Case{n, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 1, 2, 1, 64});
  cases.push_back(Case{3, STRIA_LAYOUT_ZIGZAG, true, Dt::kF16, 1, 2, 2, 1, 128});
  // The caller's stream, and q/k/v as head views of a packed QKV tensor (tensor cores and SIMT).
  Case on_stream{4, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 96, 4, 2, 64};
  on_stream.stream = true;
  cases.push_back(on_stream);
  for (Dt dt : {Dt::kBF16, Dt::kF32}) {
    Case packed{3, STRIA_LAYOUT_ZIGZAG, true, dt, 2, 48, 4, 2, 64};
    packed.strided = true;
    cases.push_back(packed);
  }
  return cases;
}

// Local groups over two GPUs (rank r on GPU r % 2: blocks cross between the GPUs at every step,
// and pass within one where the ring wraps with an odd N): tensor cores and SIMT, both layouts that
// balance, the caller's stream. Skipped where fewer than two GPUs are visible.
std::vector<Case> TwoGpus() {
  std::vector<Case> cases;
  for (int n : {2, 3, 4}) {
    Case c{n, n == 3 ? STRIA_LAYOUT_ZIGZAG : STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 80, 4, 2, 64};
    c.spread = true;
    cases.push_back(c);
  }
  Case simt{3, STRIA_LAYOUT_STRIPED, false, Dt::kF32, 1, 40, 4, 2, 64};
  simt.spread = true;
  cases.push_back(simt);
  Case on_stream{4, STRIA_LAYOUT_ZIGZAG, true, Dt::kF16, 1, 48, 2, 1, 128};
  on_stream.spread = true;
  on_stream.stream = true;
  cases.push_back(on_stream);
  return cases;
}

// Document masks: the mma.sync kernels, SIMT and the Hopper families (wgmma and TMA on compute
// capability 9.0, as the runtime model's devices are; elsewhere those rerun mma.sync),
// every layout, causal and not, rank counts, GQA, D 64 and 128, blocks of several tiles, batch
// rows with documents of their own, the caller's stream.
std::vector<Case> DocumentSweep() {
  std::vector<Case> cases;
  for (int n : {1, 2, 3, 8})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{n, lay, causal, causal ? Dt::kBF16 : Dt::kF16, 2, 80, 4, 2, 64};
        c.docs = 3 + n;
        cases.push_back(c);
      }
  for (stria_layout_t lay : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
    Case big{3, lay, true, Dt::kBF16, 2, 264, 4, 1, 128};
    big.docs = 9;
    cases.push_back(big);
  }
  for (const char* k : {"simt", "wgmma", "tma"}) {
    Case c{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 80, 4, 2, 64};
    c.kernels = k;
    c.docs = 6;
    cases.push_back(c);
  }
  for (const char* k : {"wgmma", "tma"}) {
    Case full{2, STRIA_LAYOUT_CONTIGUOUS, false, Dt::kF16, 2, 80, 4, 2, 64};
    full.kernels = k;
    full.docs = 5;
    cases.push_back(full);
    Case big{3, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 2, 264, 4, 1, 128};
    big.kernels = k;
    big.docs = 9;
    cases.push_back(big);
  }
  Case f32{4, STRIA_LAYOUT_ZIGZAG, false, Dt::kF32, 2, 40, 4, 2, 64};
  f32.docs = 5;
  cases.push_back(f32);
  Case on_stream{2, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kF16, 1, 136, 2, 2, 128};
  on_stream.docs = 4;
  on_stream.stream = true;
  cases.push_back(on_stream);
  // Document plans (S one short of whole blocks: padding slots): rank counts, causal and not, the
  // families, tiles cut at 16 tokens (a kernel tile holds several blocks) and at 64 (one each).
  for (int n : {1, 2, 3, 5})
    for (bool causal : {true, false}) {
      Case c{n, STRIA_LAYOUT_STRIPED, causal, causal ? Dt::kBF16 : Dt::kF16, 2, 80, 4, 2, 64};
      c.docs = 4;
      c.plan_tile = 16;
      cases.push_back(c);
    }
  for (const char* k : {"simt", "wgmma", "tma"}) {
    Case c{3, STRIA_LAYOUT_STRIPED, true, k == std::string("simt") ? Dt::kF32 : Dt::kBF16, 1, 264, 4, 1, 128};
    c.kernels = k;
    c.docs = 5;
    c.plan_tile = 64;
    cases.push_back(c);
  }
  // A sequence shorter than the ranks' tiles (111 tokens over 2 ranks at a plan tile of 128): no
  // rank has room for a document whole, so the solver cuts it across both; its rows see the other
  // rank's keys, so neither rank's block has a home part, whichever family would run one.
  for (const char* k : {"mma", "tma"})
    for (int docs : {1, 2}) {
      Case c{2, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 56, 2, 1, 64};
      c.kernels = k;
      c.docs = docs;
      c.plan_tile = 128;
      cases.push_back(c);
    }
  // A batch row of a block that no later rank sees does not travel (its rows hold the NaN of the
  // layout call before), while queries of a rank it reaches have keys of their document there,
  // none visible: their empty intervals must not lead a kernel's key tiles into it.
  for (const char* k : {"mma", "tma"}) {
    Case c{6, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 0, 4, 2, 64};
    c.kernels = k;
    c.docs = 8;
    c.plan_tile = 4;
    c.given = {0, 0, 19, 21, 33, 44, 52, 60, 61, 0, 1, 4, 25, 43, 44, 45, 61, 61};
    cases.push_back(c);
  }
  // Plans whose ranks keep short documents of their own past whole kernel tiles (a home part)
  // beside longer ones they share (HomeDocuments): every family, causal and not, the deterministic
  // backward, a window, more ranks, head dim 128. (The persistent TMA schedule, which keeps the
  // block whole, runs the TMA ones in model:tma_persistent.)
  auto home = [](int world, bool causal, Dt dt, int64_t B, int64_t L, int64_t Hq, int64_t Hkv, int64_t D,
                 const char* kernels) {
    Case c{world, STRIA_LAYOUT_STRIPED, causal, dt, B, L, Hq, Hkv, D};
    c.kernels = kernels;
    c.docs = 8;
    c.plan_tile = 128;
    c.home = true;
    return c;
  };
  // Two query heads on one K/V head: a home part's work is per head as the ring's, and the
  // emulator's time grows with the heads (these blocks of five kernel tiles are long there).
  for (const char* k : {"mma", "wgmma", "tma"}) cases.push_back(home(3, true, Dt::kBF16, 2, 640, 2, 1, 64, k));
  cases.push_back(home(3, true, Dt::kF32, 1, 384, 2, 1, 64, "simt"));  // smaller: float32 on the emulator
  cases.push_back(home(3, false, Dt::kF16, 2, 640, 2, 1, 64, "tma"));
  Case det = home(3, true, Dt::kBF16, 2, 640, 2, 1, 64, "tma");
  det.deterministic = true;
  cases.push_back(det);
  // Under a short window the last step's block is empty for some ranks: the ring's rows are
  // finished apart from the home part's (FinishRingRows).
  Case window = home(4, true, Dt::kBF16, 1, 512, 4, 2, 64, "tma");
  window.window = Window{100, -1};
  cases.push_back(window);
  cases.push_back(home(5, true, Dt::kBF16, 1, 512, 2, 1, 128, "tma"));
  // A plan under a short window: blocks some rank sees nothing of (no kernel: zeros in the rows of
  // the trimmed partial) while others see them.
  for (int n : {3, 4}) {
    Case c{n, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 80, 4, 2, 64};
    c.docs = 2;
    c.plan_tile = 16;
    c.window = Window{24, -1};
    cases.push_back(c);
  }
  Case repeat{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 80, 4, 2, 64};
  repeat.docs = 4;
  repeat.plan_tile = 16;
  repeat.deterministic = true;
  cases.push_back(repeat);
  // Boundaries in device memory (a framework's tensor), on the default stream and on the caller's.
  for (bool own_stream : {false, true}) {
    Case dev{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 80, 4, 2, 64};
    dev.docs = 5;
    dev.device_docs = true;
    dev.stream = own_stream;
    cases.push_back(dev);
  }
  return cases;
}

// Sliding windows (the document bounds' path): every family, layouts, causal and not, with
// documents, D 128 blocks of several tiles.
std::vector<Case> WindowSweep() {
  std::vector<Case> cases;
  for (int n : {1, 3, 4})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{n, lay, causal, causal ? Dt::kBF16 : Dt::kF16, 1, 80, 4, 2, 64};
        c.window = causal ? Window{70, -1} : Window{50, 20};
        cases.push_back(c);
      }
  for (const char* k : {"simt", "wgmma", "tma"}) {
    Case c{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 80, 4, 2, 64};
    c.kernels = k;
    c.window = Window{100, -1};
    cases.push_back(c);
  }
  Case big{3, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 2, 264, 4, 1, 128};
  big.window = Window{300, -1};
  big.docs = 5;
  cases.push_back(big);
  return cases;
}

std::string ParamName(const ::testing::TestParamInfo<Case>& info) {
  return Name(info.param);
}

// The deterministic backward (stria_context_set_deterministic): each case runs its backward twice
// and compares the bits besides the reference. Rank counts, layouts, masks, dtypes, GQA, D 64 and
// 128 (whose dK/dV pass takes 32-query tiles), documents, windows, packed views, and the Hopper
// families (their own dK/dV pass without dQ, then the wgmma dQ pass), D 64, 128 and 256 (where
// both passes are other kernels: the wide dK/dV kernel, a dQ pass of one warpgroup), documents.
std::vector<Case> DeterministicSweep() {
  std::vector<Case> cases;
  for (int n : {1, 3, 4})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{n, lay, causal, causal ? Dt::kBF16 : Dt::kF16, 1, 80, 4, 2, 64};
        c.deterministic = true;
        cases.push_back(c);
      }
  std::vector<Case> more;
  more.push_back(Case{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 264, 4, 1, 128});
  more.push_back(Case{2, STRIA_LAYOUT_ZIGZAG, false, Dt::kF16, 1, 136, 2, 2, 128});
  Case docs{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 80, 4, 2, 64};
  docs.docs = 5;
  more.push_back(docs);
  Case window{3, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kBF16, 1, 80, 4, 2, 64};
  window.window = Window{70, -1};
  more.push_back(window);
  Case packed{3, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 2, 48, 4, 2, 64};
  packed.strided = true;
  more.push_back(packed);
  Case f32{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 40, 4, 2, 64};
  more.push_back(f32);
  for (const char* k : {"wgmma", "tma"}) {
    Case c{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 80, 4, 2, 64};
    c.kernels = k;
    more.push_back(c);
    Case wide{2, STRIA_LAYOUT_ZIGZAG, false, Dt::kF16, 1, 136, 2, 1, 128};
    wide.kernels = k;
    more.push_back(wide);
    Case docs_k{2, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 80, 4, 2, 64};
    docs_k.kernels = k;
    docs_k.docs = 4;
    more.push_back(docs_k);
  }
  // The TMA family's ordered dQ in a world of one: three key tiles adding into most query tiles
  // of each of four heads (GQA 4:1), for the GPU run's racecheck of that kernel alone.
  Case ordered{1, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 264, 4, 1, 128};
  ordered.kernels = "tma";
  more.push_back(ordered);
  // D 256, GQA 2:1, documents: on the Hopper families three 64-row dQ tiles and three 64-key dK/dV
  // tiles a block; on mma.sync the dK/dV pass's two warps per 16 keys and the dQ pass's 32-row
  // tiles (two warps per 16 rows) over 32-key tiles, and a dense float16 ring besides.
  for (const char* k : {"mma", "wgmma", "tma"}) {
    Case d256{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 136, 4, 2, 256};
    d256.kernels = k;
    d256.docs = 3;
    more.push_back(d256);
  }
  Case mma_d256_dense{2, STRIA_LAYOUT_ZIGZAG, false, Dt::kF16, 1, 72, 2, 1, 256};
  mma_d256_dense.kernels = "mma";
  more.push_back(mma_d256_dense);
  for (Case& c : more) {
    c.deterministic = true;
    cases.push_back(c);
  }
  return cases;
}

// Attention sinks on every family (SIMT for float32), through the ring, with documents, on a plan
// (padding rows) and with the deterministic backward.
std::vector<Case> SinksSweep() {
  std::vector<Case> cases;
  Case simt{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 40, 4, 2, 32};
  cases.push_back(simt);
  Case mma{2, STRIA_LAYOUT_ZIGZAG, false, Dt::kBF16, 1, 80, 4, 2, 64};
  mma.kernels = "mma";
  cases.push_back(mma);
  Case docs{3, STRIA_LAYOUT_STRIPED, true, Dt::kF16, 2, 80, 4, 1, 64};
  docs.docs = 4;
  docs.deterministic = true;
  cases.push_back(docs);
  Case plan{3, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 80, 4, 2, 64};
  plan.docs = 5;
  plan.plan_tile = 64;
  cases.push_back(plan);
  for (const char* k : {"wgmma", "tma"}) {
    Case c{2, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 80, 4, 2, 64};
    c.kernels = k;
    cases.push_back(c);
  }
  for (Case& c : cases) c.sinks = true;
  return cases;
}

// Logit softcapping on every family (SIMT for float32 and D 40), forward and backward (the
// deterministic backward's dQ pass too), with documents, a window and sinks.
std::vector<Case> SoftcapSweep() {
  std::vector<Case> cases;
  cases.push_back(Case{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 40, 4, 2, 32});
  cases.push_back(Case{2, STRIA_LAYOUT_ZIGZAG, false, Dt::kBF16, 1, 40, 2, 1, 40});
  for (const char* k : {"mma", "wgmma", "tma"})
    for (bool causal : {true, false}) {
      Case c{2, causal ? STRIA_LAYOUT_STRIPED : STRIA_LAYOUT_ZIGZAG, causal, Dt::kBF16, 1, 80, 4, 2, 64};
      c.kernels = k;
      cases.push_back(c);
    }
  Case det{3, STRIA_LAYOUT_STRIPED, true, Dt::kF16, 2, 80, 4, 1, 64};
  det.kernels = "mma";
  det.deterministic = true;
  det.docs = 4;
  cases.push_back(det);
  Case wide{2, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kBF16, 1, 136, 2, 2, 128};
  wide.kernels = "tma";
  wide.window = Window{70, -1};
  wide.sinks = true;
  cases.push_back(wide);
  for (Case& c : cases) c.softcap = 5.f;
  return cases;
}

// Grids: all-to-all groups of 2 and 4 within a ring, the exchange on the device (strided head slices
// of the caller's tensors, a shared K/V head's gradients summed), every layout; with documents,
// sinks and a softcap; the caller's stream; deterministic; the SIMT kernels (float32).
std::vector<Case> GridSweep() {
  std::vector<Case> cases;
  for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
    Case c{4, lay, lay != STRIA_LAYOUT_CONTIGUOUS, Dt::kBF16, 1, 40, 4, 2, 64};
    c.ulysses = 2;
    cases.push_back(c);
  }
  Case shared{4, STRIA_LAYOUT_ZIGZAG, true, Dt::kF16, 2, 40, 8, 2, 64};  // K/V heads shared by two members
  shared.ulysses = 4;
  shared.stream = true;
  cases.push_back(shared);
  Case mods{4, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 40, 4, 1, 64};
  mods.ulysses = 2;
  mods.docs = 4;
  mods.sinks = true;
  mods.softcap = 5.f;
  mods.deterministic = true;
  cases.push_back(mods);
  Case simt{2, STRIA_LAYOUT_STRIPED, false, Dt::kF32, 1, 24, 2, 2, 32};
  simt.ulysses = 2;
  simt.strided = true;
  cases.push_back(simt);
  // Document plans on grids: made for the ring of groups, each group's slots cut in pieces, the
  // ring's messages trimmed to the rows later groups see (tensor cores; a window on SIMT).
  for (const char* k : {"mma", "tma"}) {
    Case planned{4, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 40, 4, 2, 64};
    planned.kernels = k;
    planned.ulysses = 2;
    planned.docs = 5;
    planned.plan_tile = 16;
    cases.push_back(planned);
  }
  Case window{6, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 24, 6, 3, 32};
  window.kernels = "simt";
  window.ulysses = 3;
  window.docs = 4;
  window.plan_tile = 4;
  window.window = Window{20, -1};
  cases.push_back(window);
  return cases;
}

// A local group on GPUs keeps its ring's order on the device as NCCL does: its copies wait for
// both ranks' markers and the compute for the copies (gpu/ring_order_check.h). Three ranks on one
// device, and spread over two where there are two.
TEST(CudaLocalGroup, RingOrdersItsStepsOnTheDevice) {
  STRIA_REQUIRE_GPU();
  if (stria_cuda_runtime_model_host_waits == nullptr)
    GTEST_SKIP() << "the host's waits are counted by the CUDA runtime model only";
  {
    SCOPED_TRACE("one device");
    CudaGroup group(3);
    ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
    ExpectRingOrderedOnTheDevice(group.ctx, [](int) { return 0; });
  }
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) return;
  SCOPED_TRACE("two devices");
  const std::vector<int> ordinals{0, 1, 0};
  CudaGroup group(ordinals);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  ExpectRingOrderedOnTheDevice(group.ctx, [&](int r) { return ordinals[static_cast<size_t>(r)]; });
}

// A grid in a local group on GPUs: the exchanges around its ring of two groups keep the device's
// order too, and the group's ring waits on the host for its inputs before its own transfers.
TEST(CudaLocalGroup, GridOrdersItsExchangesOnTheDevice) {
  STRIA_REQUIRE_GPU();
  if (stria_cuda_runtime_model_host_waits == nullptr)
    GTEST_SKIP() << "the host's waits are counted by the CUDA runtime model only";
  CudaGroup group(4);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  const auto device_of = [](int) { return 0; };
  ExpectRingOrderedOnTheDevice(group.ctx, device_of, 2);
}

// Features in random combination, each case from its seed: a family, the dtype it takes, head dim,
// rank count, layout or document plan, causal or not, documents, a window, softcap, sinks, GQA,
// the deterministic backward, a grid. The sweeps above take each feature through its own cases;
// these are for how they meet. STRIA_TEST_RANDOM_CASES (read when the tests are listed) sets how
// many: a longer search runs the binary with more.
std::vector<Case> RandomCases() {
  const char* env = std::getenv("STRIA_TEST_RANDOM_CASES");
  const int count = env != nullptr ? std::atoi(env) : 4;
  std::vector<Case> cases;
  for (int seed = 0; seed < count; ++seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + 17);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
    static const char* kFamilies[] = {"simt", "mma", "wgmma", "tma"};
    const char* family = kFamilies[pick(4)];
    const bool simt = family == std::string("simt");
    const Dt dt = simt ? (pick(2) ? Dt::kF32 : Dt::kBF16) : (pick(2) ? Dt::kBF16 : Dt::kF16);
    const int64_t D = simt ? std::vector<int64_t>{16, 40, 64}[static_cast<size_t>(pick(3))] : (pick(4) ? 64 : 128);
    const int world = 1 + pick(5);
    const stria_layout_t layout = static_cast<stria_layout_t>(pick(3));
    const int64_t Hkv = 1 + pick(2), Hq = Hkv * (1 + pick(2));
    Case c{world, layout, pick(3) != 0, dt, 1 + pick(2), 8 * (1 + pick(10)), Hq, Hkv, D};
    c.kernels = family;
    c.seed = seed;
    if (pick(2)) c.docs = 2 + pick(5);
    if (c.docs > 0 && world > 1 && pick(2))
      c.plan_tile = std::vector<int64_t>{4, 16, 64, 128}[static_cast<size_t>(pick(4))];
    if (pick(3) == 0) {
      const int64_t S = c.L * world;
      // At least one key besides its own for every row (a row alone has dQ and dK exactly 0, which
      // a relative error cannot judge).
      c.window = c.causal ? Window{1 + pick(static_cast<int>(S)), -1}
                          : Window{pick(static_cast<int>(S) + 1) - 1, 1 + pick(static_cast<int>(S))};
    }
    if (pick(4) == 0) c.sinks = true;
    if (pick(4) == 0) c.softcap = 30.f;
    if (pick(4) == 0) c.deterministic = true;
    if (world % 2 == 0 && Hq % 2 == 0 && pick(3) == 0) c.ulysses = 2;
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(TensorCores, CudaRingVsReference, ::testing::ValuesIn(TensorCoreSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaRingVsReference, ::testing::ValuesIn(ShapesAndPaths()), ParamName);
INSTANTIATE_TEST_SUITE_P(Wgmma, CudaRingVsReference, ::testing::ValuesIn(WgmmaSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Documents, CudaRingVsReference, ::testing::ValuesIn(DocumentSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Windows, CudaRingVsReference, ::testing::ValuesIn(WindowSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Tma, CudaRingVsReference, ::testing::ValuesIn(TmaSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Devices, CudaRingVsReference, ::testing::ValuesIn(TwoGpus()), ParamName);
INSTANTIATE_TEST_SUITE_P(Deterministic, CudaRingVsReference, ::testing::ValuesIn(DeterministicSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Sinks, CudaRingVsReference, ::testing::ValuesIn(SinksSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Softcap, CudaRingVsReference, ::testing::ValuesIn(SoftcapSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Grid, CudaRingVsReference, ::testing::ValuesIn(GridSweep()), ParamName);
INSTANTIATE_TEST_SUITE_P(Random, CudaRingVsReference, ::testing::ValuesIn(RandomCases()), ParamName);

}  // namespace

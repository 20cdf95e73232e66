// Faults of the in-process transport and the call-signature exchange: ranks that never arrive
// (timeout), ranks aborted or destroyed while a peer waits, and ranks that disagree about the
// call. Every failure must reach every rank involved, promptly, with a message naming the rank
// at fault; a disagreement must leave the group usable, a failure mid-collective must poison the
// contexts (but let them be destroyed). Every wait is bounded: timeouts are 0.5 s where a timeout
// is the point and 30 s where the test shows that something else ends the wait much sooner.
#include <gtest/gtest.h>

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "test_util.h"

using namespace stria_test;

namespace {

constexpr int64_t kB = 1, kL = 8, kH = 2, kD = 16;
constexpr double kShortTimeoutS = 0.5;
constexpr double kLongTimeoutS = 30.0;
// How long "promptly" may take on a loaded 2-core machine: far below kLongTimeoutS.
constexpr double kPromptS = 5.0;

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One rank's tensors, with finite values (content does not matter to the faults).
struct Rank : AttentionTensors {
  explicit Rank(int64_t L = kL, int64_t Hkv = kH, Dt dt = Dt::kF32) : AttentionTensors(kB, L, kH, Hkv, kD, dt, 11) {}
  stria_status_t Forward(stria_context_t c, const stria_attention_params_t& p) {
    return stria_attention_forward(c, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr);
  }
  stria_status_t Backward(stria_context_t c, const stria_attention_params_t& p) {
    return stria_attention_backward(c, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, &dout.dl, &dq.dl, &dk.dl, &dv.dl,
                                    nullptr);
  }
};

stria_attention_params_t DefaultParams() {
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  return p;
}

// What one rank's call returned, with its message and how long it took.
struct Outcome {
  stria_status_t status = STRIA_SUCCESS;
  std::string message;
  double seconds = 0;
};

Outcome Timed(const std::function<stria_status_t()>& call) {
  Outcome o;
  const auto t0 = Clock::now();
  o.status = call();
  o.seconds = Since(t0);
  o.message = stria_get_last_error();
  return o;
}

bool Contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// A correct forward on every context of the group, checked against the float64 reference: the
// group still works after whatever came before.
void ExpectCorrectForward(const std::vector<stria_context_t>& ctxs, stria_layout_t layout = STRIA_LAYOUT_ZIGZAG) {
  const int n = static_cast<int>(ctxs.size());
  const int64_t S = kL * n;
  std::mt19937_64 rng(1000 + n);
  Tensor q({kB, S, kH, kD}, Dt::kF32), k({kB, S, kH, kD}, Dt::kF32), v({kB, S, kH, kD}, Dt::kF32);
  q.FillRandom(rng);
  k.FillRandom(rng);
  v.FillRandom(rng);
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), nullptr, kB, S, kH, kH, kD, true,
                                       1.0 / std::sqrt(static_cast<double>(kD)));
  Tensor out_full({kB, S, kH, kD}, Dt::kF32), lse_full({kB, kH, S}, Dt::kF32);
  out_full.Poison();
  lse_full.Poison();
  stria_attention_params_t params = DefaultParams();
  params.layout = layout;
  std::vector<Outcome> res(static_cast<size_t>(n));
  std::mutex mu;
  RunRanks(n, [&](int r) {
    Tensor ql({kB, kL, kH, kD}, Dt::kF32), kl({kB, kL, kH, kD}, Dt::kF32), vl({kB, kL, kH, kD}, Dt::kF32);
    Tensor out({kB, kL, kH, kD}, Dt::kF32), lse({kB, kH, kL}, Dt::kF32);
    stria_shard(layout, n, r, 1, &q.dl, &ql.dl, nullptr);
    stria_shard(layout, n, r, 1, &k.dl, &kl.dl, nullptr);
    stria_shard(layout, n, r, 1, &v.dl, &vl.dl, nullptr);
    res[static_cast<size_t>(r)] = Timed([&] {
      return stria_attention_forward(ctxs[static_cast<size_t>(r)], &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl,
                                     nullptr);
    });
    std::lock_guard<std::mutex> lock(mu);
    stria_unshard(layout, n, r, 1, &out.dl, &out_full.dl, nullptr);
    stria_unshard(layout, n, r, 2, &lse.dl, &lse_full.dl, nullptr);
  });
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(res[static_cast<size_t>(r)].status, STRIA_SUCCESS)
        << "rank " << r << ": " << res[static_cast<size_t>(r)].message;
  EXPECT_LT(RelError(out_full.ToDouble(), ref.out), 1e-5);
  EXPECT_LT(RelError(lse_full.ToDouble(), ref.lse), 1e-5);
}

// (a) Ranks that never arrive: the callers time out, naming them, and are poisoned.
void ExpectTimeoutNamingMissing(int world, const std::vector<int>& callers, const std::string& missing, bool backward) {
  SCOPED_TRACE(::testing::Message() << "world " << world << (backward ? " backward" : " forward"));
  LocalGroup g(world, kShortTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  const stria_attention_params_t p = DefaultParams();
  std::vector<Outcome> res(callers.size());
  RunRanks(static_cast<int>(callers.size()), [&](int i) {
    Rank t;
    stria_context_t c = g.ctx[static_cast<size_t>(callers[static_cast<size_t>(i)])];
    res[static_cast<size_t>(i)] = Timed([&] { return backward ? t.Backward(c, p) : t.Forward(c, p); });
  });
  for (size_t i = 0; i < callers.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "rank " << callers[i]);
    EXPECT_EQ(res[i].status, STRIA_ERROR_TIMEOUT) << res[i].message;
    EXPECT_TRUE(Contains(res[i].message, "rank(s) " + missing)) << res[i].message;
    EXPECT_GE(res[i].seconds, kShortTimeoutS * 0.9);
    EXPECT_LE(res[i].seconds, 3.0);
  }
  // Poisoned: the next call on a caller fails at once with the original reason.
  for (int r : callers) {
    Rank t;
    const Outcome o = Timed([&] { return t.Forward(g.ctx[static_cast<size_t>(r)], p); });
    EXPECT_NE(o.status, STRIA_SUCCESS) << "rank " << r;
    EXPECT_TRUE(Contains(o.message, "timed out")) << o.message;
    EXPECT_LT(o.seconds, kShortTimeoutS) << "a poisoned context fails without waiting";
    // So do the settings of later calls, with the same reason.
    EXPECT_NE(stria_context_set_deterministic(g.ctx[static_cast<size_t>(r)], 1), STRIA_SUCCESS);
    EXPECT_TRUE(Contains(stria_get_last_error(), "timed out")) << stria_get_last_error();
    EXPECT_NE(stria_context_set_call_tag(g.ctx[static_cast<size_t>(r)], 1), STRIA_SUCCESS);
    EXPECT_TRUE(Contains(stria_get_last_error(), "timed out")) << stria_get_last_error();
  }
  for (auto& c : g.ctx) {
    EXPECT_EQ(stria_context_destroy(c), STRIA_SUCCESS) << stria_get_last_error();
    c = nullptr;
  }
}

TEST(Timeout, GroupOfTwoOnlyRankZeroCalls) {
  ExpectTimeoutNamingMissing(2, {0}, "1", false);
}
TEST(Timeout, GroupOfTwoOnlyRankOneCallsBackward) {
  ExpectTimeoutNamingMissing(2, {1}, "0", true);
}
TEST(Timeout, GroupOfFourRanksOneAndThreeMissing) {
  ExpectTimeoutNamingMissing(4, {0, 2}, "1, 3", false);
}
TEST(Timeout, GroupOfFourOnlyRankThreeMissing) {
  ExpectTimeoutNamingMissing(4, {0, 1, 2}, "3", false);
}

// A rank that arrives after its peer gave up must not hang: it fails within its own timeout.
// A timeout far beyond any clock's range (the config takes any finite value) means "wait", not
// an overflowed deadline in the past: the ring runs, even when one rank arrives late.
TEST(Timeout, HugeTimeoutStillWaits) {
  for (double huge : {1e12, 1e300}) {
    SCOPED_TRACE(huge);
    LocalGroup g(3, huge, 1);
    ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
    ExpectCorrectForward(g.ctx);
  }
}

// The late rank is told that its peer gave up, at once, whatever its own call: the peer's stale
// call signature must not be compared with it (a differing tag or mask used to fail it as a
// mispaired or disagreeing call) nor start a ring that fails at its first block.
TEST(Timeout, LateRankFailsToo) {
  for (const char* late_call : {"same", "tagged", "other mask"}) {
    SCOPED_TRACE(late_call);
    LocalGroup g(2, kShortTimeoutS, 1);
    ASSERT_EQ(g.status, STRIA_SUCCESS);
    stria_attention_params_t p = DefaultParams();
    Rank t0, t1;
    EXPECT_EQ(t0.Forward(g.ctx[0], p), STRIA_ERROR_TIMEOUT);
    if (std::string(late_call) == "tagged") {
      ASSERT_EQ(stria_context_set_call_tag(g.ctx[1], 0x77), STRIA_SUCCESS);
    }
    if (std::string(late_call) == "other mask") p.causal = 0;
    const Outcome late = Timed([&] { return t1.Forward(g.ctx[1], p); });
    EXPECT_EQ(late.status, STRIA_ERROR_TRANSPORT) << late.message;
    EXPECT_TRUE(Contains(late.message, "rank 0 had joined")) << late.message;
    EXPECT_TRUE(Contains(late.message, "after a failure of its own")) << late.message;
    EXPECT_LT(late.seconds, kShortTimeoutS) << late.message;
  }
}

// A timeout so short that the ranks meet right at it: a rank may time out, but only naming a
// rank that was really missing. A gather completed just at its deadline used to fail anyway,
// "waiting for rank(s)  to join", naming nobody.
TEST(Timeout, AtTheDeadlineOnlyAMissingRankIsNamed) {
  for (int i = 0; i < 20; ++i) {
    LocalGroup g(2, 1e-9, 1);
    ASSERT_EQ(g.status, STRIA_SUCCESS);
    const stria_attention_params_t p = DefaultParams();
    std::vector<Outcome> o(2);
    RunRanks(2, [&](int r) {
      Rank t;
      o[static_cast<size_t>(r)] = Timed([&] { return t.Forward(g.ctx[static_cast<size_t>(r)], p); });
    });
    for (const Outcome& x : o) {
      if (x.status == STRIA_SUCCESS) continue;
      EXPECT_FALSE(Contains(x.message, "rank(s)  ")) << x.message;
      if (x.status == STRIA_ERROR_TIMEOUT && Contains(x.message, "rank(s)")) {
        EXPECT_TRUE(Contains(x.message, "rank(s) 0") || Contains(x.message, "rank(s) 1")) << x.message;
      }
    }
  }
}

// (b) stria_context_abort from another thread ends a wait long before the timeout.
TEST(Abort, FromAnotherThreadEndsTheWait) {
  LocalGroup g(2, kLongTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  const stria_attention_params_t p = DefaultParams();
  Outcome o;
  std::thread waiter([&] {
    Rank t;
    o = Timed([&] { return t.Forward(g.ctx[0], p); });  // rank 1 never calls
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(stria_context_abort(g.ctx[0]), STRIA_SUCCESS);
  waiter.join();
  EXPECT_EQ(o.status, STRIA_ERROR_ABORTED) << o.message;
  EXPECT_FALSE(o.message.empty());
  EXPECT_GE(o.seconds, 0.05);
  EXPECT_LT(o.seconds, kPromptS);
  // Abort is idempotent; an aborted context refuses work and can be destroyed.
  EXPECT_EQ(stria_context_abort(g.ctx[0]), STRIA_SUCCESS) << stria_get_last_error();
  Rank t;
  const Outcome again = Timed([&] { return t.Forward(g.ctx[0], p); });
  EXPECT_EQ(again.status, STRIA_ERROR_ABORTED) << again.message;
  EXPECT_TRUE(Contains(again.message, "abort")) << again.message;
  EXPECT_EQ(t.Backward(g.ctx[0], p), STRIA_ERROR_ABORTED);
  int rank = -1;
  EXPECT_EQ(stria_context_get_rank(g.ctx[0], &rank), STRIA_SUCCESS) << "an aborted handle is still live";
  EXPECT_EQ(rank, 0);
  // Its peer, arriving now, sees rank 0 gone instead of waiting 30 s.
  const Outcome peer = Timed([&] { return t.Forward(g.ctx[1], p); });
  EXPECT_EQ(peer.status, STRIA_ERROR_TRANSPORT) << peer.message;
  EXPECT_TRUE(Contains(peer.message, "rank 0")) << peer.message;
  EXPECT_LT(peer.seconds, kPromptS);
  EXPECT_EQ(stria_context_destroy(g.ctx[0]), STRIA_SUCCESS);
  EXPECT_EQ(stria_context_destroy(g.ctx[1]), STRIA_SUCCESS);
  g.ctx = {nullptr, nullptr};
}

TEST(Abort, IdleSingleRankContext) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = 1;
  stria_context_t ctx = nullptr;
  ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS);
  Rank t;
  const stria_attention_params_t p = DefaultParams();
  EXPECT_EQ(t.Forward(ctx, p), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(stria_context_abort(ctx), STRIA_SUCCESS);
  EXPECT_EQ(stria_context_abort(ctx), STRIA_SUCCESS);
  EXPECT_EQ(t.Forward(ctx, p), STRIA_ERROR_ABORTED);
  EXPECT_STRNE(stria_get_last_error(), "");
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
  EXPECT_EQ(stria_context_abort(ctx), STRIA_ERROR_INVALID_ARGUMENT);
}

// (b') An abort that lands while the call computes, with nothing to wait for (a world of 1),
// stops the compute and fails the call: an aborted call never reports SUCCESS. The call would
// take seconds (16k tokens on two threads); the abort comes 100 ms into it.
void ExpectAbortStopsTheCompute(bool backward) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = 2;
  stria_context_t ctx = nullptr;
  ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  AttentionTensors t(1, 16384, 8, 8, 64, Dt::kF32, 5);
  const stria_attention_params_t p = DefaultParams();
  Outcome o;
  std::thread caller([&] {
    o = Timed([&] {
      return backward ? stria_attention_backward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, &t.dout.dl,
                                                 &t.dq.dl, &t.dk.dl, &t.dv.dl, nullptr)
                      : stria_attention_forward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr);
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(stria_context_abort(ctx), STRIA_SUCCESS);
  caller.join();
  EXPECT_EQ(o.status, STRIA_ERROR_ABORTED) << o.message;
  EXPECT_TRUE(Contains(o.message, "abort")) << o.message;
  EXPECT_LT(o.seconds, kPromptS) << "the compute stops at the abort";
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

TEST(Abort, StopsTheForwardComputeOfAWorldOfOne) {
  ExpectAbortStopsTheCompute(false);
}

TEST(Abort, StopsTheBackwardComputeOfAWorldOfOne) {
  ExpectAbortStopsTheCompute(true);
}

// (c) Aborting one rank makes the peers waiting for it fail fast with TRANSPORT.
void ExpectPeersSeeRankLeave(int world, int victim, bool destroy) {
  SCOPED_TRACE(::testing::Message() << "world " << world << " victim " << victim
                                    << (destroy ? " destroyed" : " aborted"));
  LocalGroup g(world, kLongTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  const stria_attention_params_t p = DefaultParams();
  std::vector<Outcome> res(static_cast<size_t>(world));
  std::thread waiters([&] {
    RunRanks(world, [&](int r) {
      if (r == victim) return;
      Rank t;
      res[static_cast<size_t>(r)] = Timed([&] { return t.Forward(g.ctx[static_cast<size_t>(r)], p); });
    });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (destroy) {
    EXPECT_EQ(stria_context_destroy(g.ctx[static_cast<size_t>(victim)]), STRIA_SUCCESS);
    g.ctx[static_cast<size_t>(victim)] = nullptr;
  } else {
    EXPECT_EQ(stria_context_abort(g.ctx[static_cast<size_t>(victim)]), STRIA_SUCCESS);
  }
  waiters.join();
  const std::string who = "rank " + std::to_string(victim);
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const Outcome& o = res[static_cast<size_t>(r)];
    EXPECT_EQ(o.status, STRIA_ERROR_TRANSPORT) << "rank " << r << ": " << o.message;
    EXPECT_TRUE(Contains(o.message, who) && Contains(o.message, "left")) << "rank " << r << ": " << o.message;
    EXPECT_LT(o.seconds, kPromptS) << "rank " << r;
    // The ring is broken: the survivors are poisoned too.
    Rank t;
    EXPECT_NE(t.Forward(g.ctx[static_cast<size_t>(r)], p), STRIA_SUCCESS);
  }
  for (auto& c : g.ctx) {
    if (c) {
      EXPECT_EQ(stria_context_destroy(c), STRIA_SUCCESS) << stria_get_last_error();
    }
    c = nullptr;
  }
}

TEST(Abort, PeerOfAbortedRankFailsFast) {
  ExpectPeersSeeRankLeave(2, 1, false);
}
TEST(Abort, PeersOfAbortedRankFailFastGroupOfFour) {
  ExpectPeersSeeRankLeave(4, 2, false);
}

TEST(Abort, AbortedBeforePeerArrives) {
  LocalGroup g(3, kLongTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  ASSERT_EQ(stria_context_abort(g.ctx[2]), STRIA_SUCCESS);
  const stria_attention_params_t p = DefaultParams();
  std::vector<Outcome> res(2);
  RunRanks(2, [&](int r) {
    Rank t;
    res[static_cast<size_t>(r)] = Timed([&] { return t.Forward(g.ctx[static_cast<size_t>(r)], p); });
  });
  for (const Outcome& o : res) {
    EXPECT_EQ(o.status, STRIA_ERROR_TRANSPORT) << o.message;
    EXPECT_TRUE(Contains(o.message, "rank 2")) << o.message;
    EXPECT_LT(o.seconds, kPromptS);
  }
}

// Aborting a rank that already waits for a missing one (ranks 0 and 1 call, rank 2 never does):
// rank 1 must learn that rank 0 left, not wait for rank 2 until its timeout.
TEST(Abort, WaitingRankAbortedWhileAThirdIsMissing) {
  for (const int victim : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "victim " << victim);
    LocalGroup g(3, kLongTimeoutS, 1);
    ASSERT_EQ(g.status, STRIA_SUCCESS);
    const stria_attention_params_t p = DefaultParams();
    std::vector<Outcome> res(2);
    std::thread callers([&] {
      RunRanks(2, [&](int r) {
        Rank t;
        res[static_cast<size_t>(r)] = Timed([&] { return t.Forward(g.ctx[static_cast<size_t>(r)], p); });
      });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(stria_context_abort(g.ctx[static_cast<size_t>(victim)]), STRIA_SUCCESS);
    callers.join();
    const Outcome& aborted = res[static_cast<size_t>(victim)];
    const Outcome& peer = res[static_cast<size_t>(1 - victim)];
    EXPECT_EQ(aborted.status, STRIA_ERROR_ABORTED) << aborted.message;
    EXPECT_EQ(peer.status, STRIA_ERROR_TRANSPORT) << peer.message;
    EXPECT_TRUE(Contains(peer.message, "rank " + std::to_string(victim)) && Contains(peer.message, "left"))
        << peer.message;
    EXPECT_LT(peer.seconds, kPromptS) << peer.message;
  }
}

// (f) Destroying a context while its peer waits.
TEST(Destroy, PeerOfDestroyedRankFailsFast) {
  ExpectPeersSeeRankLeave(2, 0, true);
}
TEST(Destroy, PeersOfDestroyedRankFailFastGroupOfThree) {
  ExpectPeersSeeRankLeave(3, 1, true);
}

// Destroying a context while its own call waits (misuse, but survivable): the call ends.
TEST(Destroy, WhileItsOwnCallWaits) {
  LocalGroup g(2, kLongTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  const stria_attention_params_t p = DefaultParams();
  Outcome o;
  std::thread waiter([&] {
    Rank t;
    o = Timed([&] { return t.Forward(g.ctx[0], p); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(stria_context_destroy(g.ctx[0]), STRIA_SUCCESS);
  g.ctx[0] = nullptr;
  waiter.join();
  EXPECT_NE(o.status, STRIA_SUCCESS);
  EXPECT_FALSE(o.message.empty());
  EXPECT_LT(o.seconds, kPromptS);
}

// (d) Ranks that disagree about the call: every rank gets INVALID_ARGUMENT naming the rank that
// differs, and nothing else happens, so the group then runs a correct collective.
struct Disagreement {
  const char* name;
  // What the odd rank calls (the others call a default forward).
  std::function<stria_status_t(stria_context_t)> odd;
};

void PrintTo(const Disagreement& d, std::ostream* os) {
  *os << d.name;
}

std::vector<Disagreement> Disagreements() {
  auto with = [](std::function<void(stria_attention_params_t*)> edit) {
    return [edit](stria_context_t c) {
      stria_attention_params_t p = DefaultParams();
      edit(&p);
      Rank t;
      return t.Forward(c, p);
    };
  };
  return {
      {"L", [](stria_context_t c) { return Rank(2 * kL).Forward(c, DefaultParams()); }},
      {"Hkv", [](stria_context_t c) { return Rank(kL, 1).Forward(c, DefaultParams()); }},
      {"dtype", [](stria_context_t c) { return Rank(kL, kH, Dt::kBF16).Forward(c, DefaultParams()); }},
      {"layout", with([](stria_attention_params_t* p) { p->layout = STRIA_LAYOUT_CONTIGUOUS; })},
      {"causal", with([](stria_attention_params_t* p) { p->causal = 0; })},
      {"scale", with([](stria_attention_params_t* p) { p->softmax_scale = 0.3f; })},
      {"documents",
       [](stria_context_t c) {  // the others attend over one sequence; this rank cuts it in two
         int world = 0;
         stria_context_get_world_size(c, &world);
         const int64_t cu[3] = {0, 1, kL * world};
         Rank t;
         const stria_attention_params_t p = DefaultParams();
         return stria_attention_forward_documents(c, &p, cu, 2, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl,
                                                  nullptr);
       }},
      {"window",
       [](stria_context_t c) {  // the others attend over the whole sequence; this rank through a window
         Rank t;
         const stria_attention_params_t p = DefaultParams();
         return stria_attention_forward_window(c, &p, 3, -1, nullptr, 0, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl,
                                               &t.lse.dl, nullptr);
       }},
      {"backward", [](stria_context_t c) { return Rank().Backward(c, DefaultParams()); }},
      {"tag",
       [](stria_context_t c) {
         const stria_status_t s = stria_context_set_call_tag(c, 7);
         return s != STRIA_SUCCESS ? s : Rank().Forward(c, DefaultParams());
       }},
  };
}

class Disagree : public ::testing::TestWithParam<Disagreement> {};

void ExpectDisagreement(const Disagreement& d, int world, int odd) {
  SCOPED_TRACE(::testing::Message() << "world " << world << " odd rank " << odd);
  LocalGroup g(world, 2.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  std::vector<Outcome> res(static_cast<size_t>(world));
  RunRanks(world, [&](int r) {
    stria_context_t c = g.ctx[static_cast<size_t>(r)];
    res[static_cast<size_t>(r)] = Timed([&] {
      if (r == odd) return d.odd(c);
      Rank t;
      return t.Forward(c, DefaultParams());
    });
  });
  const std::string who = "rank " + std::to_string(odd);
  for (int r = 0; r < world; ++r) {
    const Outcome& o = res[static_cast<size_t>(r)];
    EXPECT_EQ(o.status, STRIA_ERROR_INVALID_ARGUMENT) << "rank " << r << ": " << o.message;
    EXPECT_TRUE(Contains(o.message, who)) << "rank " << r << ": " << o.message;
    EXPECT_LT(o.seconds, kPromptS);
  }
  ExpectCorrectForward(g.ctx);
}

TEST_P(Disagree, GroupOfTwo) {
  ExpectDisagreement(GetParam(), 2, 1);
}
TEST_P(Disagree, GroupOfThreeLastRankOdd) {
  ExpectDisagreement(GetParam(), 3, 2);
}
TEST_P(Disagree, GroupOfThreeRankZeroOdd) {
  ExpectDisagreement(GetParam(), 3, 0);
}

INSTANTIATE_TEST_SUITE_P(Faults, Disagree, ::testing::ValuesIn(Disagreements()),
                         [](const ::testing::TestParamInfo<Disagreement>& i) { return std::string(i.param.name); });

// The group stays in step across several disagreements in a row, forward and backward.
TEST(Disagree, RepeatedThenForwardAndBackward) {
  LocalGroup g(2, 2.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  for (int i = 0; i < 3; ++i) {
    std::vector<stria_status_t> st(2);
    RunRanks(2, [&](int r) {
      stria_attention_params_t p = DefaultParams();
      p.causal = r == 0;
      Rank t;
      st[static_cast<size_t>(r)] =
          i % 2 ? t.Backward(g.ctx[static_cast<size_t>(r)], p) : t.Forward(g.ctx[static_cast<size_t>(r)], p);
    });
    EXPECT_EQ(st[0], STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(st[1], STRIA_ERROR_INVALID_ARGUMENT);
  }
  std::vector<stria_status_t> st(2);
  RunRanks(2, [&](int r) {
    Rank t;
    const stria_attention_params_t p = DefaultParams();
    st[static_cast<size_t>(r)] = t.Forward(g.ctx[static_cast<size_t>(r)], p);
    if (st[static_cast<size_t>(r)] == STRIA_SUCCESS)
      st[static_cast<size_t>(r)] = t.Backward(g.ctx[static_cast<size_t>(r)], p);
  });
  EXPECT_EQ(st[0], STRIA_SUCCESS);
  EXPECT_EQ(st[1], STRIA_SUCCESS);
  ExpectCorrectForward(g.ctx);
}

// Two independent calls of the same shapes, made in different orders on different ranks: each
// rank's first call pairs with another site's. Untagged they would exchange blocks of different
// calls (wrong numbers, and no error); tagged by call site, both pairings fail on every rank
// before any block moves, naming both tags, and the group stays usable.
TEST(CallTags, CallsInDifferentOrdersFailInsteadOfPairing) {
  LocalGroup g(2, 2.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  std::vector<Outcome> res(4);
  RunRanks(2, [&](int r) {
    stria_context_t c = g.ctx[static_cast<size_t>(r)];
    const uint64_t order[2][2] = {{0xA1, 0xB2}, {0xB2, 0xA1}};
    for (int i = 0; i < 2; ++i) {
      res[static_cast<size_t>(2 * r + i)] = Timed([&] {
        const stria_status_t s = stria_context_set_call_tag(c, order[r][i]);
        return s != STRIA_SUCCESS ? s : Rank().Forward(c, DefaultParams());
      });
    }
  });
  for (const Outcome& o : res) {
    EXPECT_EQ(o.status, STRIA_ERROR_INVALID_ARGUMENT) << o.message;
    EXPECT_TRUE(Contains(o.message, "paired different calls")) << o.message;
    EXPECT_TRUE(Contains(o.message, "0xa1") && Contains(o.message, "0xb2")) << o.message;
    EXPECT_LT(o.seconds, kPromptS);
  }
  ExpectCorrectForward(g.ctx);
}

// Equal tags pair as untagged calls do, and a tag names one call only: the next call is untagged
// (0) whether the tagged one succeeded or was refused.
TEST(CallTags, MatchingTagsRunAndATagNamesOneCall) {
  LocalGroup g(2, 2.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  std::vector<stria_status_t> st(2);
  auto both = [&](const std::function<stria_status_t(int, stria_context_t)>& call) {
    RunRanks(2, [&](int r) { st[static_cast<size_t>(r)] = call(r, g.ctx[static_cast<size_t>(r)]); });
  };
  both([](int, stria_context_t c) {
    EXPECT_EQ(stria_context_set_call_tag(c, 42), STRIA_SUCCESS);
    return Rank().Forward(c, DefaultParams());
  });
  EXPECT_EQ(st[0], STRIA_SUCCESS);
  EXPECT_EQ(st[1], STRIA_SUCCESS);
  // Rank 1 tags its call 0 explicitly; rank 0's is 0 only if its tag 42 was taken by the last call.
  both([](int r, stria_context_t c) {
    if (r == 1) {
      EXPECT_EQ(stria_context_set_call_tag(c, 0), STRIA_SUCCESS);
    }
    return Rank().Backward(c, DefaultParams());
  });
  EXPECT_EQ(st[0], STRIA_SUCCESS) << "the tag outlived its call";
  EXPECT_EQ(st[1], STRIA_SUCCESS);
  // A tagged call that fails (a disagreement) takes its tag too.
  both([](int r, stria_context_t c) {
    EXPECT_EQ(stria_context_set_call_tag(c, 9), STRIA_SUCCESS);
    stria_attention_params_t p = DefaultParams();
    p.causal = r;
    return Rank().Forward(c, p);
  });
  EXPECT_EQ(st[0], STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(st[1], STRIA_ERROR_INVALID_ARGUMENT);
  both([](int, stria_context_t c) { return Rank().Forward(c, DefaultParams()); });
  EXPECT_EQ(st[0], STRIA_SUCCESS);
  EXPECT_EQ(st[1], STRIA_SUCCESS);
  ExpectCorrectForward(g.ctx);
}

// An aborted context takes no tag: it can only be destroyed.
TEST(CallTags, AnAbortedContextRefusesATag) {
  LocalGroup g(2, 2.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  ASSERT_EQ(stria_context_abort(g.ctx[0]), STRIA_SUCCESS);
  EXPECT_EQ(stria_context_set_call_tag(g.ctx[0], 1), STRIA_ERROR_ABORTED);
  EXPECT_TRUE(Contains(stria_get_last_error(), "aborted")) << stria_get_last_error();
}

// (e) One rank rejects its own arguments: it reports its own reason, the others name it.
void ExpectOneBadRank(int world, int bad, bool backward) {
  SCOPED_TRACE(::testing::Message() << "world " << world << " bad rank " << bad << (backward ? " backward" : ""));
  LocalGroup g(world, 2.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  std::vector<Outcome> res(static_cast<size_t>(world));
  RunRanks(world, [&](int r) {
    Rank t;
    const stria_attention_params_t p = DefaultParams();
    stria_context_t c = g.ctx[static_cast<size_t>(r)];
    const DLTensor* q = r == bad ? nullptr : &t.q.dl;
    res[static_cast<size_t>(r)] = Timed([&] {
      return backward ? stria_attention_backward(c, &p, q, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, &t.dout.dl, &t.dq.dl,
                                                 &t.dk.dl, &t.dv.dl, nullptr)
                      : stria_attention_forward(c, &p, q, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr);
    });
  });
  for (int r = 0; r < world; ++r) {
    const Outcome& o = res[static_cast<size_t>(r)];
    EXPECT_EQ(o.status, STRIA_ERROR_INVALID_ARGUMENT) << "rank " << r << ": " << o.message;
    EXPECT_LT(o.seconds, kPromptS);
    if (r == bad) {
      EXPECT_TRUE(Contains(o.message, "q is NULL")) << o.message;
    } else {
      EXPECT_TRUE(Contains(o.message, "rank " + std::to_string(bad) + " rejected its arguments")) << o.message;
      EXPECT_TRUE(Contains(o.message, "q is NULL")) << "the reason travels with it: " << o.message;
    }
  }
  ExpectCorrectForward(g.ctx);
}

TEST(OneRankBad, NullQGroupOfTwo) {
  ExpectOneBadRank(2, 1, false);
}
TEST(OneRankBad, NullQGroupOfThree) {
  ExpectOneBadRank(3, 1, false);
}
TEST(OneRankBad, NullQRankZeroGroupOfFourBackward) {
  ExpectOneBadRank(4, 0, true);
}

int ThreadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

// (g) Many short-lived groups: no thread or context outlives its group, nothing gets stuck.
TEST(Lifecycle, RepeatedCreateRunDestroy) {
  // One group first, so that runtime helpers started lazily by the first threads of the process
  // (ThreadSanitizer's background thread, for one) are counted in the baseline, not as leaks.
  {
    LocalGroup warm(3, 2.0, 2);
    ASSERT_EQ(warm.status, STRIA_SUCCESS);
    std::thread([] {}).join();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int threads_before = ThreadCount();
  const auto t0 = Clock::now();
  const stria_attention_params_t p = DefaultParams();
  for (int it = 0; it < 50; ++it) {
    SCOPED_TRACE(it);
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.timeout_s = 2.0;
    cfg.num_threads = 1 + it % 2;  // some with worker threads of their own
    stria_context_t ctx[3] = {nullptr, nullptr, nullptr};
    ASSERT_EQ(stria_context_create_local_group(&cfg, 3, ctx), STRIA_SUCCESS) << stria_get_last_error();
    std::vector<stria_status_t> st(3, STRIA_SUCCESS);
    if (it % 5 == 4) {
      // Now and then a broken round: rank 2 is aborted while the others wait for it.
      std::thread waiters([&] {
        RunRanks(2, [&](int r) {
          Rank t;
          st[static_cast<size_t>(r)] = t.Forward(ctx[r], p);
        });
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(stria_context_abort(ctx[2]), STRIA_SUCCESS);
      waiters.join();
      EXPECT_EQ(st[0], STRIA_ERROR_TRANSPORT);
      EXPECT_EQ(st[1], STRIA_ERROR_TRANSPORT);
    } else {
      RunRanks(3, [&](int r) {
        Rank t;
        st[static_cast<size_t>(r)] = t.Forward(ctx[r], p);
        if (st[static_cast<size_t>(r)] == STRIA_SUCCESS) st[static_cast<size_t>(r)] = t.Backward(ctx[r], p);
      });
      for (auto s : st) EXPECT_EQ(s, STRIA_SUCCESS);
    }
    // Destroy in a different order each time.
    for (int i = 0; i < 3; ++i) EXPECT_EQ(stria_context_destroy(ctx[(i + it) % 3]), STRIA_SUCCESS);
  }
  EXPECT_LT(Since(t0), 30.0);
  EXPECT_EQ(ThreadCount(), threads_before) << "threads left behind by destroyed groups";
}

}  // namespace

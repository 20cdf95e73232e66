// The NCCL transport's logic on a host model of CUDA and NCCL (host_model.cc), ranks as threads:
// it runs on any machine, and under the sanitizers. The rings below post, wait and all-gather in
// exactly the order of the engine's schedules (src/ring/ring_forward.cc, ring_backward.cc: keep
// them in step), and check every block that arrives. The model pairs the k-th send with the k-th
// receive between two ranks and completes a send only when its receive is there, so a schedule
// that NCCL would mismatch or deadlock fails here too. Also: a caller's communicator, a wait that
// times out, an abort from another thread, a rank that never gets to NCCL, two ranks on one GPU,
// a rank of another transport in the rendezvous, and the guard on posting order.
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "ring_schedules.h"
#include "transport/module_abi.h"
#include "transport/rendezvous/rendezvous.h"

extern "C" const stria::TransportModule stria_nccl_module_v4;
int ModelSizeMismatches();
int ModelAbortStalls();
int ModelFinalizeCalls();
int ModelOpenRoots();
int ModelConcurrentIssues();

namespace stria {
namespace {

using namespace ring_schedules;  // NOLINT: the schedules are this suite's vocabulary

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

stria_context_config_t Config(int rank, int world, double timeout_s) {
  stria_context_config_t cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = STRIA_TRANSPORT_NCCL;
  cfg.device = DLDevice{kDLCUDA, rank};
  cfg.timeout_s = timeout_s;
  return cfg;
}

// world ranks as threads, each creating its transport at once (the rendezvous and NCCL's set-up
// are collectives); edit() may change a rank's config first.
struct Ranks {
  std::vector<std::unique_ptr<Transport>> t;
  std::vector<Status> s;
  uint64_t next_call = 1;  // the engine's call sequence number: tags grow from call to call
  // edit may change a rank's config and give it a communicator of the caller's (*comm).
  Ranks(int world, double timeout_s,
        const std::function<void(int, stria_context_config_t*, void** comm)>& edit = nullptr)
      : t(static_cast<size_t>(world)), s(static_cast<size_t>(world)) {
    unsetenv("STRIA_ROOT");
    stria_unique_id_t id;
    EXPECT_TRUE(stria_nccl_module_v4.get_unique_id(&id).ok());
    Run(world, [&](int r) {
      cudaSetDevice(r);
      stria_context_config_t cfg = Config(r, world, timeout_s);
      cfg.unique_id = id;
      void* comm = nullptr;
      if (edit) edit(r, &cfg, &comm);
      Transport* made = nullptr;
      s[static_cast<size_t>(r)] = stria_nccl_module_v4.create(cfg, comm, timeout_s, &made);
      t[static_cast<size_t>(r)].reset(made);
    });
  }
  static void Run(int world, const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
    for (auto& th : threads) th.join();
  }
  void ExpectAllOk() {
    for (size_t r = 0; r < s.size(); ++r) EXPECT_TRUE(s[r].ok()) << "rank " << r << ": " << s[r].message();
  }
};

void RunCalls(Ranks& ranks, int calls, size_t kv_bytes, size_t dkv_floats, int steps = 0) {
  const int world = static_cast<int>(ranks.t.size());
  const uint64_t first = ranks.next_call;
  ranks.next_call += static_cast<uint64_t>(2 * calls);
  std::vector<Status> out(static_cast<size_t>(world));
  Ranks::Run(world, [&](int r) {
    cudaSetDevice(r);
    Transport& tr = *ranks.t[static_cast<size_t>(r)];
    Status s;
    for (uint64_t seq = first; s.ok() && seq < first + static_cast<uint64_t>(2 * calls); seq += 2) {
      s = Forward(tr, seq, kv_bytes, steps);
      if (s.ok()) s = Backward(tr, seq + 1, kv_bytes, dkv_floats, steps);
    }
    out[static_cast<size_t>(r)] = s;
  });
  for (int r = 0; r < world; ++r)
    EXPECT_TRUE(out[static_cast<size_t>(r)].ok()) << out[static_cast<size_t>(r)].message();
}

TEST(NcclHostModel, RingSchedulesOrderedOnTheDevice) {
  for (int world = 1; world <= 5; ++world) {
    Ranks ranks(world, 30);
    ranks.ExpectAllOk();
    if (HasFailure()) return;
    for (int steps = 1; steps <= world; ++steps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(steps) + " steps");
      std::vector<Status> out(static_cast<size_t>(world));
      const uint64_t seq = ranks.next_call;
      ranks.next_call += 10;
      Ranks::Run(world, [&](int r) {
        cudaSetDevice(r);
        Transport& tr = *ranks.t[static_cast<size_t>(r)];
        EXPECT_TRUE(tr.OrdersOnDevice());
        const Status s = CallsOnDevice(tr, seq, steps, /*host_too=*/false);
        if (!s.ok()) tr.Abort();  // the others fail at once, not at their timeout
        out[static_cast<size_t>(r)] = s;
      });
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(out[static_cast<size_t>(r)].ok()) << out[static_cast<size_t>(r)].message();
    }
  }
  EXPECT_EQ(ModelSizeMismatches(), 0);
}

TEST(NcclHostModel, RingSchedulesAtEveryWorldSize) {
  for (int world = 1; world <= 5; ++world) {
    SCOPED_TRACE("world " + std::to_string(world));
    Ranks ranks(world, 30);
    ranks.ExpectAllOk();
    if (HasFailure()) return;
    // K/V and dK/dV of different sizes (a swapped pairing shows as a size mismatch too) and of
    // the same size (it shows in the data only).
    RunCalls(ranks, 2, 3000, 1000);
    RunCalls(ranks, 1, 4096, 1024);
  }
  EXPECT_EQ(ModelSizeMismatches(), 0);
}

// The rings a sliding window cuts short (RingSteps): every step count below the world size, the
// last holder of each block sending its dK/dV partial home over several hops in one group with
// its own block's partial coming in from elsewhere.
TEST(NcclHostModel, RingSchedulesThatAWindowCutsShort) {
  for (int world = 2; world <= 5; ++world)
    for (int steps = 1; steps < world; ++steps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(steps) + " steps");
      Ranks ranks(world, 30);
      ranks.ExpectAllOk();
      if (HasFailure()) return;
      RunCalls(ranks, 2, 3000, 1000, steps);
      RunCalls(ranks, 1, 2048, 512, steps);
    }
  EXPECT_EQ(ModelSizeMismatches(), 0);
}

// Two rings on the same two GPUs, each rank driven by its own thread, so two threads issue to
// communicators of one device. NCCL documents that as unsafe when it happens at once; every
// launch holds its device's issue lock, so the model sees no overlap (without the lock it saw
// dozens in this test).
TEST(NcclHostModel, TwoContextsOnOneGpuNeverIssueAtOnce) {
  Ranks a(2, 30), b(2, 30);
  a.ExpectAllOk();
  b.ExpectAllOk();
  if (HasFailure()) return;
  const int before = ModelConcurrentIssues();
  std::thread other([&] { RunCalls(b, 6, 2048, 512); });
  RunCalls(a, 6, 2048, 512);
  other.join();
  EXPECT_EQ(ModelConcurrentIssues(), before);
  EXPECT_EQ(ModelSizeMismatches(), 0);
}

// A caller's own communicators, rank r on device r, blocking or not (initialised concurrently,
// as NCCL requires).
std::vector<ncclComm_t> CallerComms(int world, int blocking) {
  ncclUniqueId uid;
  EXPECT_EQ(ncclGetUniqueId(&uid), ncclSuccess);
  std::vector<ncclComm_t> user(static_cast<size_t>(world), nullptr);
  Ranks::Run(world, [&](int r) {
    cudaSetDevice(r);
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    c.blocking = blocking;
    ncclResult_t st = ncclCommInitRankConfig(&user[static_cast<size_t>(r)], world, uid, r, &c);
    while (st == ncclInProgress) ncclCommGetAsyncError(user[static_cast<size_t>(r)], &st);
    EXPECT_EQ(st, ncclSuccess);
  });
  return user;
}

TEST(NcclHostModel, CallersCommunicatorIsUsedAndLeftAlone) {
  for (int blocking : {1, 0}) {
    SCOPED_TRACE(blocking ? "blocking" : "nonblocking");
    const int world = 3;
    const std::vector<ncclComm_t> user = CallerComms(world, blocking);
    {
      Ranks ranks(world, 30, [&](int r, stria_context_config_t* cfg, void** comm) {
        *comm = user[static_cast<size_t>(r)];
        std::memset(cfg->unique_id.internal, 0, sizeof cfg->unique_id.internal);  // not needed
      });
      ranks.ExpectAllOk();
      if (HasFailure()) return;
      RunCalls(ranks, 1, 2048, 300);
    }
    // Every rank's transport is gone; the caller's communicators were not aborted.
    for (ncclComm_t c : user) {
      ncclResult_t st = ncclInternalError;
      EXPECT_EQ(ncclCommGetAsyncError(c, &st), ncclSuccess);
      EXPECT_EQ(st, ncclSuccess);
    }
    // Configs that do not describe the communicator are refused before any collective.
    stria_context_config_t cfg = Config(1, world, 5);
    cudaSetDevice(1);
    Transport* t = nullptr;
    Status s = stria_nccl_module_v4.create(cfg, user[0], 5, &t);
    EXPECT_EQ(s.code(), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(s.message().find("rank 0 of its communicator but config->rank is 1"), std::string::npos) << s.message();
    cfg = Config(0, 2, 5);
    s = stria_nccl_module_v4.create(cfg, user[0], 5, &t);
    EXPECT_NE(s.message().find("has 3 ranks but config->world_size is 2"), std::string::npos) << s.message();
    cfg = Config(0, world, 5);
    cfg.device.device_id = 4;
    s = stria_nccl_module_v4.create(cfg, user[0], 5, &t);
    EXPECT_NE(s.message().find("device 0 but config->device names device 4"), std::string::npos) << s.message();
    EXPECT_EQ(t, nullptr);
    for (ncclComm_t c : user) ncclCommDestroy(c);
  }
}

// A caller's nonblocking communicator on which one rank never creates its context: the others
// give up at their timeout and leave the communicator to its owner. (On a blocking one, NCCL may
// block the broadcast's caller until every rank is there, since it connects a communicator's
// peers at its first collective: stria.h says so; the model does not block.)
TEST(NcclHostModel, CallersCommunicatorTimesOutWhenARankNeverCreates) {
  for (int blocking : {0}) {
    SCOPED_TRACE(blocking ? "blocking" : "nonblocking");
    const int world = 2;
    const std::vector<ncclComm_t> user = CallerComms(world, blocking);
    cudaSetDevice(0);
    stria_context_config_t cfg = Config(0, world, 0.5);
    Transport* t = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    Status s = stria_nccl_module_v4.create(cfg, user[0], 0.5, &t);
    EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
    EXPECT_NE(s.message().find("its owner should abort"), std::string::npos) << s.message();
    EXPECT_LT(SecondsSince(t0), 5) << "neither the wait nor the cleanup may block";
    EXPECT_EQ(t, nullptr);
    // Not stria's to abort.
    ncclResult_t st = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(user[0], &st), ncclSuccess);
    // The owner aborts it, as the message says it should: its pending broadcast would otherwise
    // hold device 0, where a later abort of another communicator waits for it (on a GPU too).
    cudaSetDevice(0);
    EXPECT_EQ(ncclCommAbort(user[0]), ncclSuccess);
    cudaSetDevice(1);
    EXPECT_EQ(ncclCommAbort(user[1]), ncclSuccess);
  }
}

// Rank 0 of a pair posts a step's K/V receive and send to rank 1, which posts nothing: one group
// launched that never completes. (Callers check HasFatalFailure.)
void PostTowardsSilentRankOne(Transport& t0, std::vector<uint8_t>& a, std::vector<uint8_t>& b, RequestId* rr,
                              RequestId* rs) {
  ASSERT_TRUE(t0.Irecv(1, Tag(1, 0, 1), b.data(), b.size(), rr).ok());
  ASSERT_TRUE(t0.Isend(1, Tag(1, 0, 1), a.data(), a.size(), rs).ok());
}

TEST(NcclHostModel, WaitTimesOutAndPoisons) {
  Ranks ranks(2, 30);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  cudaSetDevice(0);
  Transport& t0 = *ranks.t[0];
  std::vector<uint8_t> a(1000), b(1000);
  RequestId rr = 0, rs = 0;
  PostTowardsSilentRankOne(t0, a, b, &rr, &rs);
  ASSERT_FALSE(HasFatalFailure());
  const auto start = std::chrono::steady_clock::now();
  Status s = t0.Wait(rr, 0.4, "K/V block of ring step 0");  // rank 1 posts nothing
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_NE(s.message().find("waiting for rank 1 to send (K/V block of ring step 0)"), std::string::npos)
      << s.message();
  EXPECT_LT(SecondsSince(start), 3);
  // Poisoned with that first error.
  EXPECT_EQ(t0.Wait(rs, 10, "x").message(), s.message());
  EXPECT_EQ(t0.Isend(1, Tag(2, 0, 1), a.data(), a.size(), &rs).message(), s.message());
  char all[2];
  EXPECT_EQ(t0.AllGather("x", all, 1, 10, "x").message(), s.message());
  const auto end = std::chrono::steady_clock::now();
  t0.CancelAll();
  ranks.t[0].reset();
  ranks.t[1].reset();
  EXPECT_LT(SecondsSince(end), 3);
}

// The engine cancels a failed call's transfers. NCCL cannot withdraw one, so a launch still in
// flight is stopped by aborting the communicators: the transport must then say so on every later
// call, not hand NCCL a communicator that is gone.
TEST(NcclHostModel, CancellingTransfersInFlightPoisonsWithTheReason) {
  Ranks ranks(2, 30);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  cudaSetDevice(0);
  Transport& t0 = *ranks.t[0];
  std::vector<uint8_t> a(1000), b(1000);
  RequestId rr = 0, rs = 0;
  PostTowardsSilentRankOne(t0, a, b, &rr, &rs);
  ASSERT_FALSE(HasFatalFailure());
  const auto start = std::chrono::steady_clock::now();
  t0.CancelAll();
  EXPECT_LT(SecondsSince(start), 5) << "the cancel waited for the transfers";
  Status s = t0.Isend(1, Tag(2, 0, 1), a.data(), a.size(), &rs);
  EXPECT_EQ(s.code(), STRIA_ERROR_TRANSPORT) << s.message();
  EXPECT_NE(s.message().find("aborted its NCCL communicators"), std::string::npos) << s.message();
  char all[2];
  EXPECT_EQ(t0.AllGather("x", all, 1, 10, "x").message(), s.message());
  for (auto& t : ranks.t) t.reset();
}

// Both lanes have a launch in flight towards a rank that never answers (as in a backward step):
// the timeout aborts both communicators in one group. One after the other, freeing the first
// would wait on a GPU for the second's kernel, which nobody told to quit: a hang (the model
// counts it as a stall after 20 s).
TEST(NcclHostModel, TimeoutWithBothLanesBusyAbortsThemTogether) {
  Ranks ranks(2, 30);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  const int stalls = ModelAbortStalls();
  cudaSetDevice(0);
  Transport& t0 = *ranks.t[0];
  std::vector<uint8_t> a(1000), b(1000), c(1000), d(1000);
  RequestId kv_recv = 0, kv_send = 0, dkv_recv = 0, dkv_send = 0;
  ASSERT_TRUE(t0.Irecv(1, Tag(1, 0, 1), b.data(), b.size(), &kv_recv).ok());
  ASSERT_TRUE(t0.Isend(1, Tag(1, 0, 1), a.data(), a.size(), &kv_send).ok());
  ASSERT_TRUE(t0.Irecv(1, Tag(1, 0, 2), d.data(), d.size(), &dkv_recv).ok());
  ASSERT_TRUE(t0.Isend(1, Tag(1, 0, 2), c.data(), c.size(), &dkv_send).ok());
  const auto start = std::chrono::steady_clock::now();
  Status s = t0.Wait(kv_recv, 0.3, "K/V block of ring step 0");  // rank 1 posts nothing
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_LT(SecondsSince(start), 5) << "the abort after the timeout waited";
  EXPECT_EQ(ModelAbortStalls(), stalls) << "an aborted lane waited for the other lane's kernel";
  t0.CancelAll();
  for (auto& t : ranks.t) t.reset();
  EXPECT_EQ(ModelAbortStalls(), stalls);
}

// A healthy end flushes each lane (ncclCommFinalize) before it frees it; an end after a failure
// aborts instead, which the timeout already did.
TEST(NcclHostModel, HealthyEndFinalizesAndAFailedOneAborts) {
  {
    Ranks ranks(2, 30);
    ranks.ExpectAllOk();
    ASSERT_FALSE(HasFailure());
    RunCalls(ranks, 1, 2048, 512);
    const int before = ModelFinalizeCalls();
    const auto start = std::chrono::steady_clock::now();
    Ranks::Run(2, [&](int r) {
      cudaSetDevice(r);
      ranks.t[static_cast<size_t>(r)].reset();
    });
    EXPECT_EQ(ModelFinalizeCalls() - before, 4) << "2 ranks x 2 lanes";
    EXPECT_LT(SecondsSince(start), 5);
  }
  Ranks ranks(2, 30);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  cudaSetDevice(0);
  std::vector<uint8_t> b(64);
  RequestId r = 0;
  ASSERT_TRUE(ranks.t[0]->Irecv(1, Tag(1, 0, 1), b.data(), b.size(), &r).ok());
  EXPECT_EQ(ranks.t[0]->Wait(r, 0.2, "x").code(), STRIA_ERROR_TIMEOUT);
  const int before = ModelFinalizeCalls();
  ranks.t[0].reset();
  EXPECT_EQ(ModelFinalizeCalls(), before) << "a failed transport flushed";
  cudaSetDevice(1);
  ranks.t[1].reset();  // healthy: it flushes
  EXPECT_EQ(ModelFinalizeCalls() - before, 2);
}

// NCCL settings that would take away the timeouts, or the transport's two communicators, are
// refused on every rank with their name, before anything waits.
TEST(NcclHostModel, EnvironmentThatBreaksTheTransportIsRefused) {
  const std::pair<const char*, const char*> settings[] = {{"NCCL_COMM_BLOCKING", "1"},
                                                          {"NCCL_COMM_ID", "127.0.0.1:29999"}};
  for (const auto& [name, value] : settings) {
    SCOPED_TRACE(name);
    setenv(name, value, 1);
    cudaSetDevice(0);
    stria_context_config_t cfg = Config(0, 1, 5);
    Transport* t = nullptr;
    Status s = stria_nccl_module_v4.create(cfg, nullptr, 5, &t);
    unsetenv(name);
    EXPECT_EQ(s.code(), STRIA_ERROR_UNSUPPORTED) << s.message();
    EXPECT_NE(s.message().find(name), std::string::npos) << s.message();
    EXPECT_EQ(t, nullptr);
  }
  setenv("NCCL_COMM_BLOCKING", "0", 1);  // what stria asks for anyway
  stria_context_config_t cfg = Config(0, 1, 5);
  Transport* t = nullptr;
  Status s = stria_nccl_module_v4.create(cfg, nullptr, 5, &t);
  unsetenv("NCCL_COMM_BLOCKING");
  EXPECT_TRUE(s.ok()) << s.message();
  delete t;
}

// A framework may load a libnccl.so.2 older than the headers stria was built with: below 2.22 the
// grouped abort of a rank's two communicators could hang, so create refuses it and names both
// versions.
TEST(NcclHostModel, AnNcclLibraryOlderThan222IsRefused) {
  setenv("STRIA_NCCL_MODEL_VERSION", "22103", 1);  // 2.21.3
  cudaSetDevice(0);
  stria_context_config_t cfg = Config(0, 1, 5);
  Transport* t = nullptr;
  Status s = stria_nccl_module_v4.create(cfg, nullptr, 5, &t);
  unsetenv("STRIA_NCCL_MODEL_VERSION");
  EXPECT_EQ(s.code(), STRIA_ERROR_UNSUPPORTED) << s.message();
  EXPECT_NE(s.message().find("2.21.3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2.22.0"), std::string::npos) << s.message();
  EXPECT_EQ(t, nullptr);
  delete t;
}

TEST(NcclHostModel, AllGatherTimesOut) {
  Ranks ranks(2, 30);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  cudaSetDevice(0);
  char all[8];
  Status s = ranks.t[0]->AllGather("abcd", all, 4, 0.3, "the signature of call 1");
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_NE(s.message().find("all-gather of the signature of call 1"), std::string::npos) << s.message();
}

TEST(NcclHostModel, AbortFromAnotherThreadEndsTheWaitAndTheRing) {
  const int world = 3;
  Ranks ranks(world, 2);  // the peers give up on the aborted rank after 2 s
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  std::vector<Status> out(world);
  std::vector<double> took(world);
  // The ranks' buffers outlive the transports, as device memory outlives the work queued on it
  // (cudaFree waits for it): rank 0 never waits for its send, which the model's stream may still
  // be copying from when the abort ends rank 0's wait.
  std::vector<std::vector<uint8_t>> sent(world, std::vector<uint8_t>(64)), received(world, std::vector<uint8_t>(64));
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cudaSetDevice(2);  // any thread, any current device
    ranks.t[0]->Abort();
  });
  Ranks::Run(world, [&](int r) {
    cudaSetDevice(r);
    const auto start = std::chrono::steady_clock::now();
    Transport& tr = *ranks.t[static_cast<size_t>(r)];
    std::vector<uint8_t>& a = sent[static_cast<size_t>(r)];
    std::vector<uint8_t>& b = received[static_cast<size_t>(r)];
    if (r == 0) {
      // Rank 0 waits for a block that never comes (rank 2 sends nothing yet).
      RequestId rr = 0, rs = 0;
      Status s = tr.Irecv(2, Tag(1, 0, 1), b.data(), b.size(), &rr);
      if (s.ok()) s = tr.Isend(1, Tag(1, 0, 1), a.data(), a.size(), &rs);
      if (s.ok()) s = tr.Wait(rr, 60, "K/V block of ring step 0");
      out[0] = s;
    } else {
      RequestId rr = 0;
      Status s = tr.Irecv(r - 1, Tag(1, 0, 1), b.data(), b.size(), &rr);
      if (s.ok() && r == 1) s = tr.Wait(rr, 2, "K/V block of ring step 0");
      if (r == 2) {  // rank 2 waits for rank 1's block, which rank 1 never sends
        s = tr.Wait(rr, 2, "K/V block of ring step 0");
      }
      out[static_cast<size_t>(r)] = s;
    }
    took[static_cast<size_t>(r)] = SecondsSince(start);
  });
  aborter.join();
  EXPECT_EQ(out[0].code(), STRIA_ERROR_ABORTED) << out[0].message();
  EXPECT_LT(took[0], 3);
  // Rank 1 had the block from rank 0 launched before the abort, or times out: either way no hang.
  EXPECT_TRUE(out[1].ok() || out[1].code() == STRIA_ERROR_TIMEOUT) << out[1].message();
  EXPECT_EQ(out[2].code(), STRIA_ERROR_TIMEOUT) << out[2].message();
  RequestId later = 0;
  EXPECT_EQ(ranks.t[0]->Isend(1, Tag(2, 0, 1), nullptr, 0, &later).code(), STRIA_ERROR_ABORTED);
  const auto end = std::chrono::steady_clock::now();
  for (auto& t : ranks.t) {
    t->CancelAll();
    t.reset();
  }
  EXPECT_LT(SecondsSince(end), 3);
}

TEST(NcclHostModel, PostingOrderIsGuarded) {
  Ranks ranks(1, 10);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  cudaSetDevice(0);
  Transport& t = *ranks.t[0];
  std::vector<uint8_t> a(16), b(16);
  RequestId r1 = 0, r2 = 0;
  ASSERT_TRUE(t.Irecv(0, Tag(3, 1, 2), b.data(), 16, &r1).ok());
  ASSERT_TRUE(t.Isend(0, Tag(3, 1, 2), a.data(), 16, &r2).ok());
  ASSERT_TRUE(t.Wait(r1, 10, "x").ok());
  ASSERT_TRUE(t.Wait(r2, 10, "x").ok());
  // The other lane has its own order.
  ASSERT_TRUE(t.Irecv(0, Tag(2, 5, 1), b.data(), 16, &r1).ok());
  ASSERT_TRUE(t.Isend(0, Tag(2, 5, 1), a.data(), 16, &r2).ok());
  ASSERT_TRUE(t.Wait(r1, 10, "x").ok());
  ASSERT_TRUE(t.Wait(r2, 10, "x").ok());
  Status s = t.Isend(0, Tag(3, 0, 2), a.data(), 16, &r2);
  EXPECT_EQ(s.code(), STRIA_ERROR_INTERNAL);
  EXPECT_NE(s.message().find("posting order"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("dK/dV lane"), std::string::npos) << s.message();
}

// A lone request (its partner not posted) goes out when waited on.
TEST(NcclHostModel, LoneRequestsGoOutWhenWaitedOn) {
  Ranks ranks(2, 10);
  ranks.ExpectAllOk();
  ASSERT_FALSE(HasFailure());
  std::vector<uint8_t> a(100), b(100);
  FillKV(&a, 0);
  std::vector<Status> out(2);
  Ranks::Run(2, [&](int r) {
    cudaSetDevice(r);
    RequestId id = 0;
    Status s = r == 0 ? ranks.t[0]->Isend(1, Tag(1, 0, 1), a.data(), a.size(), &id)
                      : ranks.t[1]->Irecv(0, Tag(1, 0, 1), b.data(), b.size(), &id);
    if (s.ok()) s = ranks.t[static_cast<size_t>(r)]->Wait(id, 10, "x");
    out[static_cast<size_t>(r)] = s;
  });
  EXPECT_TRUE(out[0].ok()) << out[0].message();
  EXPECT_TRUE(out[1].ok()) << out[1].message();
  EXPECT_TRUE(IsKV(b, 0));
}

// Rank 1 joins the rendezvous but never calls NCCL: rank 0's set-up gives up at its timeout.
TEST(NcclHostModel, SetupTimesOutWhenARankNeverGetsToNccl) {
  unsetenv("STRIA_ROOT");
  stria_unique_id_t raw;
  ASSERT_TRUE(stria_nccl_module_v4.get_unique_id(&raw).ok());
  RendezvousId id;
  ASSERT_TRUE(DecodeId(raw, &id).ok());
  std::thread impostor([&] {
    int version = 0;
    ncclGetVersion(&version);
    Bytes blob{'S', 'N', 'C', 'L'};
    for (int shift = 24; shift >= 0; shift -= 8) blob.push_back(static_cast<uint8_t>(version >> shift));
    std::vector<Bytes> table;
    EXPECT_TRUE(JoinRendezvous(id, 1, 2, blob, 20, nullptr, &table).ok());
  });
  cudaSetDevice(0);
  stria_context_config_t cfg = Config(0, 2, 0.5);
  cfg.unique_id = raw;
  Transport* t = nullptr;
  const auto start = std::chrono::steady_clock::now();
  Status s = stria_nccl_module_v4.create(cfg, nullptr, 0.5, &t);
  impostor.join();
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_NE(s.message().find("ncclCommInitRankConfig"), std::string::npos) << s.message();
  EXPECT_LT(SecondsSince(start), 5);
  EXPECT_EQ(t, nullptr);
}

TEST(NcclHostModel, AnotherTransportInTheRendezvousIsNamed) {
  unsetenv("STRIA_ROOT");
  stria_unique_id_t raw;
  ASSERT_TRUE(stria_nccl_module_v4.get_unique_id(&raw).ok());
  RendezvousId id;
  ASSERT_TRUE(DecodeId(raw, &id).ok());
  Status joined;
  std::thread ucx_rank([&] {
    std::vector<Bytes> table;
    joined = JoinRendezvous(id, 1, 2, Bytes{'u', 'c', 'x'}, 20, nullptr, &table);
  });
  cudaSetDevice(0);
  stria_context_config_t cfg = Config(0, 2, 5);
  cfg.unique_id = raw;
  Transport* t = nullptr;
  const int roots = ModelOpenRoots();
  Status s = stria_nccl_module_v4.create(cfg, nullptr, 5, &t);
  ucx_rank.join();
  EXPECT_EQ(s.code(), STRIA_ERROR_TRANSPORT) << s.message();
  const std::string why = "rank 1 joined this rendezvous with another transport";
  EXPECT_NE(s.message().find(why), std::string::npos) << s.message();
  // Rank 0 refuses the ring before it hands out a table, so the other rank hears why, and no
  // NCCL id (a root thread that would wait for that rank for ever) was made.
  EXPECT_NE(joined.message().find(why), std::string::npos) << joined.message();
  EXPECT_EQ(ModelOpenRoots(), roots);
}

// NCCL's ids each start a root thread (in rank 0's process) that waits without a timeout for
// every rank of the communicator. Rank 0 makes them once the rendezvous is complete: before,
// every create that timed out waiting for a rank left two such threads behind.
TEST(NcclHostModel, ARingThatNeverFormsLeavesNoNcclRootBehind) {
  unsetenv("STRIA_ROOT");
  stria_unique_id_t raw;
  ASSERT_TRUE(stria_nccl_module_v4.get_unique_id(&raw).ok());
  cudaSetDevice(0);
  stria_context_config_t cfg = Config(0, 2, 0.5);
  cfg.unique_id = raw;
  Transport* t = nullptr;
  const int roots = ModelOpenRoots();
  const Status s = stria_nccl_module_v4.create(cfg, nullptr, 0.5, &t);  // rank 1 never comes
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(ModelOpenRoots(), roots) << "rank 0 made NCCL ids for a ring that never formed";
}

TEST(NcclHostModel, TwoRanksOnOneGpuAreRefused) {
  Ranks ranks(2, 5, [](int, stria_context_config_t* cfg, void**) {
    cfg->device.device_id = 0;
    cudaSetDevice(0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(ranks.s[static_cast<size_t>(r)].ok());
    EXPECT_NE(ranks.s[static_cast<size_t>(r)].message().find("Duplicate GPU"), std::string::npos)
        << ranks.s[static_cast<size_t>(r)].message();
    EXPECT_EQ(ranks.t[static_cast<size_t>(r)], nullptr);
  }
}

}  // namespace
}  // namespace stria

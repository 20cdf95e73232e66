#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/float8.h"
#include "cuda/device_api.cuh"
#include "cuda/tma_api.cuh"
#include "fiber.h"

namespace stria {
namespace cuda {
namespace emu {
namespace detail {
// Written here only; read through CurrentThreadInfo (cuda_emu.h says why).
thread_local ThreadInfo* tls_thread = nullptr;
}  // namespace detail
namespace {

constexpr int kWarp = 32;
constexpr size_t kMaxDynamicSmem = 232448;  // 227 KiB, sm_90's opt-in maximum

enum class Op : uint8_t { kWarpSync, kShfl, kShflXor, kMmaHalf, kMmaBFloat, kLdmatrix, kLdmatrixTrans };

const char* OpName(Op op) {
  switch (op) {
    case Op::kWarpSync:
      return "warp_sync";
    case Op::kShfl:
      return "shfl";
    case Op::kShflXor:
      return "shfl_xor";
    case Op::kMmaHalf:
      return "mma_16816<Half>";
    case Op::kMmaBFloat:
      return "mma_16816<BFloat>";
    case Op::kLdmatrix:
      return "ldmatrix_x4";
    case Op::kLdmatrixTrans:
      return "ldmatrix_x4_trans";
  }
  return "?";
}

// One lane's part of a warp collective: its inputs, then (once all lanes arrived) its outputs.
struct Slot {
  uint32_t in[10];  // mma: a[4], b[2], c[4]; shfl: value bits, lane or mask
  const void* ptr;  // ldmatrix: this lane's row address
  uint32_t out[4];
};

struct Warp {
  uint64_t completed = 0;  // collectives completed so far
  int arrived = 0;         // lanes at the collective now gathering
  int done = 0;            // lanes that returned
  Op op = Op::kWarpSync;   // what the first arrival started
  int first_lane = 0;
  // Collective number s uses slots[s & 1]: a lane reaches s + 1 only when all lanes reached s,
  // and no lane reaches s + 2 before all have read the outputs of s, so two sets suffice.
  Slot slots[2][kWarp];
};

enum class State : uint8_t { kRunnable, kWarpWait, kBarrierWait, kWgmmaWait, kMbarWait, kNamedWait, kDone };

struct Copy {
  unsigned char* dst;
  const unsigned char* src;
  bool valid;
};

// A tensor map as EncodeRowsMap lays it out in TensorMap::opaque: a 16-bit tensor of 4
// dimensions, innermost first, and the box a load copies.
struct TmaMapFields {
  uint64_t magic;
  const unsigned char* base;
  int64_t dim[4];
  int64_t stride[4];  // bytes; stride[0] is the element size
  int32_t box[4];     // box[0] * 2 = 128 bytes: one swizzled row
};
static_assert(sizeof(TmaMapFields) <= sizeof(TensorMap), "the fields must fit in a TensorMap");
constexpr uint64_t kTensorMapMagic = 0x53545249415f544dull;  // "STRIA_TM"

// One tma_load_4d, issued and not yet landed: the map as it was at issue (the kernel's copy of
// it may be gone by the time the copy lands: a producer thread returns after issuing).
struct TmaCopy {
  size_t dst;  // shared-memory offset
  TmaMapFields map;
  int64_t coord[4];
  uint32_t bytes;
};

struct Mbarrier {
  int count = 0, pending = 0;  // arrivals per phase, and still to come in the current one
  int64_t tx = 0;              // transaction bytes announced and not yet retired (may dip below 0)
  uint64_t phase = 0;
  std::vector<TmaCopy> copies;  // queued on this barrier, in issue order
};
// What MbarInit writes into the barrier's own 8 bytes, checked at every use: a kernel whose store
// or copy overwrites a live mbarrier corrupts it on the GPU.
constexpr uint64_t kMbarrierTag = 0x4d42415252494552ull;

struct NamedBarrierState {
  int expected = 0, arrived = 0;  // expected: fixed by the generation's first arrival
  uint64_t gen = 0;
  std::vector<int> members;  // the threads that arrived in this generation
};
constexpr int kNamedBarriers = 16;

struct Block;

struct Thread {
  detail::ThreadInfo info{};
  int linear = 0;
  Block* block = nullptr;
  fiber::Context ctx;
  State state = State::kRunnable;
  Op waiting_at = Op::kWarpSync;  // for messages
  // kWarpWait: collective number; kBarrierWait, kNamedWait: barrier generation; kWgmmaWait: op;
  // kMbarWait: the barrier's shared-memory offset (for messages; `mbar` is the barrier).
  uint64_t wait_for = 0;
  int wait_id = 0;  // kMbarWait: the parity waited for; kNamedWait: the barrier id
  const Mbarrier* mbar = nullptr;
  uint64_t warp_seq = 0;  // warp collectives this lane entered
  // cp.async copies not yet landed, in issue order; group_ends[i]: end of committed group i.
  std::vector<Copy> copies;
  std::vector<size_t> group_ends;
  // Warpgroup MMA: operations issued (numbered per thread), not yet committed, and committed
  // groups not yet waited for; whether a wgmma_fence came since the last wait; whether cp.async
  // landed shared-memory data with no fence_proxy_async since (wgmma would read it stale).
  uint64_t wgmma_seq = 0;
  std::vector<uint64_t> wgmma_open;
  std::deque<std::vector<uint64_t>> wgmma_groups;
  // Accumulator arrays that pending operations own: what they held at the first issue (or the
  // last completion), while the registers themselves hold kAccPoison (see Wgmma).
  struct OwnedAccumulators {
    std::vector<float> held;
    int pending = 0;
  };
  std::map<float*, OwnedAccumulators> owned_acc;
  bool wgmma_fenced = false;
  bool proxy_dirty = false;
  bool proxy_fenced = false;  // a fence_proxy_async since the last barrier
};

constexpr int kWarpGroup = 128;

// The operand type of a wgmma: 16-bit (K 16 per instruction) or e4m3 (K 32).
enum class WgmmaElem : uint8_t { kF16, kBF16, kE4M3 };

// One wgmma.mma_async of a warpgroup: the k-th operation of every thread of the group.
struct WgmmaOp {
  WgmmaElem elem = WgmmaElem::kF16;
  bool a_regs = false;   // A in registers (a, a_regs below), else by descriptor
  bool a_kmajor = true;  // the layouts the descriptors describe
  bool b_kmajor = true;
  bool accumulate = false;
  int n = 0, first = 0;
  uint64_t desc_a = 0, desc_b = 0;
  int arrived = 0, completed = 0;
  uint32_t a[kWarpGroup][4];              // kRSTransB: every thread's A fragment, as issued
  const uint32_t* a_regs_at[kWarpGroup];  // and where it lives: unchanged until the wait
  float* d[kWarpGroup];                   // every thread's accumulators
  std::vector<double> product;            // A B, 64 x n row-major: at the first completion
};

struct WarpGroup {
  std::map<uint64_t, WgmmaOp> ops;  // by per-thread operation number
};

struct Block {
  detail::BlockInfo info{};
  int n = 0;
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::vector<WarpGroup> groups;
  int barrier_arrived = 0;
  uint64_t barrier_gen = 0;
  int done = 0;
  bool aborting = false;
  int proxy_dirty_threads = 0;  // threads whose proxy_dirty is set (SetProxyDirty keeps it)
  // Shared memory as the async proxy (wgmma) may see it: a copy taken at each barrier that every
  // thread reached with a fence_proxy_async since the barrier before. A byte wgmma reads that
  // differs from it was written through the generic proxy (a store or cp.async) without that
  // fence-then-barrier, or changed under an operation in flight. Conservative: the GPU needs the
  // fence only in the threads that wrote; our kernels fence in every thread.
  std::vector<unsigned char> async_view;
  // mbarriers by shared-memory offset (node addresses are stable: waiting threads point at them),
  // and the named barriers by id (0, block_sync's, unused).
  std::map<size_t, Mbarrier> mbarriers;
  NamedBarrierState named[kNamedBarriers];
  std::string error;
  fiber::Context main;
  const std::function<void()>* body = nullptr;
  // The schedule (SetSchedule). Round robin: order is the identity, and the next thread to run is
  // the next ready one after the current. The warp-serial schedules: order lists the threads by
  // priority, and the next thread to run is the first ready one in it.
  Schedule schedule = Schedule::kRoundRobin;
  uint64_t rng = 0;
  std::vector<int> order, pos;
  // A waiting thread becomes ready only through what the running thread does: completing a warp
  // collective, a barrier or an mbarrier phase, a warpgroup operation's last arrival, queuing a
  // copy on an mbarrier, initialising an mbarrier, an error (or a new block). Each of those counts
  // a wake. Between wakes a thread found not ready stays so, and the scheduler's scan skips it:
  // `blocked` holds a bit per position in `order`, cleared when wakes moves past blocked_at.
  // (Otherwise every switch rescans the waiting threads: a warp collective under the warp-serial
  // schedules cost O(threads) per lane, and these schedules took three times round robin's time.)
  uint64_t wakes = 0, blocked_at = ~uint64_t{0};
  std::vector<uint64_t> blocked;
};

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// order[0 .. n): units of `unit` consecutive indices (a warp's threads, or one block), in index
// order, in reverse, or shuffled (Fisher-Yates) for the schedule; within a unit in index order.
void DrawOrder(Schedule schedule, int unit, uint64_t* rng, std::vector<int>* order) {
  const int units = static_cast<int>(order->size()) / unit;
  std::vector<int> u(static_cast<size_t>(units));
  for (int i = 0; i < units; ++i) u[i] = schedule == Schedule::kWarpsDescending ? units - 1 - i : i;
  if (schedule == Schedule::kWarpsShuffled) {
    for (int i = units - 1; i > 0; --i) std::swap(u[i], u[SplitMix(rng) % static_cast<uint64_t>(i + 1)]);
  }
  for (int i = 0; i < units; ++i)
    for (int j = 0; j < unit; ++j) (*order)[i * unit + j] = u[i] * unit + j;
}

void DrawThreadOrder(Block* b) {
  DrawOrder(b->schedule, kWarp, &b->rng, &b->order);
  for (int k = 0; k < b->n; ++k) b->pos[b->order[k]] = k;
}

// SetSchedule's choice for this OS thread, if it made one.
struct ScheduleChoice {
  bool set = false;
  Schedule schedule = Schedule::kRoundRobin;
  uint64_t seed = 0;
};
thread_local ScheduleChoice tls_schedule;

// The schedule of a launch: SetSchedule's, else STRIA_EMU_SCHEDULE's.
ScheduleChoice CurrentSchedule() {
  if (tls_schedule.set) return tls_schedule;
  ScheduleChoice c;
  const char* env = std::getenv("STRIA_EMU_SCHEDULE");
  const std::string v = env != nullptr ? env : "";
  const std::string shuffled = "warps-shuffled";
  if (v.empty() || v == "round-robin") return c;
  if (v == "warps-ascending" || v == "warps-descending") {
    c.schedule = v == "warps-ascending" ? Schedule::kWarpsAscending : Schedule::kWarpsDescending;
    return c;
  }
  if (v.compare(0, shuffled.size(), shuffled) == 0) {
    c.schedule = Schedule::kWarpsShuffled;
    if (v.size() == shuffled.size()) return c;
    char* end = nullptr;
    if (v[shuffled.size()] == ':' && v.size() > shuffled.size() + 1) {
      c.seed = std::strtoull(v.c_str() + shuffled.size() + 1, &end, 10);
      if (*end == '\0') return c;
    }
  }
  throw std::invalid_argument("cuda emulator: STRIA_EMU_SCHEDULE=\"" + v +
                              "\" is not round-robin, warps-ascending, warps-descending or warps-shuffled[:seed]");
}

// Thrown on a fiber to unwind it when the launch fails; never leaves the fiber.
struct FiberAbort {};

std::string DimStr(const Dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string Where(const Thread* t) {
  return "block " + DimStr(t->block->info.idx) + " thread " + DimStr(t->info.idx) + " (warp " +
         std::to_string(t->info.warp) + ", lane " + std::to_string(t->info.lane) + "): ";
}

void Record(Block* b, const std::string& what) {
  if (!b->aborting) b->error = "cuda emulator: " + what;
  b->aborting = true;
  ++b->wakes;
}

[[noreturn]] void Fail(Thread* t, const std::string& what) {
  Record(t->block, Where(t) + what);
  throw FiberAbort{};
}

Thread* Current() {
  return static_cast<Thread*>(detail::Self().impl);
}

bool Ready(const Block* b, const Thread* t) {
  switch (t->state) {
    case State::kRunnable:
      return true;
    case State::kDone:
      return false;
    case State::kWarpWait:
      return b->aborting || b->warps[t->info.warp].completed > t->wait_for;
    case State::kBarrierWait:
      return b->aborting || b->barrier_gen > t->wait_for;
    case State::kWgmmaWait: {
      if (b->aborting) return true;
      const WarpGroup& g = b->groups[static_cast<size_t>(t->linear / kWarpGroup)];
      const auto it = g.ops.find(t->wait_for);
      return it != g.ops.end() && it->second.arrived == kWarpGroup;
    }
    case State::kMbarWait:
      // Queued copies wake a waiter too: they land only in a wait (MbarWait), and may complete
      // the phase.
      return b->aborting || static_cast<int>(t->mbar->phase & 1) != t->wait_id || !t->mbar->copies.empty();
    case State::kNamedWait:
      return b->aborting || b->named[t->wait_id].gen > t->wait_for;
  }
  return false;
}

// The thread to run when `cur` waits or returns (not `cur`; null if none can run): round robin,
// the next ready one after `cur`; otherwise the first ready one in the order of priority.
Thread* PickNext(Block* b, const Thread* cur) {
  if (b->blocked_at != b->wakes) {
    std::fill(b->blocked.begin(), b->blocked.end(), uint64_t{0});
    b->blocked_at = b->wakes;
  }
  // The first ready thread at positions [from, to) of the order, skipping those known blocked.
  auto scan = [&](int from, int to) -> Thread* {
    for (int i = from; i < to;) {  // this loop is the scheduler's hot path
      const uint64_t open = ~b->blocked[static_cast<size_t>(i >> 6)] >> (i & 63);
      if (open == 0) {
        i = (i | 63) + 1;
        continue;
      }
      i += __builtin_ctzll(open);
      if (i >= to) break;
      Thread* t = &b->threads[b->order[i]];
      if (t != cur) {
        if (Ready(b, t)) return t;
        b->blocked[static_cast<size_t>(i >> 6)] |= uint64_t{1} << (i & 63);
      }
      ++i;
    }
    return nullptr;
  };
  if (b->schedule != Schedule::kRoundRobin) return scan(0, b->n);
  const int after = b->pos[cur->linear] + 1;
  Thread* next = scan(after, b->n);
  return next != nullptr ? next : scan(0, after);
}

void SwitchTo(Thread* from, Thread* to) {
  detail::tls_thread = &to->info;
  fiber::Switch(&from->ctx, &to->ctx);
  detail::tls_thread = &from->info;
}

// "threads 0-63 wait at block_sync; threads 64-127 returned": what every thread is doing.
std::string DescribeThreads(const Block* b) {
  auto what = [&](const Thread& t) -> std::string {
    switch (t.state) {
      case State::kDone:
        return "returned";
      case State::kBarrierWait:
        return "wait at block_sync";
      case State::kWarpWait:
        return std::string("wait at ") + OpName(t.waiting_at);
      case State::kWgmmaWait:
        return "wait at wgmma_wait for an mma_async the rest of their warpgroup never issued";
      case State::kMbarWait: {
        const Mbarrier& m = *t.mbar;
        return "wait at mbar_wait for parity " + std::to_string(t.wait_id) +
               " on the mbarrier at shared-memory offset " + std::to_string(t.wait_for) + " (its phase " +
               std::to_string(m.phase) + " has " + std::to_string(m.pending) + " of " + std::to_string(m.count) +
               " arrivals and " + std::to_string(m.tx) + " transaction bytes outstanding)";
      }
      case State::kNamedWait: {
        const NamedBarrierState& nb = b->named[t.wait_id];
        return "wait at named barrier " + std::to_string(t.wait_id) + " (" + std::to_string(nb.arrived) + " of " +
               std::to_string(nb.expected) + " threads arrived)";
      }
      case State::kRunnable:
        return "are runnable";
    }
    return "?";
  };
  std::string out;
  for (int i = 0; i < b->n;) {
    const std::string w = what(b->threads[i]);
    int j = i + 1;
    while (j < b->n && what(b->threads[j]) == w) ++j;
    if (!out.empty()) out += "; ";
    out += (j - i == 1 ? "thread " + std::to_string(i) : "threads " + std::to_string(i) + "-" + std::to_string(j - 1)) +
           " " + w;
    i = j;
  }
  return out;
}

// No thread can run and not all returned: a GPU would hang here.
void RecordDeadlock(Block* b) {
  int at_barrier = 0, at_warp = 0, at_mbar = 0, at_named = 0;
  bool warp_with_exited_lane = false;
  for (const Thread& t : b->threads) {
    at_barrier += t.state == State::kBarrierWait;
    at_mbar += t.state == State::kMbarWait;
    at_named += t.state == State::kNamedWait;
    if (t.state == State::kWarpWait) {
      ++at_warp;
      warp_with_exited_lane |= b->warps[t.info.warp].done > 0;
    }
  }
  std::string why;
  if (at_barrier > 0 && b->done > 0 && at_barrier + b->done == b->n) {
    why = "block_sync never completes: " + std::to_string(at_barrier) + " of " + std::to_string(b->n) +
          " threads reached it, the others returned (all threads of a block must reach every block_sync)";
  } else if (warp_with_exited_lane) {
    why = "a warp collective never completes: lanes of the warp returned (all 32 lanes must take part)";
  } else if (at_mbar + at_named > 0 && at_mbar + at_named + b->done == b->n) {
    why = at_named == 0  ? "deadlock: an mbarrier phase that threads wait for never completes (arrivals or TMA bytes "
                           "missing, or the wrong parity)"
          : at_mbar == 0 ? "deadlock: a named barrier never completes (fewer threads arrive than its count)"
                         : "deadlock: mbarrier phases and named barriers that threads wait for never complete";
  } else {
    why = "deadlock: threads wait at different barriers or collectives";
  }
  Record(b, "block " + DimStr(b->info.idx) + ": " + why + ". Threads: " + DescribeThreads(b));
}

// Under the strict-priority schedules, `t`, which just completed a barrier, first lets the ready
// threads before it in the order run, so that the first warp runs the next interval alone.
void YieldToPriority(Block* b, Thread* t) {
  if (b->schedule == Schedule::kRoundRobin) return;
  Thread* next = PickNext(b, t);
  if (next != nullptr && b->pos[next->linear] < b->pos[t->linear]) {
    SwitchTo(t, next);
    if (b->aborting) throw FiberAbort{};
  }
}

// Suspends `t` (whose state says what it waits for) until it can go on.
void Wait(Thread* t) {
  Block* b = t->block;
  for (;;) {
    if (b->aborting) throw FiberAbort{};
    if (Ready(b, t)) {
      t->state = State::kRunnable;
      return;
    }
    Thread* next = PickNext(b, t);
    if (next == nullptr) {
      RecordDeadlock(b);
      throw FiberAbort{};
    }
    SwitchTo(t, next);
  }
}

STRIA_EMU_FIBER_ENTRY void ThreadMain(void* arg) noexcept {
  fiber::Entered();
  Thread* t = static_cast<Thread*>(arg);
  Block* b = t->block;
  try {
    if (!b->aborting) (*b->body)();  // a thread that had not started when the launch failed stays out
    if (!b->aborting && (!t->wgmma_open.empty() || !t->wgmma_groups.empty())) {
      Record(b, Where(t) + "returned with wgmma operations it never waited for (wgmma_commit, wgmma_wait<0>)");
    }
  } catch (const FiberAbort&) {
  } catch (const std::exception& e) {
    Record(b, Where(t) + "the kernel threw: " + e.what());
  } catch (...) {
    Record(b, Where(t) + "the kernel threw an exception");
  }
  t->state = State::kDone;
  ++b->done;
  ++b->warps[t->info.warp].done;
  Thread* next = PickNext(b, t);
  if (next == nullptr && b->done < b->n) {
    RecordDeadlock(b);      // the rest wait for this thread forever
    next = PickNext(b, t);  // aborting: every live thread can run (and unwinds)
  }
  detail::tls_thread = next ? &next->info : nullptr;
  fiber::SwitchAndExit(&t->ctx, next ? &next->ctx : &b->main);
}

void CheckSharedRange(Thread* t, const char* what, const void* p) {
  const detail::BlockInfo& bi = t->block->info;
  const intptr_t off = reinterpret_cast<intptr_t>(p) - reinterpret_cast<intptr_t>(bi.smem);
  if (off < 0 || static_cast<size_t>(off) + 16 > bi.smem_bytes) {
    char buf[200];
    if (off > -(intptr_t{1} << 20) && off < (intptr_t{1} << 30)) {
      std::snprintf(buf, sizeof buf,
                    "the 16 bytes at shared-memory offset %td are outside the %zu-byte dynamic shared memory", off,
                    bi.smem_bytes);
    } else {
      std::snprintf(buf, sizeof buf, "address %p is not in the %zu-byte dynamic shared memory", p, bi.smem_bytes);
    }
    Fail(t, std::string(what) + ": " + buf);
  }
  if (off % 16 != 0) {
    Fail(t, std::string(what) + ": shared-memory offset " + std::to_string(off) + " is not 16-byte aligned");
  }
}

// Enters warp collective `op`: returns this lane's slot (to fill in) and the collective's number.
Slot& Enter(Thread* t, Op op, uint64_t* seq) {
  Warp& w = t->block->warps[t->info.warp];
  if (w.done > 0) {
    Fail(t, std::string(OpName(op)) + ": " + std::to_string(w.done) +
                " lane(s) of this warp returned before it (all 32 lanes must take part)");
  }
  if (w.arrived == 0) {
    w.op = op;
    w.first_lane = t->info.lane;
  } else if (w.op != op) {
    Fail(t, std::string("reached ") + OpName(op) + " while lane " + std::to_string(w.first_lane) +
                " of its warp waits at " + OpName(w.op) + " (the lanes of a warp must run the same collectives)");
  }
  *seq = t->warp_seq++;
  return w.slots[*seq & 1][t->info.lane];
}

uint32_t Lo(uint32_t r) {
  return r & 0xffffu;
}
uint32_t Hi(uint32_t r) {
  return r >> 16;
}

// The two products the emulated tensor-core operations spend their arithmetic in, each compiled
// for AVX-512, AVX2 and the baseline, the version picked once by what the CPU has. (Not GCC's
// target_clones: its resolvers run while the program is relocated, before a sanitizer's runtime
// has started, and crash the TSan build.) Products of 16-bit values are exact in double and every
// version adds the same terms in the same order, so all give the same sums.
// D += A B for one m16n8k16 operation, a row of D (eight independent sums, each adding its terms
// in K order) as one vector: written with a vector type, since the compiler's own vectorisation of
// the loops mixed scalar adds and shuffles.
using Row8 = double __attribute__((vector_size(64)));
inline __attribute__((always_inline)) void MmaProductBody(const double (&A)[16][16], const double (&B)[16][8],
                                                          double (&D)[16][8]) {
  Row8 b[16];
  std::memcpy(b, B, sizeof b);
  for (int row = 0; row < 16; ++row) {
    Row8 acc;
    std::memcpy(&acc, D[row], sizeof acc);
    for (int k = 0; k < 16; ++k) acc += A[row][k] * b[k];
    std::memcpy(D[row], &acc, sizeof acc);
  }
}

// out (64 x n) += A (64 x kdim) B (kdim x n), all row-major: the inner loop runs along a row of
// independent sums (each adds its kdim terms in K order), vectorised.
inline __attribute__((always_inline)) void WgmmaProductBody(const double* A, const double* B, int n, int kdim,
                                                            double* out) {
  for (int row = 0; row < 64; ++row, out += n) {
    for (int k = 0; k < kdim; ++k) {
      const double a = A[row * kdim + k];
      const double* b = B + static_cast<ptrdiff_t>(k) * n;
      for (int col = 0; col < n; ++col) out[col] += a * b[col];
    }
  }
}

struct Products {
  void (*mma)(const double (&)[16][16], const double (&)[16][8], double (&)[16][8]);
  void (*wgmma)(const double*, const double*, int, int, double*);
};
#define STRIA_EMU_PRODUCTS(name, attributes)                                                        \
  attributes void name##Mma(const double(&A)[16][16], const double(&B)[16][8], double(&D)[16][8]) { \
    MmaProductBody(A, B, D);                                                                        \
  }                                                                                                 \
  attributes void name##Wgmma(const double* A, const double* B, int n, int kdim, double* out) {     \
    WgmmaProductBody(A, B, n, kdim, out);                                                           \
  }
STRIA_EMU_PRODUCTS(Baseline, )
#if defined(__x86_64__) && defined(__GNUC__)
STRIA_EMU_PRODUCTS(Avx512, __attribute__((target("avx512f"))))
STRIA_EMU_PRODUCTS(Avx2, __attribute__((target("avx2"))))
#endif
#undef STRIA_EMU_PRODUCTS

const Products& PickedProducts() {
  static const Products picked = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Products{Avx512Mma, Avx512Wgmma};
    if (__builtin_cpu_supports("avx2")) return Products{Avx2Mma, Avx2Wgmma};
#endif
    return Products{BaselineMma, BaselineWgmma};
  }();
  return picked;
}

void MmaProduct(const double (&A)[16][16], const double (&B)[16][8], double (&D)[16][8]) {
  PickedProducts().mma(A, B, D);
}
void WgmmaProduct(const double* A, const double* B, int n, int kdim, double* out) {
  PickedProducts().wgmma(A, B, n, kdim, out);
}

template <float (*Conv)(uint16_t)>
void ComputeMma(Slot* s) {
  // Whole matrices from the fragments (PTX ISA, mma.m16n8k16 .row.col): lane = 4g + t. In double:
  // products of 16-bit values are exact, and the sum rounds once, to float.
  double A[16][16], B[16][8], D[16][8];
  for (int lane = 0; lane < kWarp; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    const uint32_t* a = s[lane].in;
    const uint32_t* b = s[lane].in + 4;
    const uint32_t* c = s[lane].in + 6;
    for (int r = 0; r < 4; ++r) {
      const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
      A[row][col] = Conv(static_cast<uint16_t>(Lo(a[r])));
      A[row][col + 1] = Conv(static_cast<uint16_t>(Hi(a[r])));
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * t + 8 * r][g] = Conv(static_cast<uint16_t>(Lo(b[r])));
      B[2 * t + 8 * r + 1][g] = Conv(static_cast<uint16_t>(Hi(b[r])));
    }
    for (int r = 0; r < 4; ++r) D[g + 8 * (r >> 1)][2 * t + (r & 1)] = BitsFloat(c[r]);
  }
  MmaProduct(A, B, D);
  for (int lane = 0; lane < kWarp; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int r = 0; r < 4; ++r) s[lane].out[r] = FloatBits(static_cast<float>(D[g + 8 * (r >> 1)][2 * t + (r & 1)]));
  }
}

uint16_t Load16(const void* row, int elem) {
  uint16_t v;
  std::memcpy(&v, static_cast<const unsigned char*>(row) + 2 * elem, 2);
  return v;
}

void Compute(Op op, Slot* s) {
  switch (op) {
    case Op::kWarpSync:
      break;
    case Op::kShfl:
      // __shfl_sync with width 32 reads lane (src mod 32).
      for (int l = 0; l < kWarp; ++l) s[l].out[0] = s[s[l].in[1] & 31u].in[0];
      break;
    case Op::kShflXor:
      // shfl.bfly: a source lane past 31 means "keep your own value".
      for (int l = 0; l < kWarp; ++l) {
        const uint32_t j = static_cast<uint32_t>(l) ^ s[l].in[1];
        s[l].out[0] = j < kWarp ? s[j].in[0] : s[l].in[0];
      }
      break;
    case Op::kMmaHalf:
      ComputeMma<HalfToFloat>(s);
      break;
    case Op::kMmaBFloat:
      ComputeMma<BFloatToFloat>(s);
      break;
    case Op::kLdmatrix:
      // Register i of lane 4g + t: row g of matrix i (address from lane 8i + g), elements 2t, 2t+1.
      for (int l = 0; l < kWarp; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; ++i) {
          const void* row = s[8 * i + g].ptr;
          s[l].out[i] = Load16(row, 2 * t) | (static_cast<uint32_t>(Load16(row, 2 * t + 1)) << 16);
        }
      }
      break;
    case Op::kLdmatrixTrans:
      // .trans: register i of lane 4g + t: element g of rows 2t and 2t+1 of matrix i.
      for (int l = 0; l < kWarp; ++l) {
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; ++i) {
          s[l].out[i] =
              Load16(s[8 * i + 2 * t].ptr, g) | (static_cast<uint32_t>(Load16(s[8 * i + 2 * t + 1].ptr, g)) << 16);
        }
      }
      break;
  }
}

// This lane has filled its slot of collective `seq`: completes it (the last lane) or waits.
const Slot& Arrive(Thread* t, Op op, uint64_t seq) {
  Warp& w = t->block->warps[t->info.warp];
  Slot* set = w.slots[seq & 1];
  if (++w.arrived == kWarp) {
    Compute(op, set);
    w.arrived = 0;
    w.completed = seq + 1;
    ++t->block->wakes;
  } else {
    t->state = State::kWarpWait;
    t->waiting_at = op;
    t->wait_for = seq;
    Wait(t);
  }
  return set[t->info.lane];
}

void Mma(Op op, float d[4], const uint32_t a[4], const uint32_t b[2]) {
  Thread* t = Current();
  uint64_t seq;
  Slot& s = Enter(t, op, &seq);
  std::memcpy(s.in, a, 16);
  std::memcpy(s.in + 4, b, 8);
  std::memcpy(s.in + 6, d, 16);
  std::memcpy(d, Arrive(t, op, seq).out, 16);
}

void Land(const Copy& c) {
  if (c.valid) {
    std::memcpy(c.dst, c.src, 16);
  } else {
    std::memset(c.dst, 0, 16);
  }
}

// Where the elements (mn, k) of the matrix a wgmma descriptor describes are: shared-memory
// offsets at [mn * kdim + k], mn < rows the M or N index, k the K index (0..kdim - 1; kdim 16 for
// 16-bit elements, 32 for 8-bit ones: 32 bytes of a row either way). PTX ISA, canonical layouts,
// with T = 16 / esize elements per 16 bytes (written below for 16-bit T = 8):
// K-major:  none ((8,m),(T,2k)):((T,SBO),(1,LBO));  W-byte swizzle ((8,m),(T,2k)):((W/2,SBO),(1,T))
// MN-major: none ((T,1,m),(8,k)):((1,T,SBO),(T,LBO)); W-byte swizzle ((W/2,m),(8,k)):((1,LBO),(W/2,SBO))
// then the swizzle XORs address bits [4, 4 + log2(W/16)) with the bits from 7 up. Computed once
// per operation, not once per element that each of its 128 threads reads.
std::vector<uint32_t> DescOffsets(Thread* t, uint64_t desc, bool k_major, int rows, int esize = 2) {
  const int kdim = 32 / esize, per16 = 16 / esize;
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFFu) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
  const int base_offset = static_cast<int>((desc >> 49) & 7u), mode = static_cast<int>(desc >> 62);
  if (base_offset != 0) Fail(t, "wgmma descriptor: a non-zero matrix base offset is not emulated");
  const uint32_t width = mode == 0 ? 0u : mode == 1 ? 128u : mode == 2 ? 64u : 32u;
  const detail::BlockInfo& bi = t->block->info;
  if (!k_major && esize != 2)
    Fail(t, "wgmma descriptor: 8-bit operands are K-major only (the PTX ISA has no transpose)");
  const uint32_t ue = static_cast<uint32_t>(esize), up = static_cast<uint32_t>(per16);
  std::vector<uint32_t> offsets(static_cast<size_t>(rows) * kdim);
  for (int mn = 0; mn < rows; ++mn)
    for (int k = 0; k < kdim; ++k) {
      const uint32_t umn = static_cast<uint32_t>(mn), uk = static_cast<uint32_t>(k);
      uint32_t addr = start;
      if (k_major) {
        addr += (umn / 8) * sbo +
                (width == 0 ? (umn % 8) * 16 + (uk % up) * ue + (uk / up) * lbo : (umn % 8) * width + uk * ue);
      } else if (width == 0) {
        addr += (umn % 8) * 2 + (umn / 8) * sbo + (uk % 8) * 16 + (uk / 8) * lbo;
      } else {
        addr += (umn % (width / 2)) * 2 + (umn / (width / 2)) * lbo + (uk % 8) * width + (uk / 8) * sbo;
      }
      if (width != 0) addr ^= ((addr >> 7) & (width / 16 - 1)) << 4;
      if (addr < detail::kSmemWindowBase || addr - detail::kSmemWindowBase + ue > bi.smem_bytes) {
        Fail(t, "wgmma descriptor: element (" + std::to_string(mn) + ", " + std::to_string(k) +
                    ") is at window address " + std::to_string(addr) + ", outside the " +
                    std::to_string(bi.smem_bytes) + "-byte dynamic shared memory");
      }
      offsets[static_cast<size_t>(mn) * kdim + static_cast<size_t>(k)] = addr - detail::kSmemWindowBase;
    }
  return offsets;
}

[[noreturn]] void OperandRaced(Thread* t, int mn, int k, uint32_t off) {
  Fail(t, "wgmma descriptor: element (" + std::to_string(mn) + ", " + std::to_string(k) + ") at window address " +
              std::to_string(off + detail::kSmemWindowBase) +
              " changed after the last barrier that every thread reached with a fence_proxy_async since the one "
              "before: a shared-memory store or cp.async not fenced for the async proxy, or a write racing the "
              "wgmma");
}

// The elements (mn, k) of `esize` bytes (mn < rows, k < 32 / esize) at the offsets DescOffsets
// found, as this thread's read sees them now, each decoded into out[mn * mn_stride + k * k_stride];
// an element that differs from the async proxy's view fails (a write not fenced, or a race). One
// pass over an operand, compared as integers of the element's width and decoded inline: with the
// products, this is most of the emulator's time, and a call per element (or a memcmp of two bytes)
// cost more than the arithmetic.
template <typename Decode>
void ReadOperand(Thread* t, const std::vector<uint32_t>& offsets, int rows, int esize, Decode decode, double* out,
                 size_t mn_stride, size_t k_stride) {
  const uint8_t* now = t->block->info.smem;
  const uint8_t* seen = t->block->async_view.data();
  const int kdim = 32 / esize;
  const uint32_t* off = offsets.data();
  for (int mn = 0; mn < rows; ++mn)
    for (int k = 0; k < kdim; ++k, ++off) {
      uint16_t a = now[*off], b = seen[*off];
      if (esize == 2) {
        std::memcpy(&a, now + *off, 2);
        std::memcpy(&b, seen + *off, 2);
      }
      if (a != b) OperandRaced(t, mn, k, *off);
      out[static_cast<size_t>(mn) * mn_stride + static_cast<size_t>(k) * k_stride] = decode(a);
    }
}

// Thread `me` (of its warpgroup) of a completed operation: its accumulators, rows 16 * warp + g
// and + 8, columns 8 i + 2 t and + 1 of every n8 chunk i (the m16n8 C layout per warp).
// While a wgmma owns a thread's accumulators (from its issue to the wait that completes it), the
// GPU may write them at any moment, and reading or writing them is undefined. The emulator fills
// them with a NaN of its own at the issue and keeps their values aside: an early read sees NaN, an
// early write is reported at the wait (ptxas would have serialised the MMAs there, or the compiler
// moved code across the wait).
constexpr uint32_t kAccPoison = 0x7FC0ACC0u;

void PoisonAccumulators(float* d, int n) {
  for (int i = 0; i < n; ++i) std::memcpy(&d[i], &kAccPoison, 4);
}

// At the issue of an operation on `d` (n floats).
void OwnAccumulators(Thread* t, float* d, int n) {
  Thread::OwnedAccumulators& o = t->owned_acc[d];
  if (o.pending++ > 0) return;  // a chain on the same accumulators: they are owned already
  o.held.assign(d, d + n);
  PoisonAccumulators(d, n);
}

// Before an operation on `d` completes: the registers must still hold the poison; their values
// come back for the product.
void TakeBackAccumulators(Thread* t, float* d, int n) {
  const auto it = t->owned_acc.find(d);
  if (it == t->owned_acc.end()) return;
  for (int i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &d[i], 4);
    if (bits != kAccPoison)
      Fail(t, "wgmma: accumulator " + std::to_string(i) +
                  " of this thread was written between the operation and the wgmma_wait that completes it");
  }
  std::copy(it->second.held.begin(), it->second.held.end(), d);
}

// After it completed: owned again (and poisoned) while later operations on `d` are pending.
void HandBackAccumulators(Thread* t, float* d, int n) {
  const auto it = t->owned_acc.find(d);
  if (it == t->owned_acc.end()) return;
  if (--it->second.pending == 0) {
    t->owned_acc.erase(it);
    return;
  }
  it->second.held.assign(d, d + n);
  PoisonAccumulators(d, n);
}

// A B of a completed operation (64 x n, row-major, in double), computed once for the warpgroup
// when its first thread completes it: the hardware's operation is one for the warpgroup and has
// read its operands once the first wait returns, so shared memory is read (and checked against the
// async proxy's view) then, and every operand element is decoded once rather than by each of the
// threads that hold a product of it.
void ComputeWgmmaProduct(Thread* t, WgmmaOp& op) {
  const int n = op.n;
  const bool e4m3 = op.elem == WgmmaElem::kE4M3;
  const int esize = e4m3 ? 1 : 2, kdim = 32 / esize;
  auto val = [&](uint16_t x) -> double {
    return e4m3                          ? Float8E4M3ToF32(static_cast<uint8_t>(x))
           : op.elem == WgmmaElem::kBF16 ? BFloatToFloat(x)
                                         : HalfToFloat(x);
  };
  std::vector<double> A(static_cast<size_t>(64) * kdim), B(static_cast<size_t>(n) * kdim);
  if (op.a_regs) {
    // Lane 4g + tt of warp w holds row 16 w + g in registers 0, 2 and row + 8 in 1, 3. 16-bit:
    // columns 2 tt (+1) in registers 0, 1 and 2 tt + 8 (+1) in 2, 3. e4m3: columns 4 tt .. + 3 in
    // registers 0, 1 and 16 + 4 tt .. in 2, 3, the lowest byte the lowest column.
    for (int w = 0; w < kWarpGroup / kWarp; ++w)
      for (int gq = 0; gq < 8; ++gq)
        for (int tt = 0; tt < 4; ++tt) {
          const uint32_t* regs = op.a[kWarp * w + 4 * gq + tt];
          for (int r = 0; r < 4; ++r) {
            const int row = 16 * w + gq + 8 * (r & 1);
            const size_t at = static_cast<size_t>(row * kdim + (e4m3 ? 4 * tt + 16 * (r >> 1) : 2 * tt + 8 * (r >> 1)));
            for (int e = 0; e < 4 / esize; ++e)
              A[at + static_cast<size_t>(e)] =
                  val(static_cast<uint16_t>((regs[r] >> (8 * esize * e)) & (e4m3 ? 0xFFu : 0xFFFFu)));
          }
        }
  }
  // A by row, then K; B by K index, then column: the product's inner loop runs along a row of
  // independent sums (each still adds its terms in K order), which the compiler vectorises.
  const auto read = [&](auto decode) {
    if (!op.a_regs)
      ReadOperand(t, DescOffsets(t, op.desc_a, op.a_kmajor, 64, esize), 64, esize, decode, A.data(),
                  static_cast<size_t>(kdim), 1);
    ReadOperand(t, DescOffsets(t, op.desc_b, op.b_kmajor, n, esize), n, esize, decode, B.data(), 1,
                static_cast<size_t>(n));
  };
  if (e4m3)
    read([](uint16_t x) -> double { return Float8E4M3ToF32(static_cast<uint8_t>(x)); });
  else if (op.elem == WgmmaElem::kBF16)
    read([](uint16_t x) -> double { return BFloatToFloat(x); });
  else
    read([](uint16_t x) -> double { return HalfToFloat(x); });
  op.product.assign(static_cast<size_t>(64) * n, 0.0);
  WgmmaProduct(A.data(), B.data(), n, kdim, op.product.data());
}

void CompleteWgmma(Thread* t, WgmmaOp& op, int me) {
  const int w = me / kWarp, lane = me % kWarp, gq = lane >> 2, t4 = lane & 3;
  // The GPU reads register operands while the operation runs. Where a kernel reuses them before
  // the wait, ptxas keeps them by waiting for the operation right there (a silent serialisation,
  // warning C7517), so the emulator refuses it instead of modelling either outcome.
  if (op.a_regs && std::memcmp(op.a_regs_at[me], op.a[me], 16) != 0)
    Fail(t,
         "wgmma with A in registers: this thread's A fragment registers changed between the operation and the "
         "wgmma_wait that completes it (ptxas would serialise the MMAs there)");
  if (op.product.empty()) ComputeWgmmaProduct(t, op);
  float* d = op.d[me];
  TakeBackAccumulators(t, d, op.n / 2);
  // Accumulator i = 4 j + c: row 16 w + g + 8 (c >> 1), column 8 j + 2 t4 + (c & 1). By rows, each
  // a stride of 8 columns from column 2 t4 on, two adjacent ones at a time.
  const size_t n = static_cast<size_t>(op.n);
  for (int half = 0; half < 2; ++half) {
    const double* p = op.product.data() + static_cast<size_t>(16 * w + gq + 8 * half) * n + 2 * t4;
    float* out = d + 2 * half;
    for (size_t j = 0; j < n / 8; ++j, p += 8, out += 4) {
      const double acc0 = op.accumulate ? out[0] : 0.0, acc1 = op.accumulate ? out[1] : 0.0;
      out[0] = static_cast<float>(acc0 + p[0]);
      out[1] = static_cast<float>(acc1 + p[1]);
    }
  }
  HandBackAccumulators(t, d, op.n / 2);
}

// The shared-memory offset of the mbarrier `bar` that primitive `what` got: 8 bytes in the dynamic
// shared memory, 8-byte aligned, as the GPU requires.
size_t MbarrierOffset(Thread* t, const std::string& what, const void* bar) {
  const detail::BlockInfo& bi = t->block->info;
  const intptr_t off = reinterpret_cast<intptr_t>(bar) - reinterpret_cast<intptr_t>(bi.smem);
  if (off < 0 || static_cast<size_t>(off) + 8 > bi.smem_bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p", bar);
    Fail(t, what + ": the mbarrier at " + buf + " is not in the " + std::to_string(bi.smem_bytes) +
                "-byte dynamic shared memory");
  }
  if (off % 8 != 0) {
    Fail(t, what + ": the mbarrier at shared-memory offset " + std::to_string(off) + " is not 8-byte aligned");
  }
  return static_cast<size_t>(off);
}

// The mbarrier `bar` points at, initialised and intact; its offset into `*offset`.
Mbarrier& BarrierAt(Thread* t, const std::string& what, const void* bar, size_t* offset) {
  Block* b = t->block;
  const size_t off = MbarrierOffset(t, what, bar);
  const auto it = b->mbarriers.find(off);
  if (it == b->mbarriers.end()) {
    Fail(t, what + ": the mbarrier at shared-memory offset " + std::to_string(off) +
                " was never initialised (mbar_init, then fence_barrier_init and a block_sync before other threads "
                "use it)");
  }
  uint64_t tag;
  std::memcpy(&tag, b->info.smem + off, 8);
  if (tag != kMbarrierTag) {
    Fail(t, what + ": the 8 bytes of the mbarrier at shared-memory offset " + std::to_string(off) +
                " were overwritten since its mbar_init (a store or copy into a live barrier)");
  }
  *offset = off;
  return it->second;
}

// Completes the current phase of `m` if nothing more is outstanding in it; whether it did.
bool CompletePhaseIfDone(Block* b, Mbarrier* m) {
  if (m->pending != 0 || m->tx != 0) return false;
  ++b->wakes;
  ++m->phase;
  m->pending = m->count;
  return true;
}

// Lands TMA copy `c` (PTX cp.async.bulk.tensor, tile mode, 128-byte swizzle, zero fill): row r of
// the box (its dimensions 1..3, innermost first) to bytes [128 r, 128 r + 128) of the
// destination, the row's 16-byte chunk j to chunk j ^ (bits 7..9 of the row's shared-window
// address), elements outside the tensor as zeros; in shared memory and the async proxy's view
// alike, since TMA writes through the async proxy that wgmma reads through.
void LandTma(Block* b, const TmaCopy& c) {
  const TmaMapFields& m = c.map;
  const size_t row_bytes = 2 * static_cast<size_t>(m.box[0]);
  size_t row = c.dst;
  for (int i3 = 0; i3 < m.box[3]; ++i3)
    for (int i2 = 0; i2 < m.box[2]; ++i2)
      for (int i1 = 0; i1 < m.box[1]; ++i1, row += row_bytes) {
        const int64_t x[4] = {0, c.coord[1] + i1, c.coord[2] + i2, c.coord[3] + i3};
        bool inside = true;
        for (int k = 1; k < 4; ++k) inside = inside && x[k] >= 0 && x[k] < m.dim[k];
        const unsigned char* src = nullptr;
        if (inside) src = m.base + x[1] * m.stride[1] + x[2] * m.stride[2] + x[3] * m.stride[3];
        const size_t pattern = ((detail::kSmemWindowBase + row) >> 7) & 7;
        for (int j = 0; j < m.box[0]; ++j) {
          const int64_t col = c.coord[0] + j;
          uint16_t v = 0;
          if (src != nullptr && col >= 0 && col < m.dim[0]) std::memcpy(&v, src + 2 * col, 2);
          const size_t at = row + ((static_cast<size_t>(j >> 3) ^ pattern) << 4) + 2 * static_cast<size_t>(j & 7);
          std::memcpy(b->info.smem + at, &v, 2);
          std::memcpy(b->async_view.data() + at, &v, 2);
        }
      }
}

// After a block: TMA work it left undone (recorded as the launch's error). On the GPU a copy
// nobody waits for may still be writing when the next block reuses the shared memory.
void CheckTmaSettled(Block* b) {
  for (const auto& [off, m] : b->mbarriers) {
    if (!m.copies.empty()) {
      uint64_t bytes = 0;
      for (const TmaCopy& c : m.copies) bytes += c.bytes;
      Record(b, "block " + DimStr(b->info.idx) + ": TMA copy never waited for: " + std::to_string(m.copies.size()) +
                    " tma_load_4d (" + std::to_string(bytes) + " bytes) on the mbarrier at shared-memory offset " +
                    std::to_string(off) + " with no mbar_wait on that barrier after them");
      return;
    }
    if (m.tx != 0) {
      Record(b, "block " + DimStr(b->info.idx) + ": the mbarrier at shared-memory offset " + std::to_string(off) +
                    " ended its phase " + std::to_string(m.phase) + " with " + std::to_string(m.tx) +
                    " transaction bytes announced (mbar_arrive_expect_tx) and never retired by a TMA copy" +
                    (m.tx < 0 ? " (negative: copies retired more than was announced)" : ""));
      return;
    }
  }
}

// Adds `tx_bytes` to the transaction bytes the current phase of `m` waits for (within the
// hardware's count).
void AnnounceBytes(Thread* t, const std::string& what, Mbarrier* m, size_t off, uint32_t tx_bytes) {
  m->tx += tx_bytes;
  if (m->tx > (1 << 20) - 1) {
    Fail(t, what + ": more than 2^20-1 transaction bytes outstanding on the mbarrier at shared-memory offset " +
                std::to_string(off) + " (" + std::to_string(m->tx) + ")");
  }
}

}  // namespace

namespace detail {

ThreadInfo* CurrentThreadInfo() {
  return tls_thread;
}

void Misaligned(const char* what, const void* p, int bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%p", p);
  Fail(Current(), std::string(what) + ": address " + buf + " is not " + std::to_string(bytes) + "-byte aligned");
}

void CountNeverReached(const int* counter, int have, int want) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%p", static_cast<const void*>(counter));
  Fail(Current(), std::string("a wait for the count at ") + buf + " to be " + std::to_string(want) + ", which is " +
                      std::to_string(have) +
                      " with every block before this one finished: no other block can make it so");
}

void Trapped() {
  Fail(Current(), "the kernel trapped");
}

void NotInKernel() {
  throw std::logic_error("cuda emulator: a device primitive was called outside emu::Launch");
}

void BlockSync() {
  Thread* t = Current();
  Block* b = t->block;
  if (++b->barrier_arrived == b->n) {
    b->barrier_arrived = 0;
    ++b->barrier_gen;
    ++b->wakes;
    bool all_fenced = true;
    for (Thread& o : b->threads) {
      all_fenced = all_fenced && o.proxy_fenced;
      o.proxy_fenced = false;
    }
    if (all_fenced) std::memcpy(b->async_view.data(), b->info.smem, b->info.smem_bytes);
    if (b->schedule == Schedule::kWarpsShuffled) DrawThreadOrder(b);
    YieldToPriority(b, t);  // the last thread to arrive goes on, after those before it
    return;
  }
  t->state = State::kBarrierWait;
  t->wait_for = b->barrier_gen;
  Wait(t);
}

void WarpSync() {
  Thread* t = Current();
  uint64_t seq;
  Enter(t, Op::kWarpSync, &seq);
  Arrive(t, Op::kWarpSync, seq);
}

float Shfl(float v, int lane_or_mask, bool xor_mode) {
  Thread* t = Current();
  const Op op = xor_mode ? Op::kShflXor : Op::kShfl;
  uint64_t seq;
  Slot& s = Enter(t, op, &seq);
  s.in[0] = FloatBits(v);
  s.in[1] = static_cast<uint32_t>(lane_or_mask);
  return BitsFloat(Arrive(t, op, seq).out[0]);
}

void MmaHalf(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  Mma(Op::kMmaHalf, d, a, b);
}
void MmaBFloat(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  Mma(Op::kMmaBFloat, d, a, b);
}

void Ldmatrix(uint32_t r[4], const void* smem_row, bool trans) {
  Thread* t = Current();
  const Op op = trans ? Op::kLdmatrixTrans : Op::kLdmatrix;
  CheckSharedRange(t, OpName(op), smem_row);
  uint64_t seq;
  Slot& s = Enter(t, op, &seq);
  s.ptr = smem_row;
  std::memcpy(r, Arrive(t, op, seq).out, 16);
}

void CpAsync16(void* smem, const void* gmem, bool valid) {
  Thread* t = Current();
  CheckSharedRange(t, "cp_async_16", smem);
  const uintptr_t g = reinterpret_cast<uintptr_t>(gmem), base = reinterpret_cast<uintptr_t>(t->block->info.smem);
  if (g % 16 != 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p", gmem);
    Fail(t, std::string("cp_async_16: global source ") + buf + " is not 16-byte aligned");
  }
  if (valid && g + 16 > base && g < base + t->block->info.smem_bytes) {
    Fail(t, "cp_async_16: the source is in shared memory, not global memory");
  }
  t->copies.push_back({static_cast<unsigned char*>(smem), static_cast<const unsigned char*>(gmem), valid});
}

void CpAsyncCommit() {
  Thread* t = Current();
  t->group_ends.push_back(t->copies.size());
}

// Every wgmma issue asks whether any thread of the block has unfenced cp.async data: a count
// kept here answers that without a scan of the block's threads per issuing thread.
void SetProxyDirty(Thread* t, bool dirty) {
  if (t->proxy_dirty == dirty) return;
  t->proxy_dirty = dirty;
  t->block->proxy_dirty_threads += dirty ? 1 : -1;
}

void CpAsyncWait(int n) {
  Thread* t = Current();
  // Copies land only now (as late as the GPU may land them), so reading before the wait shows.
  const size_t groups = t->group_ends.size();
  if (n < 0 || groups <= static_cast<size_t>(n)) return;
  const size_t finish = groups - static_cast<size_t>(n);  // the oldest groups
  const size_t end = t->group_ends[finish - 1];
  for (size_t i = 0; i < end; ++i) Land(t->copies[i]);
  if (end > 0) SetProxyDirty(t, true);
  t->copies.erase(t->copies.begin(), t->copies.begin() + static_cast<std::ptrdiff_t>(end));
  t->group_ends.erase(t->group_ends.begin(), t->group_ends.begin() + static_cast<std::ptrdiff_t>(finish));
  for (size_t& e : t->group_ends) e -= end;
}

uint32_t SmemAddr(const void* p) {
  Thread* t = Current();
  const detail::BlockInfo& bi = t->block->info;
  const intptr_t off = reinterpret_cast<intptr_t>(p) - reinterpret_cast<intptr_t>(bi.smem);
  if (off < 0 || static_cast<size_t>(off) > bi.smem_bytes) Fail(t, "smem_addr: the pointer is not in shared memory");
  return kSmemWindowBase + static_cast<uint32_t>(off);
}

void WgmmaFence() {
  Current()->wgmma_fenced = true;
}

void FenceProxyAsync() {
  Thread* t = Current();
  SetProxyDirty(t, false);
  t->proxy_fenced = true;
}

namespace {

// Issues one thread's part of a warpgroup operation; `form`: its operand type and layouts.
void IssueWgmma(const char* name, const WgmmaOp& form, int n, float* d, const uint32_t* a, uint64_t desc_a,
                uint64_t desc_b, bool accumulate) {
  Thread* t = Current();
  Block* b = t->block;
  if (b->n % kWarpGroup != 0)
    Fail(t, std::string(name) + ": the block is not a whole number of warpgroups (128 threads)");
  if (n % 8 != 0 || n < 8 || n > 256) Fail(t, std::string(name) + ": N must be a multiple of 8 in 8..256");
  if (!t->wgmma_fenced) {
    Fail(t, std::string(name) +
                ": no wgmma_fence since this thread's last wgmma_wait (or ever): the registers and "
                "shared memory the operation reads are not ordered before it");
  }
  if (b->proxy_dirty_threads > 0) {
    for (const Thread& o : b->threads) {
      if (o.proxy_dirty) {
        Fail(t, std::string(name) + ": thread " + std::to_string(o.linear) +
                    " has cp.async data landed in shared memory with no fence_proxy_async since; wgmma reads shared "
                    "memory through the async proxy and may not see it");
      }
    }
  }
  WarpGroup& g = b->groups[static_cast<size_t>(t->linear / kWarpGroup)];
  const uint64_t seq = t->wgmma_seq++;
  auto [it, fresh] = g.ops.try_emplace(seq);
  WgmmaOp& op = it->second;
  if (fresh) {
    op.elem = form.elem;
    op.a_regs = form.a_regs;
    op.a_kmajor = form.a_kmajor;
    op.b_kmajor = form.b_kmajor;
    op.n = n;
    op.first = t->linear;
    op.desc_a = desc_a;
    op.desc_b = desc_b;
    op.accumulate = accumulate;
  } else if (op.elem != form.elem || op.a_regs != form.a_regs || op.a_kmajor != form.a_kmajor ||
             op.b_kmajor != form.b_kmajor || op.n != n || op.desc_a != desc_a || op.desc_b != desc_b ||
             op.accumulate != accumulate) {
    Fail(t, std::string(name) + ": its shape, type, descriptors or scale-d differ from those thread " +
                std::to_string(op.first) + " gave to the same warpgroup operation (they must be uniform)");
  }
  if (form.a_regs) {
    std::memcpy(op.a[t->linear % kWarpGroup], a, 16);
    op.a_regs_at[t->linear % kWarpGroup] = a;
  }
  if (++op.arrived == kWarpGroup) ++b->wakes;
  t->wgmma_open.push_back(seq);
  op.d[t->linear % kWarpGroup] = d;  // written at the wait that completes the operation
  OwnAccumulators(t, d, n / 2);
}

}  // namespace

void Wgmma(WgmmaKind kind, bool bf16, int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
           bool accumulate) {
  const char* name = kind == WgmmaKind::kSS         ? "wgmma_ss"
                     : kind == WgmmaKind::kSSTrans  ? "wgmma_ss_tt"
                     : kind == WgmmaKind::kSSTransB ? "wgmma_ss_tb"
                                                    : "wgmma_rs_tb";
  WgmmaOp form;
  form.elem = bf16 ? WgmmaElem::kBF16 : WgmmaElem::kF16;
  form.a_regs = kind == WgmmaKind::kRSTransB;
  form.a_kmajor = kind == WgmmaKind::kSS || kind == WgmmaKind::kSSTransB;
  form.b_kmajor = kind == WgmmaKind::kSS;
  IssueWgmma(name, form, n, d, a, desc_a, desc_b, accumulate);
}

void WgmmaE4m3(int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  WgmmaOp form;
  form.elem = WgmmaElem::kE4M3;
  form.a_regs = a != nullptr;
  IssueWgmma(a != nullptr ? "wgmma_rs_e4m3" : "wgmma_ss_e4m3", form, n, d, a, desc_a, desc_b, accumulate);
}

void WgmmaWait(int n) {
  Thread* t = Current();
  WarpGroup& g = t->block->groups[static_cast<size_t>(t->linear / kWarpGroup)];
  const int me = t->linear % kWarpGroup;
  while (t->wgmma_groups.size() > static_cast<size_t>(n < 0 ? 0 : n)) {
    const std::vector<uint64_t> group = std::move(t->wgmma_groups.front());
    t->wgmma_groups.pop_front();
    for (uint64_t seq : group) {
      if (g.ops.at(seq).arrived < kWarpGroup) {  // the rest of the warpgroup has not issued it yet
        t->state = State::kWgmmaWait;
        t->wait_for = seq;
        Wait(t);
      }
      WgmmaOp& op = g.ops.at(seq);
      CompleteWgmma(t, op, me);
      if (++op.completed == kWarpGroup) g.ops.erase(seq);
    }
  }
  t->wgmma_fenced = false;
}

void WgmmaCommit() {
  Thread* t = Current();
  t->wgmma_groups.push_back(std::move(t->wgmma_open));
  t->wgmma_open.clear();
}

void MbarInit(uint64_t* bar, int count) {
  Thread* t = Current();
  Block* b = t->block;
  const size_t off = MbarrierOffset(t, "mbar_init", bar);
  if (count < 1 || count > (1 << 20) - 1) {
    Fail(t, "mbar_init: count " + std::to_string(count) + " is outside 1..2^20-1");
  }
  const auto it = b->mbarriers.find(off);
  if (it != b->mbarriers.end()) {
    const Mbarrier& m = it->second;
    if (!m.copies.empty() || m.pending != m.count || m.tx != 0) {
      Fail(t, "mbar_init: the mbarrier at shared-memory offset " + std::to_string(off) +
                  " initialised again in the middle of its phase " + std::to_string(m.phase) +
                  " (arrivals or TMA copies under way: only one thread should initialise it)");
    }
  }
  Mbarrier& m = b->mbarriers[off];
  m = Mbarrier{};
  m.count = count;
  ++b->wakes;
  m.pending = count;
  std::memcpy(b->info.smem + off, &kMbarrierTag, 8);
}

void MbarArrive(uint64_t* bar, uint32_t tx_bytes) {
  Thread* t = Current();
  const std::string what = tx_bytes == 0 ? "mbar_arrive" : "mbar_arrive_expect_tx";
  size_t off;
  Mbarrier& m = BarrierAt(t, what, bar, &off);
  // The GPU would count the arrival into the next phase only once this one completed; here the
  // phase still waits for bytes, so the arrival is one more than the kernel planned for.
  if (m.pending == 0) {
    Fail(t, what + ": more arrivals than its count (" + std::to_string(m.count) + ") in phase " +
                std::to_string(m.phase) + " of the mbarrier at shared-memory offset " + std::to_string(off) +
                ", which waits for " + std::to_string(m.tx) + " transaction bytes only");
  }
  AnnounceBytes(t, what, &m, off, tx_bytes);
  --m.pending;
  if (CompletePhaseIfDone(t->block, &m)) YieldToPriority(t->block, t);
}

void MbarExpectTx(uint64_t* bar, uint32_t tx_bytes) {
  Thread* t = Current();
  size_t off;
  Mbarrier& m = BarrierAt(t, "mbar_expect_tx", bar, &off);
  // More bytes to wait for: no phase completes and no waiter wakes.
  AnnounceBytes(t, "mbar_expect_tx", &m, off, tx_bytes);
}

void MbarWait(uint64_t* bar, int parity) {
  Thread* t = Current();
  if (parity != 0 && parity != 1) Fail(t, "mbar_wait: parity " + std::to_string(parity) + " is not 0 or 1");
  size_t off;
  Mbarrier& m = BarrierAt(t, "mbar_wait", bar, &off);
  for (;;) {
    if (static_cast<int>(m.phase & 1) != parity) return;
    if (!m.copies.empty()) {
      // As late as the GPU may land them: only now, in issue order, each retiring its bytes (a
      // copy after one that completes the phase counts into the next).
      const std::vector<TmaCopy> copies = std::move(m.copies);
      m.copies.clear();
      for (const TmaCopy& c : copies) {
        LandTma(t->block, c);
        m.tx -= c.bytes;
        CompletePhaseIfDone(t->block, &m);
      }
      continue;
    }
    t->state = State::kMbarWait;
    t->wait_for = off;
    t->wait_id = parity;
    t->mbar = &m;
    Wait(t);
  }
}

void TmaLoad4d(void* smem_dst, const TensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  Thread* t = Current();
  Block* b = t->block;
  if (map == nullptr) Fail(t, "tma_load_4d: the tensor map is null");
  TmaMapFields f;
  std::memcpy(&f, map->opaque, sizeof f);
  if (f.magic != kTensorMapMagic) Fail(t, "tma_load_4d: the tensor map was not made by EncodeRowsMap");
  size_t bar_off;
  Mbarrier& m = BarrierAt(t, "tma_load_4d", bar, &bar_off);
  const uint32_t bytes = 2u * static_cast<uint32_t>(f.box[0] * f.box[1] * f.box[2] * f.box[3]);
  const detail::BlockInfo& bi = b->info;
  const intptr_t off = reinterpret_cast<intptr_t>(smem_dst) - reinterpret_cast<intptr_t>(bi.smem);
  if (off < 0 || static_cast<size_t>(off) + bytes > bi.smem_bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%p", smem_dst);
    Fail(t, "tma_load_4d: the " + std::to_string(bytes) + "-byte box at " + buf + " is not inside the " +
                std::to_string(bi.smem_bytes) + "-byte dynamic shared memory");
  }
  const size_t dst = static_cast<size_t>(off);
  if ((detail::kSmemWindowBase + dst) % 128 != 0) {
    Fail(t, "tma_load_4d: the destination, shared-window address " + std::to_string(detail::kSmemWindowBase + dst) +
                ", is not 128-byte aligned");
  }
  for (const auto& [other, unused] : b->mbarriers) {
    if (other + 8 > dst && other < dst + bytes) {
      Fail(t, "tma_load_4d: the box at shared-memory offset " + std::to_string(dst) + " (" + std::to_string(bytes) +
                  " bytes) covers the mbarrier at offset " + std::to_string(other));
    }
  }
  // Poisoned from the issue until the copy lands (in a wait on `bar`): a read in between, through
  // either proxy, sees NaN.
  std::memset(bi.smem + dst, 0xff, bytes);
  std::memset(b->async_view.data() + dst, 0xff, bytes);
  m.copies.push_back(TmaCopy{dst, f, {c0, c1, c2, c3}, bytes});
  ++b->wakes;
}

void NamedBarrier(int id, int threads, bool wait) {
  Thread* t = Current();
  Block* b = t->block;
  const std::string what = wait ? "named_barrier_sync" : "named_barrier_arrive";
  if (id < 1 || id >= kNamedBarriers) {
    Fail(t, what + ": barrier id " + std::to_string(id) + " is outside 1..15 (0 is block_sync's)");
  }
  if (threads < kWarp || threads % kWarp != 0 || threads > b->n) {
    Fail(t, what + ": thread count " + std::to_string(threads) + " is not a positive multiple of 32 up to the " +
                std::to_string(b->n) + " threads of the block");
  }
  NamedBarrierState& nb = b->named[id];
  if (nb.arrived == 0) {
    nb.expected = threads;
  } else if (threads != nb.expected) {
    Fail(t, what + ": thread count " + std::to_string(threads) + " for named barrier " + std::to_string(id) +
                ", where " + std::to_string(nb.arrived) + " threads already arrived with a count of " +
                std::to_string(nb.expected) + " (every arrival of a generation must give the same count)");
  }
  const uint64_t gen = nb.gen;
  nb.members.push_back(t->linear);
  if (++nb.arrived == nb.expected) {
    nb.arrived = 0;
    ++nb.gen;
    ++b->wakes;
    // As at block_sync, for the threads of this barrier: when every one of them fenced the async
    // proxy since its last barrier, what they stored is what wgmma may now read (conservative in
    // the same way: the whole of shared memory is taken).
    bool all_fenced = true;
    for (int m : nb.members) {
      all_fenced = all_fenced && b->threads[static_cast<size_t>(m)].proxy_fenced;
      b->threads[static_cast<size_t>(m)].proxy_fenced = false;
    }
    nb.members.clear();
    if (all_fenced) std::memcpy(b->async_view.data(), b->info.smem, b->info.smem_bytes);
    YieldToPriority(b, t);
    return;
  }
  if (!wait) return;
  t->state = State::kNamedWait;
  t->wait_for = gen;
  t->wait_id = id;
  Wait(t);
}

}  // namespace detail

void Launch(Dim3 grid, Dim3 block, size_t dynamic_smem_bytes, const std::function<void()>& body) {
  if (detail::tls_thread != nullptr) throw std::logic_error("cuda emulator: Launch called from inside a kernel");
  const uint64_t n = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (n == 0 || n > 1024 || n % kWarp != 0) {
    throw std::invalid_argument("cuda emulator: block " + DimStr(block) + " has " + std::to_string(n) +
                                " threads; it must be a positive multiple of 32, at most 1024");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
    throw std::invalid_argument("cuda emulator: invalid grid " + DimStr(grid));
  }
  if (dynamic_smem_bytes > kMaxDynamicSmem) {
    throw std::invalid_argument("cuda emulator: " + std::to_string(dynamic_smem_bytes) +
                                " bytes of dynamic shared memory; at most " + std::to_string(kMaxDynamicSmem));
  }

  auto b = std::make_unique<Block>();
  b->n = static_cast<int>(n);
  b->body = &body;
  b->threads.resize(n);
  b->warps.resize(n / kWarp);
  b->groups.resize(n / kWarpGroup);
  // Exactly the requested size, so that under ASan plain loads and stores past its end are caught.
  struct FreeSmem {
    void operator()(unsigned char* p) const { ::operator delete (p, std::align_val_t{128}); }
  };
  std::unique_ptr<unsigned char, FreeSmem> smem(
      static_cast<unsigned char*>(::operator new (dynamic_smem_bytes, std::align_val_t{128})));
  b->info.dim = block;
  b->info.grid = grid;
  b->info.smem = smem.get();
  b->info.smem_bytes = dynamic_smem_bytes;
  const ScheduleChoice choice = CurrentSchedule();
  b->schedule = choice.schedule;
  b->rng = choice.seed;
  b->order.resize(n);
  b->pos.resize(n);
  fiber::InitMain(&b->main);
  std::vector<fiber::Stack> stacks(n);
  for (uint64_t i = 0; i < n; ++i) stacks[i] = fiber::PooledStack(i);

  // The blocks in the schedule's order (index order without a list for the default).
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  std::vector<int> block_order;
  if (choice.schedule != Schedule::kRoundRobin) {
    if (blocks > (uint64_t{1} << 24)) {
      throw std::invalid_argument("cuda emulator: a grid of " + std::to_string(blocks) +
                                  " blocks is too large to run out of order");
    }
    block_order.resize(blocks);
    DrawOrder(choice.schedule, 1, &b->rng, &block_order);
  }
  for (uint64_t k = 0; k < blocks; ++k) {
    const uint64_t bi = block_order.empty() ? k : static_cast<uint64_t>(block_order[k]);
    b->info.idx = Dim3{static_cast<unsigned>(bi % grid.x), static_cast<unsigned>(bi / grid.x % grid.y),
                       static_cast<unsigned>(bi / (uint64_t{grid.x} * grid.y))};
    b->barrier_arrived = 0;
    b->barrier_gen = 0;
    b->done = 0;
    b->proxy_dirty_threads = 0;
    b->mbarriers.clear();
    for (NamedBarrierState& nb : b->named) nb = NamedBarrierState{};
    for (WarpGroup& g : b->groups) g.ops.clear();
    for (Warp& w : b->warps) {
      w.completed = 0;
      w.arrived = 0;
      w.done = 0;
    }
    std::memset(b->info.smem, 0xff, dynamic_smem_bytes);
    b->async_view.assign(b->info.smem, b->info.smem + dynamic_smem_bytes);
    for (int i = 0; i < b->n; ++i) {
      Thread& t = b->threads[i];
      const unsigned u = static_cast<unsigned>(i);
      t.info.idx = Dim3{u % block.x, u / block.x % block.y, u / (block.x * block.y)};
      t.info.lane = i % kWarp;
      t.info.warp = i / kWarp;
      t.info.block = &b->info;
      t.info.impl = &t;
      t.linear = i;
      t.block = b.get();
      t.state = State::kRunnable;
      t.warp_seq = 0;
      t.copies.clear();
      t.group_ends.clear();
      t.wgmma_seq = 0;
      t.wgmma_open.clear();
      t.wgmma_groups.clear();
      t.wgmma_fenced = false;
      t.proxy_dirty = false;
      t.proxy_fenced = false;
      fiber::Prepare(&t.ctx, stacks[i], &ThreadMain, &t);
    }
    // Runs the whole block: the fibers switch among themselves, the last one comes back.
    DrawThreadOrder(b.get());
    Thread* first = &b->threads[b->order[0]];
    b->blocked.assign(static_cast<size_t>(b->n + 63) / 64, uint64_t{0});
    ++b->wakes;  // a new block: what was known blocked concerned the last one
    detail::tls_thread = &first->info;
    fiber::Switch(&b->main, &first->ctx);
    detail::tls_thread = nullptr;
    if (!b->aborting) CheckTmaSettled(b.get());
    if (b->aborting) throw std::runtime_error(b->error);
  }
}

void SetSchedule(Schedule schedule, uint64_t seed) {
  tls_schedule.set = true;
  tls_schedule.schedule = schedule;
  tls_schedule.seed = seed;
}

void ResetSchedule() {
  tls_schedule = ScheduleChoice{};
}

}  // namespace emu

// The emulator's tensor maps: refused where cuTensorMapEncodeTiled would refuse them (the GPU
// build's EncodeRowsMap is kernels/cuda/tensor_map.cu, which this follows), else the fields
// TmaLoad4d reads, in the opaque bytes.
namespace {
std::atomic<uint64_t> tma_map_failures{0};

bool EncodeMap(TensorMap* map, const void* base, int B, int L, int H, int D, int64_t sb, int64_t sl, int64_t sh,
               int box_rows) {
  if (map == nullptr || base == nullptr) return false;
  if (D < 64 || D % 64 != 0 || box_rows < 1 || box_rows > 256 || B < 1 || L < 1 || H < 1) return false;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  constexpr int64_t kStrideLimit = int64_t{1} << 40;  // byte strides must stay below it
  // Innermost first: columns, heads, rows, batch. A dimension of extent 1 is never stepped along,
  // so its stride is the caller's to leave arbitrary (0, say): it gets the compact value instead
  // (saturated, so that absurd extents cannot overflow: they are refused).
  const int64_t dims[4] = {D, H, L, B};
  const int64_t given[3] = {sh, sl, sb};
  emu::TmaMapFields f{};
  f.magic = emu::kTensorMapMagic;
  f.base = static_cast<const unsigned char*>(base);
  f.stride[0] = 2;
  int64_t compact = int64_t{2} * D;
  for (int i = 0; i < 3; ++i) {
    const int64_t g = given[i];
    const int64_t s = dims[i + 1] == 1 ? compact : (g > 0 && g < kStrideLimit / 2) ? 2 * g : -1;
    if (s <= 0 || s % 16 != 0 || s >= kStrideLimit) return false;
    f.stride[i + 1] = s;
    compact = compact > kStrideLimit / dims[i + 1] ? kStrideLimit : compact * dims[i + 1];
  }
  for (int i = 0; i < 4; ++i) f.dim[i] = dims[i];
  f.box[0] = 64;
  f.box[1] = 1;
  f.box[2] = box_rows;
  f.box[3] = 1;
  std::memset(map->opaque, 0, sizeof map->opaque);
  std::memcpy(map->opaque, &f, sizeof f);
  return true;
}
}  // namespace

bool EncodeRowsMap(TensorMap* map, const void* base, int B, int L, int H, int D, int64_t sb, int64_t sl, int64_t sh,
                   int box_rows) {
  const bool ok = EncodeMap(map, base, B, L, H, D, sb, sl, sh, box_rows);
  if (!ok) tma_map_failures.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

uint64_t TmaMapFailures() {
  return tma_map_failures.load(std::memory_order_relaxed);
}

}  // namespace cuda
}  // namespace stria

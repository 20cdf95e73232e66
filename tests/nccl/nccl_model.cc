// A host model of the part of NCCL that the NCCL transport uses, on the host model of the CUDA
// runtime (tests/cuda_host/cudart_model.cc), so that the transport's logic (lanes, grouping,
// completion events, timeouts, aborts) and the whole GPU ring over NCCL run on a machine without
// a GPU, with ranks as threads of one process. Built as a library of its own (the communicators
// live in it, shared by a test and the module it loads); test_nccl_host_model and the NCCL module
// of tests/cuda_host link it instead of libnccl.
//
// The model keeps what the transport relies on, and is stricter where that finds bugs:
// - a group launch is one kernel on its stream (a host function of the runtime model: it runs
//   once the stream's earlier work is done, and holds the stream until it ends), and only then
//   offers its sends and receives to the peers;
// - a send completes only when the matching receive is there (no eager buffering), and between
//   two ranks of a communicator the k-th send pairs with the k-th receive, whatever their sizes
//   (a size mismatch is recorded as a bug, see ModelSizeMismatches);
// - nonblocking communicators report ncclInProgress after set-up and launches, and a launch
//   reaches its stream only a little later, from another thread;
// - ncclCommAbort ends the communicator's kernels; a peer's kernels then wait until their own
//   communicator is aborted; two ranks on one device are refused, as NCCL does;
// - freeing an aborted communicator waits, as cudaFree and cuMemUnmap do on a GPU, for every
//   NCCL kernel on its device: at once outside a group, at the group's end inside one (where NCCL
//   frees). A kernel that never ends there (another communicator's, nobody aborted it) would hang
//   the GPU; the model gives up after 20 s and counts a stall (ModelAbortStalls);
// - ncclCommFinalize reports ncclInProgress until the communicator's kernels have ended;
// - two threads issuing to communicators of one device at once (NCCL: unsafe) are counted, see
//   ModelConcurrentIssues; so are NCCL ids whose root still waits for ranks (ModelOpenRoots);
// - a thread that starts a nonblocking set-up or finalize outside a group while its previous one
//   is still in progress is refused (ncclInvalidUsage): NCCL up to 2.26 keeps that job in
//   per-thread state, which the second call corrupts;
// - ncclGetVersion reports STRIA_NCCL_MODEL_VERSION when set (an NCCL version code), so that the
//   transport's check of the library's version can be tested.
// Objects are never freed (they stay reachable, for the leak checker): a late access is harmless
// here (the real libraries are the judge of lifetimes on a GPU).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

// Keeps every object of the model alive and reachable until the process ends.
template <typename T>
T* Keep(T* p) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::shared_ptr<T>(p));
  return p;
}

struct Clique;

struct P2p {
  bool is_send;
  void* buf;
  size_t bytes;
  int peer;
  bool done = false;
  ncclComm* owner = nullptr;
};

struct Gather {  // a rank's part of a collective (all-gather, broadcast from rank 0, float sum)
  const void* send;
  void* recv;
  size_t bytes;
};

}  // namespace

struct ncclComm {
  Clique* clique = nullptr;
  int rank = 0, device = 0;
  bool blocking = true;
  std::atomic<int> state{ncclSuccess};
  std::atomic<bool> aborted{false};
  int gathers = 0;
  int running = 0;  // launches queued or running on a stream (under g_mu)
  bool finalized = false;
  // A nonblocking set-up or finalize counts as in progress until a poll has seen it end (on a GPU
  // it takes milliseconds; the model's may end at once).
  std::atomic<bool> job_seen_done{false};
};

namespace {

// Never destroyed: stream threads may still wait on them (for an aborted peer) when the process
// exits.
std::mutex& g_mu = *new std::mutex();  // the whole model: cliques, channels, collectives
std::condition_variable& g_cv = *new std::condition_variable();
std::map<std::string, Clique*>& g_cliques = *new std::map<std::string, Clique*>();  // by unique id
std::atomic<int> g_mismatches{0};
std::atomic<int> g_abort_stalls{0};
std::atomic<int> g_finalize_calls{0};
// The ids whose root would still be running in NCCL: made, and not yet checked in by every rank
// of a communicator (NCCL's root thread waits for them with no timeout). Under g_mu.
std::set<std::string> g_open_roots;
// Issue windows per device: from the first operation of a group (or a lone operation) until
// its launch has been enqueued (for a nonblocking communicator, when its state leaves
// ncclInProgress). NCCL documents that issuing to independent communicators of one device from
// several threads at once is unsafe; windows of two threads that overlap on a device are counted
// (ModelConcurrentIssues). Under g_mu.
struct IssueWindow {
  int open = 0;
  std::thread::id owner;
};
std::map<int, IssueWindow>& g_issuing = *new std::map<int, IssueWindow>();
std::atomic<int> g_concurrent_issues{0};
char g_last_nccl[256];  // what ncclGetLastError returns (written rarely, under g_mu)

struct GatherRound {
  int arrived = 0;
  std::vector<Gather> parts;
};

struct Clique {
  int n = 0, joined = 0;
  std::vector<ncclComm*> members;
  // channels[src * n + dst]: offered sends of src to dst and receives of dst from src, in order.
  std::vector<std::deque<P2p*>> sends, recvs;
  std::map<int, GatherRound> gathers;
  explicit Clique(int size)
      : n(size), members(static_cast<size_t>(size), nullptr), sends(size * size), recvs(size * size) {}
};

// Pairs what two ranks offered, in order (under g_mu).
void Match(Clique* c, int src, int dst) {
  auto& s = c->sends[static_cast<size_t>(src * c->n + dst)];
  auto& r = c->recvs[static_cast<size_t>(src * c->n + dst)];
  while (!s.empty() && !r.empty()) {
    P2p* a = s.front();
    P2p* b = r.front();
    if (a->owner->aborted || b->owner->aborted) return;  // a dead peer: the other side waits
    s.pop_front();
    r.pop_front();
    if (a->bytes != b->bytes) ++g_mismatches;
    std::memcpy(b->buf, a->buf, std::min(a->bytes, b->bytes));
    a->done = b->done = true;
  }
  g_cv.notify_all();
}

struct Op {
  enum Kind { kSend, kRecv, kGather, kBcast, kSum } kind;
  ncclComm_t comm;
  cudaStream_t stream;
  void* buf;
  const void* send_buf;
  size_t bytes;
  int peer;
};

thread_local int g_depth = 0;
thread_local std::vector<Op> g_ops;

void OpenIssue(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  IssueWindow& w = g_issuing[device];
  if (w.open > 0 && w.owner != std::this_thread::get_id()) ++g_concurrent_issues;
  ++w.open;
  w.owner = std::this_thread::get_id();
}
void CloseIssue(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  --g_issuing[device].open;
}

// The kernel of one launch, run by its stream's thread.
void RunKernel(ncclComm_t comm, std::vector<Op> ops) {
  std::unique_lock<std::mutex> lock(g_mu);
  Clique* c = comm->clique;
  std::vector<std::unique_ptr<P2p>> mine;
  std::vector<std::pair<int, Op::Kind>> gathers;  // collective rounds, and their kinds
  for (const Op& op : ops) {
    if (op.kind == Op::kGather || op.kind == Op::kBcast || op.kind == Op::kSum) {
      const int round = ++comm->gathers;
      GatherRound& g = c->gathers[round];
      if (g.parts.empty()) g.parts.resize(static_cast<size_t>(c->n));
      g.parts[static_cast<size_t>(comm->rank)] = Gather{op.send_buf, op.buf, op.bytes};
      ++g.arrived;
      gathers.push_back({round, op.kind});
      continue;
    }
    auto p = std::make_unique<P2p>(P2p{op.kind == Op::kSend, op.buf, op.bytes, op.peer});
    p->owner = comm;
    if (p->is_send)
      c->sends[static_cast<size_t>(comm->rank * c->n + op.peer)].push_back(p.get());
    else
      c->recvs[static_cast<size_t>(op.peer * c->n + comm->rank)].push_back(p.get());
    mine.push_back(std::move(p));
  }
  for (auto& p : mine) p->is_send ? Match(c, comm->rank, p->peer) : Match(c, p->peer, comm->rank);
  for (auto [round, kind] : gathers) {
    GatherRound& g = c->gathers[round];
    if (g.arrived != c->n) continue;
    const size_t bytes = g.parts[0].bytes;
    const bool bcast = kind == Op::kBcast;
    if (kind == Op::kSum) {  // summed first, then written: the buffers may be the same
      std::vector<float> sum(bytes / sizeof(float), 0.0f), x(sum.size());
      for (const Gather& part : g.parts) {
        std::memcpy(x.data(), part.send, bytes);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
      }
      for (const Gather& part : g.parts) std::memcpy(part.recv, sum.data(), bytes);
      g.arrived = -1;
      g_cv.notify_all();
      continue;
    }
    for (int q = 0; q < c->n; ++q) {
      auto* recv = static_cast<uint8_t*>(g.parts[static_cast<size_t>(q)].recv);
      if (bcast) {
        if (q != 0) std::memcpy(recv, g.parts[0].send, bytes);
        continue;
      }
      for (int from = 0; from < c->n; ++from)
        std::memmove(recv + from * bytes, g.parts[static_cast<size_t>(from)].send, bytes);
    }
    if (bcast && g.parts[0].recv != g.parts[0].send) std::memmove(g.parts[0].recv, g.parts[0].send, bytes);
    g.arrived = -1;  // complete
    g_cv.notify_all();
  }
  g_cv.wait(lock, [&] {
    if (comm->aborted) return true;
    for (auto& p : mine)
      if (!p->done) return false;
    for (auto round_kind : gathers)
      if (c->gathers[round_kind.first].arrived != -1) return false;
    return true;
  });
  // Offers of an aborted kernel stay queued, never matched: its peers wait for their own abort.
  for (auto& p : mine)
    if (!p->done) Keep(p.release());
  --comm->running;
  g_cv.notify_all();
}

// Frees aborted `comm` as NCCL does on a GPU: after every NCCL kernel on its device has ended.
void FreeOnDevice(ncclComm* comm) {
  std::unique_lock<std::mutex> lock(g_mu);
  auto quiet = [&] {
    for (const auto& [key, c] : g_cliques)
      for (const ncclComm* m : c->members)
        if (m != nullptr && m->device == comm->device && m->running > 0) return false;
    return true;
  };
  if (!g_cv.wait_for(lock, std::chrono::seconds(20), quiet)) {
    ++g_abort_stalls;
    std::fprintf(stderr,
                 "nccl model: freeing an aborted communicator on device %d waited 20 s for another "
                 "communicator's kernel there (a hang on a GPU)\n",
                 comm->device);
  }
}

thread_local std::vector<ncclComm*> g_aborted_in_group;  // freed at the group's end

// This thread's last nonblocking set-up or finalize issued outside a group (see the top).
thread_local ncclComm* g_thread_job = nullptr;

// Under g_mu: whether this thread's last such job is still in progress, and if so, refuses the
// next one with NCCL's code and a message.
bool ThreadJobBusy(const char* call) {
  ncclComm* j = g_thread_job;
  if (j == nullptr || j->aborted) return false;
  const bool busy = !j->job_seen_done.load();
  if (busy)
    std::snprintf(g_last_nccl, sizeof g_last_nccl,
                  "%s while this thread's previous nonblocking set-up or finalize is in progress, outside a group "
                  "(NCCL up to 2.26 corrupts the first)",
                  call);
  return busy;
}

// Enqueues a group's kernel and closes the group's issue window (opened by its first Add).
ncclResult_t Launch(std::vector<Op> ops) {
  if (ops.empty()) return ncclSuccess;
  ncclComm_t comm = ops[0].comm;
  cudaStream_t stream = ops[0].stream;
  const int device = comm->device;
  for (const Op& op : ops)
    if (op.comm != comm || op.stream != stream) {
      std::snprintf(g_last_nccl, sizeof g_last_nccl, "the host model takes one communicator and stream per group");
      CloseIssue(device);
      return ncclInvalidUsage;
    }
  if (comm->aborted) {
    CloseIssue(device);
    return ncclInvalidArgument;
  }
  auto enqueue = [comm, stream, ops] {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      ++comm->running;
    }
    auto* kernel = new std::function<void()>([comm, ops] { RunKernel(comm, ops); });
    const cudaError_t e = cudaLaunchHostFunc(
        stream,
        [](void* k) {
          auto* fn = static_cast<std::function<void()>*>(k);
          (*fn)();
          delete fn;
        },
        kernel);
    if (e != cudaSuccess) {
      delete kernel;
      std::lock_guard<std::mutex> lock(g_mu);
      --comm->running;
      g_cv.notify_all();
    }
    return e;
  };
  if (comm->blocking) {
    const cudaError_t e = enqueue();
    CloseIssue(device);
    return e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
  }
  // Nonblocking: NCCL's thread launches a little later; the state says so meanwhile.
  comm->state = ncclInProgress;
  std::thread([comm, enqueue, device] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    const cudaError_t e = enqueue();
    CloseIssue(device);  // before the state tells the issuing thread that it is over
    int expected = ncclInProgress;
    comm->state.compare_exchange_strong(expected, e == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError);
  }).detach();
  return ncclInProgress;
}

ncclResult_t Add(Op op) {
  if (op.comm == nullptr || op.comm->aborted) return ncclInvalidArgument;
  if (g_ops.empty()) OpenIssue(op.comm->device);
  g_ops.push_back(op);
  if (g_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(g_ops);
  return Launch(std::move(ops));
}

// Completes a clique once all its ranks joined (under g_mu).
void Complete(Clique* c) {
  bool duplicate = false;
  for (int a = 0; a < c->n; ++a)
    for (int b = a + 1; b < c->n; ++b)
      duplicate |= c->members[static_cast<size_t>(a)]->device == c->members[static_cast<size_t>(b)]->device;
  for (ncclComm* m : c->members) m->state = duplicate ? ncclInvalidUsage : ncclSuccess;
  if (duplicate) std::snprintf(g_last_nccl, sizeof g_last_nccl, "Duplicate GPU detected");
  g_cv.notify_all();
}

}  // namespace

// The number of messages whose sizes differed between sender and receiver (a schedule bug).
int ModelSizeMismatches() {
  return g_mismatches.load();
}
// How often freeing an aborted communicator would have hung on a GPU.
int ModelAbortStalls() {
  return g_abort_stalls.load();
}
int ModelFinalizeCalls() {
  return g_finalize_calls.load();
}
// How often two threads issued to communicators of one device at once.
int ModelConcurrentIssues() {
  return g_concurrent_issues.load();
}
// How many NCCL ids still have a root thread waiting for ranks that never came.
int ModelOpenRoots() {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int>(g_open_roots.size());
}

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclInProgress:
      return "operation in progress";
    default:
      return "host-model NCCL error";
  }
}
const char* ncclGetLastError(ncclComm_t) {
  return g_last_nccl;
}
ncclResult_t ncclGetVersion(int* v) {
  const char* forced = std::getenv("STRIA_NCCL_MODEL_VERSION");
  *v = forced != nullptr ? std::atoi(forced) : NCCL_VERSION_CODE;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::mt19937_64 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(g_mu);
  for (char& c : id->internal) c = static_cast<char>(rng());
  g_open_roots.insert(std::string(id->internal, sizeof id->internal));
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int n, ncclUniqueId id, int rank, ncclConfig_t* cfg) {
  std::unique_lock<std::mutex> lock(g_mu);
  const bool ungrouped_nonblocking = cfg != nullptr && cfg->blocking == 0 && g_depth == 0;
  if (ungrouped_nonblocking && ThreadJobBusy("ncclCommInitRankConfig")) return ncclInvalidUsage;
  const std::string key(id.internal, sizeof id.internal);
  Clique*& c = g_cliques[key];
  if (c == nullptr) c = Keep(new Clique(n));
  if (c->n != n || rank < 0 || rank >= n || c->members[static_cast<size_t>(rank)] != nullptr)
    return ncclInvalidArgument;
  auto* comm = Keep(new ncclComm());
  comm->clique = c;
  comm->rank = rank;
  (void)cudaGetDevice(&comm->device);
  comm->blocking = cfg == nullptr || cfg->blocking != 0;
  comm->state = ncclInProgress;
  c->members[static_cast<size_t>(rank)] = comm;
  *out = comm;
  if (ungrouped_nonblocking) g_thread_job = comm;
  if (++c->joined == n) {
    g_open_roots.erase(key);
    Complete(c);
  }
  if (!comm->blocking) return comm->state.load() == ncclInProgress ? ncclInProgress : ncclSuccess;
  g_cv.wait(lock, [&] { return comm->state.load() != ncclInProgress || comm->aborted; });
  return static_cast<ncclResult_t>(comm->state.load());
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr || comm->aborted) return ncclInvalidArgument;  // freed, with the real library
  *state = static_cast<ncclResult_t>(comm->state.load());
  if (*state != ncclInProgress) comm->job_seen_done = true;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  *n = comm->clique->n;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  *device = comm->device;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    comm->aborted = true;  // the flag goes up at once, in a group or not
    g_cv.notify_all();
  }
  if (g_depth > 0)
    g_aborted_in_group.push_back(comm);
  else
    FreeOnDevice(comm);
  return ncclSuccess;
}
// Flushes: done (ncclSuccess) once the communicator's kernels have ended.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::unique_lock<std::mutex> lock(g_mu);
  if (comm->aborted || comm->finalized) return ncclInvalidArgument;
  if (!comm->blocking && g_depth == 0) {
    if (ThreadJobBusy("ncclCommFinalize")) return ncclInvalidUsage;
    g_thread_job = comm;
    comm->job_seen_done = false;
  }
  comm->finalized = true;
  ++g_finalize_calls;
  comm->state = ncclInProgress;
  auto flush = [comm] {
    std::unique_lock<std::mutex> l(g_mu);
    g_cv.wait(l, [&] { return comm->running == 0 || comm->aborted; });
    if (!comm->aborted) comm->state = ncclSuccess;
  };
  if (comm->blocking) {
    lock.unlock();
    flush();
    return ncclSuccess;
  }
  std::thread(flush).detach();
  return ncclInProgress;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  if (comm->aborted) return ncclInvalidArgument;  // freed already
  comm->aborted = true;                           // freed: the model keeps the object
  g_cv.notify_all();
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++g_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (g_depth == 0) return ncclInvalidUsage;
  if (--g_depth > 0) return ncclSuccess;
  std::vector<ncclComm*> aborted;
  aborted.swap(g_aborted_in_group);
  for (ncclComm* comm : aborted) FreeOnDevice(comm);
  std::vector<Op> ops;
  ops.swap(g_ops);
  return Launch(std::move(ops));
}
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (type != ncclUint8) return ncclInvalidArgument;
  return Add(Op{Op::kSend, comm, stream, const_cast<void*>(buf), nullptr, count, peer});
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclUint8) return ncclInvalidArgument;
  return Add(Op{Op::kRecv, comm, stream, buf, nullptr, count, peer});
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  if (type != ncclUint8) return ncclInvalidArgument;
  return Add(Op{Op::kGather, comm, stream, recv, send, count, -1});
}
// Float sums only (what the tests use on a caller's communicator).
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclFloat || op != ncclSum) return ncclInvalidArgument;
  return Add(Op{Op::kSum, comm, stream, recv, send, count * sizeof(float), -1});
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (type != ncclUint8 || root != 0) return ncclInvalidArgument;  // all the transport needs
  return Add(Op{Op::kBcast, comm, stream, recv, send, count, -1});
}

}  // extern "C"

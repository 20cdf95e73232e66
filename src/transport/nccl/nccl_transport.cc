// The NCCL transport: one rank per GPU, ranks in one process or many, on one host or many. K/V
// blocks and dK/dV partials move between the GPUs' memories with ncclSend/ncclRecv; the per-call
// signature goes through ncclAllGather.
//
// Joining. Every context forms communicators of its own from NCCL ids that rank 0 makes
// (ncclGetUniqueId) and hands to every rank: through the rendezvous of src/transport/rendezvous,
// in rank 0's entry of the ring table, made once every rank has joined (so the one 128-byte stria
// id serves UCX and NCCL alike),
// or, when the caller passes a communicator of its own (nccl_comm), by one broadcast over
// that communicator. stria never splits the caller's communicator: a split may share its parent's
// resources and abort flag (splitShare), and aborting stria's communicator on a timeout must never
// touch the caller's, which stria never destroys either.
//
// Matching. NCCL has no tags: between two ranks, the k-th send of one is received by the k-th
// receive the other posted on the same communicator. The engine's posting order is not the same
// on both sides: in the backward a rank sends its step-s dK/dV partial (after the step's compute)
// before the step-(s+1) K/V block, while its successor posts the K/V receive of step s+1 before the
// dK/dV receive. So each message kind travels on a communicator of its own ("lane": 0 for K/V
// blocks and the all-gather, 1 for dK/dV partials, the kind in the tag's low bits, see
// ring_common.h). Within a lane both sides post in the order of the ring steps; Post() checks
// that the tags of each (lane, peer, direction) increase, so a schedule that breaks the
// assumption fails with INTERNAL instead of mixing up blocks.
//
// Grouping. At every step each rank receives from its predecessor and sends to its successor.
// NCCL runs each launch as a kernel on the lane's stream, and a rank's kernels of one
// communicator run one after the other, so a receive launched on its own would wait for the
// predecessor's send, queued behind the predecessor's own receive, and so on around the ring: a
// deadlock as soon as a message exceeds NCCL's buffers. A lane therefore holds what is posted
// until it has both a receive and a send, and launches them together in one
// ncclGroupStart/ncclGroupEnd, where NCCL progresses them concurrently. The engine posts the
// K/V receive and send of a step back to back, so they leave at once and overlap the step's
// compute; a dK/dV partial, posted after the compute, leaves with the next step's dK/dV receive
// (the successor needs it only at the end of that step). Every rank forms the same groups, so
// the groups of a step complete together. A Wait on a request still held launches its lane as
// it is (the transfer cannot complete otherwise).
//
// Completion. A group's end is an event recorded on the lane's stream after the launch; Wait()
// polls it (and NCCL's asynchronous error state) until it completes, fails, or the timeout
// passes, so Wait returning OK means the data is in device memory for any later work.
//
// Device ordering. The engine does not wait on the host for its compute before posting, nor for a
// transfer before queuing the compute that reads it: OrderAfter makes both lanes' streams wait for
// an event of the compute stream (every launch after it follows the compute queued before it),
// and DeviceWait makes the compute stream wait for a group's event. The host still Waits for every
// request (its timeout and faults as above), a step later, while the device runs the step. A
// launch's kernel that waits on the device for compute holds no NCCL resource a peer needs first:
// every rank's step-s transfer waits only for its own compute of steps before s, which waits
// only for transfers before s, so no cycle forms.
//
// Faults. stria's communicators are nonblocking (ncclConfig_t::blocking = 0), so no NCCL call on
// them can hang a rank: launches and set-up are polled with ncclCommGetAsyncError under the
// timeout (NCCL_COMM_BLOCKING=1 would override that, so it is refused). A timeout, an
// asynchronous NCCL error or an abort calls ncclCommAbort on both lanes in one group, which stops
// their kernels and frees them: the transport is then poisoned (every call fails with the first
// error, or ABORTED) and nothing it launched touches the ring buffers any more. All NCCL calls
// happen under one mutex that no wait holds while it sleeps, so stria_context_abort from another
// thread gets in at once. Peers learn of it from their own timeout, or earlier where NCCL reports
// the broken connection.
//
// One device, several contexts. NCCL documents that issuing operations to independent
// communicators of one device from several threads at once is unsafe. Two stria contexts on one
// GPU may be driven by two threads, so every launch (group start to group end, and until a
// nonblocking end has finished enqueuing) holds a process-wide lock of its device. A context
// waits for that lock without holding its own mutex (stria_context_abort still gets in at once)
// and under its timeout; aborts, set-up and the end take no such lock, as they must not wait for
// a launch that waits on a dead peer. Nor does the broadcast of the ids over a caller's
// communicator: issuing on that one is for its owner to serialise with the owner's other work.
//
// The end. A healthy context flushes before it frees: a send whose kernel has completed may still
// have bytes in NCCL's proxy on their way to another node, which an abort would drop for a peer
// still in the call. So its end calls ncclCommFinalize (polled, bounded by kDrainS), then
// ncclCommDestroy, which frees locally without blocking once finalized (but, freeing device
// memory, waits like an abort for the kernels on its device: another context's launch in flight
// there delays it until that launch ends or times out). A context that failed,
// was aborted, has a transfer it never waited for, or whose flush does not end in time aborts.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/deadline.h"
#include "core/raw_enum.h"
#include "cuda_common/cuda_status.h"
#include "cuda_common/device_scope.h"
#include "transport/module_abi.h"
#include "transport/rendezvous/rendezvous.h"

// 2.22: ncclCommAbort inside a group raises its flag at once and frees at the group's end (before,
// it freed at once, so the grouped abort of both lanes below could wait on the other lane's
// kernel). The library loaded at run time is checked too (CheckLibraryVersion).
#define STRIA_NCCL_MIN_VERSION NCCL_VERSION(2, 22, 0)
#if NCCL_VERSION_CODE < STRIA_NCCL_MIN_VERSION
#error "the NCCL transport needs NCCL 2.22 or later"
#endif

namespace stria {
namespace {

using Clock = std::chrono::steady_clock;
using Lock = std::unique_lock<std::mutex>;

constexpr int kLanes = 2;
constexpr int kKvLane = 0, kDkvLane = 1;
const char* const kLaneName[kLanes] = {"K/V", "dK/dV"};
constexpr uint64_t kDkvKind = 2;  // MessageKind::kDKV in ring_common.h
constexpr double kDrainS = 10;    // the bound on draining aborted kernels, and on a healthy end's flush
constexpr size_t kScratchMin = 4096;
constexpr size_t kIdOffset = 1024;  // where the NCCL ids are broadcast within the scratch buffer

// The rendezvous entry of a rank: a tag, the NCCL version it runs and, from rank 0, NCCL's ids.
constexpr uint8_t kBlobMagic[4] = {'S', 'N', 'C', 'L'};
constexpr size_t kBlobHeader = 8;

// One NCCL id per lane: rank 0 makes them, every rank forms the lanes' communicators from them.
struct NcclIds {
  ncclUniqueId lane[kLanes];
};

int LaneOf(int64_t tag) {
  return (static_cast<uint64_t>(tag) & 3) == kDkvKind ? kDkvLane : kKvLane;
}

// cudaEventQuery and cudaStreamQuery leave cudaErrorNotReady as the thread's last error; the
// engine's own CUDA error checks must not take it for theirs.
void ClearNotReady() {
  ForgetError(cudaErrorNotReady);
}

stria_status_t NcclCode(ncclResult_t r) {
  switch (r) {
    case ncclUnhandledCudaError:
      return STRIA_ERROR_CUDA;
    case ncclInternalError:
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return STRIA_ERROR_INTERNAL;
    default:
      return STRIA_ERROR_TRANSPORT;
  }
}

// NCCL keeps one "last error" string for the whole process (ncclGetLastError ignores its
// argument), so it may tell of another communicator's trouble: it is quoted as a hint, by name.
std::string NcclText(ncclResult_t r, ncclComm_t comm) {
  std::string text = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += Format(" (NCCL's last warning in this process: %s)", last);
  return text;
}

Status NcclError(const char* call, ncclResult_t r, ncclComm_t comm) {
  return Status(NcclCode(r), Format("%s failed: ", call) + NcclText(r, comm));
}

std::string VersionText(int code) {
  return code >= 10000 ? Format("%d.%d.%d", code / 10000, code / 100 % 100, code % 100)
                       : Format("%d.%d.%d", code / 1000, code / 100 % 10, code % 100);
}

// The issue lock of each device (see the top), shared by every NCCL context of the process; never
// destroyed, so a context ending during exit still finds it.
std::mutex& IssueMutex(int device) {
  static constexpr int kDevices = 256;  // more than any node has; beyond it, devices share one
  static auto* locks = new std::mutex[kDevices];
  return locks[static_cast<unsigned>(device) % kDevices];
}

// A GPU must exist before anything waits on the network.
Status CheckDevice(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary ||
      (e == cudaSuccess && count == 0))
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "the NCCL transport needs a CUDA GPU, and none is usable here (cudaGetDeviceCount: %s)",
                 e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
  if (e != cudaSuccess) return CudaStatus(e, "cudaGetDeviceCount");
  if (ordinal < 0 || ordinal >= count)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->device names CUDA device %d, but %d device(s) are visible",
                 ordinal, count);
  return Status::Ok();
}

struct Op {
  int lane = 0;
  bool is_send = false;
  bool gather = false;  // an all-gather's (AllGatherInPlaceOnDevice), not a transfer to or from `peer`
  int peer = 0;
  void* buf = nullptr;
  size_t bytes = 0;
  int64_t group = 0;  // 0 while held back, then the launch it went out with
};

// One ncclGroupStart/End launch on a lane's stream.
struct Group {
  cudaEvent_t done = nullptr;  // recorded once NCCL has enqueued the kernel
  int refs = 0;                // requests of this launch not yet waited for
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(int rank, int world, int device, double timeout_s)
      : rank_(rank), world_(world), device_(device), timeout_s_(timeout_s) {}
  ~NcclTransport() override { Shutdown(); }

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  // The lanes' streams (high priority, so transfers are not queued behind compute) and a small
  // device buffer for the first exchange and the all-gather.
  Status CreateStreams() {
    DeviceScope dev(device_);
    STRIA_RETURN_IF_ERROR(dev.status());
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e != cudaSuccess) return CudaStatus(e, "cudaDeviceGetStreamPriorityRange");
    for (cudaStream_t& s : streams_) {
      e = cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest);
      if (e != cudaSuccess) return CudaStatus(e, "cudaStreamCreateWithPriority");
    }
    int pools = 0;
    e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device_);
    if (e != cudaSuccess) return CudaStatus(e, "cudaDeviceGetAttribute");
    async_alloc_ = pools != 0;
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(EnsureScratchLocked(kScratchMin));
    e = cudaStreamSynchronize(streams_[kKvLane]);  // the buffer is used on both lanes' streams
    return e == cudaSuccess ? Status::Ok() : CudaStatus(e, "cudaStreamSynchronize");
  }

  // Both lanes' communicators from rank 0's ids, set up concurrently (nonblocking), in one group:
  // NCCL up to 2.26 keeps a nonblocking call's job in per-thread state, and a second set-up issued
  // by the same thread before the first is done corrupts it. A group is NCCL's way to make several
  // communicators from one thread.
  Status InitFromIds(const NcclIds& ids) {
    DeviceScope dev(device_);
    STRIA_RETURN_IF_ERROR(dev.status());
    Lock lock(mu_);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return FailLocked(NcclError("ncclGroupStart", r, nullptr));
    Status made;
    for (int lane = 0; lane < kLanes && made.ok(); ++lane) {
      ncclConfig_t cfg = Config();
      ncclComm_t comm = nullptr;
      r = ncclCommInitRankConfig(&comm, world_, ids.lane[lane], rank_, &cfg);
      comms_[lane] = comm;  // even half made: the destructor aborts it
      if (r != ncclSuccess && r != ncclInProgress) made = NcclError("ncclCommInitRankConfig", r, comm);
    }
    r = ncclGroupEnd();  // always: an open group would capture this thread's later NCCL calls
    if (made.ok() && r != ncclSuccess && r != ncclInProgress) made = NcclError("ncclGroupEnd (set-up)", r, nullptr);
    if (!made.ok()) return FailLocked(made);
    const auto deadline = DeadlineAfter(timeout_s_);
    for (int lane = 0; lane < kLanes; ++lane) {
      const std::string what = Format("NCCL to set up the %s communicator (ncclCommInitRankConfig)", kLaneName[lane]);
      STRIA_RETURN_IF_ERROR(AwaitCommLocked(lock, lane, deadline, what.c_str()));
    }
    return Status::Ok();
  }

  // Both lanes from the caller's communicator, which stays the caller's.
  Status InitFromComm(ncclComm_t user) {
    DeviceScope dev(device_);
    STRIA_RETURN_IF_ERROR(dev.status());
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(user, &state);
    if (r != ncclSuccess) return BadComm("ncclCommGetAsyncError", r, user);
    if (state == ncclInProgress)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "nccl_comm is still being set up (ncclCommGetAsyncError reports ncclInProgress): wait "
                   "until it reports ncclSuccess");
    if (state != ncclSuccess)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "nccl_comm has failed: %s", NcclText(state, user).c_str());
    int count = 0, rank = 0, device = 0;
    if ((r = ncclCommCount(user, &count)) != ncclSuccess) return BadComm("ncclCommCount", r, user);
    if ((r = ncclCommUserRank(user, &rank)) != ncclSuccess) return BadComm("ncclCommUserRank", r, user);
    if ((r = ncclCommCuDevice(user, &device)) != ncclSuccess) return BadComm("ncclCommCuDevice", r, user);
    if (count != world_)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "nccl_comm has %d ranks but config->world_size is %d", count, world_);
    if (rank != rank_)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "nccl_comm is rank %d of its communicator but config->rank is %d",
                   rank, rank_);
    if (device != device_)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "nccl_comm works on CUDA device %d but config->device names device %d",
                   device, device_);
    // stria's communicators are its own, made from an NCCL id that rank 0 broadcasts over the
    // caller's communicator. Not split off it: a split shares the parent's resources, abort flag
    // included, whenever the parent was made with splitShare (or NCCL_COMM_SPLIT_SHARE_RESOURCES
    // is set), and aborting stria's communicator would then abort the caller's.
    NcclIds ids;
    std::memset(&ids, 0, sizeof ids);
    if (rank_ == 0)
      for (ncclUniqueId& id : ids.lane)
        if ((r = ncclGetUniqueId(&id)) != ncclSuccess) return NcclError("ncclGetUniqueId", r, nullptr);
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(BroadcastIdsLocked(lock, user, &ids));
    lock.unlock();
    return InitFromIds(ids);
  }

  // A one-byte exchange with both neighbours on each lane, and an all-gather: NCCL connects peers
  // on first use (and, since 2.22, a collective's ring at its first launch), and doing it here puts
  // that cost (and a peer that cannot be reached) into create, under the timeout, rather than into
  // a call's launch, which holds the device's issue lock while NCCL connects.
  Status Warmup() {
    const int next = (rank_ + 1) % world_, prev = (rank_ - 1 + world_) % world_;
    std::vector<RequestId> reqs;
    auto* base = static_cast<char*>(scratch_);
    for (int lane = 0; lane < kLanes; ++lane) {
      const int64_t tag = lane == kDkvLane ? static_cast<int64_t>(kDkvKind) : 1;  // call 0: below every call's tags
      RequestId r = 0;
      STRIA_RETURN_IF_ERROR(Irecv(prev, tag, base + 1 + lane, 1, &r));
      reqs.push_back(r);
      STRIA_RETURN_IF_ERROR(Isend(next, tag, base, 1, &r));
      reqs.push_back(r);
    }
    for (RequestId r : reqs)
      STRIA_RETURN_IF_ERROR(Wait(r, timeout_s_, "the first exchange with the neighbouring ranks"));
    std::vector<uint8_t> all(static_cast<size_t>(world_));
    const uint8_t mine = 1;
    return AllGather(&mine, all.data(), 1, timeout_s_, "the first all-gather");
  }

  Status AllGather(const void* mine, void* all, size_t bytes, double timeout_s, const char* what) override {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    auto* out = static_cast<char*>(all);
    if (world_ == 1) {
      std::memcpy(out, mine, bytes);
      return Status::Ok();
    }
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    const size_t total = bytes * static_cast<size_t>(world_);
    STRIA_RETURN_IF_ERROR(EnsureScratchLocked(total));
    auto* base = static_cast<char*>(scratch_);
    cudaStream_t stream = streams_[kKvLane];
    // The staging copies are tiny and the lane's stream is idle between calls.
    cudaError_t e =
        cudaMemcpyAsync(base + static_cast<size_t>(rank_) * bytes, mine, bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return FailLocked(CudaStatus(e, "cudaMemcpyAsync"));
    STRIA_RETURN_IF_ERROR(GatherInPlaceLocked(lock, base, bytes, timeout_s, what));
    e = cudaMemcpyAsync(out, base, total, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return FailLocked(CudaStatus(e, "cudaMemcpyAsync (all-gather result)"));
    return Status::Ok();
  }

  // Device memory of this rank's GPU, gathered where it lies by one ncclAllGather (NCCL's in-place
  // form: this rank's share already at its place): one collective instead of N - 1 pairs, which
  // would run one after another on the lane's stream.
  Status AllGatherInPlace(void* all, size_t bytes, int64_t /*tag*/, double timeout_s, const char* what) override {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    if (world_ == 1 || bytes == 0) return Status::Ok();
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    return GatherInPlaceLocked(lock, static_cast<char*>(all), bytes, timeout_s, what);
  }

  Status Isend(int peer, int64_t tag, const void* buf, size_t bytes, RequestId* req) override {
    return Post(true, peer, tag, const_cast<void*>(buf), bytes, req);
  }
  Status Irecv(int peer, int64_t tag, void* buf, size_t bytes, RequestId* req) override {
    return Post(false, peer, tag, buf, bytes, req);
  }

  Status Wait(RequestId id, double timeout_s, const char* what) override {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    auto it = ops_.find(id);
    if (it == ops_.end()) return Error(STRIA_ERROR_INTERNAL, "unknown transport request %lld", (long long)id);
    const auto deadline = DeadlineAfter(timeout_s);
    if (it->second.group == 0) {
      // Held back without its partner: it cannot complete unless it goes out now.
      STRIA_RETURN_IF_ERROR(LaunchLocked(lock, it->second.lane, deadline, what));
      it = ops_.find(id);
    }
    const Op op = it->second;
    Status s = PollLocked(
        lock, deadline, [&](bool* done) { return EventDone(groups_.at(op.group).done, done); },
        [&] {
          if (op.gather)
            return Error(STRIA_ERROR_TIMEOUT,
                         "timed out after %.3g s in the all-gather of %s: a rank has not called, or is stuck",
                         timeout_s, what);
          return Error(STRIA_ERROR_TIMEOUT, "timed out after %.3g s waiting for rank %d to %s (%s)", timeout_s, op.peer,
                       op.is_send ? "take a message" : "send", what);
        });
    if (s.ok()) ReleaseLocked(id);
    return s;
  }

  // Device ordering (transport.h): both lanes' streams wait for the engine's event, so every
  // launch from now on follows the work it marks (cudaStreamWaitEvent takes the event as last
  // recorded, so the engine may record it again at once); a DeviceWait holds the engine's stream
  // until the request's group has run.
  bool OrdersOnDevice() const override { return true; }
  Status OrderAfter(void* event) override {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    for (cudaStream_t s : streams_) {
      const cudaError_t e = cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(event), 0);
      if (e != cudaSuccess) return FailLocked(CudaStatus(e, "cudaStreamWaitEvent (a lane after the compute)"));
    }
    return Status::Ok();
  }
  Status DeviceWait(RequestId id, void* stream, double /*timeout_s*/, const char* /*what*/) override {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    auto it = ops_.find(id);
    if (it == ops_.end()) return Error(STRIA_ERROR_INTERNAL, "unknown transport request %lld", (long long)id);
    if (it->second.group == 0) {
      STRIA_RETURN_IF_ERROR(
          LaunchLocked(lock, it->second.lane, DeadlineAfter(timeout_s_), "a transfer the device waits for"));
      it = ops_.find(id);
      if (it == ops_.end())
        return UsableLocked().ok() ? Error(STRIA_ERROR_INTERNAL, "a request was withdrawn") : UsableLocked();
    }
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    const cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), groups_.at(it->second.group).done, 0);
    if (e != cudaSuccess) return FailLocked(CudaStatus(e, "cudaStreamWaitEvent (the compute after a transfer)"));
    return Status::Ok();
  }

  // GatherInPlaceLocked's collective without the wait: its completion event makes a request of
  // its own (a group of one), which DeviceWait and Wait take like a transfer's.
  Status AllGatherInPlaceOnDevice(void* all, size_t bytes, int64_t /*tag*/, std::vector<RequestId>* reqs) override {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    const char* what = "an all-gather ordered on the device";
    const auto deadline = DeadlineAfter(timeout_s_);
    std::unique_lock<std::mutex> issue;
    STRIA_RETURN_IF_ERROR(AcquireIssueLocked(lock, &issue, deadline, what));
    if (world_ > 1 && bytes > 0) {
      char* base = static_cast<char*>(all);
      const ncclResult_t r = ncclAllGather(base + static_cast<size_t>(rank_) * bytes, base, bytes, ncclUint8,
                                           comms_[kKvLane], streams_[kKvLane]);
      if (r != ncclSuccess && r != ncclInProgress) return FailLocked(NcclError("ncclAllGather", r, comms_[kKvLane]));
      if (r == ncclInProgress) STRIA_RETURN_IF_ERROR(AwaitCommLocked(lock, kKvLane, deadline, what));
    }
    issue.unlock();
    const int64_t gid = next_group_++;
    groups_[gid].refs = 1;
    Op op;
    op.lane = kKvLane;
    op.gather = true;
    op.peer = -1;
    op.group = gid;
    const RequestId id = next_id_++;
    ops_.emplace(id, op);
    STRIA_RETURN_IF_ERROR(RecordDoneLocked(gid, streams_[kKvLane]));
    reqs->assign(1, id);
    return Status::Ok();
  }

  void CancelAll() override {
    Lock lock(mu_);
    bool busy = false;
    for (auto& [gid, g] : groups_) {
      if (g.done == nullptr) {
        busy = true;  // a launch that never completed
      } else if (cudaEventQuery(g.done) != cudaSuccess) {
        busy = true;
      }
    }
    ClearNotReady();
    // NCCL cannot withdraw a single transfer: aborting the communicators is what stops them (and
    // the context is poisoned after a failure anyway). Later calls then say why, rather than hand
    // NCCL a communicator that is gone.
    if (busy) {
      if (failure_.ok())
        failure_ = Error(STRIA_ERROR_TRANSPORT,
                         "rank %d aborted its NCCL communicators to stop the transfers of a call that failed; the "
                         "context can only be destroyed",
                         rank_);
      AbortCommsLocked();
    }
    lock.unlock();
    DrainStreams();
    lock.lock();
    ops_.clear();
    for (auto& [gid, g] : groups_)
      if (g.done != nullptr) free_events_.push_back(g.done);
    groups_.clear();
    for (auto& p : pending_) p.clear();
  }

  void Abort() override {
    aborted_.store(true);
    Lock lock(mu_);
    AbortCommsLocked();
  }

 private:
  static ncclConfig_t Config() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
  }

  static Status BadComm(const char* call, ncclResult_t r, ncclComm_t comm) {
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "nccl_comm is not a usable NCCL communicator: %s failed: %s", call,
                 NcclText(r, comm).c_str());
  }

  static void Backoff(int polls) {
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 200));
  }

  Status Aborted() const {
    return Error(STRIA_ERROR_ABORTED, "rank %d was aborted (stria_context_abort) and can only be destroyed", rank_);
  }

  Status UsableLocked() const {
    if (aborted_.load()) return Aborted();
    return failure_;
  }

  // The first failure poisons the transport: the communicators are aborted, later calls fail.
  Status FailLocked(Status why) {
    if (failure_.ok()) failure_ = why;
    AbortCommsLocked();
    return why;
  }

  // Both lanes in one group. ncclCommAbort raises its communicator's abort flag at once but frees
  // its memory (cudaFree, cuMemUnmap: they wait for every kernel on the device) only at the end of
  // its group. One abort after the other, the first would wait for the other lane's kernel, still
  // spinning on a dead peer with its flag down: a hang. In one group both flags are up before
  // anything is freed, and NCCL frees the two concurrently.
  void AbortCommsLocked() {
    if (comms_closed_) return;
    comms_closed_ = true;
    DeviceScope dev(device_);
    (void)ncclGroupStart();
    for (ncclComm_t comm : comms_)
      if (comm != nullptr) (void)ncclCommAbort(comm);
    (void)ncclGroupEnd();
    for (ncclComm_t& comm : comms_) comm = nullptr;
  }

  // The end of a healthy transport (see the top): flush, then free; anything else aborts.
  void CloseCommsLocked(Lock& lock) {
    if (comms_closed_) return;
    if (!failure_.ok() || aborted_.load() || !ops_.empty()) return AbortCommsLocked();
    DeviceScope dev(device_);
    if (!dev.status().ok()) return AbortCommsLocked();
    // One lane after the other: a nonblocking finalize is a per-thread job in NCCL up to 2.26, like
    // a set-up (InitFromIds), and the second must not start before the first is done.
    const auto deadline = DeadlineAfter(std::min(timeout_s_, kDrainS));
    for (int lane = 0; lane < kLanes; ++lane) {
      if (comms_[lane] == nullptr) continue;
      const ncclResult_t r = ncclCommFinalize(comms_[lane]);
      if (r != ncclSuccess && r != ncclInProgress) return AbortCommsLocked();
      const std::string what = Format("NCCL to flush the %s communicator (ncclCommFinalize)", kLaneName[lane]);
      if (!AwaitCommLocked(lock, lane, deadline, what.c_str()).ok()) return;  // failed: aborted there
    }
    comms_closed_ = true;
    for (ncclComm_t& comm : comms_) {
      if (comm != nullptr) (void)ncclCommDestroy(comm);
      comm = nullptr;
    }
  }

  // ncclAllGather of `bytes` per rank in device memory at base (this rank's share at its place)
  // on the K/V lane's stream, idle between calls, and the wait for it.
  Status GatherInPlaceLocked(Lock& lock, char* base, size_t bytes, double timeout_s, const char* what) {
    cudaStream_t stream = streams_[kKvLane];
    const auto deadline = DeadlineAfter(timeout_s);
    std::unique_lock<std::mutex> issue;
    STRIA_RETURN_IF_ERROR(AcquireIssueLocked(lock, &issue, deadline, what));
    const ncclResult_t r =
        ncclAllGather(base + static_cast<size_t>(rank_) * bytes, base, bytes, ncclUint8, comms_[kKvLane], stream);
    if (r != ncclSuccess && r != ncclInProgress) return FailLocked(NcclError("ncclAllGather", r, comms_[kKvLane]));
    if (r == ncclInProgress) STRIA_RETURN_IF_ERROR(AwaitCommLocked(lock, kKvLane, deadline, what));
    issue.unlock();
    return AwaitStreamLocked(lock, stream, deadline, [&] {
      return Error(STRIA_ERROR_TIMEOUT,
                   "timed out after %.3g s in the all-gather of %s: a rank has not called, or is stuck", timeout_s,
                   what);
    });
  }

  // Waits, polling to `deadline`, until `stream` has run everything queued on it so far. The event
  // goes back to the pool whatever the outcome, so that Shutdown destroys it: a timed-out set-up
  // on a caller's communicator used to leak one per attempt.
  template <typename OnTimeout>
  Status AwaitStreamLocked(Lock& lock, cudaStream_t stream, Clock::time_point deadline, OnTimeout&& on_timeout) {
    cudaEvent_t ev = nullptr;
    STRIA_RETURN_IF_ERROR(TakeEventLocked(&ev));
    const cudaError_t e = cudaEventRecord(ev, stream);
    Status s;
    if (e == cudaSuccess)
      s = PollLocked(
          lock, deadline, [&](bool* done) { return EventDone(ev, done); }, on_timeout);
    else
      s = FailLocked(CudaStatus(e, "cudaEventRecord"));
    free_events_.push_back(ev);
    return s;
  }

  // Polls ready() (under mu_) until it reports done, a failure, an NCCL error, an abort or the
  // deadline; mu_ is released while it sleeps.
  template <typename Ready, typename OnTimeout>
  Status PollLocked(Lock& lock, Clock::time_point deadline, Ready&& ready, OnTimeout&& on_timeout) {
    for (int polls = 0;; ++polls) {
      STRIA_RETURN_IF_ERROR(UsableLocked());
      bool done = false;
      Status s = ready(&done);
      if (!s.ok()) return FailLocked(s);
      if (done) return Status::Ok();
      s = AsyncErrorsLocked();
      if (!s.ok()) return FailLocked(s);
      if (Clock::now() >= deadline) return FailLocked(on_timeout());
      lock.unlock();
      Backoff(polls);
      lock.lock();
    }
  }

  Status EventDone(cudaEvent_t ev, bool* done) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
      ClearNotReady();
      return Status::Ok();
    }
    if (e != cudaSuccess) return CudaStatus(e, "cudaEventQuery");
    *done = true;
    return Status::Ok();
  }

  // NCCL reports what goes wrong inside its kernels and proxy threads (a peer's connection
  // broke, a remote error) through the communicator's asynchronous state.
  Status AsyncErrorsLocked() {
    for (int lane = 0; lane < kLanes; ++lane) {
      ncclComm_t comm = comms_[lane];
      if (comm == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r, comm);
      if (state != ncclSuccess && state != ncclInProgress)
        return Status(NcclCode(state) == STRIA_ERROR_CUDA ? STRIA_ERROR_CUDA : STRIA_ERROR_TRANSPORT,
                      Format("NCCL reported an error on rank %d's %s communicator: ", rank_, kLaneName[lane]) +
                          NcclText(state, comm));
    }
    return Status::Ok();
  }

  // A nonblocking communicator finishes setup and launches on a thread of NCCL's; its state is
  // ncclInProgress meanwhile, and nothing may be enqueued behind the launch before it is over.
  Status AwaitCommLocked(Lock& lock, int lane, Clock::time_point deadline, const char* what) {
    const double budget = std::chrono::duration<double>(deadline - Clock::now()).count();
    return PollLocked(
        lock, deadline,
        [&](bool* done) {
          ncclResult_t state = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(comms_[lane], &state);
          if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError", r, comms_[lane]);
          if (state != ncclSuccess && state != ncclInProgress)
            return Status(
                NcclCode(state) == STRIA_ERROR_CUDA ? STRIA_ERROR_CUDA : STRIA_ERROR_TRANSPORT,
                Format("NCCL failed while rank %d waited for %s: ", rank_, what) + NcclText(state, comms_[lane]));
          *done = state == ncclSuccess;
          return Status::Ok();
        },
        [&] {
          return Error(STRIA_ERROR_TIMEOUT,
                       "timed out after %.3g s waiting for %s (a rank has not got there, or NCCL cannot connect to it)",
                       std::max(budget, 0.0), what);
        });
  }

  // One broadcast of the ids from rank 0 over the caller's communicator, through the scratch
  // buffer on lane 0's stream. A rank that never comes leaves the broadcast pending in the caller's
  // communicator, which only its owner may abort; the scratch buffer then stays allocated for it.
  // On a blocking communicator NCCL may instead wait inside ncclBroadcast, connecting its ring at
  // this first collective, for as long as a rank is missing: no timeout of stria's can end that
  // (stria.h says so; a nonblocking nccl_comm keeps create under timeout_s).
  Status BroadcastIdsLocked(Lock& lock, ncclComm_t user, NcclIds* ids) {
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    auto* slot = static_cast<char*>(scratch_) + kIdOffset;
    cudaStream_t stream = streams_[kKvLane];
    cudaError_t e = cudaMemcpyAsync(slot, ids, sizeof *ids, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return FailLocked(CudaStatus(e, "cudaMemcpyAsync"));
    const auto deadline = DeadlineAfter(timeout_s_);
    foreign_work_ = true;  // until the broadcast is known to be over
    ncclResult_t r = ncclBroadcast(slot, slot, sizeof *ids, ncclUint8, 0, user, stream);
    auto timeout = [&] {
      return Error(STRIA_ERROR_TIMEOUT,
                   "timed out after %.3g s waiting for every rank to create its context on nccl_comm (rank 0 "
                   "broadcasts stria's NCCL ids over it, a collective); that broadcast is still pending in the "
                   "caller's communicator, which its owner should abort",
                   timeout_s_);
    };
    if (r == ncclInProgress) {
      // A nonblocking communicator of the caller's: its launch is polled like ours.
      STRIA_RETURN_IF_ERROR(PollLocked(
          lock, deadline,
          [&](bool* done) {
            ncclResult_t state = ncclSuccess;
            r = ncclCommGetAsyncError(user, &state);
            if (r != ncclSuccess) return NcclError("ncclCommGetAsyncError on nccl_comm", r, user);
            if (state != ncclSuccess && state != ncclInProgress)
              return Status(STRIA_ERROR_TRANSPORT, "ncclBroadcast on nccl_comm failed: " + NcclText(state, user));
            *done = state == ncclSuccess;
            return Status::Ok();
          },
          timeout));
      r = ncclSuccess;
    }
    if (r != ncclSuccess) return FailLocked(NcclError("ncclBroadcast on nccl_comm", r, user));
    STRIA_RETURN_IF_ERROR(AwaitStreamLocked(lock, stream, deadline, timeout));
    foreign_work_ = false;
    e = cudaMemcpyAsync(ids, slot, sizeof *ids, cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return FailLocked(CudaStatus(e, "cudaMemcpyAsync (NCCL ids)"));
    return Status::Ok();
  }

  Status Post(bool is_send, int peer, int64_t tag, void* buf, size_t bytes, RequestId* req) {
    Lock lock(mu_);
    STRIA_RETURN_IF_ERROR(UsableLocked());
    if (peer < 0 || peer >= world_)
      return Error(STRIA_ERROR_INTERNAL, "peer %d out of range for world_size %d", peer, world_);
    const int lane = LaneOf(tag);
    // Messages match in posting order (see the top): a tag at or below the last one of this lane,
    // peer and direction means the two sides may not pair the same messages.
    auto key = std::make_tuple(lane, peer, is_send);
    auto last = last_tag_.find(key);
    if (last != last_tag_.end() && tag <= last->second)
      return FailLocked(Error(STRIA_ERROR_INTERNAL,
                              "the NCCL transport matches messages in posting order, but a %s %s rank %d with tag "
                              "%#llx was posted after tag %#llx on the %s lane",
                              is_send ? "send" : "receive", is_send ? "to" : "from", peer, (long long)tag,
                              (long long)last->second, kLaneName[lane]));
    last_tag_[key] = tag;
    Status s = AsyncErrorsLocked();
    if (!s.ok()) return FailLocked(s);
    const RequestId id = next_id_++;
    Op op;
    op.lane = lane;
    op.is_send = is_send;
    op.peer = peer;
    op.buf = buf;
    op.bytes = bytes;
    ops_.emplace(id, op);
    pending_[lane].push_back(id);
    *req = id;
    bool has_send = false, has_recv = false;
    for (RequestId p : pending_[lane]) (ops_.at(p).is_send ? has_send : has_recv) = true;
    if (has_send && has_recv)
      return LaunchLocked(lock, lane, DeadlineAfter(timeout_s_), is_send ? "posting a send" : "posting a receive");
    return Status::Ok();
  }

  // Takes the device's issue lock into *issue, polling to `deadline`; mu_ is released while it
  // waits, and the transport may have been failed or aborted meanwhile (checked on return).
  Status AcquireIssueLocked(Lock& lock, std::unique_lock<std::mutex>* issue, Clock::time_point deadline,
                            const char* what) {
    std::mutex& m = IssueMutex(device_);
    const double budget = std::chrono::duration<double>(deadline - Clock::now()).count();
    for (int polls = 0; !m.try_lock(); ++polls) {
      STRIA_RETURN_IF_ERROR(UsableLocked());
      if (Clock::now() >= deadline)
        return FailLocked(Error(STRIA_ERROR_TIMEOUT,
                                "timed out after %.3g s waiting to issue NCCL work for %s: another NCCL context on "
                                "CUDA device %d kept issuing (NCCL forbids issuing to two communicators of one "
                                "device at once, so stria serialises it; is that context waiting on a dead peer?)",
                                std::max(budget, 0.0), what, device_));
      lock.unlock();
      Backoff(polls);
      lock.lock();
    }
    *issue = std::unique_lock<std::mutex>(m, std::adopt_lock);
    return UsableLocked();
  }

  // Launches everything the lane holds as one group and records its completion event.
  Status LaunchLocked(Lock& lock, int lane, Clock::time_point deadline, const char* what) {
    std::unique_lock<std::mutex> issue;
    STRIA_RETURN_IF_ERROR(AcquireIssueLocked(lock, &issue, deadline, what));
    DeviceScope dev(device_);
    if (!dev.status().ok()) return FailLocked(dev.status());
    ncclComm_t comm = comms_[lane];
    cudaStream_t stream = streams_[lane];
    const int64_t gid = next_group_++;
    Group& g = groups_[gid];
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return FailLocked(NcclError("ncclGroupStart", r, comm));
    Status first;
    for (RequestId id : pending_[lane]) {
      Op& op = ops_.at(id);
      r = op.is_send ? ncclSend(op.buf, op.bytes, ncclUint8, op.peer, comm, stream)
                     : ncclRecv(op.buf, op.bytes, ncclUint8, op.peer, comm, stream);
      if (r != ncclSuccess && r != ncclInProgress && first.ok())
        first = NcclError(op.is_send ? "ncclSend" : "ncclRecv", r, comm);
      op.group = gid;
      ++g.refs;
    }
    pending_[lane].clear();
    r = ncclGroupEnd();  // always, to close the group even after a failed call in it
    if (!first.ok()) return FailLocked(first);
    if (r != ncclSuccess && r != ncclInProgress) return FailLocked(NcclError("ncclGroupEnd", r, comm));
    if (r == ncclInProgress) STRIA_RETURN_IF_ERROR(AwaitCommLocked(lock, lane, deadline, what));
    issue.unlock();  // enqueued: what follows is stria's own
    return RecordDoneLocked(gid, stream);
  }

  // The completion event of group `gid`, recorded on `stream` after its launch.
  Status RecordDoneLocked(int64_t gid, cudaStream_t stream) {
    cudaEvent_t ev = nullptr;
    STRIA_RETURN_IF_ERROR(TakeEventLocked(&ev));
    const cudaError_t e = cudaEventRecord(ev, stream);
    if (e != cudaSuccess) {
      free_events_.push_back(ev);
      return FailLocked(CudaStatus(e, "cudaEventRecord"));
    }
    groups_.at(gid).done = ev;
    return Status::Ok();
  }

  void ReleaseLocked(RequestId id) {
    auto it = ops_.find(id);
    if (it == ops_.end()) return;
    const int64_t gid = it->second.group;
    ops_.erase(it);
    auto g = groups_.find(gid);
    if (g == groups_.end() || --g->second.refs > 0) return;
    if (g->second.done != nullptr) free_events_.push_back(g->second.done);
    groups_.erase(g);
  }

  Status TakeEventLocked(cudaEvent_t* ev) {
    if (!free_events_.empty()) {
      *ev = free_events_.back();
      free_events_.pop_back();
      return Status::Ok();
    }
    const cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    return e == cudaSuccess ? Status::Ok() : FailLocked(CudaStatus(e, "cudaEventCreateWithFlags"));
  }

  // Stream-ordered on lane 0's stream (cudaFree would wait for the whole device).
  Status EnsureScratchLocked(size_t bytes) {
    if (scratch_bytes_ >= bytes) return Status::Ok();
    bytes = std::max(bytes, kScratchMin);
    FreeScratch();
    void* p = nullptr;
    const cudaError_t e = async_alloc_ ? cudaMallocAsync(&p, bytes, streams_[kKvLane]) : cudaMalloc(&p, bytes);
    if (e != cudaSuccess) return FailLocked(CudaStatus(e, async_alloc_ ? "cudaMallocAsync" : "cudaMalloc"));
    scratch_ = p;
    scratch_bytes_ = bytes;
    return Status::Ok();
  }

  void FreeScratch() {
    if (scratch_ == nullptr) return;
    // Stream-ordered: after anything still pending on lane 0's stream. Without memory pools,
    // cudaFree would wait for a broadcast pending in the caller's communicator: leave it then.
    if (async_alloc_)
      (void)cudaFreeAsync(scratch_, streams_[kKvLane]);
    else if (!foreign_work_)
      (void)cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }

  // After ncclCommAbort the kernels have been told to quit; give them a bounded moment.
  // A broadcast pending in the caller's communicator does not end with our aborts: not waited for.
  void DrainStreams() {
    const auto deadline = DeadlineAfter(kDrainS);
    for (int lane = 0; lane < kLanes; ++lane) {
      cudaStream_t s = streams_[lane];
      if (s == nullptr || (lane == kKvLane && foreign_work_)) continue;
      while (cudaStreamQuery(s) == cudaErrorNotReady && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ClearNotReady();
  }

  void Shutdown() {
    {
      Lock lock(mu_);
      CloseCommsLocked(lock);
    }
    DrainStreams();
    DeviceScope dev(device_);
    FreeScratch();
    for (auto& [gid, g] : groups_)
      if (g.done != nullptr) free_events_.push_back(g.done);
    groups_.clear();
    for (cudaEvent_t ev : free_events_) (void)cudaEventDestroy(ev);
    free_events_.clear();
    for (cudaStream_t& s : streams_) {
      if (s != nullptr) (void)cudaStreamDestroy(s);
      s = nullptr;
    }
  }

  const int rank_, world_, device_;
  const double timeout_s_;
  std::mutex mu_;  // every NCCL call and all of the state below
  ncclComm_t comms_[kLanes] = {nullptr, nullptr};
  bool comms_closed_ = false;  // aborted, or finalized and destroyed
  cudaStream_t streams_[kLanes] = {nullptr, nullptr};
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  bool async_alloc_ = false;
  bool foreign_work_ = false;  // a broadcast on the caller's communicator may still be pending on lane 0's stream
  std::unordered_map<RequestId, Op> ops_;
  std::vector<RequestId> pending_[kLanes];  // posted, not launched yet, in posting order
  std::unordered_map<int64_t, Group> groups_;
  std::vector<cudaEvent_t> free_events_;
  std::map<std::tuple<int, int, bool>, int64_t> last_tag_;
  std::atomic<bool> aborted_{false};
  Status failure_;
  RequestId next_id_ = 1;
  int64_t next_group_ = 1;
};

// Every rank's rendezvous entry must come from this transport and the same NCCL version as `mine`.
Status CheckNcclEntries(const std::vector<Bytes>& table, int my_rank, int mine) {
  for (size_t q = 0; q < table.size(); ++q) {
    const Bytes& b = table[q];
    if (b.size() < kBlobHeader || std::memcmp(b.data(), kBlobMagic, 4) != 0)
      return Error(STRIA_ERROR_TRANSPORT,
                   "rank %zu joined this rendezvous with another transport: every rank of a ring must use "
                   "STRIA_TRANSPORT_NCCL",
                   q);
    const int theirs = static_cast<int>((uint32_t{b[4]} << 24) | (uint32_t{b[5]} << 16) | (uint32_t{b[6]} << 8) | b[7]);
    if (theirs != mine)
      return Error(STRIA_ERROR_UNSUPPORTED, "rank %zu runs NCCL %s and rank %d NCCL %s: every rank needs the same NCCL",
                   q, VersionText(theirs).c_str(), my_rank, VersionText(mine).c_str());
  }
  return Status::Ok();
}

// Forms the ring table of the rendezvous; every rank gets rank 0's NCCL ids out of it. A world of
// one needs no rendezvous (nor a stria id). `version`: this rank's NCCL, which every rank must share.
Status ExchangeNcclIds(const stria_context_config_t& config, double timeout_s, int version, NcclIds* ids) {
  if (config.world_size == 1) {
    ReleaseUnusedRendezvous(config.unique_id);  // an id from stria_get_unique_id is used up
    for (ncclUniqueId& id : ids->lane) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess) return NcclError("ncclGetUniqueId", r, nullptr);
    }
    return Status::Ok();
  }
  if (config.world_size > kMaxWorldSize)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "world_size %d exceeds the rendezvous' limit of %d", config.world_size,
                 kMaxWorldSize);
  RendezvousId id;
  STRIA_RETURN_IF_ERROR(ResolveId(config.unique_id, config.world_size, &id));
  Bytes blob(kBlobMagic, kBlobMagic + 4);
  for (int shift = 24; shift >= 0; shift -= 8)
    blob.push_back(static_cast<uint8_t>(static_cast<uint32_t>(version) >> shift));
  std::vector<Bytes> table;
  if (config.rank == 0) {
    // Each NCCL id starts a root thread in this process that waits, with no timeout, until every
    // rank of its communicator has checked in. So rank 0 makes them only once every rank has
    // joined with a usable entry: a ring that never forms, or one with a rank on another
    // transport or NCCL version, leaves no such thread behind (and every rank hears why).
    auto check_and_add_ids = [&](std::vector<Bytes>* joined) {
      STRIA_RETURN_IF_ERROR(CheckNcclEntries(*joined, 0, version));
      NcclIds mine;
      for (ncclUniqueId& nid : mine.lane) {
        const ncclResult_t made = ncclGetUniqueId(&nid);
        if (made != ncclSuccess) return NcclError("rank 0: ncclGetUniqueId", made, nullptr);
      }
      const auto* bytes = reinterpret_cast<const uint8_t*>(&mine);
      (*joined)[0].insert((*joined)[0].end(), bytes, bytes + sizeof mine);
      return Status::Ok();
    };
    STRIA_RETURN_IF_ERROR(ServeRendezvous(id, config.world_size, blob, check_and_add_ids, timeout_s, nullptr, &table));
  } else {
    STRIA_RETURN_IF_ERROR(JoinRendezvous(id, config.rank, config.world_size, blob, timeout_s, nullptr, &table));
    STRIA_RETURN_IF_ERROR(CheckNcclEntries(table, config.rank, version));
  }
  const Bytes& root = table[0];
  if (root.size() != kBlobHeader + sizeof *ids)
    return Error(STRIA_ERROR_TRANSPORT, "rank 0's rendezvous entry carries no NCCL ids (%zu bytes)", root.size());
  std::memcpy(ids, root.data() + kBlobHeader, sizeof *ids);
  return Status::Ok();
}

Status NcclGetUniqueId(stria_unique_id_t* out) {
  RendezvousId id;
  STRIA_RETURN_IF_ERROR(OpenRendezvous(&id));
  EncodeId(id, out);
  return Status::Ok();
}

// NCCL settings from the environment that would break the transport, refused on every rank with
// the reason (before anything waits on a peer).
Status CheckEnvironment() {
  // It overrides ncclConfig_t::blocking: set-up and launches would then block the calling thread,
  // with no stria timeout and no way in for stria_context_abort.
  const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
  if (blocking != nullptr && std::strtol(blocking, nullptr, 10) == 1)
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "NCCL_COMM_BLOCKING=1 makes NCCL block the calling thread, which takes away stria's timeouts "
                 "and stria_context_abort: unset it for the processes that use stria's NCCL transport");
  // It makes every ncclGetUniqueId return the same id, and stria forms one communicator per lane.
  const char* comm_id = std::getenv("NCCL_COMM_ID");
  if (comm_id != nullptr && *comm_id != '\0')
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "NCCL_COMM_ID is set (%s): NCCL then gives every communicator the same id, and stria forms "
                 "two of its own; unset it for the processes that use stria's NCCL transport",
                 comm_id);
  return Status::Ok();
}

// The version of the libnccl.so.2 loaded (a framework may bring its own, older than the headers
// built against), refused below 2.22.
Status CheckLibraryVersion(int* version) {
  const ncclResult_t r = ncclGetVersion(version);
  if (r != ncclSuccess) return NcclError("ncclGetVersion", r, nullptr);
  if (*version < STRIA_NCCL_MIN_VERSION)
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "the NCCL library loaded is %s; stria's NCCL transport needs %s or later (before 2.22 an abort "
                 "frees its communicator at once, even in a group, and aborting the two lanes of a rank could "
                 "hang on the GPU): load a newer libnccl.so.2",
                 VersionText(*version).c_str(), VersionText(STRIA_NCCL_MIN_VERSION).c_str());
  return Status::Ok();
}

Status NcclCreate(const stria_context_config_t& config, void* nccl_comm, double timeout_s, Transport** out) {
  if (RawEnum(config.device.device_type) != kDLCUDA)
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "the NCCL transport moves CUDA device memory: set config->device to {kDLCUDA, ordinal} (CPU "
                 "contexts across processes use STRIA_TRANSPORT_UCX)");
  STRIA_RETURN_IF_ERROR(CheckEnvironment());
  int version = 0;
  STRIA_RETURN_IF_ERROR(CheckLibraryVersion(&version));
  STRIA_RETURN_IF_ERROR(CheckDevice(config.device.device_id));
  auto t = std::make_unique<NcclTransport>(config.rank, config.world_size, config.device.device_id, timeout_s);
  STRIA_RETURN_IF_ERROR(t->CreateStreams());
  if (nccl_comm != nullptr) {
    STRIA_RETURN_IF_ERROR(t->InitFromComm(static_cast<ncclComm_t>(nccl_comm)));
  } else {
    NcclIds ids;
    STRIA_RETURN_IF_ERROR(ExchangeNcclIds(config, timeout_s, version, &ids));
    STRIA_RETURN_IF_ERROR(t->InitFromIds(ids));
  }
  STRIA_RETURN_IF_ERROR(t->Warmup());
  *out = t.release();
  return Status::Ok();
}

}  // namespace
}  // namespace stria

extern "C" __attribute__((visibility("default"))) const stria::TransportModule stria_nccl_module_v4 = {
    stria::kTransportModuleAbiVersion, "nccl", &stria::NcclGetUniqueId, &stria::NcclCreate};

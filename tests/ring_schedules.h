// The ring engine's posting and waiting orders, replayed on a transport by ranks as threads, with
// every block checked where it is read: the host's order (Forward, Backward: src/ring/ring_forward.cc
// and ring_backward.cc, keep them in step) and the device's (ForwardOnDevice, BackwardOnDevice,
// GatherOnDevice: src/ring/ring_order.h), whose compute is host functions on a stream of the CUDA
// runtime model (tests/cuda_host). Shared by the transports' host-model suites (NCCL's, the local
// group's), which run under the sanitizers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "transport/transport.h"

namespace stria {
namespace ring_schedules {

inline int64_t Tag(uint64_t call, int64_t step, int kind) {
  return static_cast<int64_t>((call << 24) | (static_cast<uint64_t>(step) << 2) | static_cast<uint64_t>(kind));
}

// A K/V block that says whose it is.
inline void FillKV(std::vector<uint8_t>* b, int owner) {
  for (size_t i = 0; i < b->size(); ++i) (*b)[i] = static_cast<uint8_t>(owner * 37 + i * 7);
}
inline bool IsKV(const std::vector<uint8_t>& b, int owner) {
  for (size_t i = 0; i < b.size(); ++i)
    if (b[i] != static_cast<uint8_t>(owner * 37 + i * 7)) return false;
  return true;
}

#define CHECK_OK(expr)         \
  do {                         \
    Status st_ = (expr);       \
    if (!st_.ok()) return st_; \
  } while (0)
#define CHECK_THAT(cond, ...)                                     \
  do {                                                            \
    if (!(cond)) return Error(STRIA_ERROR_INTERNAL, __VA_ARGS__); \
  } while (0)

// AgreeOnCall's exchange: a 192-byte record per rank.
inline Status Agree(Transport& tr, uint64_t seq) {
  const int n = tr.world_size();
  std::vector<uint8_t> mine(192, 0), all(192 * static_cast<size_t>(n), 0xEE);
  std::memcpy(mine.data(), &seq, sizeof seq);
  const int r = tr.rank();
  std::memcpy(mine.data() + 8, &r, sizeof r);
  CHECK_OK(tr.AllGather(mine.data(), all.data(), 192, 30, "the call's signature"));
  for (int q = 0; q < n; ++q) {
    uint64_t s = 0;
    int who = -1;
    std::memcpy(&s, all.data() + 192 * static_cast<size_t>(q), sizeof s);
    std::memcpy(&who, all.data() + 192 * static_cast<size_t>(q) + 8, sizeof who);
    CHECK_THAT(s == seq && who == q, "rank %d: the all-gather's record %d is (%llu, %d)", r, q, (unsigned long long)s,
               who);
  }
  return Status::Ok();
}

// RingForward's posting order, over `steps` ring steps (0: all; fewer where a sliding window
// leaves the later steps without work, RingSteps).
inline Status Forward(Transport& tr, uint64_t seq, size_t kv_bytes, int steps = 0) {
  const int n = tr.world_size(), r = tr.rank(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  if (steps == 0) steps = n;
  CHECK_OK(Agree(tr, seq));
  std::vector<uint8_t> kv[2] = {std::vector<uint8_t>(kv_bytes), std::vector<uint8_t>(kv_bytes)};
  FillKV(&kv[0], r);
  for (int step = 0; step < steps; ++step) {
    const int holder = (r - step + n) % n;
    RequestId send = 0, recv = 0;
    const bool forward_block = step < steps - 1;
    if (forward_block) {
      CHECK_OK(tr.Irecv(prev, Tag(seq, step, 1), kv[(step + 1) % 2].data(), kv_bytes, &recv));
      CHECK_OK(tr.Isend(next, Tag(seq, step, 1), kv[step % 2].data(), kv_bytes, &send));
    }
    CHECK_THAT(IsKV(kv[step % 2], holder), "rank %d step %d: not rank %d's K/V", r, step, holder);
    if (forward_block) {
      CHECK_OK(tr.Wait(recv, 30, "K/V block"));
      CHECK_OK(tr.Wait(send, 30, "K/V block"));
    }
  }
  return Status::Ok();
}

// RingBackward's posting order; each rank's dK/dV contribution to block k is (rank+1)(k+1) + i%5.
// With fewer steps than ranks the last holder of a block sends its partial straight home.
inline Status Backward(Transport& tr, uint64_t seq, size_t kv_bytes, size_t dkv_floats, int steps = 0) {
  const int n = tr.world_size(), r = tr.rank(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  if (steps == 0) steps = n;
  const int home_to = (r - (steps - 1) + n) % n, home_from = (r + steps - 1) % n;
  CHECK_OK(Agree(tr, seq));
  const size_t dkv_bytes = dkv_floats * sizeof(float);
  std::vector<uint8_t> kv[2] = {std::vector<uint8_t>(kv_bytes), std::vector<uint8_t>(kv_bytes)};
  std::vector<float> dkv[2] = {std::vector<float>(dkv_floats), std::vector<float>(dkv_floats)};
  std::vector<float> dkv_in(dkv_floats);
  FillKV(&kv[0], r);
  RequestId dkv_send = 0;
  for (int step = 0; step < steps; ++step) {
    const int holder = (r - step + n) % n;
    RequestId kv_send = 0, kv_recv = 0, dkv_recv = 0;
    const bool forward_block = step < steps - 1;
    if (forward_block) {
      CHECK_OK(tr.Irecv(prev, Tag(seq, step, 1), kv[(step + 1) % 2].data(), kv_bytes, &kv_recv));
      CHECK_OK(tr.Isend(next, Tag(seq, step, 1), kv[step % 2].data(), kv_bytes, &kv_send));
    }
    if (step > 0) CHECK_OK(tr.Irecv(prev, Tag(seq, step, 2), dkv_in.data(), dkv_bytes, &dkv_recv));
    CHECK_THAT(IsKV(kv[step % 2], holder), "rank %d step %d: not rank %d's K/V", r, step, holder);
    std::vector<float>& mine = dkv[step % 2];
    for (size_t i = 0; i < dkv_floats; ++i) mine[i] = static_cast<float>((r + 1) * (holder + 1) + i % 5);
    if (step > 0) {
      CHECK_OK(tr.Wait(dkv_recv, 30, "dK/dV partial"));
      for (size_t i = 0; i < dkv_floats; ++i) mine[i] += dkv_in[i];
      CHECK_OK(tr.Wait(dkv_send, 30, "dK/dV partial"));
    }
    if (steps > 1)
      CHECK_OK(tr.Isend(step == steps - 1 ? home_to : next, Tag(seq, step + 1, 2), mine.data(), dkv_bytes, &dkv_send));
    if (forward_block) {
      CHECK_OK(tr.Wait(kv_recv, 30, "K/V block"));
      CHECK_OK(tr.Wait(kv_send, 30, "K/V block"));
    }
  }
  const float* done = dkv[0].data();
  if (steps > 1) {
    RequestId final_recv = 0;
    CHECK_OK(tr.Irecv(home_from, Tag(seq, steps, 2), dkv_in.data(), dkv_bytes, &final_recv));
    CHECK_OK(tr.Wait(final_recv, 30, "final dK/dV"));
    CHECK_OK(tr.Wait(dkv_send, 30, "last dK/dV"));
    done = dkv_in.data();
  }
  int holders = 0;  // the sum of rank + 1 over the ranks that held this rank's block
  for (int j = 0; j < steps; ++j) holders += (r + j) % n + 1;
  for (size_t i = 0; i < dkv_floats; ++i) {
    const float want = static_cast<float>((r + 1) * holders + steps * static_cast<int>(i % 5));
    CHECK_THAT(done[i] == want, "rank %d: dK/dV[%zu] is %g, want %g", r, i, done[i], want);
  }
  return Status::Ok();
}

// The same schedules with their order kept on the device, as src/ring/ring_order.h keeps it over
// NCCL: a rank's "compute" is host functions on a stream of its own (the model runs a stream's
// work on a thread), its transfers wait for an event of that stream (OrderAfter), the compute
// waits for the transfers it reads (DeviceWait), and the host waits for each transfer a step later
// and never for the compute until the call's end. Every block is checked where the compute runs.
struct DeviceOrder {
  Transport& tr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  std::vector<std::pair<RequestId, int>> deferred;  // (request, step) not yet waited for
  std::string error;                                // the compute's first complaint (its thread only)

  explicit DeviceOrder(Transport& t) : tr(t) {
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
  }
  ~DeviceOrder() {
    cudaStreamSynchronize(stream);
    cudaEventDestroy(ready);
    cudaStreamDestroy(stream);
  }
  Status BeforePosting() {
    if (cudaEventRecord(ready, stream) != cudaSuccess) return Error(STRIA_ERROR_INTERNAL, "cudaEventRecord");
    return tr.OrderAfter(ready);
  }
  Status Arrived(RequestId id, int step) {
    CHECK_OK(tr.DeviceWait(id, stream, 30, "a transfer the device waits for"));
    deferred.emplace_back(id, step);
    return Status::Ok();
  }
  Status Retire(int before_step) {
    size_t done = 0;
    for (; done < deferred.size() && deferred[done].second < before_step; ++done)
      CHECK_OK(tr.Wait(deferred[done].first, 30, "a transfer waited for on the device"));
    deferred.erase(deferred.begin(), deferred.begin() + static_cast<std::ptrdiff_t>(done));
    return Status::Ok();
  }
  void Compute(std::function<void()> fn) {
    auto* f = new std::function<void()>(std::move(fn));
    cudaLaunchHostFunc(
        stream,
        [](void* p) {
          auto* g = static_cast<std::function<void()>*>(p);
          (*g)();
          delete g;
        },
        f);
  }
  void Complain(const std::string& what) {
    if (error.empty()) error = what;
  }
  // The call's end: every transfer, then the compute, then what the compute found.
  Status Finish() {
    CHECK_OK(Retire(1 << 30));
    CHECK_THAT(cudaStreamSynchronize(stream) == cudaSuccess, "cudaStreamSynchronize");
    CHECK_THAT(error.empty(), "%s", error.c_str());
    return Status::Ok();
  }
};

inline Status ForwardOnDevice(Transport& tr, uint64_t seq, size_t kv_bytes, int steps) {
  const int n = tr.world_size(), r = tr.rank(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  CHECK_OK(Agree(tr, seq));
  DeviceOrder order(tr);
  std::vector<uint8_t> kv[2] = {std::vector<uint8_t>(kv_bytes), std::vector<uint8_t>(kv_bytes)};
  order.Compute([&kv, r] { FillKV(&kv[0], r); });  // the packing
  for (int step = 0; step < steps; ++step) {
    const int holder = (r - step + n) % n;
    RequestId send = 0, recv = 0;
    const bool forward_block = step < steps - 1;
    if (forward_block) {
      CHECK_OK(order.BeforePosting());
      CHECK_OK(tr.Irecv(prev, Tag(seq, step, 1), kv[(step + 1) % 2].data(), kv_bytes, &recv));
      CHECK_OK(tr.Isend(next, Tag(seq, step, 1), kv[step % 2].data(), kv_bytes, &send));
    }
    order.Compute([&, step, holder] {
      if (!IsKV(kv[step % 2], holder)) order.Complain(Format("rank %d step %d: not rank %d's K/V", r, step, holder));
    });
    if (forward_block) {
      CHECK_OK(order.Arrived(recv, step));
      CHECK_OK(order.Arrived(send, step));
    }
    CHECK_OK(order.Retire(step));
  }
  return order.Finish();
}

inline Status BackwardOnDevice(Transport& tr, uint64_t seq, size_t kv_bytes, size_t dkv_floats, int steps) {
  const int n = tr.world_size(), r = tr.rank(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  const int home_to = (r - (steps - 1) + n) % n, home_from = (r + steps - 1) % n;
  CHECK_OK(Agree(tr, seq));
  DeviceOrder order(tr);
  const size_t dkv_bytes = dkv_floats * sizeof(float);
  std::vector<uint8_t> kv[2] = {std::vector<uint8_t>(kv_bytes), std::vector<uint8_t>(kv_bytes)};
  std::vector<float> dkv[2] = {std::vector<float>(dkv_floats), std::vector<float>(dkv_floats)};
  std::vector<float> dkv_in(dkv_floats);
  order.Compute([&kv, r] { FillKV(&kv[0], r); });
  RequestId dkv_send = 0;
  for (int step = 0; step < steps; ++step) {
    const int holder = (r - step + n) % n;
    RequestId kv_send = 0, kv_recv = 0, dkv_recv = 0;
    const bool forward_block = step < steps - 1;
    if (steps > 1) CHECK_OK(order.BeforePosting());
    if (forward_block) {
      CHECK_OK(tr.Irecv(prev, Tag(seq, step, 1), kv[(step + 1) % 2].data(), kv_bytes, &kv_recv));
      CHECK_OK(tr.Isend(next, Tag(seq, step, 1), kv[step % 2].data(), kv_bytes, &kv_send));
    }
    if (step > 0) CHECK_OK(tr.Irecv(prev, Tag(seq, step, 2), dkv_in.data(), dkv_bytes, &dkv_recv));
    std::vector<float>& mine = dkv[step % 2];
    order.Compute([&, step, holder] {
      if (!IsKV(kv[step % 2], holder)) order.Complain(Format("rank %d step %d: not rank %d's K/V", r, step, holder));
      for (size_t i = 0; i < dkv_floats; ++i) mine[i] = static_cast<float>((r + 1) * (holder + 1) + i % 5);
    });
    if (step > 0) {
      CHECK_OK(order.Arrived(dkv_recv, step));
      order.Compute([&] {
        for (size_t i = 0; i < dkv_floats; ++i) mine[i] += dkv_in[i];
      });
      CHECK_OK(order.Arrived(dkv_send, step));
    }
    if (steps > 1) {
      CHECK_OK(order.BeforePosting());
      CHECK_OK(tr.Isend(step == steps - 1 ? home_to : next, Tag(seq, step + 1, 2), mine.data(), dkv_bytes, &dkv_send));
    }
    if (forward_block) {
      CHECK_OK(order.Arrived(kv_recv, step));
      CHECK_OK(order.Arrived(kv_send, step));
    }
    CHECK_OK(order.Retire(step));
  }
  const std::vector<float>* done = &dkv[0];
  if (steps > 1) {
    RequestId final_recv = 0;
    CHECK_OK(tr.Irecv(home_from, Tag(seq, steps, 2), dkv_in.data(), dkv_bytes, &final_recv));
    CHECK_OK(order.Arrived(final_recv, steps));
    CHECK_OK(order.Arrived(dkv_send, steps));
    done = &dkv_in;
  }
  int holders = 0;  // the sum of rank + 1 over the ranks that held this rank's block
  for (int j = 0; j < steps; ++j) holders += (r + j) % n + 1;
  order.Compute([&, holders] {
    for (size_t i = 0; i < dkv_floats; ++i) {
      const float want = static_cast<float>((r + 1) * holders + steps * static_cast<int>(i % 5));
      if ((*done)[i] != want) {
        order.Complain(Format("rank %d: dK/dV[%zu] is %g, want %g", r, i, (*done)[i], want));
        return;
      }
    }
  });
  return order.Finish();
}

// A decode's gather in the device's order: each rank's records written by its compute, gathered
// in place after them, read by the compute after the gather (the merge).
inline Status GatherOnDevice(Transport& tr, uint64_t seq, size_t bytes) {
  const int n = tr.world_size(), r = tr.rank();
  CHECK_OK(Agree(tr, seq));
  DeviceOrder order(tr);
  std::vector<uint8_t> all(bytes * static_cast<size_t>(n), 0xEE);
  order.Compute([&all, bytes, r] {
    for (size_t i = 0; i < bytes; ++i) all[static_cast<size_t>(r) * bytes + i] = static_cast<uint8_t>(r * 31 + i);
  });
  CHECK_OK(order.BeforePosting());
  std::vector<RequestId> gather;
  CHECK_OK(tr.AllGatherInPlaceOnDevice(all.data(), bytes, Tag(seq, 1, 3), &gather));
  for (RequestId id : gather) CHECK_OK(order.Arrived(id, 0));
  order.Compute([&] {
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < bytes; ++i)
        if (all[static_cast<size_t>(q) * bytes + i] != static_cast<uint8_t>(q * 31 + i)) {
          order.Complain(Format("rank %d: byte %zu of rank %d's records is wrong", r, i, q));
          return;
        }
  });
  return order.Finish();
}

// Two rounds of the device-ordered forward, backward and gather over `steps` ring steps (with
// host_too, each round also the host-ordered forward and backward), from call sequence number
// `seq` on: ten numbers in all.
inline Status CallsOnDevice(Transport& tr, uint64_t seq, int steps, bool host_too) {
  Status s;
  for (uint64_t round = 0; s.ok() && round < 2; ++round) {
    const uint64_t at = seq + 5 * round;
    s = ForwardOnDevice(tr, at, 3000, steps);
    if (s.ok()) s = BackwardOnDevice(tr, at + 1, 3000, 1000, steps);
    if (s.ok()) s = GatherOnDevice(tr, at + 2, 777);
    if (s.ok() && host_too) s = Forward(tr, at + 3, 3000, steps);
    if (s.ok() && host_too) s = Backward(tr, at + 4, 3000, 1000, steps);
  }
  return s;
}

}  // namespace ring_schedules
}  // namespace stria

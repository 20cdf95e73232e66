// The in-process transport's device ordering (src/transport/local_transport.cc) on the CUDA runtime
// model, ranks as threads: the ring engine's schedules (tests/ring_schedules.h) in the device's order
// and the host's, over a copier that orders its copies on the model's streams as the CUDA module's
// does on GPUs (markers after the engine's events, each copy behind both halves' markers, its
// completion an event). It builds without the CUDA module and runs under the sanitizers, where the
// module's own copier (tests/gpu, on the model) does not.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ring_schedules.h"
#include "transport/transport.h"

namespace stria {
namespace {

using namespace ring_schedules;  // NOLINT: the schedules are this suite's vocabulary

// Markers on a stream per rank, copies as host functions on a stream per receiving rank.
class ModelCopier final : public BufferCopier {
 public:
  explicit ModelCopier(int n) : marks_(static_cast<size_t>(n)), lanes_(static_cast<size_t>(n)) {
    for (auto* streams : {&marks_, &lanes_})
      for (cudaStream_t& s : *streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  ~ModelCopier() override {
    for (auto* streams : {&marks_, &lanes_})
      for (cudaStream_t s : *streams) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
  }
  Status Copy(int /*dst_rank*/, void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  bool OrdersOnDevice() const override { return true; }
  Status Mark(int rank, void* event, void** marker) override {
    cudaEvent_t m = nullptr;
    cudaEventCreateWithFlags(&m, cudaEventDisableTiming);
    cudaStream_t s = marks_[static_cast<size_t>(rank)];
    if (cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(event), 0) != cudaSuccess ||
        cudaEventRecord(m, s) != cudaSuccess)
      return Error(STRIA_ERROR_CUDA, "the model refused a marker");
    *marker = m;
    return Status::Ok();
  }
  Status CopyAfter(int dst_rank, void* dst, const void* src, size_t bytes, void* after_send, void* after_receive,
                   void** done) override {
    cudaStream_t lane = lanes_[static_cast<size_t>(dst_rank)];
    for (void* m : {after_send, after_receive})
      if (m != nullptr) cudaStreamWaitEvent(lane, static_cast<cudaEvent_t>(m), 0);
    struct Job {
      void* dst;
      const void* src;
      size_t bytes;
    };
    cudaLaunchHostFunc(
        lane,
        [](void* p) {
          std::unique_ptr<Job> job(static_cast<Job*>(p));
          std::memcpy(job->dst, job->src, job->bytes);
        },
        new Job{dst, src, bytes});
    cudaEvent_t e = nullptr;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventRecord(e, lane);
    *done = e;
    return Status::Ok();
  }
  Status StreamWait(void* stream, void* done) override {
    cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(done), 0);
    return Status::Ok();
  }
  Status Poll(void* done, bool* complete) override {
    *complete = cudaEventQuery(static_cast<cudaEvent_t>(done)) == cudaSuccess;
    cudaGetLastError();  // not-ready is no error of the next call's
    return Status::Ok();
  }
  void Finish(void* done) override { cudaEventSynchronize(static_cast<cudaEvent_t>(done)); }
  void Release(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 private:
  std::vector<cudaStream_t> marks_, lanes_;
};

void RunRanks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// Every world size and step count: two calls each of the forward, the backward and a decode's
// gather in the device's order, then the forward and backward in the host's order on the same
// group (no markers: each copy runs as soon as it is matched).
TEST(LocalGroupOnModel, RingSchedulesInBothOrders) {
  uint64_t seq = 1;
  for (int world = 1; world <= 5; ++world) {
    auto copier = std::make_shared<ModelCopier>(world);
    auto group = CreateLocalGroup(world, copier);
    for (int steps = 1; steps <= world; ++steps) {
      SCOPED_TRACE("world " + std::to_string(world) + ", " + std::to_string(steps) + " steps");
      std::vector<Status> out(static_cast<size_t>(world));
      RunRanks(world, [&](int r) {
        Transport& tr = *group[static_cast<size_t>(r)];
        EXPECT_TRUE(tr.OrdersOnDevice());
        const Status s = CallsOnDevice(tr, seq, steps, /*host_too=*/true);
        if (!s.ok()) tr.LeaveAfterError();  // as the engine does: the others fail at once, not at their timeout
        out[static_cast<size_t>(r)] = s;
      });
      seq += 10;
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(out[static_cast<size_t>(r)].ok()) << "rank " << r << ": " << out[static_cast<size_t>(r)].message();
    }
  }
}

// A device wait for a half its peer never posts: it times out naming the peer, and once the peer
// has left, fails at once saying so; the rank's queued copies finish before its buffers go.
TEST(LocalGroupOnModel, DeviceWaitNamesTheMissingPeer) {
  auto copier = std::make_shared<ModelCopier>(2);
  auto group = CreateLocalGroup(2, copier);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<uint8_t> in(4096), out(4096, 7), back(4096);
  RequestId recv = 0, send = 0, echo = 0, late = 0;
  // A matched pair first, queued on the device behind rank 1's marker.
  cudaEvent_t ev = nullptr;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  cudaEventRecord(ev, stream);
  ASSERT_TRUE(group[1]->OrderAfter(ev).ok());
  ASSERT_TRUE(group[1]->Isend(0, Tag(1, 0, 1), out.data(), out.size(), &send).ok());
  ASSERT_TRUE(group[0]->Irecv(1, Tag(1, 0, 1), in.data(), in.size(), &recv).ok());
  ASSERT_TRUE(group[0]->DeviceWait(recv, stream, 10, "K/V block of ring step 0").ok());
  ASSERT_TRUE(group[0]->Wait(recv, 10, "K/V block of ring step 0").ok());
  ASSERT_TRUE(group[1]->Wait(send, 10, "K/V block of ring step 0").ok());
  EXPECT_EQ(in, out);
  // Then a receive that rank 1 never answers.
  ASSERT_TRUE(group[0]->Irecv(1, Tag(1, 1, 1), back.data(), back.size(), &echo).ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status s = group[0]->DeviceWait(echo, stream, 0.3, "K/V block of ring step 1");
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_NE(s.message().find("waiting for rank 1 to send (K/V block of ring step 1)"), std::string::npos)
      << s.message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
  group[1]->Abort();
  s = group[0]->DeviceWait(echo, stream, 10, "K/V block of ring step 1");
  EXPECT_EQ(s.code(), STRIA_ERROR_TRANSPORT) << s.message();
  EXPECT_NE(s.message().find("rank 1 left the group"), std::string::npos) << s.message();
  // A queued copy the rank never waited for finishes before CancelAll returns.
  ASSERT_TRUE(group[0]->Isend(0, Tag(2, 0, 1), out.data(), out.size(), &late).ok());
  RequestId self = 0;
  ASSERT_TRUE(group[0]->Irecv(0, Tag(2, 0, 1), back.data(), back.size(), &self).ok());
  group[0]->CancelAll();
  EXPECT_EQ(back, out);
  cudaStreamSynchronize(stream);
  cudaEventDestroy(ev);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace stria

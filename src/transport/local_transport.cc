// The in-process transport: N ranks of one process, each driven by its own thread.
//
// Matching is rendezvous-style: a send and a receive with the same (source, destination, tag)
// meet in the group's tables; once both are posted, the receiving rank's copy thread moves the
// bytes while both ranks go on computing. One mutex guards the whole group: messages are few and
// large (a K/V block per ring step), so contention is negligible next to the copies.
//
// Device ordering (a group on GPUs, whose copier orders copies on the device): OrderAfter turns
// the engine's event into a marker of the rank's (BufferCopier::Mark), and each post carries its
// rank's marker at the time; the copy thread queues a matched copy behind both halves' markers
// and leaves it running (kQueued, its completion an event), DeviceWait makes the engine's stream
// wait for that event (waiting on the host only for the peer's half to be posted and queued), and
// Wait polls it. So neither rank's host waits for its compute, nor for a copy before queuing the
// kernels that read it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/deadline.h"
#include "transport/transport.h"

namespace stria {
namespace {

using Clock = std::chrono::steady_clock;

enum class ReqState { kPosted, kMatched, kQueued, kDone, kFailed };

struct Request {
  int owner = 0;  // the rank that posted it
  int peer = 0;
  bool is_send = false;
  int64_t tag = 0;
  const void* src = nullptr;  // send buffer
  void* dst = nullptr;        // receive buffer
  size_t bytes = 0;
  ReqState state = ReqState::kPosted;
  std::string error;
  stria_status_t code = STRIA_ERROR_TRANSPORT;  // of a failure
  // Device ordering: the owner's marker when it posted (null: none), and once queued the copy's
  // completion (shared by both halves).
  std::shared_ptr<void> after, done;
};

struct CopyJob {
  RequestId send, recv;
};

class LocalGroup {
 public:
  LocalGroup(int n, std::shared_ptr<BufferCopier> copier)
      : n_(n),
        copier_(std::move(copier)),
        ordered_(copier_ != nullptr && copier_->OrdersOnDevice()),
        marker_(static_cast<size_t>(n)),
        gone_(n, false),
        gone_after_error_(n, false),
        posted_round_(n, 0),
        copy_queues_(n) {
    for (auto& slot : board_) slot.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) copiers_.emplace_back([this, r] { CopyLoop(r); });
  }
  ~LocalGroup() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    copy_cv_.notify_all();
    for (auto& t : copiers_) t.join();
  }

  int size() const { return n_; }
  bool ordered() const { return ordered_; }

  // The transfers `rank` posts from now on start after the work `event` marks.
  Status OrderAfter(int rank, void* event) {
    void* m = nullptr;
    STRIA_RETURN_IF_ERROR(copier_->Mark(rank, event, &m));
    std::shared_ptr<void> marker = Owned(m);
    std::lock_guard<std::mutex> lock(mu_);
    marker_[static_cast<size_t>(rank)] = std::move(marker);
    return Status::Ok();
  }

  // `stream` goes on once request `id`'s copy is done: on the device once the copy is queued, which
  // the host waits for (the peer's half posted, the copy thread's turn).
  Status DeviceWait(int rank, RequestId id, void* stream, double timeout_s, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = DeadlineAfter(timeout_s);
    for (;;) {
      auto it = requests_.find(id);
      if (it == requests_.end()) return Error(STRIA_ERROR_INTERNAL, "unknown transport request %lld", (long long)id);
      Request& req = it->second;
      if (req.state == ReqState::kFailed) return Status(req.code, req.error);
      if (req.state == ReqState::kDone) return Status::Ok();
      if (req.state == ReqState::kQueued) {
        const std::shared_ptr<void> done = req.done;
        lock.unlock();
        return copier_->StreamWait(stream, done.get());
      }
      STRIA_RETURN_IF_ERROR(AwaitProgress(lock, rank, id, deadline, timeout_s, what));
    }
  }

  Status AllGather(int rank, uint64_t round, const void* mine, void* all, size_t bytes, double timeout_s,
                   const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& slot = board_[round % 2];
    slot[static_cast<size_t>(rank)].assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + bytes);
    posted_round_[static_cast<size_t>(rank)] = round;
    cv_.notify_all();
    auto deadline = DeadlineAfter(timeout_s);
    for (;;) {
      if (gone_[static_cast<size_t>(rank)]) return Aborted(rank);
      // A rank that left before posting can never complete the gather. One that posted and then
      // was aborted or destroyed while it waited here too could, but the call it gathers for
      // would only fail at its first transfer with that rank, after the missing ranks had come,
      // or at the timeout if they never do: either way its peers learn now. One that posted and
      // left after its own failure (its wait timed out) most likely waited for the same missing
      // ranks as this one, whose own deadline, close by, names them.
      // Once every rank has posted, one that then left after its own failure can only have
      // timed out waiting for this one (or failed early in the call itself): its stale
      // contribution must not pass for a live rank's, so the gather fails naming it.
      int missing = -1, left_before = -1, left_after = -1, failed_after = -1;
      for (int q = 0; q < n_; ++q) {
        const size_t i = static_cast<size_t>(q);
        const bool posted = posted_round_[i] >= round;
        if (!posted && missing < 0) missing = q;
        if (gone_[i] && !posted) left_before = q;
        if (gone_[i] && posted && !gone_after_error_[i]) left_after = q;
        if (gone_[i] && posted && gone_after_error_[i]) failed_after = q;
      }
      if (missing < 0 && failed_after >= 0)
        return Error(STRIA_ERROR_TRANSPORT,
                     "rank %d had joined %s but then left the group after a failure of its own (most likely it "
                     "timed out waiting for this rank; its own error says)",
                     failed_after, what);
      if (missing < 0) break;
      if (left_before >= 0)
        return Error(STRIA_ERROR_TRANSPORT, "rank %d left the group (%s) before joining %s", left_before,
                     HowLeft(left_before), what);
      if (left_after >= 0)
        return Error(STRIA_ERROR_TRANSPORT,
                     "rank %d left the group (aborted or destroyed) while waiting for rank %d to join %s", left_after,
                     missing, what);
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
        // The last rank may have joined just as the deadline passed: a complete gather is no timeout.
        std::string who;
        for (int q = 0; q < n_; ++q)
          if (posted_round_[static_cast<size_t>(q)] < round) who += (who.empty() ? "" : ", ") + std::to_string(q);
        if (who.empty()) break;
        return Error(STRIA_ERROR_TIMEOUT, "timed out after %.3g s waiting for rank(s) %s to join %s", timeout_s,
                     who.c_str(), what);
      }
    }
    for (int q = 0; q < n_; ++q) {
      const auto& rec = slot[static_cast<size_t>(q)];
      if (rec.size() != bytes)
        return Error(STRIA_ERROR_INTERNAL, "rank %d contributed %zu bytes to %s, this rank %zu", q, rec.size(), what,
                     bytes);
      std::memcpy(static_cast<char*>(all) + static_cast<size_t>(q) * bytes, rec.data(), bytes);
    }
    return Status::Ok();
  }

  Status Post(int rank, int peer, bool is_send, int64_t tag, const void* src, void* dst, size_t bytes, RequestId* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_[static_cast<size_t>(rank)]) return Aborted(rank);
    RequestId id = next_id_++;
    Request& req = requests_[id];
    req.owner = rank;
    req.peer = peer;
    req.is_send = is_send;
    req.tag = tag;
    req.src = src;
    req.dst = dst;
    req.bytes = bytes;
    if (ordered_) req.after = marker_[static_cast<size_t>(rank)];
    *out = id;
    // Look for the matching half among the peer's unmatched posts.
    auto& pending = unmatched_;
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      Request& other = requests_[*it];
      if (other.owner == peer && other.peer == rank && other.tag == tag && other.is_send != is_send) {
        RequestId other_id = *it;
        pending.erase(it);
        RequestId send_id = is_send ? id : other_id, recv_id = is_send ? other_id : id;
        Request& s = requests_[send_id];
        Request& r = requests_[recv_id];
        if (s.bytes != r.bytes) {
          std::string msg = Format(
              "message size mismatch on tag %lld between rank %d (sends %zu bytes) and rank %d "
              "(expects %zu)",
              static_cast<long long>(tag), s.owner, s.bytes, r.owner, r.bytes);
          Fail(s, msg);
          Fail(r, msg);
          return Status::Ok();
        }
        s.state = r.state = ReqState::kMatched;
        ++inflight_[s.owner];
        ++inflight_[r.owner];
        copy_queues_[static_cast<size_t>(r.owner)].push_back(CopyJob{send_id, recv_id});
        copy_cv_.notify_all();
        return Status::Ok();
      }
    }
    pending.push_back(id);
    return Status::Ok();
  }

  Status Wait(int rank, RequestId id, double timeout_s, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    auto deadline = DeadlineAfter(timeout_s);
    for (int polls = 0;;) {
      auto it = requests_.find(id);
      if (it == requests_.end()) return Error(STRIA_ERROR_INTERNAL, "unknown transport request %lld", (long long)id);
      Request& req = it->second;
      if (req.state == ReqState::kDone) {
        requests_.erase(it);
        return Status::Ok();
      }
      if (req.state == ReqState::kFailed) {
        Status s(req.code, req.error);
        requests_.erase(it);
        return s;
      }
      if (gone_[static_cast<size_t>(rank)]) return Aborted(rank);
      if (req.state == ReqState::kQueued) {  // on the device: polled
        bool complete = false;
        Status polled = copier_->Poll(req.done.get(), &complete);
        if (!polled.ok() || complete) {
          requests_.erase(it);
          return polled;
        }
        if (Clock::now() >= deadline)
          return Error(STRIA_ERROR_TIMEOUT,
                       "timed out after %.3g s waiting for the copy %s rank %d to finish on the device (%s)", timeout_s,
                       req.is_send ? "to" : "from", req.peer, what);
        cv_.wait_for(lock, std::chrono::microseconds(polls++ < 64 ? 10 : 100));
        continue;
      }
      STRIA_RETURN_IF_ERROR(AwaitProgress(lock, rank, id, deadline, timeout_s, what));
    }
  }

  void CancelAll(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    unmatched_.erase(
        std::remove_if(unmatched_.begin(), unmatched_.end(), [&](RequestId id) { return requests_[id].owner == rank; }),
        unmatched_.end());
    // Copies already matched touch our buffers: let them finish (they are short and never block),
    // on the device too (a queued copy waits only for work already queued there).
    cv_.wait(lock, [&] { return inflight_[rank] == 0; });
    std::vector<std::shared_ptr<void>> queued;
    for (auto& [id, req] : requests_)
      if (req.owner == rank && req.state == ReqState::kQueued) queued.push_back(req.done);
    if (!queued.empty()) {
      lock.unlock();
      for (const auto& done : queued) copier_->Finish(done.get());
      lock.lock();
    }
    for (auto it = requests_.begin(); it != requests_.end();) {
      it = it->second.owner == rank ? requests_.erase(it) : std::next(it);
    }
  }

  void Leave(int rank, bool after_error = false) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!gone_[static_cast<size_t>(rank)]) gone_after_error_[static_cast<size_t>(rank)] = after_error;
      gone_[static_cast<size_t>(rank)] = true;
    }
    cv_.notify_all();
  }

 private:
  // Why rank q is gone, for messages; mu_ held.
  const char* HowLeft(int q) const {
    return gone_after_error_[static_cast<size_t>(q)] ? "after a failure of its own" : "aborted or destroyed";
  }
  static Status Aborted(int rank) {
    return Error(STRIA_ERROR_ABORTED, "rank %d was aborted (stria_context_abort) and can only be destroyed", rank);
  }
  // One wait (mu_ held) for request `id`, not yet done or queued, to get further: an error when
  // this rank was aborted, when the peer left before posting its half, or when the deadline
  // passed with the half still missing; otherwise OK once woken, for the caller to look again.
  Status AwaitProgress(std::unique_lock<std::mutex>& lock, int rank, RequestId id, Clock::time_point deadline,
                       double timeout_s, const char* what) {
    if (gone_[static_cast<size_t>(rank)]) return Aborted(rank);
    const Request& req = requests_[id];
    if (req.state == ReqState::kPosted && gone_[static_cast<size_t>(req.peer)])
      return Error(STRIA_ERROR_TRANSPORT, "rank %d left the group (%s) during %s", req.peer, HowLeft(req.peer), what);
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
      const Request& late = requests_[id];  // the map may have rehashed meanwhile
      if (late.state == ReqState::kPosted)
        return Error(STRIA_ERROR_TIMEOUT, "timed out after %.3g s waiting for rank %d to %s (%s)", timeout_s, late.peer,
                     late.is_send ? "receive" : "send", what);
    }
    return Status::Ok();
  }
  // A copier's event, released by the copier when its last holder lets go.
  std::shared_ptr<void> Owned(void* event) {
    std::shared_ptr<BufferCopier> copier = copier_;
    return std::shared_ptr<void>(event, [copier](void* e) {
      if (e != nullptr) copier->Release(e);
    });
  }
  void Fail(Request& r, const std::string& msg) {
    r.state = ReqState::kFailed;
    r.error = msg;
    cv_.notify_all();
  }

  void CopyLoop(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& queue = copy_queues_[static_cast<size_t>(rank)];
    for (;;) {
      copy_cv_.wait(lock, [&] { return stopping_ || !queue.empty(); });
      if (queue.empty()) return;  // stopping
      CopyJob job = queue.front();
      queue.pop_front();
      Request& s = requests_[job.send];
      Request& r = requests_[job.recv];
      const void* src = s.src;
      void* dst = r.dst;
      size_t bytes = s.bytes;
      const std::shared_ptr<void> after_send = s.after, after_receive = r.after;
      lock.unlock();
      Status copied;
      std::shared_ptr<void> done;
      if (bytes && ordered_) {
        void* event = nullptr;
        copied = copier_->CopyAfter(rank, dst, src, bytes, after_send.get(), after_receive.get(), &event);
        done = Owned(event);
      } else if (bytes && copier_) {
        copied = copier_->Copy(rank, dst, src, bytes);
      } else if (bytes) {
        std::memcpy(dst, src, bytes);
      }
      lock.lock();
      // The map may have rehashed while unlocked: look both up again.
      Request& s2 = requests_[job.send];
      Request& r2 = requests_[job.recv];
      if (copied.ok() && done != nullptr) {
        s2.state = r2.state = ReqState::kQueued;
        s2.done = r2.done = done;
      } else if (copied.ok()) {
        s2.state = r2.state = ReqState::kDone;
      } else {
        s2.state = r2.state = ReqState::kFailed;
        s2.error = r2.error = copied.message();
        s2.code = r2.code = copied.code();
      }
      --inflight_[s2.owner];
      --inflight_[r2.owner];
      cv_.notify_all();
    }
  }

  const int n_;
  const std::shared_ptr<BufferCopier> copier_;
  const bool ordered_;                         // copies ordered on the device (the copier's)
  std::vector<std::shared_ptr<void>> marker_;  // per rank: its last OrderAfter's marker
  std::mutex mu_;
  std::condition_variable cv_;       // request completion, arrivals, departures
  std::condition_variable copy_cv_;  // work for the copy threads
  std::vector<bool> gone_;
  std::vector<bool> gone_after_error_;  // left by LeaveAfterError (its own call failed), not abort or destroy
  std::vector<uint64_t> posted_round_;
  std::vector<std::vector<char>> board_[2];
  std::unordered_map<RequestId, Request> requests_;
  std::list<RequestId> unmatched_;
  std::unordered_map<int, int> inflight_;
  std::vector<std::deque<CopyJob>> copy_queues_;
  std::vector<std::thread> copiers_;
  RequestId next_id_ = 1;
  bool stopping_ = false;
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  ~LocalTransport() override {
    group_->Leave(rank_);
    group_->CancelAll(rank_);
  }
  const char* name() const override { return "local"; }
  int rank() const override { return rank_; }
  int world_size() const override { return group_->size(); }

  Status AllGather(const void* mine, void* all, size_t bytes, double timeout_s, const char* what) override {
    return group_->AllGather(rank_, ++round_, mine, all, bytes, timeout_s, what);
  }
  Status Isend(int peer, int64_t tag, const void* buf, size_t bytes, RequestId* req) override {
    return group_->Post(rank_, peer, true, tag, buf, nullptr, bytes, req);
  }
  Status Irecv(int peer, int64_t tag, void* buf, size_t bytes, RequestId* req) override {
    return group_->Post(rank_, peer, false, tag, nullptr, buf, bytes, req);
  }
  Status Wait(RequestId req, double timeout_s, const char* what) override {
    return group_->Wait(rank_, req, timeout_s, what);
  }
  bool OrdersOnDevice() const override { return group_->ordered(); }
  Status OrderAfter(void* event) override { return group_->OrderAfter(rank_, event); }
  Status DeviceWait(RequestId req, void* stream, double timeout_s, const char* what) override {
    return group_->DeviceWait(rank_, req, stream, timeout_s, what);
  }
  void CancelAll() override { group_->CancelAll(rank_); }
  void Abort() override { group_->Leave(rank_); }
  void LeaveAfterError() override { group_->Leave(rank_, /*after_error=*/true); }

 private:
  std::shared_ptr<LocalGroup> group_;
  const int rank_;
  uint64_t round_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> CreateLocalGroup(int world_size, std::shared_ptr<BufferCopier> copier) {
  auto group = std::make_shared<LocalGroup>(world_size, std::move(copier));
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<LocalTransport>(group, r));
  return out;
}

}  // namespace stria

// The UCX transport: one rank per process, ranks on one host or many. UCX picks the wire
// (shared memory and CMA on one host, TCP or RDMA across hosts); stria uses its tagged messages.
//
// Threading. The worker is created SERIALIZED and every UCX call happens under mu_. A progress
// thread drives the worker while the rank computes, so a K/V block moves (the rendezvous
// protocol's RTS/GET/ATS steps included) without the compute thread's help; it sleeps on the
// worker's event fd (plus a short poll period as a safety net) when there is nothing to do.
//
// Faults. Endpoints use UCX's peer error handling, so a broken connection is reported to us and
// fails every wait on that peer. A rank that aborts or is destroyed first sends a one-word "bye"
// to every peer (each rank keeps a receive posted for it), so its peers fail at once rather than
// at their timeout. Everything else is bounded by the caller's timeout.
#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/deadline.h"
#include "core/raw_enum.h"
#include "transport/module_abi.h"
#include "transport/rendezvous/rendezvous.h"

namespace stria {
namespace {

using Clock = std::chrono::steady_clock;

// A UCX tag: the sender's rank in the top 16 bits, the engine's tag (call, step, kind) below.
constexpr int kRankShift = 48;
constexpr uint64_t kLowMask = (uint64_t{1} << kRankShift) - 1;
constexpr uint64_t kFullMask = ~uint64_t{0};
// Engine tags end in a kind (ring_common.h); the all-gather uses kind 3 at step 0, which the
// engine's kind-3 messages never use, and kind 0 with step 0 and call 0 (the whole low part zero)
// is the "bye".
constexpr uint64_t kAllGatherKind = 3;
constexpr uint64_t kByeTag = 0;
constexpr size_t kByeBytes = 256;  // a bye carries why the rank left, so peers can say what happened
constexpr const char* kByeAfterError = "after an error: ";  // a bye of a rank whose own call failed
constexpr size_t kMaxWorld = size_t{1} << 16;

uint64_t WireTag(int sender, int64_t tag) {
  return (static_cast<uint64_t>(sender) << kRankShift) | (static_cast<uint64_t>(tag) & kLowMask);
}

enum class State { kPending, kDone, kFailed };

struct Req {
  int peer = 0;
  bool is_send = false;
  size_t bytes = 0;
  void* ucp = nullptr;  // the UCX request while pending
  State state = State::kPending;
  ucs_status_t status = UCS_OK;
  size_t received = 0;
  class UcxTransport* owner = nullptr;
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(int rank, int world)
      : rank_(rank), world_(world), gone_(static_cast<size_t>(world)), gone_after_error_(static_cast<size_t>(world)) {}
  ~UcxTransport() override { Shutdown(); }

  const char* name() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  // Creates the UCX context and worker; *address is what the peers need to reach us.
  Status Init(Bytes* address) {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return UcxError("ucp_config_read", st);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) return UcxError("ucp_init", st);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) return UcxError("ucp_worker_create", st);
    st = ucp_worker_get_efd(worker_, &worker_fd_);
    if (st != UCS_OK) worker_fd_ = -1;  // no wakeup: the progress thread polls instead
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Error(STRIA_ERROR_TRANSPORT, "eventfd failed: %s", strerror(errno));
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) return UcxError("ucp_worker_get_address", st);
    const auto* p = reinterpret_cast<const uint8_t*>(addr);
    address->assign(p, p + len);
    ucp_worker_release_address(worker_, addr);
    if (address->size() > kMaxBlobBytes)
      return Error(STRIA_ERROR_TRANSPORT, "the UCX worker address has %zu bytes, more than the rendezvous carries",
                   address->size());
    return Status::Ok();
  }

  // Reaches every rank, posts the "bye" receives and starts the progress thread.
  Status Connect(const std::vector<Bytes>& table) {
    std::lock_guard<std::mutex> lock(mu_);
    // Peer error handling is what reports a dead peer's endpoint. UCX 1.13 admits only transports
    // that can detect peer failure then (TCP on a plain host: no shared memory, no CMA), so
    // STRIA_UCX_PEER_ERRORS=0 trades it for UCX's fastest transports; failures are then seen
    // through the byes and the timeout only.
    const char* pe = std::getenv("STRIA_UCX_PEER_ERRORS");
    const bool peer_errors = pe == nullptr || std::strcmp(pe, "0") != 0;
    eps_.assign(static_cast<size_t>(world_), nullptr);
    peer_args_.resize(static_cast<size_t>(world_));
    for (int q = 0; q < world_; ++q) {
      peer_args_[static_cast<size_t>(q)] = {this, q};
      ucp_ep_params_t ep{};
      ep.field_mask =
          UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(table[static_cast<size_t>(q)].data());
      ep.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      ep.err_handler.cb = &UcxTransport::OnPeerError;
      ep.err_handler.arg = &peer_args_[static_cast<size_t>(q)];
      ucs_status_t st = ucp_ep_create(worker_, &ep, &eps_[static_cast<size_t>(q)]);
      if (st != UCS_OK) return UcxError(Format("ucp_ep_create to rank %d", q).c_str(), st);
    }
    bye_in_.assign(static_cast<size_t>(world_), {});
    for (int q = 0; q < world_; ++q) {
      if (q == rank_) continue;
      RequestId id = 0;
      STRIA_RETURN_IF_ERROR(
          PostLocked(q, false, WireTag(q, kByeTag), bye_in_[static_cast<size_t>(q)].data(), kByeBytes, &id));
      bye_reqs_.push_back(id);
    }
    progress_ = std::thread([this] { ProgressLoop(); });
    return Status::Ok();
  }

  Status AllGather(const void* mine, void* all, size_t bytes, double timeout_s, const char* what) override {
    const int64_t tag = static_cast<int64_t>((++round_ << 24) | kAllGatherKind);
    auto* out = static_cast<char*>(all);
    std::memcpy(out + static_cast<size_t>(rank_) * bytes, mine, bytes);
    std::vector<RequestId> reqs;
    Status s;
    for (int q = 0; q < world_ && s.ok(); ++q) {
      if (q == rank_) continue;
      RequestId r = 0;
      s = Irecv(q, tag, out + static_cast<size_t>(q) * bytes, bytes, &r);
      if (s.ok()) reqs.push_back(r);
      if (s.ok()) s = Isend(q, tag, mine, bytes, &r);
      if (s.ok()) reqs.push_back(r);
    }
    // One deadline for the whole exchange; the first failure is the answer, the rest are dropped.
    const auto deadline = DeadlineAfter(timeout_s);
    for (RequestId r : reqs) {
      if (!s.ok()) {
        Forget(r);
        continue;
      }
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      std::unique_lock<std::mutex> lock(mu_);
      s = NoteErrorLocked(WaitLocked(lock, r, left > 0 ? left : 0, what, /*any_peer_gone_fails=*/true));
    }
    // A peer's contribution may be what it sent before giving up (its own wait in this gather
    // timed out while this rank was late, most likely): it is not a live rank's call to pair with.
    std::lock_guard<std::mutex> lock(mu_);
    for (int q = 0; s.ok() && q < world_; ++q)
      if (q != rank_ && gone_after_error_[static_cast<size_t>(q)])
        s = NoteErrorLocked(Error(STRIA_ERROR_TRANSPORT, "rank %d had joined %s but then %s", q, what,
                                  gone_[static_cast<size_t>(q)].c_str()));
    return s;
  }

  Status Isend(int peer, int64_t tag, const void* buf, size_t bytes, RequestId* req) override {
    std::lock_guard<std::mutex> lock(mu_);
    Status s = CheckPost(peer, true);
    if (s.ok()) s = PostLocked(peer, true, WireTag(rank_, tag), const_cast<void*>(buf), bytes, req);
    return NoteErrorLocked(std::move(s));
  }

  Status Irecv(int peer, int64_t tag, void* buf, size_t bytes, RequestId* req) override {
    std::lock_guard<std::mutex> lock(mu_);
    Status s = CheckPost(peer, false);
    if (s.ok()) s = PostLocked(peer, false, WireTag(peer, tag), buf, bytes, req);
    return NoteErrorLocked(std::move(s));
  }

  Status Wait(RequestId id, double timeout_s, const char* what) override {
    std::unique_lock<std::mutex> lock(mu_);
    return NoteErrorLocked(WaitLocked(lock, id, timeout_s, what));
  }

 private:
  // The first failure this rank saw, told to the peers in its bye: a post refused because a peer
  // already left counts as much as a failed wait, or the bye would only say "aborted".
  Status NoteErrorLocked(Status s) {
    if (!s.ok() && first_error_.empty()) first_error_ = s.message();
    return s;
  }

  // any_peer_gone_fails: the wait is part of a collective (the call's agreement), which no rank
  // completes once any rank has left, whichever peer this request is with. A peer that leaves
  // normally (destroy after its call) has passed the agreement long before: every rank's ring
  // needs every other rank to have passed it first.
  Status WaitLocked(std::unique_lock<std::mutex>& lock, RequestId id, double timeout_s, const char* what,
                    bool any_peer_gone_fails = false) {
    const auto deadline = DeadlineAfter(timeout_s);
    bool drained = false;
    for (;;) {
      auto it = reqs_.find(id);
      if (it == reqs_.end()) return Error(STRIA_ERROR_INTERNAL, "unknown transport request %lld", (long long)id);
      Req& r = *it->second;
      if (r.state == State::kDone) {
        const bool short_message = !r.is_send && r.received != r.bytes;
        const size_t got = r.received, want = r.bytes;
        const int peer = r.peer;
        reqs_.erase(it);
        if (short_message)
          return Error(STRIA_ERROR_TRANSPORT, "rank %d sent %zu bytes where %zu were expected (%s)", peer, got, want,
                       what);
        return Status::Ok();
      }
      if (r.state == State::kFailed) {
        Status s = r.status == UCS_ERR_MESSAGE_TRUNCATED
                       ? Error(STRIA_ERROR_TRANSPORT, "rank %d sent a longer message than the %zu bytes expected (%s)",
                               r.peer, r.bytes, what)
                       : Error(STRIA_ERROR_TRANSPORT, "the transfer %s rank %d failed (%s): %s",
                               r.is_send ? "to" : "from", r.peer, what, ucs_status_string(r.status));
        if (!gone_[static_cast<size_t>(r.peer)].empty())
          s = Error(STRIA_ERROR_TRANSPORT, "rank %d %s (%s)", r.peer, gone_[static_cast<size_t>(r.peer)].c_str(), what);
        reqs_.erase(it);
        return s;
      }
      if (aborted_.load()) return Aborted();
      if (!gone_[static_cast<size_t>(r.peer)].empty()) {
        // A receive may still be matched by what the peer sent before it left (CheckPost): let
        // UCX complete it, from this thread (every UCX call is under mu_), before giving up.
        if (!r.is_send && !drained) {
          drained = true;
          while (ucp_worker_progress(worker_) != 0) {
          }
          continue;
        }
        return Error(STRIA_ERROR_TRANSPORT, "rank %d %s (%s)", r.peer, gone_[static_cast<size_t>(r.peer)].c_str(),
                     what);
      }
      for (int q = 0; any_peer_gone_fails && q < world_; ++q) {
        // A peer that left after its own failure (a timeout in this same agreement, most likely)
        // does not end the wait: this rank's own deadline, close by, names the missing ranks.
        if (q != rank_ && !gone_[static_cast<size_t>(q)].empty() && !gone_after_error_[static_cast<size_t>(q)])
          return Error(STRIA_ERROR_TRANSPORT, "rank %d %s (%s, while waiting for rank %d)", q,
                       gone_[static_cast<size_t>(q)].c_str(), what, r.peer);
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
        auto again = reqs_.find(id);
        if (again != reqs_.end() && again->second->state == State::kPending)
          return Error(STRIA_ERROR_TIMEOUT, "timed out after %.3g s waiting for rank %d to %s (%s)", timeout_s, r.peer,
                       r.is_send ? "take a message" : "send", what);
      }
    }
  }

 public:
  void CancelAll() override {
    std::unique_lock<std::mutex> lock(mu_);
    // Receives can be withdrawn; their buffers are then ours again.
    for (auto& [id, r] : reqs_)
      if (r->state == State::kPending && !r->is_send && r->ucp != nullptr) ucp_request_cancel(worker_, r->ucp);
    Kick();
    cv_.wait_for(lock, std::chrono::seconds(2), [&] {
      for (auto& [id, r] : reqs_)
        if (r->state == State::kPending && !r->is_send && !IsBye(id)) return false;
      return true;
    });
    // A pending send may still be read by its peer (UCX's rendezvous lets the receiver pull);
    // the context is poisoned now, and the destructor closes the endpoints before any buffer is
    // freed. Forget what is done.
    for (auto it = reqs_.begin(); it != reqs_.end();)
      it = it->second->state != State::kPending ? reqs_.erase(it) : std::next(it);
  }

  void Abort() override {
    if (aborted_.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      SayByeLocked();
    }
    cv_.notify_all();
    Kick();
  }

 private:
  struct PeerArg {
    UcxTransport* self;
    int rank;
  };

  static Status UcxError(const char* call, ucs_status_t st) {
    return Error(STRIA_ERROR_TRANSPORT, "%s failed: %s", call, ucs_status_string(st));
  }
  Status Aborted() const {
    return Error(STRIA_ERROR_ABORTED, "rank %d was aborted (stria_context_abort) and can only be destroyed", rank_);
  }
  bool IsBye(RequestId id) const {
    for (RequestId b : bye_reqs_)
      if (b == id) return true;
    return false;
  }

  // A receive from a peer that has left is still posted: what it sent before leaving may be here
  // already (an eager message waits in UCX's unexpected queue until a receive matches it; UCX
  // keeps a peer's messages in order, so it came before the bye or the closed connection) and
  // then completes at once. If it is not, the wait fails at once (WaitLocked).
  Status CheckPost(int peer, bool is_send) const {
    if (aborted_.load()) return Aborted();
    if (peer < 0 || peer >= world_)
      return Error(STRIA_ERROR_INTERNAL, "peer %d out of range for world_size %d", peer, world_);
    if (is_send && !gone_[static_cast<size_t>(peer)].empty())
      return Error(STRIA_ERROR_TRANSPORT, "rank %d %s", peer, gone_[static_cast<size_t>(peer)].c_str());
    return Status::Ok();
  }

  Status PostLocked(int peer, bool is_send, uint64_t tag, void* buf, size_t bytes, RequestId* out) {
    auto req = std::make_unique<Req>();
    Req* r = req.get();
    r->peer = peer;
    r->is_send = is_send;
    r->bytes = bytes;
    r->owner = this;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = r;
    ucs_status_ptr_t sp;
    if (is_send) {
      p.cb.send = &UcxTransport::OnSend;
      sp = ucp_tag_send_nbx(eps_[static_cast<size_t>(peer)], buf, bytes, tag, &p);
    } else {
      // Always through the callback: it is the one place that reads the received length.
      p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.cb.recv = &UcxTransport::OnRecv;
      sp = ucp_tag_recv_nbx(worker_, buf, bytes, tag, kFullMask, &p);
    }
    if (UCS_PTR_IS_ERR(sp))
      return Error(STRIA_ERROR_TRANSPORT, "posting a %s %s rank %d failed: %s", is_send ? "send" : "receive",
                   is_send ? "to" : "from", peer, ucs_status_string(UCS_PTR_STATUS(sp)));
    if (sp == nullptr) {  // a send done at once
      r->state = State::kDone;
      r->received = bytes;
    } else {
      r->ucp = sp;
    }
    const RequestId id = next_id_++;
    reqs_.emplace(id, std::move(req));
    *out = id;
    Kick();
    return Status::Ok();
  }

  // Forgets a request whose outcome no longer matters (its wait was abandoned after an error).
  void Forget(RequestId id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reqs_.find(id);
    if (it != reqs_.end() && it->second->state != State::kPending) reqs_.erase(it);
  }

  static void Complete(Req* r, ucs_status_t status, size_t received) {
    r->ucp = nullptr;
    r->status = status;
    r->received = received;
    r->state = status == UCS_OK ? State::kDone : State::kFailed;
  }
  static void OnSend(void* request, ucs_status_t status, void* user) {
    auto* r = static_cast<Req*>(user);
    Complete(r, status, r->bytes);
    ucp_request_free(request);
    r->owner->cv_.notify_all();
  }
  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
    auto* r = static_cast<Req*>(user);
    Complete(r, status, info != nullptr && status == UCS_OK ? info->length : 0);
    ucp_request_free(request);
    r->owner->OnReceived(r);
    r->owner->cv_.notify_all();
  }
  static void OnPeerError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* p = static_cast<PeerArg*>(arg);
    std::string& why = p->self->gone_[static_cast<size_t>(p->rank)];
    if (why.empty()) why = Format("is unreachable: its connection failed (%s)", ucs_status_string(status));
    p->self->cv_.notify_all();
  }
  // Called under mu_ from the progress: a completed "bye" means that peer has left.
  void OnReceived(Req* r) {
    if (r->state != State::kDone) return;
    for (RequestId b : bye_reqs_) {
      auto it = reqs_.find(b);
      if (it != reqs_.end() && it->second.get() == r) {
        std::string& why = gone_[static_cast<size_t>(r->peer)];
        if (why.empty()) {
          std::string text;
          const char* in = bye_in_[static_cast<size_t>(r->peer)].data();
          for (size_t i = 0; i < r->received && i < kByeBytes && in[i] != 0; ++i)
            text += in[i] >= ' ' && in[i] < 127 ? in[i] : '?';
          why =
              "left the group (" + (text.empty() ? std::string("it failed, was aborted or was destroyed") : text) + ")";
          gone_after_error_[static_cast<size_t>(r->peer)] = text.rfind(kByeAfterError, 0) == 0;
        }
      }
    }
  }

  void SayByeLocked() {
    if (said_bye_ || eps_.empty()) return;
    said_bye_ = true;
    bye_text_ = !first_error_.empty() ? kByeAfterError + first_error_
                : aborted_.load()     ? std::string("stria_context_abort")
                                      : std::string("its context was destroyed");
    if (bye_text_.size() >= kByeBytes) bye_text_.resize(kByeBytes - 1);
    for (int q = 0; q < world_; ++q) {
      if (q == rank_ || !gone_[static_cast<size_t>(q)].empty()) continue;
      RequestId id = 0;
      (void)PostLocked(q, true, WireTag(rank_, kByeTag), bye_text_.data(), bye_text_.size() + 1, &id);
    }
  }

  void Kick() {
    if (wake_fd_ >= 0) {
      const uint64_t one = 1;
      ssize_t n = write(wake_fd_, &one, sizeof one);
      (void)n;
    }
  }

  void ProgressLoop() {
    for (;;) {
      unsigned worked = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        while (ucp_worker_progress(worker_) != 0) ++worked;
        if (worked == 0 && worker_fd_ >= 0) {
          const ucs_status_t st = ucp_worker_arm(worker_);
          if (st == UCS_ERR_BUSY) worked = 1;                       // events arrived meanwhile
          if (st != UCS_OK && st != UCS_ERR_BUSY) worker_fd_ = -1;  // cannot sleep on it: poll
        }
      }
      if (worked) {
        cv_.notify_all();
        continue;
      }
      // Sleep until UCX or a poster has something for us. Transports that cannot signal are
      // polled every 50 us instead (cheap next to a K/V block, and only while idle).
      pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {worker_fd_, POLLIN, 0}};
      const timespec nap = worker_fd_ >= 0 ? timespec{0, 2000000} : timespec{0, 50000};
      ppoll(fds, worker_fd_ >= 0 ? 2 : 1, &nap, nullptr);
      uint64_t drain = 0;
      ssize_t n = read(wake_fd_, &drain, sizeof drain);
      (void)n;
    }
  }

  // Drives UCX requests to completion from the calling thread (used once the progress thread stopped).
  void ProgressUntil(void* ucp_request, double seconds) {
    const auto deadline = DeadlineAfter(seconds);
    while (ucp_request_check_status(ucp_request) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker_);
  }

  void Shutdown() {
    if (worker_ != nullptr && progress_.joinable()) {
      // A rank that failed or was aborted has said bye already. One that ends normally does not:
      // its peers are ending too, and would only log our bye as an unexpected message. Should a
      // peer still call, it learns from UCX that our endpoint closed.
      // Give the byes and any last sends a moment to leave before the endpoints close.
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(aborted_.load() ? 200 : 1000), [&] {
          for (auto& [id, r] : reqs_)
            if (r->is_send && r->state == State::kPending) return false;
          return true;
        });
        stop_ = true;
      }
      Kick();
      progress_.join();
    }
    if (worker_ != nullptr) {
      for (auto& [id, r] : reqs_)
        if (r->state == State::kPending && !r->is_send && r->ucp != nullptr) ucp_request_cancel(worker_, r->ucp);
      for (ucp_ep_h ep : eps_) {
        if (ep == nullptr) continue;
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = aborted_.load() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &p);
        if (sp != nullptr && !UCS_PTR_IS_ERR(sp)) {
          ProgressUntil(sp, 1.0);
          if (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            // A flush that a dead peer never acknowledges: close by force instead.
            ucp_request_cancel(worker_, sp);
            ProgressUntil(sp, 1.0);
          }
          ucp_request_free(sp);
        }
      }
      eps_.clear();
      for (int i = 0; i < 100; ++i) ucp_worker_progress(worker_);
      ucp_worker_destroy(worker_);  // may still call back into requests: free them after
      worker_ = nullptr;
      reqs_.clear();
    }
    if (context_ != nullptr) ucp_cleanup(context_);
    context_ = nullptr;
    if (wake_fd_ >= 0) close(wake_fd_);
    wake_fd_ = -1;
  }

  const int rank_, world_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_fd_ = -1, wake_fd_ = -1;
  std::vector<ucp_ep_h> eps_;
  std::vector<PeerArg> peer_args_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<RequestId, std::unique_ptr<Req>> reqs_;
  std::vector<RequestId> bye_reqs_;
  std::vector<std::array<char, kByeBytes>> bye_in_;
  std::string bye_text_, first_error_;
  std::vector<std::string> gone_;  // why each peer is gone; empty while it is fine
  // Peers whose bye said they left after an error of their own call (see Transport::LeaveAfterError).
  std::vector<char> gone_after_error_;
  std::atomic<bool> aborted_{false};
  bool said_bye_ = false, stop_ = false;
  RequestId next_id_ = 1;
  uint64_t round_ = 0;
  std::thread progress_;
};

Status UcxGetUniqueId(stria_unique_id_t* out) {
  RendezvousId id;
  STRIA_RETURN_IF_ERROR(OpenRendezvous(&id));
  EncodeId(id, out);
  return Status::Ok();
}

Status UcxCreate(const stria_context_config_t& config, void* /*nccl_comm: always NULL here*/, double timeout_s,
                 Transport** out) {
  if (RawEnum(config.device.device_type) != kDLCPU)
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "the UCX transport carries host memory; GPU contexts across processes use STRIA_TRANSPORT_NCCL");
  if (static_cast<size_t>(config.world_size) > kMaxWorld)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "world_size %d exceeds the UCX transport's limit of %zu",
                 config.world_size, kMaxWorld);
  RendezvousId id;
  STRIA_RETURN_IF_ERROR(ResolveId(config.unique_id, config.world_size, &id));
  auto t = std::make_unique<UcxTransport>(config.rank, config.world_size);
  Bytes address;
  STRIA_RETURN_IF_ERROR(t->Init(&address));
  std::vector<Bytes> table;
  if (config.rank == 0)
    STRIA_RETURN_IF_ERROR(ServeRendezvous(id, config.world_size, address, timeout_s, nullptr, &table));
  else
    STRIA_RETURN_IF_ERROR(JoinRendezvous(id, config.rank, config.world_size, address, timeout_s, nullptr, &table));
  STRIA_RETURN_IF_ERROR(t->Connect(table));
  *out = t.release();
  return Status::Ok();
}

}  // namespace
}  // namespace stria

extern "C" __attribute__((visibility("default"))) const stria::TransportModule stria_ucx_module_v4 = {
    stria::kTransportModuleAbiVersion, "ucx", &stria::UcxGetUniqueId, &stria::UcxCreate};

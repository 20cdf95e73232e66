// Small blocking-with-deadline TCP helpers for the rendezvous. Every call takes a deadline and
// an optional abort flag, and polls in short slices, so nothing here can hang a rank.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/status.h"
#include "transport/rendezvous/wire.h"

namespace stria {

using Deadline = SteadyClock::time_point;  // from DeadlineAfter (core/deadline.h)
double SecondsLeft(Deadline d);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset();
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Binds and listens on host:port (port 0: the kernel picks; *bound gets it). A host that is not
// an address of this machine falls back to every interface on that port.
Status Listen(const std::string& host, uint16_t port, Fd* out, uint16_t* bound);
// Connects, retrying refused connections until the deadline (rank 0 may not be up yet).
Status Connect(const std::string& host, uint16_t port, Deadline deadline, const std::atomic<bool>* abort, Fd* out);
Status SendAll(int fd, const Bytes& bytes, Deadline deadline, const std::atomic<bool>* abort, const char* peer);
// Reads one frame whose payload is at most max_payload.
Status RecvFrame(int fd, size_t max_payload, Deadline deadline, const std::atomic<bool>* abort, const char* peer,
                 FrameHeader* header, Bytes* payload);
// A numeric address of this host that other hosts can reach (first non-loopback IPv4), else
// 127.0.0.1.
std::string HostAddress();

}  // namespace stria

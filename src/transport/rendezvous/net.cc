#include "transport/rendezvous/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace stria {
namespace {

constexpr int kSliceMs = 50;  // how often a blocked call looks at its abort flag

bool Aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load();
}

Status AbortedError(const char* what) {
  return Error(STRIA_ERROR_ABORTED, "aborted (stria_context_abort) during %s", what);
}

// Waits until fd is ready for `events`, in slices; fails on the deadline or abort.
Status WaitReady(int fd, short events, Deadline deadline, const std::atomic<bool>* abort, const char* what) {
  for (;;) {
    if (Aborted(abort)) return AbortedError(what);
    const double left = SecondsLeft(deadline);
    if (left <= 0) return Error(STRIA_ERROR_TIMEOUT, "timed out during %s", what);
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<double>(kSliceMs, left * 1000 + 1));
    const int r = poll(&p, 1, ms);
    if (r > 0) return Status::Ok();
    if (r < 0 && errno != EINTR)
      return Error(STRIA_ERROR_TRANSPORT, "poll failed during %s: %s", what, strerror(errno));
  }
}

Status Resolve(const std::string& host, uint16_t port, bool passive, addrinfo** out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, out);
  if (rc != 0)
    return Error(STRIA_ERROR_TRANSPORT, "cannot resolve rendezvous host '%s': %s", host.c_str(), gai_strerror(rc));
  return Status::Ok();
}

Status BindListen(const addrinfo* ai, Fd* out, uint16_t* bound) {
  Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
  if (!fd.valid()) return Error(STRIA_ERROR_TRANSPORT, "socket failed: %s", strerror(errno));
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) return Error(STRIA_ERROR_TRANSPORT, "%s", strerror(errno));
  if (listen(fd.get(), 512) != 0) return Error(STRIA_ERROR_TRANSPORT, "listen failed: %s", strerror(errno));
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
  *bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  *out = std::move(fd);
  return Status::Ok();
}

}  // namespace

double SecondsLeft(Deadline d) {
  return std::chrono::duration<double>(d - std::chrono::steady_clock::now()).count();
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

Status Listen(const std::string& host, uint16_t port, Fd* out, uint16_t* bound) {
  addrinfo* ai = nullptr;
  STRIA_RETURN_IF_ERROR(Resolve(host, port, true, &ai));
  std::string errors;
  Status s;
  for (const addrinfo* a = ai; a != nullptr; a = a->ai_next) {
    s = BindListen(a, out, bound);
    if (s.ok()) break;
    errors += (errors.empty() ? "" : "; ") + s.message();
  }
  freeaddrinfo(ai);
  if (s.ok()) return s;
  // The id may name this host by an address we cannot bind (NAT, a DNS name of a load balancer):
  // then listen on every interface at that port.
  if (!host.empty() && port != 0) {
    addrinfo* any = nullptr;
    STRIA_RETURN_IF_ERROR(Resolve("", port, true, &any));
    s = BindListen(any, out, bound);
    freeaddrinfo(any);
    if (s.ok()) return s;
    errors += "; any interface: " + s.message();
  }
  return Error(STRIA_ERROR_TRANSPORT, "cannot listen for the rendezvous on %s:%u (%s)", host.c_str(), port,
               errors.c_str());
}

Status Connect(const std::string& host, uint16_t port, Deadline deadline, const std::atomic<bool>* abort, Fd* out) {
  const std::string what = Format("connecting to rank 0's rendezvous at %s:%u", host.c_str(), port);
  std::string last = "no address";
  bool have_reason = false;  // `last` says why an attempt failed
  int backoff_ms = 10;
  for (;;) {
    if (Aborted(abort)) return AbortedError(what.c_str());
    addrinfo* ai = nullptr;
    Status r = Resolve(host, port, false, &ai);
    if (r.ok()) {
      for (const addrinfo* a = ai; a != nullptr; a = a->ai_next) {
        Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (!fd.valid()) continue;
        int err = connect(fd.get(), a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
        if (err == EINPROGRESS) {
          if (!WaitReady(fd.get(), POLLOUT, deadline, abort, what.c_str()).ok()) {
            // Out of time (or aborted) with this connect still pending. EINPROGRESS is no reason:
            // keep the one an earlier attempt gave (e.g. "Connection refused").
            if (!have_reason) last = "no answer before the deadline";
            continue;
          }
          // The connect completed: its outcome is the socket's pending error.
          socklen_t len = sizeof err;
          if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
        if (err == 0) {
          const int one = 1;
          setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          freeaddrinfo(ai);
          *out = std::move(fd);
          return Status::Ok();
        }
        last = strerror(err);
        have_reason = true;
      }
      freeaddrinfo(ai);
    } else {
      last = r.message();
      have_reason = true;
    }
    if (SecondsLeft(deadline) <= 0)
      return Error(STRIA_ERROR_TIMEOUT, "timed out %s (last error: %s); is rank 0 running?", what.c_str(),
                   last.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

Status SendAll(int fd, const Bytes& bytes, Deadline deadline, const std::atomic<bool>* abort, const char* peer) {
  size_t done = 0;
  const std::string what = Format("sending to %s", peer);
  while (done < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      STRIA_RETURN_IF_ERROR(WaitReady(fd, POLLOUT, deadline, abort, what.c_str()));
      continue;
    }
    return Error(STRIA_ERROR_TRANSPORT, "the connection to %s broke: %s", peer, strerror(errno));
  }
  return Status::Ok();
}

namespace {

Status RecvExact(int fd, uint8_t* p, size_t n, Deadline deadline, const std::atomic<bool>* abort, const char* peer) {
  const std::string what = Format("waiting for %s", peer);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return Error(STRIA_ERROR_TRANSPORT, "%s closed the connection", peer);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      STRIA_RETURN_IF_ERROR(WaitReady(fd, POLLIN, deadline, abort, what.c_str()));
      continue;
    }
    return Error(STRIA_ERROR_TRANSPORT, "the connection to %s broke: %s", peer, strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Status RecvFrame(int fd, size_t max_payload, Deadline deadline, const std::atomic<bool>* abort, const char* peer,
                 FrameHeader* header, Bytes* payload) {
  uint8_t h[kFrameHeaderBytes];
  STRIA_RETURN_IF_ERROR(RecvExact(fd, h, sizeof h, deadline, abort, peer));
  STRIA_RETURN_IF_ERROR(ParseFrameHeader(h, sizeof h, max_payload, header));
  payload->resize(header->length);
  return RecvExact(fd, payload->data(), payload->size(), deadline, abort, peer);
}

std::string HostAddress() {
  ifaddrs* list = nullptr;
  std::string found = "127.0.0.1";
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char buf[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf)) {
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace stria

#include "transport/rendezvous/rendezvous.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace stria {
namespace {

constexpr double kHandshakeS = 10;     // an accepted connection must JOIN within this
constexpr size_t kMaxRejectNotes = 8;  // rejections quoted in a timeout message
constexpr double kClientGraceS = 2;

// Listeners opened by stria_get_unique_id, waiting for this process's rank 0 (keyed by secret).
struct ListenerRegistry {
  std::mutex mu;
  std::map<std::string, Fd> open;
};
ListenerRegistry& Listeners() {
  static ListenerRegistry* r = new ListenerRegistry();  // never destroyed: no exit-time ordering
  return *r;
}
std::string Key(const RendezvousId& id) {
  return std::string(reinterpret_cast<const char*>(id.secret), kSecretBytes);
}

uint64_t SocketInode(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// The listener another stria module of this process opened for this id (stria_get_unique_id is
// served by one module, the context may be another's): found among this process's descriptors by
// its socket inode, which the id carries. *out gets a duplicate; the other module keeps its own.
bool AdoptListener(uint64_t inode, Fd* out) {
  if (inode == 0) return false;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir) || SocketInode(static_cast<int>(fd)) != inode) continue;
    // Checked again on the duplicate: the number may have been closed and reused meanwhile.
    Fd dup(fcntl(static_cast<int>(fd), F_DUPFD_CLOEXEC, 0));
    int listening = 0;
    socklen_t len = sizeof listening;
    if (dup.valid() && SocketInode(dup.get()) == inode &&
        getsockopt(dup.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening) {
      *out = std::move(dup);
      found = true;
    }
    break;
  }
  closedir(dir);
  return found;
}

// *shared: the listening socket is also held by another module (see AdoptListener).
Status TakeListener(const RendezvousId& id, Fd* out, bool* shared) {
  *shared = false;
  {
    ListenerRegistry& reg = Listeners();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto it = reg.open.find(Key(id));
    if (it != reg.open.end()) {
      *out = std::move(it->second);
      reg.open.erase(it);
      return Status::Ok();
    }
  }
  if (AdoptListener(id.listener, out)) {
    *shared = true;
    return Status::Ok();
  }
  uint16_t bound = 0;
  return Listen(id.host, id.port, out, &bound);
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return Format("%s:%u", host, port);
}

struct Conn {
  Fd fd;
  std::string peer;
  Nonce nonce{};
  Nonce client_nonce{};
  Bytes in;
  int rank = -1;  // set once its JOIN is accepted
  Deadline handshake_deadline;
};

class Server {
 public:
  Server(const RendezvousId& id, int world, double timeout_s, const std::atomic<bool>* abort)
      : id_(id), world_(world), timeout_s_(timeout_s), abort_(abort), deadline_(DeadlineAfter(timeout_s)) {}

  Status Run(int listener, Bytes own, const std::function<Status(std::vector<Bytes>*)>& complete,
             std::vector<Bytes>* table) {
    blobs_.assign(static_cast<size_t>(world_), Bytes());
    holder_.assign(static_cast<size_t>(world_), nullptr);
    blobs_[0] = std::move(own);
    int joined = 1;
    while (joined < world_) {
      if (abort_ != nullptr && abort_->load())
        return FailAll(Error(STRIA_ERROR_ABORTED, "rank 0 was aborted (stria_context_abort) during the rendezvous"));
      if (SecondsLeft(deadline_) <= 0) return FailAll(TimeoutError());
      std::vector<pollfd> fds{{listener, POLLIN, 0}};
      for (auto& c : conns_) fds.push_back({c->fd.get(), POLLIN, 0});
      const int r = poll(fds.data(), fds.size(), 50);
      if (r < 0 && errno != EINTR)
        return FailAll(Error(STRIA_ERROR_TRANSPORT, "poll failed in the rendezvous: %s", strerror(errno)));
      if (r > 0 && (fds[0].revents & POLLIN)) Accept(listener);
      // Read from the connections that were polled (accepted ones come next round).
      for (size_t i = 1; i < fds.size(); ++i) {
        Conn& c = *conns_[i - 1];
        if (fds[i].revents != 0) Read(c);
        if (c.fd.valid() && c.rank < 0 && SecondsLeft(c.handshake_deadline) <= 0)
          Reject(c, Format("no JOIN within %.0f s of connecting", kHandshakeS));
      }
      // Drop closed connections; a rank that left before the ring formed must come again.
      for (auto it = conns_.begin(); it != conns_.end();) {
        if ((*it)->fd.valid()) {
          ++it;
          continue;
        }
        it = conns_.erase(it);
      }
      joined = 1;
      for (int q = 1; q < world_; ++q) joined += holder_[static_cast<size_t>(q)] != nullptr;
    }
    if (complete) {
      const Status s = complete(&blobs_);
      if (!s.ok()) return FailAll(s);
    }
    for (int q = 1; q < world_; ++q) {
      Conn& c = *holder_[static_cast<size_t>(q)];
      Status s = SendAll(c.fd.get(), EncodeTable(id_.secret, c.client_nonce, blobs_), deadline_, abort_,
                         Format("rank %d (%s)", q, c.peer.c_str()).c_str());
      if (!s.ok()) return FailAll(Status(s.code(), Format("sending the ring table to rank %d: ", q) + s.message()));
    }
    *table = blobs_;
    return Status::Ok();
  }

 private:
  void Accept(int listener) {
    for (;;) {
      Fd fd(accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) return;
      auto c = std::make_unique<Conn>();
      c->fd = std::move(fd);
      c->peer = PeerName(c->fd.get());
      c->handshake_deadline = DeadlineAfter(kHandshakeS);
      // Bound the number of connections that have not joined: a flood cannot exhaust memory.
      size_t pending = 0;
      for (auto& o : conns_) pending += o->rank < 0;
      if (pending >= static_cast<size_t>(world_) + 64) {
        Note(c->peer + ": too many unauthenticated connections");
        continue;
      }
      if (!RandomBytes(c->nonce.data(), kNonceBytes).ok()) continue;
      const Bytes hello = EncodeChallenge(c->nonce);
      if (send(c->fd.get(), hello.data(), hello.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(hello.size()))
        continue;
      conns_.push_back(std::move(c));
    }
  }

  void Read(Conn& c) {
    uint8_t buf[4096];
    for (;;) {
      const ssize_t n = recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (c.rank >= 0) return Reject(c, Format("rank %d sent bytes after its JOIN", c.rank));
        c.in.insert(c.in.end(), buf, buf + n);
        if (c.in.size() > kFrameHeaderBytes + kMaxJoinBytes) return Reject(c, "a JOIN longer than the limit");
        continue;
      }
      if (n == 0) {
        if (c.rank < 0) TryParse(c, /*eof=*/true);
        return Drop(c, "disconnected before the ring formed");
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Drop(c, Format("connection broke: %s", strerror(errno)));
      break;
    }
    TryParse(c, false);
  }

  void TryParse(Conn& c, bool eof) {
    if (c.rank >= 0 || !c.fd.valid()) return;
    if (c.in.size() < kFrameHeaderBytes) {
      if (eof) Note(c.peer + (c.in.empty() ? ": connected and left without a word" : ": a truncated frame"));
      return;
    }
    FrameHeader h{};
    Status s = ParseFrameHeader(c.in.data(), c.in.size(), kMaxJoinBytes, &h);
    if (!s.ok()) return Reject(c, s.message());
    if (h.type != MsgType::kJoin)
      return Reject(c, Format("expected a JOIN message, got %s", MsgTypeName(static_cast<uint16_t>(h.type))));
    if (c.in.size() < kFrameHeaderBytes + h.length) {
      if (eof) Note(c.peer + ": a truncated JOIN");
      return;
    }
    if (c.in.size() > kFrameHeaderBytes + h.length) return Reject(c, "bytes after the JOIN");
    JoinMsg m;
    s = DecodeJoin(c.in.data() + kFrameHeaderBytes, h.length, &m);
    if (!s.ok()) return Reject(c, s.message());
    if (m.world != world_)
      return Reject(c, Format("it joins a world of %d, this job's world_size is %d", m.world, world_));
    if (m.rank < 1 || m.rank >= world_) return Reject(c, Format("rank %d is out of range 1..%d", m.rank, world_ - 1));
    if (JoinMac(id_.secret, c.nonce, m) != m.mac) return Reject(c, "wrong secret (not a rank of this job)");
    if (holder_[static_cast<size_t>(m.rank)] != nullptr)
      return Reject(c, Format("rank %d has already joined (two processes with the same rank?)", m.rank));
    c.rank = m.rank;
    c.client_nonce = m.client_nonce;
    blobs_[static_cast<size_t>(m.rank)] = std::move(m.blob);
    holder_[static_cast<size_t>(m.rank)] = &c;
    c.in.clear();
  }

  // Closes a connection; a rank that had joined must come again.
  void Drop(Conn& c, const std::string& why) {
    if (c.rank >= 0) {
      Note(Format("rank %d (%s) %s", c.rank, c.peer.c_str(), why.c_str()));
      holder_[static_cast<size_t>(c.rank)] = nullptr;
      c.rank = -1;
    }
    c.fd.reset();
  }

  void Reject(Conn& c, const std::string& why) {
    Note(c.peer + ": " + why);
    if (c.fd.valid()) {
      const Bytes e = EncodeError("rank 0 refused this connection: " + why);
      send(c.fd.get(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (c.rank >= 0) holder_[static_cast<size_t>(c.rank)] = nullptr;
    c.rank = -1;
    c.fd.reset();
  }

  void Note(const std::string& what) {
    ++rejected_;
    if (notes_.size() < kMaxRejectNotes) notes_.push_back(what);
  }

  Status TimeoutError() const {
    std::string missing;
    int count = 0;
    for (int q = 1; q < world_; ++q) {
      if (holder_[static_cast<size_t>(q)] != nullptr) continue;
      if (count++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    }
    if (count > 16) missing += Format(" and %d more", count - 16);
    std::string msg = Format("timed out after %.3g s waiting for rank(s) %s to join the rendezvous at %s:%u",
                             timeout_s_, missing.c_str(), id_.host.c_str(), id_.port);
    if (rejected_ > 0) {
      msg += Format("; refused %d connection(s):", rejected_);
      for (const std::string& n : notes_) msg += " [" + n + "]";
    }
    return Status(STRIA_ERROR_TIMEOUT, msg);
  }

  // Tells every joined rank why the ring will not form, so it fails now rather than at its timeout.
  Status FailAll(Status why) {
    const Bytes e = EncodeError(why.message());
    for (auto& c : conns_)
      if (c->fd.valid() && c->rank >= 0) send(c->fd.get(), e.data(), e.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    return why;
  }

  const RendezvousId& id_;
  const int world_;
  const double timeout_s_;
  const std::atomic<bool>* abort_;
  const Deadline deadline_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Bytes> blobs_;
  std::vector<Conn*> holder_;  // holder_[r]: the connection of joined rank r
  std::vector<std::string> notes_;
  int rejected_ = 0;
};

// Rank 0 answered with an ERROR frame: its text is the reason.
Status RefusedBy(const std::string& root, const Bytes& payload) {
  std::string text;
  (void)DecodeError(payload.data(), payload.size(), &text);
  return Error(STRIA_ERROR_TRANSPORT, "%s: %s", root.c_str(), text.c_str());
}

}  // namespace

Status OpenRendezvous(RendezvousId* id) {
  std::string host;
  uint16_t port = 0;
  bool set = false;
  STRIA_RETURN_IF_ERROR(RootFromEnvironment(&set, &host, &port));
  Fd fd;
  uint16_t bound = 0;
  // Without STRIA_ROOT: every interface, a port the kernel picks, and this host's address in the id.
  STRIA_RETURN_IF_ERROR(Listen(host, port, &fd, &bound));
  id->host = host.empty() ? HostAddress() : host;
  id->port = bound;
  STRIA_RETURN_IF_ERROR(RandomBytes(id->secret, kSecretBytes));
  id->listener = SocketInode(fd.get());
  ListenerRegistry& reg = Listeners();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.open[Key(*id)] = std::move(fd);
  return Status::Ok();
}

Status ResolveId(const stria_unique_id_t& given, int world_size, RendezvousId* out) {
  if (IsZeroId(given)) return IdFromEnvironment(world_size, out);
  return DecodeId(given, out);
}

// Closes this process's listener for id, if it has one: the registry's, or another module's
// (stopped through a duplicate, which shuts the socket down for both holders).
void ReleaseListener(const RendezvousId& id) {
  {
    ListenerRegistry& reg = Listeners();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (reg.open.erase(Key(id)) > 0) return;
  }
  Fd adopted;
  if (AdoptListener(id.listener, &adopted)) shutdown(adopted.get(), SHUT_RDWR);
}

void ReleaseUnusedRendezvous(const stria_unique_id_t& given) {
  RendezvousId id;
  if (!IsZeroId(given) && DecodeId(given, &id).ok()) ReleaseListener(id);
}

Status ServeRendezvous(const RendezvousId& id, int world_size, const Bytes& own, double timeout_s,
                       const std::atomic<bool>* abort, std::vector<Bytes>* table) {
  return ServeRendezvous(id, world_size, own, nullptr, timeout_s, abort, table);
}

Status ServeRendezvous(const RendezvousId& id, int world_size, Bytes own,
                       const std::function<Status(std::vector<Bytes>* table)>& complete, double timeout_s,
                       const std::atomic<bool>* abort, std::vector<Bytes>* table) {
  if (world_size == 1) {
    ReleaseListener(id);
    *table = {std::move(own)};
    return complete ? complete(table) : Status::Ok();
  }
  Fd listener;
  bool shared = false;
  STRIA_RETURN_IF_ERROR(TakeListener(id, &listener, &shared));
  Server server(id, world_size, timeout_s, abort);
  Status s = server.Run(listener.get(), std::move(own), complete, table);
  // The id is used up. A listener shared with another module would stay open (and queue
  // connections nobody answers) until that module's table goes: stop it for both.
  if (shared) shutdown(listener.get(), SHUT_RDWR);
  return s;
}

Status JoinRendezvous(const RendezvousId& id, int rank, int world_size, const Bytes& blob, double timeout_s,
                      const std::atomic<bool>* abort, std::vector<Bytes>* table) {
  // A little longer than rank 0's own wait: when a rank is missing, rank 0 gives up first and
  // tells everyone which rank it was, which is a better message than a bare timeout here.
  const Deadline deadline = DeadlineAfter(timeout_s + kClientGraceS);
  const std::string root = Format("rank 0's rendezvous at %s:%u", id.host.c_str(), id.port);
  Fd fd;
  STRIA_RETURN_IF_ERROR(Connect(id.host, id.port, deadline, abort, &fd));
  FrameHeader h{};
  Bytes payload;
  Status s = RecvFrame(fd.get(), kMaxErrorBytes, deadline, abort, root.c_str(), &h, &payload);
  if (!s.ok()) return Status(s.code(), Format("rank %d joining: ", rank) + s.message());
  if (h.type == MsgType::kError) return RefusedBy(root, payload);
  if (h.type != MsgType::kChallenge)
    return Error(STRIA_ERROR_TRANSPORT, "%s sent %s where a CHALLENGE was due", root.c_str(),
                 MsgTypeName(static_cast<uint16_t>(h.type)));
  Nonce server_nonce{};
  STRIA_RETURN_IF_ERROR(DecodeChallenge(payload.data(), payload.size(), &server_nonce));
  JoinMsg m;
  m.rank = rank;
  m.world = world_size;
  STRIA_RETURN_IF_ERROR(RandomBytes(m.client_nonce.data(), kNonceBytes));
  m.blob = blob;
  m.mac = JoinMac(id.secret, server_nonce, m);
  STRIA_RETURN_IF_ERROR(SendAll(fd.get(), EncodeJoin(m), deadline, abort, root.c_str()));
  s = RecvFrame(fd.get(), kMaxTableBytes, deadline, abort, root.c_str(), &h, &payload);
  if (!s.ok()) {
    if (s.code() == STRIA_ERROR_TIMEOUT)
      return Error(STRIA_ERROR_TIMEOUT,
                   "rank %d timed out after %.3g s waiting for %s to hand out the ring table (rank 0 still waits for "
                   "another rank, or is stuck)",
                   rank, timeout_s + kClientGraceS, root.c_str());
    return Status(s.code(), Format("rank %d joining: ", rank) + s.message());
  }
  if (h.type == MsgType::kError) return RefusedBy(root, payload);
  if (h.type != MsgType::kTable)
    return Error(STRIA_ERROR_TRANSPORT, "%s sent %s where the TABLE was due", root.c_str(),
                 MsgTypeName(static_cast<uint16_t>(h.type)));
  return DecodeTable(payload.data(), payload.size(), id.secret, m.client_nonce, world_size, table);
}

}  // namespace stria

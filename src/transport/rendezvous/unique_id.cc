#include "transport/rendezvous/unique_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "transport/rendezvous/siphash.h"

namespace stria {
namespace {

// Byte layout of the 128 bytes: "STRI", format version, host length, port (big-endian),
// secret, host (NUL-padded), zeros, and in the last 8 bytes the listener's socket inode
// (big-endian; zero when none). Readers of the first version ignore those bytes.
constexpr char kMagic[4] = {'S', 'T', 'R', 'I'};
constexpr uint8_t kIdVersion = 1;
constexpr size_t kSecretAt = 8, kHostAt = kSecretAt + kSecretBytes;
constexpr size_t kListenerAt = sizeof(stria_unique_id_t) - 8;
static_assert(kHostAt + kMaxHostBytes + 1 <= kListenerAt, "the id must fit in 128 bytes");

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void EncodeId(const RendezvousId& id, stria_unique_id_t* out) {
  auto* b = reinterpret_cast<uint8_t*>(out->internal);
  std::memset(b, 0, sizeof out->internal);
  std::memcpy(b, kMagic, 4);
  b[4] = kIdVersion;
  b[5] = static_cast<uint8_t>(id.host.size());
  b[6] = static_cast<uint8_t>(id.port >> 8);
  b[7] = static_cast<uint8_t>(id.port & 0xff);
  std::memcpy(b + kSecretAt, id.secret, kSecretBytes);
  std::memcpy(b + kHostAt, id.host.data(), id.host.size());
  for (size_t i = 0; i < 8; ++i) b[kListenerAt + i] = static_cast<uint8_t>(id.listener >> (56 - 8 * i));
}

Status DecodeId(const stria_unique_id_t& in, RendezvousId* out) {
  const auto* b = reinterpret_cast<const uint8_t*>(in.internal);
  if (std::memcmp(b, kMagic, 4) != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "config->unique_id is not a stria id (get it from stria_get_unique_id on rank 0, or leave it all "
                 "zero and set STRIA_ROOT=host:port)");
  if (b[4] != kIdVersion)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->unique_id has format version %d, this stria reads %d", b[4],
                 kIdVersion);
  const size_t host_len = b[5];
  if (host_len == 0 || host_len > kMaxHostBytes)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->unique_id names a host of %zu bytes (1..%zu)", host_len,
                 kMaxHostBytes);
  for (size_t i = 0; i < host_len; ++i) {
    const uint8_t c = b[kHostAt + i];
    if (c <= ' ' || c >= 127)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->unique_id's host name has a non-printable byte");
  }
  out->host.assign(reinterpret_cast<const char*>(b + kHostAt), host_len);
  out->port = static_cast<uint16_t>((b[6] << 8) | b[7]);
  if (out->port == 0) return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->unique_id names port 0");
  std::memcpy(out->secret, b + kSecretAt, kSecretBytes);
  out->listener = 0;
  for (size_t i = 0; i < 8; ++i) out->listener = (out->listener << 8) | b[kListenerAt + i];
  return Status::Ok();
}

bool IsZeroId(const stria_unique_id_t& id) {
  for (char c : id.internal)
    if (c != 0) return false;
  return true;
}

Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  std::string h, p;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "'%s' is not [address]:port", text.c_str());
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "'%s' is not host:port (IPv6: [address]:port)", text.c_str());
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  if (h.empty() || h.size() > kMaxHostBytes)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "the host in '%s' must have 1..%zu characters", text.c_str(),
                 kMaxHostBytes);
  for (char c : h)
    if (c <= ' ' || c >= 127)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "the host in '%s' has a space or control character", text.c_str());
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "the port in '%s' is not a number", text.c_str());
  const long v = std::strtol(p.c_str(), nullptr, 10);
  if (v < 1 || v > 65535)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "the port in '%s' is out of range 1..65535", text.c_str());
  *host = h;
  *port = static_cast<uint16_t>(v);
  return Status::Ok();
}

Status RootFromEnvironment(bool* set, std::string* host, uint16_t* port) {
  const char* root = std::getenv("STRIA_ROOT");
  *set = root != nullptr && *root != '\0';
  if (!*set) return Status::Ok();
  Status s = ParseHostPort(root, host, port);
  return s.ok() ? s : Status(s.code(), "STRIA_ROOT: " + s.message());
}

Status IdFromEnvironment(int world_size, RendezvousId* out) {
  bool set = false;
  STRIA_RETURN_IF_ERROR(RootFromEnvironment(&set, &out->host, &out->port));
  if (!set)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "config->unique_id is all zero and STRIA_ROOT is not set: either hand every rank the id from "
                 "stria_get_unique_id on rank 0, or set STRIA_ROOT=host:port (rank 0's address) on every rank");
  const char* secret = std::getenv("STRIA_SECRET");
  if (secret != nullptr && *secret != '\0') {
    if (std::strlen(secret) != 2 * kSecretBytes)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "STRIA_SECRET must be %zu hex digits (it has %zu characters)",
                   2 * kSecretBytes, std::strlen(secret));
    for (size_t i = 0; i < kSecretBytes; ++i) {
      const int hi = HexDigit(secret[2 * i]), lo = HexDigit(secret[2 * i + 1]);
      if (hi < 0 || lo < 0) return Error(STRIA_ERROR_INVALID_ARGUMENT, "STRIA_SECRET is not hexadecimal");
      out->secret[i] = static_cast<uint8_t>(hi * 16 + lo);
    }
    return Status::Ok();
  }
  // No secret given: derive one that every rank of this job computes alike.
  static const uint8_t kDerivationKey[kSecretBytes] = {'s', 't', 'r', 'i', 'a', '-', 'e', 'n',
                                                       'v', '-', 's', 'e', 'c', 'r', 'e', 't'};
  const std::string seed = Format("%s|%u|%d", out->host.c_str(), out->port, world_size);
  const uint64_t a = SipHash24(kDerivationKey, seed.data(), seed.size());
  const uint64_t b = SipHash24(kDerivationKey, &a, sizeof a);
  std::memcpy(out->secret, &a, 8);
  std::memcpy(out->secret + 8, &b, 8);
  return Status::Ok();
}

Status RandomBytes(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    const ssize_t n = getrandom(p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error(STRIA_ERROR_INTERNAL, "getrandom failed: %s", std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace stria

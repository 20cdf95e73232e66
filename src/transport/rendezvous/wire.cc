#include "transport/rendezvous/wire.h"

#include <cstring>

#include "transport/rendezvous/siphash.h"

namespace stria {
namespace {

constexpr uint8_t kMagic[4] = {'S', 'T', 'R', 'V'};
constexpr uint16_t kWireVersion = 1;

void Put16(Bytes* b, uint16_t v) {
  b->push_back(static_cast<uint8_t>(v >> 8));
  b->push_back(static_cast<uint8_t>(v));
}
void Put32(Bytes* b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b->push_back(static_cast<uint8_t>(v >> s));
}
void Put64(Bytes* b, uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) b->push_back(static_cast<uint8_t>(v >> s));
}
void PutBytes(Bytes* b, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  b->insert(b->end(), c, c + n);
}

// A bounds-checked reader: every Get fails instead of reading past the end.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool Get32(uint32_t* v) {
    if (n_ - at_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v = (*v << 8) | p_[at_++];
    return true;
  }
  bool Get64(uint64_t* v) {
    if (n_ - at_ < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v = (*v << 8) | p_[at_++];
    return true;
  }
  bool GetBytes(void* out, size_t k) {
    if (n_ - at_ < k) return false;
    std::memcpy(out, p_ + at_, k);
    at_ += k;
    return true;
  }
  bool GetBlob(size_t k, Bytes* out) {
    if (n_ - at_ < k) return false;
    out->assign(p_ + at_, p_ + at_ + k);
    at_ += k;
    return true;
  }
  size_t left() const { return n_ - at_; }
  size_t at() const { return at_; }

 private:
  const uint8_t* p_;
  size_t n_, at_ = 0;
};

Bytes Frame(MsgType type, const Bytes& payload) {
  Bytes b;
  b.reserve(kFrameHeaderBytes + payload.size());
  PutBytes(&b, kMagic, 4);
  Put16(&b, kWireVersion);
  Put16(&b, static_cast<uint16_t>(type));
  Put32(&b, static_cast<uint32_t>(payload.size()));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

Status Malformed(const char* what, const char* why) {
  return Error(STRIA_ERROR_TRANSPORT, "malformed rendezvous %s message: %s", what, why);
}

}  // namespace

const char* MsgTypeName(uint16_t type) {
  switch (type) {
    case 1:
      return "CHALLENGE";
    case 2:
      return "JOIN";
    case 3:
      return "TABLE";
    case 4:
      return "ERROR";
  }
  return "unknown";
}

Status ParseFrameHeader(const uint8_t* bytes, size_t n, size_t max_payload, FrameHeader* out) {
  if (n < kFrameHeaderBytes) return Malformed("frame", "shorter than its header");
  if (std::memcmp(bytes, kMagic, 4) != 0)
    return Error(STRIA_ERROR_TRANSPORT, "the peer does not speak the stria rendezvous protocol (bad magic)");
  const uint16_t version = static_cast<uint16_t>((bytes[4] << 8) | bytes[5]);
  if (version != kWireVersion)
    return Error(STRIA_ERROR_TRANSPORT, "the peer speaks rendezvous protocol version %u, this stria %u", version,
                 kWireVersion);
  const uint16_t type = static_cast<uint16_t>((bytes[6] << 8) | bytes[7]);
  if (type < 1 || type > 4) return Error(STRIA_ERROR_TRANSPORT, "unknown rendezvous message type %u", type);
  uint32_t length = 0;
  for (int i = 8; i < 12; ++i) length = (length << 8) | bytes[i];
  if (length > max_payload)
    return Error(STRIA_ERROR_TRANSPORT, "a rendezvous %s message of %u bytes exceeds the limit of %zu",
                 MsgTypeName(type), length, max_payload);
  out->type = static_cast<MsgType>(type);
  out->length = length;
  return Status::Ok();
}

Bytes EncodeChallenge(const Nonce& server_nonce) {
  Bytes p(server_nonce.begin(), server_nonce.end());
  return Frame(MsgType::kChallenge, p);
}

Status DecodeChallenge(const uint8_t* p, size_t n, Nonce* out) {
  if (n != kNonceBytes) return Malformed("CHALLENGE", "wrong length");
  std::memcpy(out->data(), p, kNonceBytes);
  return Status::Ok();
}

uint64_t JoinMac(const uint8_t secret[kSecretBytes], const Nonce& server_nonce, const JoinMsg& m) {
  Bytes b;
  PutBytes(&b, "join", 4);
  PutBytes(&b, server_nonce.data(), kNonceBytes);
  Put32(&b, static_cast<uint32_t>(m.rank));
  Put32(&b, static_cast<uint32_t>(m.world));
  PutBytes(&b, m.client_nonce.data(), kNonceBytes);
  PutBytes(&b, m.blob.data(), m.blob.size());
  return SipHash24(secret, b.data(), b.size());
}

Bytes EncodeJoin(const JoinMsg& m) {
  Bytes p;
  Put32(&p, static_cast<uint32_t>(m.rank));
  Put32(&p, static_cast<uint32_t>(m.world));
  PutBytes(&p, m.client_nonce.data(), kNonceBytes);
  Put64(&p, m.mac);
  PutBytes(&p, m.blob.data(), m.blob.size());
  return Frame(MsgType::kJoin, p);
}

Status DecodeJoin(const uint8_t* p, size_t n, JoinMsg* out) {
  if (n < kJoinFixedBytes) return Malformed("JOIN", "shorter than its fixed fields");
  if (n > kMaxJoinBytes) return Malformed("JOIN", "longer than the limit");
  Reader r(p, n);
  uint32_t rank = 0, world = 0;
  r.Get32(&rank);
  r.Get32(&world);
  r.GetBytes(out->client_nonce.data(), kNonceBytes);
  r.Get64(&out->mac);
  r.GetBlob(r.left(), &out->blob);
  out->rank = static_cast<int32_t>(rank);
  out->world = static_cast<int32_t>(world);
  return Status::Ok();
}

Bytes EncodeTable(const uint8_t secret[kSecretBytes], const Nonce& client_nonce, const std::vector<Bytes>& blobs) {
  Bytes body;
  Put32(&body, static_cast<uint32_t>(blobs.size()));
  for (const Bytes& blob : blobs) {
    Put32(&body, static_cast<uint32_t>(blob.size()));
    PutBytes(&body, blob.data(), blob.size());
  }
  Bytes signed_part;
  PutBytes(&signed_part, "table", 5);
  PutBytes(&signed_part, client_nonce.data(), kNonceBytes);
  signed_part.insert(signed_part.end(), body.begin(), body.end());
  Bytes p;
  Put64(&p, SipHash24(secret, signed_part.data(), signed_part.size()));
  p.insert(p.end(), body.begin(), body.end());
  return Frame(MsgType::kTable, p);
}

Status DecodeTable(const uint8_t* p, size_t n, const uint8_t secret[kSecretBytes], const Nonce& client_nonce, int world,
                   std::vector<Bytes>* out) {
  Reader r(p, n);
  uint64_t mac = 0;
  if (!r.Get64(&mac)) return Malformed("TABLE", "shorter than its mac");
  Bytes signed_part;
  PutBytes(&signed_part, "table", 5);
  PutBytes(&signed_part, client_nonce.data(), kNonceBytes);
  PutBytes(&signed_part, p + r.at(), r.left());
  if (SipHash24(secret, signed_part.data(), signed_part.size()) != mac)
    return Error(STRIA_ERROR_TRANSPORT,
                 "the rendezvous table is not signed with this job's secret (another job's rank 0 at that address?)");
  uint32_t count = 0;
  if (!r.Get32(&count)) return Malformed("TABLE", "no entry count");
  if (static_cast<int64_t>(count) != world)
    return Error(STRIA_ERROR_TRANSPORT, "the rendezvous table has %u entries for a world of %d", count, world);
  out->assign(count, Bytes());
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    if (!r.Get32(&len)) return Malformed("TABLE", "truncated entry length");
    if (len > kMaxBlobBytes) return Malformed("TABLE", "an entry exceeds the address limit");
    if (!r.GetBlob(len, &(*out)[i])) return Malformed("TABLE", "truncated entry");
  }
  if (r.left() != 0) return Malformed("TABLE", "trailing bytes");
  return Status::Ok();
}

Bytes EncodeError(const std::string& text) {
  const size_t n = text.size() < kMaxErrorBytes ? text.size() : kMaxErrorBytes;
  return Frame(MsgType::kError, Bytes(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(n)));
}

Status DecodeError(const uint8_t* p, size_t n, std::string* out) {
  if (n > kMaxErrorBytes) return Malformed("ERROR", "longer than the limit");
  out->clear();
  for (size_t i = 0; i < n; ++i) out->push_back(p[i] >= ' ' && p[i] < 127 ? static_cast<char>(p[i]) : '?');
  return Status::Ok();
}

}  // namespace stria

// The rendezvous protocol's messages and their byte encoding. Everything a peer sends is parsed
// here, with every length bounded before anything is allocated; nothing executable or
// serialized-object-like ever crosses the wire, only fixed fields and opaque byte strings (the
// transports' endpoint addresses).
//
// A frame is a 12-byte header {magic "STRV", version u16, type u16, payload length u32}, all
// big-endian, then the payload. The exchange, on one TCP connection per rank:
//   rank 0 → rank r   CHALLENGE {server nonce[16]}
//   rank r → rank 0   JOIN      {rank i32, world i32, client nonce[16], mac u64, blob}
//   rank 0 → rank r   TABLE     {mac u64, count u32, count × (length u32, blob)}   or ERROR {text}
// JOIN's mac = SipHash(secret, "join" ‖ server nonce ‖ rank ‖ world ‖ client nonce ‖ blob) proves
// the joiner knows the secret; TABLE's mac = SipHash(secret, "table" ‖ client nonce ‖ payload
// after the mac) proves the table comes from rank 0 of the same job.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "transport/rendezvous/unique_id.h"

namespace stria {

constexpr size_t kFrameHeaderBytes = 12;
constexpr size_t kNonceBytes = 16;
constexpr size_t kMaxBlobBytes = 64 * 1024;  // an endpoint address (UCX's are ~1 KiB)
constexpr int kMaxWorldSize = 1 << 16;
constexpr size_t kMaxErrorBytes = 1024;
constexpr size_t kJoinFixedBytes = 4 + 4 + kNonceBytes + 8;
constexpr size_t kMaxJoinBytes = kJoinFixedBytes + kMaxBlobBytes;
constexpr size_t kMaxTableBytes = size_t{256} << 20;  // bounds what a client accepts

enum class MsgType : uint16_t { kChallenge = 1, kJoin = 2, kTable = 3, kError = 4 };
const char* MsgTypeName(uint16_t type);

struct FrameHeader {
  MsgType type;
  uint32_t length;
};

// Checks magic, version and type, and that the length is at most max_payload.
Status ParseFrameHeader(const uint8_t* bytes, size_t n, size_t max_payload, FrameHeader* out);

using Bytes = std::vector<uint8_t>;
using Nonce = std::array<uint8_t, kNonceBytes>;

struct JoinMsg {
  int32_t rank = 0, world = 0;
  Nonce client_nonce{};
  uint64_t mac = 0;
  Bytes blob;
};

Bytes EncodeChallenge(const Nonce& server_nonce);
Status DecodeChallenge(const uint8_t* p, size_t n, Nonce* out);

uint64_t JoinMac(const uint8_t secret[kSecretBytes], const Nonce& server_nonce, const JoinMsg& m);
Bytes EncodeJoin(const JoinMsg& m);
Status DecodeJoin(const uint8_t* p, size_t n, JoinMsg* out);

// The table frame for one joiner (its mac binds the joiner's nonce).
Bytes EncodeTable(const uint8_t secret[kSecretBytes], const Nonce& client_nonce, const std::vector<Bytes>& blobs);
// Verifies the mac and that the table has `world` entries.
Status DecodeTable(const uint8_t* p, size_t n, const uint8_t secret[kSecretBytes], const Nonce& client_nonce, int world,
                   std::vector<Bytes>* out);

Bytes EncodeError(const std::string& text);
Status DecodeError(const uint8_t* p, size_t n, std::string* out);

}  // namespace stria

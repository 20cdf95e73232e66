// libFuzzer target: everything a peer can send to the rendezvous goes through these parsers.
// A crash, a leak, an out-of-bounds read (under ASan) or an accepted message that does not
// re-encode to the same bytes is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/rendezvous/unique_id.h"
#include "transport/rendezvous/wire.h"

using namespace stria;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The id a user hands us.
  if (size >= sizeof(stria_unique_id_t)) {
    stria_unique_id_t raw;
    std::memcpy(raw.internal, data, sizeof raw.internal);
    RendezvousId id;
    if (DecodeId(raw, &id).ok()) {
      stria_unique_id_t again;
      EncodeId(id, &again);
      RendezvousId id2;
      if (!DecodeId(again, &id2).ok() || id2.host != id.host || id2.port != id.port) abort();
    }
  }
  // A frame from the network.
  FrameHeader h{};
  if (!ParseFrameHeader(data, size, kMaxTableBytes, &h).ok()) return 0;
  const uint8_t* p = data + kFrameHeaderBytes;
  const size_t n = size - kFrameHeaderBytes < h.length ? size - kFrameHeaderBytes : h.length;
  static const uint8_t secret[kSecretBytes] = {7};
  switch (h.type) {
    case MsgType::kChallenge: {
      Nonce nonce{};
      (void)DecodeChallenge(p, n, &nonce);
      break;
    }
    case MsgType::kJoin: {
      JoinMsg m;
      if (DecodeJoin(p, n, &m).ok()) {
        const Bytes again = EncodeJoin(m);
        if (again.size() != kFrameHeaderBytes + n || std::memcmp(again.data() + kFrameHeaderBytes, p, n) != 0) abort();
      }
      break;
    }
    case MsgType::kTable: {
      std::vector<Bytes> table;
      for (int world : {1, 2, 3}) (void)DecodeTable(p, n, secret, Nonce{}, world, &table);
      break;
    }
    case MsgType::kError: {
      std::string text;
      (void)DecodeError(p, n, &text);
      break;
    }
  }
  return 0;
}

#include "transport/rendezvous/siphash.h"

#include <cstring>

namespace stria {
namespace {

inline uint64_t Rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little-endian, whatever the host
  return v;
}

struct State {
  uint64_t v0, v1, v2, v3;
  void Round() {
    v0 += v1;
    v1 = Rotl(v1, 13);
    v1 ^= v0;
    v0 = Rotl(v0, 32);
    v2 += v3;
    v3 = Rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = Rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = Rotl(v1, 17);
    v1 ^= v2;
    v2 = Rotl(v2, 32);
  }
  void Absorb(uint64_t m) {
    v3 ^= m;
    Round();
    Round();
    v0 ^= m;
  }
};

}  // namespace

uint64_t SipHash24(const uint8_t key[16], const void* data, size_t bytes) {
  const uint64_t k0 = Load64(key), k1 = Load64(key + 8);
  State s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
          k1 ^ 0x7465646279746573ULL};
  const auto* in = static_cast<const uint8_t*>(data);
  const size_t whole = bytes - bytes % 8;
  for (size_t i = 0; i < whole; i += 8) s.Absorb(Load64(in + i));
  uint8_t last[8] = {0, 0, 0, 0, 0, 0, 0, static_cast<uint8_t>(bytes)};
  if (bytes % 8) std::memcpy(last, in + whole, bytes % 8);
  s.Absorb(Load64(last));
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.Round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

}  // namespace stria

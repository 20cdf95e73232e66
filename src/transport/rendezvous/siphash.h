// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit PRF. The rendezvous uses it as a
// MAC in a challenge-response, so the job's secret never crosses the wire.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stria {

uint64_t SipHash24(const uint8_t key[16], const void* data, size_t bytes);

}  // namespace stria

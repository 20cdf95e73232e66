// Deadlines from timeouts in seconds, for every wait of the engine and the transports. The
// config accepts any finite timeout_s, and converting, say, 1e300 s into the clock's nanoseconds
// overflows (undefined behaviour; in practice a deadline in the past, so an instant timeout). All
// conversions go through here and clamp to kMaxWaitS, about 116 days: "never" for a collective.
#pragma once

#include <chrono>

namespace stria {

using SteadyClock = std::chrono::steady_clock;

constexpr double kMaxWaitS = 1e7;

// `seconds` as a clock duration: negative or NaN is 0, beyond kMaxWaitS is kMaxWaitS.
inline SteadyClock::duration SecondsToDuration(double seconds) {
  if (!(seconds > 0)) seconds = 0;
  if (seconds > kMaxWaitS) seconds = kMaxWaitS;
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

inline SteadyClock::time_point DeadlineAfter(double seconds) {
  return SteadyClock::now() + SecondsToDuration(seconds);
}

}  // namespace stria

// What the one-rank-per-process programs (tests/ucx/ucx_rank.cc, tests/nccl/nccl_rank.cc) share:
// the clock, rank variables from the environment, the RESULT line their launchers parse, the
// unique-id exchange through a file, the checks after a failed call, and the comparison of this
// rank's rows with a float64 reference of the whole sequence.
#pragma once

#include <stria/stria.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace stria_test {

inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The integer in variable `a`, else in `b` (torchrun's and Open MPI's names), else -1.
inline int EnvInt(const char* a, const char* b) {
  const char* v = std::getenv(a);
  if (v == nullptr && b != nullptr) v = std::getenv(b);
  return v ? std::atoi(v) : -1;
}

// The last line of a rank (tests/ucx/launcher.h reads it): C is the stria_status_t of the first
// failing call, SUCCESS when every call passed and matched.
inline void PrintResult(int rank, stria_status_t s, double t0, const std::string& msg) {
  std::printf("RESULT rank=%d code=%d seconds=%.3f message=(%s) %s\n", rank, static_cast<int>(s), Now() - t0,
              stria_status_string(s), msg.c_str());
  std::fflush(stdout);
}

// Rank 0 publishes its id through a file (written, then renamed: a reader never sees half of it);
// the others poll for it until `timeout` seconds have passed.
inline bool ExchangeIdThroughFile(int rank, const std::string& path, double timeout, stria_unique_id_t* id,
                                  std::string* err) {
  if (rank == 0) {
    if (stria_get_unique_id(id) != STRIA_SUCCESS) {
      *err = stria_get_last_error();
      return false;
    }
    std::string hex;
    char b[3];
    for (char c : id->internal) {
      std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(c));
      hex += b;
    }
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << hex;
    std::rename(tmp.c_str(), path.c_str());
    return true;
  }
  const double deadline = Now() + timeout;
  for (;;) {
    std::ifstream in(path);
    std::string hex;
    if (in >> hex && hex.size() == 2 * sizeof id->internal) {
      for (size_t i = 0; i < sizeof id->internal; ++i)
        id->internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
      return true;
    }
    if (Now() > deadline) {
      *err = "no id file from rank 0";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Runs `fn` on a thread after `delay_ms` (a fault played in the middle of a call).
inline std::thread AfterDelay(int delay_ms, std::function<void()> fn) {
  return std::thread([delay_ms, fn = std::move(fn)] {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    fn();
  });
}

// After a call failed with `call_error`: the context must refuse more work (`retry` must fail)
// and still be destroyed cleanly, within `max_destroy_s` seconds when that is positive. Returns
// the message for the RESULT line, with a [BUG: ...] note for each rule broken.
inline std::string AfterFailure(stria_context_t ctx, const std::string& call_error,
                                const std::function<stria_status_t()>& retry, double max_destroy_s) {
  const stria_status_t again = retry();
  const double d0 = Now();
  const stria_status_t destroyed = stria_context_destroy(ctx);
  const double took = Now() - d0;
  std::string m = call_error;
  if (again == STRIA_SUCCESS) m += " [BUG: a failed context accepted more work]";
  if (destroyed != STRIA_SUCCESS) m += std::string(" [BUG: destroy failed: ") + stria_get_last_error() + "]";
  if (max_destroy_s > 0 && took > max_destroy_s) m += " [BUG: destroy took " + std::to_string(took) + " s]";
  return m;
}

// This rank's rows of `got` ([B, L, H, D], or lse [B, H, L]) against the full reference
// ([B, S, H, D] or [B, H, S]); pos: the sequence positions of the rank's rows.
inline double RowError(const Tensor& got, const std::vector<double>& ref, const std::vector<int64_t>& pos, int64_t S,
                       bool is_lse) {
  std::vector<double> want(static_cast<size_t>(got.numel()));
  const int64_t B = got.shape[0];
  if (is_lse) {
    const int64_t H = got.shape[1], L = got.shape[2];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i)
          want[static_cast<size_t>((b * H + h) * L + i)] =
              ref[static_cast<size_t>((b * H + h) * S + pos[static_cast<size_t>(i)])];
  } else {
    const int64_t L = got.shape[1], HD = got.shape[2] * got.shape[3];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < HD; ++x)
          want[static_cast<size_t>((b * L + i) * HD + x)] =
              ref[static_cast<size_t>((b * S + pos[static_cast<size_t>(i)]) * HD + x)];
  }
  return RelError(got.ToDouble(), want);
}

// One rank's forward and backward results (host tensors).
struct RankResults {
  const Tensor *out, *lse, *dq, *dk, *dv;
};

// Compares a rank's results with the float64 dense attention of the whole sequence (q, k, v,
// dout: the full tensors every rank drew), printing each error. The tolerance is 1e-5 for
// float32 and 2e-2 otherwise, and `lse_tol` for the LSE. Returns "" or a MISMATCH message.
inline std::string CompareWithReference(int rank, Dt dt, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& dout, const RankResults& got, const std::vector<int64_t>& pos,
                                        bool causal, double lse_tol) {
  const int64_t S = q.shape[1], Hq = q.shape[2], Hkv = k.shape[2], D = q.shape[3];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto qx = q.ToDouble(), kx = k.ToDouble(), vx = v.ToDouble(), dx = dout.ToDouble();
  const Reference ref = DenseAttention(qx, kx, vx, &dx, q.shape[0], S, Hq, Hkv, D, causal, scale);
  const double tol = dt == Dt::kF32 ? 1e-5 : 2e-2;
  const double errs[5] = {RowError(*got.out, ref.out, pos, S, false), RowError(*got.lse, ref.lse, pos, S, true),
                          RowError(*got.dq, ref.dq, pos, S, false), RowError(*got.dk, ref.dk, pos, S, false),
                          RowError(*got.dv, ref.dv, pos, S, false)};
  const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; ++i) {
    std::printf("rank %d: %s %s rel error %.3g\n", rank, DtName(dt), names[i], errs[i]);
    if (!(errs[i] < (i == 1 ? lse_tol : tol)))
      return std::string("MISMATCH: ") + DtName(dt) + " " + names[i] + " error " + std::to_string(errs[i]);
  }
  return "";
}

}  // namespace stria_test

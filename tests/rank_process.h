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

// The options both rank programs take; each sets its own defaults and parses its extra flags.
// RANK / WORLD_SIZE (or Open MPI's OMPI_COMM_WORLD_*) give the rank and world unless --rank and
// --world do.
struct RankOptions {
  int rank = -1, world = -1;
  std::string id_file;  // rank 0 writes stria_get_unique_id's id here (hex), the others read it
  stria_layout_t layout = STRIA_LAYOUT_STRIPED;
  bool causal = true;
  std::vector<Dt> dtypes{Dt::kF32};
  int64_t L = 64, Hq = 4, Hkv = 2, D = 32;
  Window window{};  // --window-left / --window-right: a sliding window (stria_attention_forward_window)
  int iters = 1;
  double timeout = 30;
  std::string fault;  // which fault the odd rank plays (each program names its own)
  int fault_rank = -1, fault_delay_ms = 0;
  // > 0: a document plan of this many random documents over S = L * world - 1 tokens (every rank
  // draws the same boundaries), the calls through stria_attention_*_documents with them.
  int plan_docs = 0;
  // --plan-home 1: the plan's documents as HomeDocuments draws them (one shared across the ranks,
  // short ones each rank keeps) and the plan made for 128-token tiles, so that ranks keep
  // documents of their own past whole kernel tiles (a home part, ForwardStep::home_begin).
  bool plan_home = false;
  int ulysses = 1;  // --ulysses U: a grid of all-to-all groups of U ranks (stria_context_set_grid)

  void ReadEnvironment() {
    rank = EnvInt("RANK", "OMPI_COMM_WORLD_RANK");
    world = EnvInt("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE");
  }
  // Takes flag `k` with value `v` when it is one of the common ones.
  bool Parse(const std::string& k, const std::string& v) {
    if (k == "--rank")
      rank = std::stoi(v);
    else if (k == "--world")
      world = std::stoi(v);
    else if (k == "--id-file")
      id_file = v;
    else if (k == "--layout")
      layout = v == "contiguous" ? STRIA_LAYOUT_CONTIGUOUS : v == "zigzag" ? STRIA_LAYOUT_ZIGZAG : STRIA_LAYOUT_STRIPED;
    else if (k == "--causal")
      causal = v != "0";
    else if (k == "--plan-docs")
      plan_docs = std::stoi(v);
    else if (k == "--plan-home")
      plan_home = v != "0";
    else if (k == "--ulysses")
      ulysses = std::stoi(v);
    else if (k == "--dtypes") {  // a comma-separated list of f32, f16, bf16
      dtypes.clear();
      for (size_t at = 0; at <= v.size();) {
        size_t comma = v.find(',', at);
        if (comma == std::string::npos) comma = v.size();
        const std::string d = v.substr(at, comma - at);
        dtypes.push_back(d == "f16" ? Dt::kF16 : d == "bf16" ? Dt::kBF16 : Dt::kF32);
        at = comma + 1;
      }
    } else if (k == "--L")
      L = std::stoll(v);
    else if (k == "--window-left")
      window.left = std::stoll(v);
    else if (k == "--window-right")
      window.right = std::stoll(v);
    else if (k == "--heads")
      Hq = std::stoll(v);
    else if (k == "--kv-heads")
      Hkv = std::stoll(v);
    else if (k == "--dim")
      D = std::stoll(v);
    else if (k == "--iters")
      iters = std::stoi(v);
    else if (k == "--timeout")
      timeout = std::stod(v);
    else if (k == "--fault")
      fault = v;
    else if (k == "--fault-rank")
      fault_rank = std::stoi(v);
    else if (k == "--fault-delay-ms")
      fault_delay_ms = std::stoi(v);
    else
      return false;
    return true;
  }
};

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
// ([B, S, H, D] or [B, H, S]); pos: the sequence positions of the rank's rows, -1 for a plan's
// padding slot, which must hold a row that saw nothing (0, and an LSE of -inf).
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
              pos[static_cast<size_t>(i)] < 0 ? -INFINITY
                                              : ref[static_cast<size_t>((b * H + h) * S + pos[static_cast<size_t>(i)])];
  } else {
    const int64_t L = got.shape[1], HD = got.shape[2] * got.shape[3];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < HD; ++x)
          want[static_cast<size_t>((b * L + i) * HD + x)] =
              pos[static_cast<size_t>(i)] < 0
                  ? 0.0
                  : ref[static_cast<size_t>((b * S + pos[static_cast<size_t>(i)]) * HD + x)];
  }
  return RelError(got.ToDouble(), want);
}

// Which tokens of the sequence a rank holds: the layout's L = o.L each, or a document plan's
// (o.plan_docs), with the plan's boundaries for the calls.
struct RankTokens {
  int64_t S = 0, L = 0;
  std::vector<int64_t> documents;  // the plan's boundaries [0, .., S] (empty without a plan)
  std::vector<int64_t> pos;        // the global position of each local slot, -1 for padding
  stria_plan_t plan = nullptr;
  stria_status_t status = STRIA_SUCCESS;  // of making the plan

  explicit RankTokens(const RankOptions& o) : S(o.L * o.world), L(o.L) {
    if (o.plan_docs > 0) {
      if (o.world > 1) --S;  // any S works on a plan: one token short leaves some rank padding
      std::mt19937_64 cuts(17);
      documents = o.plan_home ? HomeDocuments(1, S, o.plan_docs, cuts) : RandomDocuments(1, S, o.plan_docs, cuts);
      // On a grid the plan is for the ring of groups, and each group's slots split into U pieces.
      stria_plan_config_t pc;
      stria_plan_config_init(&pc);
      pc.world_size = o.world / o.ulysses;
      pc.causal = o.causal;
      pc.tile = o.plan_home ? 128 : 16;
      stria_plan_info_t info;
      info.struct_size = sizeof info;
      status = stria_plan_create(&pc, documents.data(), o.plan_docs, 1, S, &plan);
      if (status == STRIA_SUCCESS) status = stria_plan_get_info(plan, &info);
      if (status == STRIA_SUCCESS && info.local_len % o.ulysses != 0) {
        stria_plan_destroy(plan);
        plan = nullptr;
        pc.local_len = (info.local_len + o.ulysses - 1) / o.ulysses * o.ulysses;
        status = stria_plan_create(&pc, documents.data(), o.plan_docs, 1, S, &plan);
        if (status == STRIA_SUCCESS) status = stria_plan_get_info(plan, &info);
      }
      if (status != STRIA_SUCCESS) return;
      L = info.local_len / o.ulysses;
    }
    pos.resize(static_cast<size_t>(L));
    status = plan != nullptr ? stria_plan_grid_positions(plan, o.ulysses, o.rank, pos.data())
                             : stria_grid_positions(o.layout, S, o.world, o.ulysses, o.rank, pos.data());
  }
  ~RankTokens() {
    if (plan != nullptr) stria_plan_destroy(plan);
  }
  RankTokens(const RankTokens&) = delete;
  RankTokens& operator=(const RankTokens&) = delete;
  // The rank's tokens of a full [1, S, H, D] host tensor into local [1, L, H, D].
  stria_status_t Shard(const RankOptions& o, const Tensor& full, Tensor* local) const {
    if (plan != nullptr) return stria_plan_grid_shard(plan, o.ulysses, o.rank, 1, &full.dl, &local->dl, nullptr);
    return stria_grid_shard(o.layout, o.world, o.ulysses, o.rank, 1, &full.dl, &local->dl, nullptr);
  }
  int64_t num_seqs() const { return documents.empty() ? 0 : static_cast<int64_t>(documents.size()) - 1; }
};

// One rank's forward and backward results (host tensors).
struct RankResults {
  const Tensor *out, *lse, *dq, *dk, *dv;
};

// Compares a rank's results with the float64 dense attention of the whole sequence (q, k, v,
// dout: the full tensors every rank drew), printing each error. The tolerance is 1e-5 for
// float32 and 2e-2 otherwise, and `lse_tol` for the LSE. Returns "" or a MISMATCH message.
inline std::string CompareWithReference(int rank, Dt dt, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& dout, const RankResults& got, const std::vector<int64_t>& pos,
                                        bool causal, double lse_tol, Window window = {},
                                        const std::vector<int64_t>* documents = nullptr) {
  const int64_t S = q.shape[1], Hq = q.shape[2], Hkv = k.shape[2], D = q.shape[3];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto qx = q.ToDouble(), kx = k.ToDouble(), vx = v.ToDouble(), dx = dout.ToDouble();
  const Reference ref = DenseAttention(qx, kx, vx, &dx, q.shape[0], S, Hq, Hkv, D, causal, scale, documents, window);
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

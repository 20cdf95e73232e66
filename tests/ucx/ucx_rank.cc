// One rank of a ring across processes, for the multi-process tests and the launch examples'
// checks. Every rank builds the same full-sequence inputs from a seed, takes its shard, runs the
// ring over UCX and compares its own rows with a float64 dense reference. It can also play the
// faults the tests need (die, stall, abort from a thread, disagree on shapes).
//
// It prints one line per finished step and ends with
//   RESULT rank=R code=C seconds=T message=(status name) ...
// where C is the stria_status_t that of the first failing stria call (SUCCESS when all passed and matched).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rank_process.h"
#include "test_util.h"

using namespace stria_test;

namespace {

struct Options : RankOptions {
  int threads = 1;
  // Faults (kill | stop | abort | shape | late) are played at iteration fault_iter.
  int fault_iter = 0;
  int fault_hq = 0;   // for "shape": the odd rank's number of heads
  double late_s = 0;  // for "late": the odd rank sleeps this long before creating its context
  // A second rank that is late: it sleeps slow_call_s before its call at fault_iter (a rank
  // still busy elsewhere while the others wait for it, and something happens to one of them).
  int slow_call_rank = -1;
  double slow_call_s = 0;
  // Destroy the context as soon as the last call returns, then check the results: how a job
  // ends, with slower ranks possibly still finishing that call.
  bool close_first = false;
  // Instead of the ring: decode calls over a KV cache sharded across the processes (striped), in
  // each dtype, a generation loop of this many steps, each appending one token per sequence.
  int decode_steps = 0;
  // With decode_steps: a prefill of 2 * world new tokens per sequence first, in this mode (1
  // pass-KV, 2 pass-Q), the prompt sharded striped over the processes.
  int prefill_mode = 0;
};

Options Parse(int argc, char** argv) {
  Options o;
  o.ReadEnvironment();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (o.RankOptions::Parse(k, v)) continue;
    if (k == "--threads")
      o.threads = std::stoi(v);
    else if (k == "--fault-iter")
      o.fault_iter = std::stoi(v);
    else if (k == "--fault-heads")
      o.fault_hq = std::stoi(v);
    else if (k == "--late-s")
      o.late_s = std::stod(v);
    else if (k == "--slow-call-rank")
      o.slow_call_rank = std::stoi(v);
    else if (k == "--slow-call-s")
      o.slow_call_s = std::stod(v);
    else if (k == "--close-first")
      o.close_first = v == "1";
    else if (k == "--decode-steps")
      o.decode_steps = std::stoi(v);
    else if (k == "--prefill-mode")
      o.prefill_mode = std::stoi(v);
  }
  return o;
}

void Result(const Options& o, stria_status_t s, double t0, const std::string& msg) {
  PrintResult(o.rank, s, t0, msg);
}

// The fault of --fault kill or stop, played by the odd rank during its serving call number `call`
// (the prefill, if any, is call 0) when that is --fault-iter: a thread to join after the call.
std::thread ServingFault(const Options& o, int call) {
  if (o.rank != o.fault_rank || call != o.fault_iter || (o.fault != "kill" && o.fault != "stop")) return {};
  const int sig = o.fault == "kill" ? SIGKILL : SIGSTOP;
  return AfterDelay(o.fault_delay_ms, [sig] { raise(sig); });
}

// The decode check: every process draws the same whole cache and queries, keeps its striped share
// of the prefix and appends one token per sequence per step; each step's output must match the
// float64 reference over the cache so far. Returns "" or what went wrong; *s gets the first failed
// call's status.
std::string DecodeLoop(const Options& o, stria_context_t ctx, stria_status_t* s) {
  const int64_t B = 3, Hq = o.Hq, Hkv = o.Hkv, D = o.D, capacity = 48;
  int call = 0;
  const std::vector<int64_t> prefix = {0, 37, 61};
  for (Dt dt : o.dtypes) {
    std::mt19937_64 rng(77);
    const int64_t S = o.world * capacity;
    Tensor kf({B, S, Hkv, D}, dt), vf({B, S, Hkv, D}, dt), kc({B, capacity, Hkv, D}, dt), vc({B, capacity, Hkv, D}, dt);
    kf.FillRandom(rng);
    vf.FillRandom(rng);
    kc.Poison();
    vc.Poison();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = o.rank; t < prefix[static_cast<size_t>(b)]; t += o.world)
        for (int64_t i = 0; i < Hkv * D; ++i) {
          kc.Set((b * capacity + t / o.world) * Hkv * D + i, kf.Get((b * S + t) * Hkv * D + i));
          vc.Set((b * capacity + t / o.world) * Hkv * D + i, vf.Get((b * S + t) * Hkv * D + i));
        }
    std::vector<int64_t> lens = prefix;
    if (o.prefill_mode > 0) {
      const int64_t P = 2 * o.world, L = 2;
      Tensor qf({B, P, Hq, D}, dt), out({B, L, Hq, D}, dt), q({B, L, Hq, D}, dt), k({B, L, Hkv, D}, dt),
          v({B, L, Hkv, D}, dt);
      qf.FillRandom(rng);
      std::vector<int64_t> mine(static_cast<size_t>(L));
      stria_layout_positions(STRIA_LAYOUT_STRIPED, P, o.world, o.rank, mine.data());
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t c = mine[static_cast<size_t>(i)], at = lens[static_cast<size_t>(b)] + c;
          for (int64_t x = 0; x < Hq * D; ++x) q.Set((b * L + i) * Hq * D + x, qf.Get((b * P + c) * Hq * D + x));
          for (int64_t x = 0; x < Hkv * D; ++x) {
            k.Set((b * L + i) * Hkv * D + x, kf.Get((b * S + at) * Hkv * D + x));
            v.Set((b * L + i) * Hkv * D + x, vf.Get((b * S + at) * Hkv * D + x));
          }
        }
      out.Poison();
      stria_attention_params_t params;
      stria_attention_params_init(&params);
      stria_kv_cache_t cache;
      stria_kv_cache_init(&cache);
      cache.k = &kc.dl;
      cache.v = &vc.dl;
      cache.lens = lens.data();
      std::thread fault = ServingFault(o, call++);
      *s = stria_attention_prefill(ctx, &params, &cache, static_cast<stria_prefill_t>(o.prefill_mode), &q.dl, &k.dl,
                                   &v.dl, &out.dl, nullptr, nullptr);
      const std::string error = stria_get_last_error();
      if (fault.joinable()) fault.join();
      if (*s != STRIA_SUCCESS) return error;
      const Reference ref = DecodeReference(qf, kf, vf, lens, P, true, -1);
      std::vector<double> want;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t x = 0; x < Hq * D; ++x)
            want.push_back(ref.out[static_cast<size_t>((b * P + mine[static_cast<size_t>(i)]) * Hq * D + x)]);
      const double err = RelError(out.ToDouble(), want), tol = dt == Dt::kF32 ? 1e-5 : 2e-2;
      if (!(err < tol)) {
        *s = STRIA_ERROR_INTERNAL;
        return std::string("prefill (") + DtName(dt) + "): relative error " + std::to_string(err);
      }
      for (int64_t& l : lens) l += P;
    }
    for (int step = 0; step < o.decode_steps; ++step) {
      Tensor q({B, 1, Hq, D}, dt), kn({B, 1, Hkv, D}, dt), vn({B, 1, Hkv, D}, dt), out({B, 1, Hq, D}, dt),
          lse({B, Hq, 1}, Dt::kF32);
      q.FillRandom(rng);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < Hkv * D; ++i) {
          kn.Set(b * Hkv * D + i, kf.Get((b * S + lens[static_cast<size_t>(b)]) * Hkv * D + i));
          vn.Set(b * Hkv * D + i, vf.Get((b * S + lens[static_cast<size_t>(b)]) * Hkv * D + i));
        }
      out.Poison();
      stria_attention_params_t params;
      stria_attention_params_init(&params);
      stria_kv_cache_t cache;
      stria_kv_cache_init(&cache);
      cache.k = &kc.dl;
      cache.v = &vc.dl;
      cache.lens = lens.data();
      std::thread fault = ServingFault(o, call++);
      *s = stria_attention_decode(ctx, &params, &cache, &q.dl, &kn.dl, &vn.dl, &out.dl, &lse.dl, nullptr);
      const std::string error = stria_get_last_error();
      if (fault.joinable()) fault.join();
      if (*s != STRIA_SUCCESS) return error;
      const Reference ref = DecodeReference(q, kf, vf, lens, 1, true, -1);
      const double err = RelError(out.ToDouble(), ref.out), tol = dt == Dt::kF32 ? 1e-5 : 2e-2;
      if (!(err < tol)) {
        *s = STRIA_ERROR_INTERNAL;
        return "decode step " + std::to_string(step) + " (" + DtName(dt) + "): relative error " + std::to_string(err);
      }
      for (int64_t& l : lens) ++l;
    }
    std::printf("rank %d: %s %sdecode loop of %d steps matches\n", o.rank, DtName(dt),
                o.prefill_mode > 0 ? "prefill and " : "", o.decode_steps);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const Options o = Parse(argc, argv);
  const double t0 = Now();
  if (o.rank < 0 || o.world < 1) {
    std::fprintf(stderr, "usage: %s --rank R --world N (or RANK/WORLD_SIZE) [options]\n", argv[0]);
    return 2;
  }
  const bool odd = o.rank == o.fault_rank;
  if (odd && o.fault == "late") std::this_thread::sleep_for(std::chrono::duration<double>(o.late_s));

  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = o.rank;
  cfg.world_size = o.world;
  cfg.transport = STRIA_TRANSPORT_UCX;
  cfg.timeout_s = o.timeout;
  cfg.num_threads = o.threads;
  std::string err;
  if (!o.id_file.empty() && !ExchangeIdThroughFile(o.rank, o.id_file, o.timeout, &cfg.unique_id, &err)) {
    Result(o, STRIA_ERROR_INTERNAL, t0, err);
    return 0;
  }
  stria_context_t ctx = nullptr;
  stria_status_t s = stria_context_create(&cfg, &ctx);
  if (s != STRIA_SUCCESS) {
    Result(o, s, t0, stria_get_last_error());
    return 0;
  }
  std::printf("rank %d: joined after %.3f s\n", o.rank, Now() - t0);
  if (o.ulysses != 1 && (s = stria_context_set_grid(ctx, o.ulysses)) != STRIA_SUCCESS) {
    Result(o, s, t0, stria_get_last_error());
    stria_context_destroy(ctx);
    return 0;
  }
  if (o.decode_steps > 0) {
    const std::string failed = DecodeLoop(o, ctx, &s);
    const stria_status_t destroyed = stria_context_destroy(ctx);
    if (failed.empty() && destroyed != STRIA_SUCCESS) s = destroyed;
    Result(o, s, t0, failed.empty() ? "every decode step matches the float64 reference" : failed);
    return 0;
  }

  const RankTokens tokens(o);
  if (tokens.status != STRIA_SUCCESS) {
    Result(o, tokens.status, t0, stria_get_last_error());
    return 0;
  }
  const int64_t S = tokens.S, L = tokens.L;
  const int64_t Hq = odd && o.fault == "shape" ? o.fault_hq : o.Hq;
  auto shard = [&](const Tensor& full, Tensor* local) { return tokens.Shard(o, full, local); };
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = o.layout;
  params.causal = o.causal;
  params.plan = tokens.plan;
  const std::string msg = "all results match the float64 reference";
  for (Dt dt : o.dtypes) {
    // Every rank draws the same full-sequence inputs; each takes its own shard.
    std::mt19937_64 rng(42);
    Tensor q({1, S, o.Hq, o.D}, dt), k({1, S, o.Hkv, o.D}, dt), v({1, S, o.Hkv, o.D}, dt), dout({1, S, o.Hq, o.D}, dt);
    for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
    Tensor ql({1, L, Hq, o.D}, dt), kl({1, L, o.Hkv, o.D}, dt), vl({1, L, o.Hkv, o.D}, dt), dol({1, L, Hq, o.D}, dt);
    if (Hq == o.Hq) {
      shard(q, &ql);
      shard(dout, &dol);
    }
    shard(k, &kl);
    shard(v, &vl);
    Tensor out({1, L, Hq, o.D}, dt), lse({1, Hq, L}, Dt::kF32), dq({1, L, Hq, o.D}, dt), dk({1, L, o.Hkv, o.D}, dt),
        dv({1, L, o.Hkv, o.D}, dt);
    for (int it = 0; it < o.iters; ++it) {
      for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->Poison();
      std::thread fault;
      if (odd && it == o.fault_iter && (o.fault == "kill" || o.fault == "stop")) {
        const int sig = o.fault == "kill" ? SIGKILL : SIGSTOP;
        fault = AfterDelay(o.fault_delay_ms, [sig] { raise(sig); });
      }
      if (odd && it == o.fault_iter && o.fault == "abort")
        fault = AfterDelay(o.fault_delay_ms, [ctx] { stria_context_abort(ctx); });
      if (o.rank == o.slow_call_rank && it == o.fault_iter)
        std::this_thread::sleep_for(std::chrono::duration<double>(o.slow_call_s));
      s = AttentionForward(ctx, &params, tokens.documents, tokens.num_seqs(), &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl,
                           nullptr, o.window);
      if (s == STRIA_SUCCESS)
        s = AttentionBackward(ctx, &params, tokens.documents, tokens.num_seqs(), &ql.dl, &kl.dl, &vl.dl, &out.dl,
                              &lse.dl, &dol.dl, &dq.dl, &dk.dl, &dv.dl, nullptr, o.window);
      const std::string call_error = stria_get_last_error();
      if (fault.joinable()) fault.join();
      if (s != STRIA_SUCCESS) {
        // After a failure the context must refuse work and still be destroyed cleanly.
        const std::string m = AfterFailure(
            ctx, call_error,
            [&] { return stria_attention_forward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr); },
            0);
        Result(o, s, t0, m);
        return 0;
      }
      std::printf("rank %d: %s iteration %d done at %.3f s\n", o.rank, DtName(dt), it, Now() - t0);
    }
    if (o.close_first && dt == o.dtypes.back()) {
      s = stria_context_destroy(ctx);
      ctx = nullptr;
      if (s != STRIA_SUCCESS) {
        Result(o, s, t0, stria_get_last_error());
        return 0;
      }
    }
    const std::string mismatch =
        CompareWithReference(o.rank, dt, q, k, v, dout, RankResults{&out, &lse, &dq, &dk, &dv}, tokens.pos, o.causal,
                             1e-5, o.window, tokens.documents.empty() ? nullptr : &tokens.documents);
    if (!mismatch.empty()) {
      if (ctx) stria_context_destroy(ctx);
      Result(o, STRIA_ERROR_INTERNAL, t0, mismatch);
      return 1;
    }
  }
  if (ctx) s = stria_context_destroy(ctx);
  Result(o, s, t0, s == STRIA_SUCCESS ? msg : stria_get_last_error());
  return 0;
}

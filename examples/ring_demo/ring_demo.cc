// The main demo: N CPU ranks in one process (a local group, one thread each) run a causal
// forward and backward over a long sequence in each layout. For every layout it prints the wall
// time, the ring latency modelled from measured per-step compute (sum over steps of the slowest
// rank: what N dedicated machines would see), the contiguous/layout latency ratio beside the
// analytical one, and the error against a float64 dense reference on sampled rows.
//
// Uses only the public C API. Options: --world N --seq S --heads H --kv-heads H --dim D
// --dtype f32|bf16|f16 --samples R.
#include <stria/stria.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "demo_tensor.h"

namespace {

struct Options {
  int world = 8;
  int64_t seq = 16384, heads = 4, kv_heads = 2, dim = 64;
  DemoDtype dtype = DemoDtype::kF32;
  int samples = 24;  // query/key rows checked per layout
};

void Usage() {
  std::fprintf(stderr,
               "usage: stria-ring-demo [--world N] [--seq S] [--heads H] [--kv-heads H] [--dim D] "
               "[--dtype f32|bf16|f16] [--samples R]\n");
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--world")
      o->world = std::atoi(v);
    else if (a == "--seq")
      o->seq = std::atoll(v);
    else if (a == "--heads")
      o->heads = std::atoll(v);
    else if (a == "--kv-heads")
      o->kv_heads = std::atoll(v);
    else if (a == "--dim")
      o->dim = std::atoll(v);
    else if (a == "--samples")
      o->samples = std::atoi(v);
    else if (a == "--dtype") {
      if (!ParseDtype(v, &o->dtype)) return false;
    } else {
      return false;
    }
  }
  return o->world >= 1 && o->seq >= 1 && o->heads >= 1 && o->kv_heads >= 1 && o->dim >= 1 && o->samples >= 1;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define CHECK_STRIA(call)                                                                                  \
  do {                                                                                                     \
    stria_status_t s_ = (call);                                                                            \
    if (s_ != STRIA_SUCCESS) {                                                                             \
      std::fprintf(stderr, "%s failed: %s: %s\n", #call, stria_status_string(s_), stria_get_last_error()); \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

struct LayoutResult {
  double fwd_wall = 0, bwd_wall = 0;
  double fwd_model = 0, bwd_model = 0;  // sum over steps of max over ranks (CPU seconds of compute)
  double err_out = 0, err_lse = 0, err_dq = 0, err_dk = 0, err_dv = 0;
};

// Runs one layout: shards the full tensors, drives each rank on its own thread, gathers outputs.
LayoutResult RunLayout(const Options& o, stria_layout_t layout, const Full& in, Full* got) {
  const int n = o.world;
  const int64_t L = o.seq / n;
  std::vector<stria_context_t> ctx(static_cast<size_t>(n));
  stria_context_config_t cfg;
  CHECK_STRIA(stria_context_config_init(&cfg));
  cfg.num_threads = 1;  // one thread per rank: per-step CPU time is then the rank's own compute
  CHECK_STRIA(stria_context_create_local_group(&cfg, n, ctx.data()));
  stria_attention_params_t params;
  CHECK_STRIA(stria_attention_params_init(&params));
  params.layout = layout;
  params.causal = 1;

  std::vector<std::vector<stria_step_time_t>> fwd_steps(static_cast<size_t>(n)), bwd_steps(static_cast<size_t>(n));
  std::vector<double> fwd_end(static_cast<size_t>(n)), bwd_end(static_cast<size_t>(n));
  std::vector<Local> locals;
  for (int r = 0; r < n; ++r) locals.emplace_back(o, L);
  for (int r = 0; r < n; ++r) locals[static_cast<size_t>(r)].ShardFrom(in, layout, n, r);
  const double t0 = Now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Local& x = locals[static_cast<size_t>(r)];
      stria_context_t c = ctx[static_cast<size_t>(r)];
      CHECK_STRIA(stria_attention_forward(c, &params, &x.q.dl, &x.k.dl, &x.v.dl, &x.out.dl, &x.lse.dl, nullptr));
      fwd_end[static_cast<size_t>(r)] = Now();
      auto& fs = fwd_steps[static_cast<size_t>(r)];
      fs.resize(static_cast<size_t>(n));
      int steps = 0;
      CHECK_STRIA(stria_context_get_step_times(c, fs.data(), n, &steps));
      CHECK_STRIA(stria_attention_backward(c, &params, &x.q.dl, &x.k.dl, &x.v.dl, &x.out.dl, &x.lse.dl, &x.dout.dl,
                                           &x.dq.dl, &x.dk.dl, &x.dv.dl, nullptr));
      bwd_end[static_cast<size_t>(r)] = Now();
      auto& bs = bwd_steps[static_cast<size_t>(r)];
      bs.resize(static_cast<size_t>(n));
      CHECK_STRIA(stria_context_get_step_times(c, bs.data(), n, &steps));
    });
  }
  for (auto& t : threads) t.join();
  LayoutResult res;
  double fwd_done = 0, bwd_done = 0;
  for (int r = 0; r < n; ++r) {
    fwd_done = std::max(fwd_done, fwd_end[static_cast<size_t>(r)]);
    bwd_done = std::max(bwd_done, bwd_end[static_cast<size_t>(r)]);
  }
  res.fwd_wall = fwd_done - t0;
  res.bwd_wall = bwd_done - fwd_done;
  for (int s = 0; s < n; ++s) {
    double f = 0, b = 0;
    for (int r = 0; r < n; ++r) {
      f = std::max(f, fwd_steps[static_cast<size_t>(r)][static_cast<size_t>(s)].compute_cpu_s);
      b = std::max(b, bwd_steps[static_cast<size_t>(r)][static_cast<size_t>(s)].compute_cpu_s);
    }
    res.fwd_model += f;
    res.bwd_model += b;
  }
  for (int r = 0; r < n; ++r) locals[static_cast<size_t>(r)].UnshardInto(got, layout, n, r);
  for (auto c : ctx) CHECK_STRIA(stria_context_destroy(c));
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    Usage();
    return 2;
  }
  const stria_layout_t layouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG, STRIA_LAYOUT_STRIPED};
  const char* names[] = {"contiguous", "zigzag", "striped"};
  const int64_t unit = 2 * static_cast<int64_t>(o.world);
  if (o.seq % unit != 0) {
    std::fprintf(stderr, "--seq must be a multiple of 2 x world (%lld) so every layout applies\n", (long long)unit);
    return 2;
  }
  std::printf(
      "stria %d.%d.%d ring demo: %d CPU ranks in one process, causal, S=%lld, B=1, Hq=%lld, Hkv=%lld, "
      "D=%lld, %s\n",
      stria_get_version() / 10000, stria_get_version() / 100 % 100, stria_get_version() % 100, o.world,
      (long long)o.seq, (long long)o.heads, (long long)o.kv_heads, (long long)o.dim, DtypeName(o.dtype));
  std::printf(
      "(%u hardware threads: ranks share them, so wall time is the sum of all ranks' work; the modelled ring "
      "latency is what %d dedicated machines would take)\n\n",
      std::thread::hardware_concurrency(), o.world);
  std::fflush(stdout);

  Full in(o), got(o);
  in.Randomize(42);
  std::mt19937_64 rng(7);
  std::vector<int64_t> rows(static_cast<size_t>(o.samples));
  for (auto& r : rows) r = static_cast<int64_t>(rng() % static_cast<uint64_t>(o.seq));
  rows[0] = 0;  // the first token sees only itself
  rows[1] = o.seq - 1;

  LayoutResult res[3];
  for (int li = 0; li < 3; ++li) {
    std::printf("[%d/3] %-10s forward + backward on %d ranks ... ", li + 1, names[li], o.world);
    std::fflush(stdout);
    got.Poison();
    res[li] = RunLayout(o, layouts[li], in, &got);
    std::printf("%.2f s; checking %d sampled rows against float64 ... ", res[li].fwd_wall + res[li].bwd_wall,
                o.samples);
    std::fflush(stdout);
    CheckSampledRows(in, got, rows, &res[li].err_out, &res[li].err_lse, &res[li].err_dq, &res[li].err_dk,
                     &res[li].err_dv);
    std::printf("done\n");
    std::fflush(stdout);
  }

  stria_balance_t bal[3];
  for (int li = 0; li < 3; ++li) {
    bal[li].struct_size = sizeof(stria_balance_t);
    CHECK_STRIA(stria_analyze_balance(layouts[li], 1, o.seq, o.world, 64, &bal[li]));
  }
  const double tol = o.dtype == DemoDtype::kF32 ? 1e-5 : 2e-2;
  std::printf("\n%-10s | %9s %9s | %12s %12s | %9s %10s | %9s %9s %9s %9s %9s\n", "layout", "fwd wall", "bwd wall",
              "ring fwd", "ring bwd", "speedup", "analytic", "err out", "err lse", "err dq", "err dk", "err dv");
  std::printf("%-10s | %9s %9s | %12s %12s | %9s %10s |\n", "", "(s)", "(s)", "model (s)", "model (s)", "vs contig",
              "(tile 64)");
  bool ok = true;
  for (int li = 0; li < 3; ++li) {
    const LayoutResult& r = res[li];
    const double measured = (res[0].fwd_model + res[0].bwd_model) / (r.fwd_model + r.bwd_model);
    const double analytic = bal[0].ring_latency / bal[li].ring_latency;
    std::printf("%-10s | %9.2f %9.2f | %12.3f %12.3f | %8.2fx %9.2fx | %9.1e %9.1e %9.1e %9.1e %9.1e\n", names[li],
                r.fwd_wall, r.bwd_wall, r.fwd_model, r.bwd_model, measured, analytic, r.err_out, r.err_lse, r.err_dq,
                r.err_dk, r.err_dv);
    for (double e : {r.err_out, r.err_dq, r.err_dk, r.err_dv})
      if (!(e < tol)) ok = false;
    if (!(r.err_lse < 1e-5)) ok = false;
  }
  std::printf("\nstriped balance: speedup %.2f of an ideal %d (imbalance %.3f); contiguous: %.2f (imbalance %.3f)\n",
              bal[2].speedup, o.world, bal[2].imbalance, bal[0].speedup, bal[0].imbalance);
  std::printf("%s: relative errors %s the %s tolerance (%.0e)\n", ok ? "OK" : "FAILED", ok ? "within" : "outside",
              DtypeName(o.dtype), tol);
  return ok ? 0 : 1;
}

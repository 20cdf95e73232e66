// CPU benchmark of stria through its public API.
//
//   stria-bench kernel --dim D --len L --heads H [--causal 0|1] [--dtype f32|bf16] [--threads T]
//                      [--docs n] [--softcap c] [--sinks 0|1]
//       one block (world_size 1): forward and backward median time and GFLOP/s, counted like
//       FlashAttention (forward 4·L²·H·D, halved when causal; backward 2.5x the forward). With
//       --docs, n documents of equal length in params (the rate still counts the whole block's
//       FLOPs: the time is what to compare); with --softcap, logit softcapping at c; with --sinks 1,
//       a sink logit per head and the backward's gradient of them. The same FLOPs are counted, so
//       the rates beside the plain call's give the cost of each.
//   stria-bench fp8 --dim D --len L --heads H [--causal 0|1] [--dtype f32|bf16] [--threads T]
//       the forward of the same block with float8_e4m3fn q, k and v (per-head descales for q, one
//       for k and for v) and out in --dtype, beside the forward of --dtype inputs in the same run:
//       the cost of taking FP8 inputs (their widening) next to the attention itself.
//   stria-bench ring --world N --len L --heads H --dim D [--threads-per-rank T] [--docs n]
//                    [--window w]
//       a local group per layout: wall time of the ring against the slowest rank's compute, and
//       the ring latency modelled from per-step compute (sum over steps of the slowest rank), with
//       the imbalance (that latency over the mean rank's compute). With --docs, the forward of n
//       documents of random lengths (fixed cuts, the same for every layout). With --window, a
//       causal sliding window of w keys before each query (stria_attention_forward_window; the
//       ring steps it needs are printed as steps=).
//
// Prints one "key=value" line per measurement so bench/run.sh can tabulate them.
#include <stria/stria.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Args {
  std::string mode;
  int64_t dim = 128, len = 4096, heads = 8, world = 2;
  int causal = 1, threads = 0, reps = 5;
  int64_t docs = 0;     // kernel mode: > 0 runs the document-mask entry points with this many documents
  int64_t window = -1;  // ring mode: >= 0 runs a causal sliding window of this many keys back
  float softcap = 0.f;  // kernel mode: > 0 caps the scores
  int sinks = 0;        // kernel mode: 1 adds attention sinks and their gradient
  bool bf16 = false;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Die(const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, stria_get_last_error());
  std::exit(1);
}

struct Buf {
  std::vector<int64_t> shape;
  std::vector<uint16_t> h;
  std::vector<float> f;
  DLTensor dl{};
  Buf(std::vector<int64_t> s, bool bf16, bool force_f32 = false) : shape(std::move(s)) {
    int64_t n = 1;
    for (auto x : shape) n *= x;
    const bool half = bf16 && !force_f32;
    std::mt19937 rng(static_cast<unsigned>(n));
    std::normal_distribution<float> nd;
    if (half) {
      h.resize(static_cast<size_t>(n));
      for (auto& x : h) {
        float v = nd(rng);
        uint32_t b;
        std::memcpy(&b, &v, 4);
        x = static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
      }
    } else {
      f.resize(static_cast<size_t>(n));
      for (auto& x : f) x = nd(rng);
    }
    dl.data = half ? static_cast<void*>(h.data()) : static_cast<void*>(f.data());
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.shape = shape.data();
    dl.dtype = DLDataType{static_cast<uint8_t>(half ? kDLBfloat : kDLFloat), static_cast<uint8_t>(half ? 16 : 32), 1};
  }
};

// float8_e4m3fn codes of magnitudes 2^-3 .. 2^2 (exponent fields 4..8), random signs and
// mantissas: values of a unit's order, as scaled FP8 activations are.
struct Fp8Buf {
  std::vector<int64_t> shape;
  std::vector<uint8_t> codes;
  DLTensor dl{};
  explicit Fp8Buf(std::vector<int64_t> s) : shape(std::move(s)) {
    int64_t n = 1;
    for (auto x : shape) n *= x;
    std::mt19937 rng(static_cast<unsigned>(n) + 7u);
    codes.resize(static_cast<size_t>(n));
    for (auto& c : codes) {
      const unsigned r = static_cast<unsigned>(rng());
      c = static_cast<uint8_t>(((r & 1u) << 7) | ((4u + (r >> 1) % 5u) << 3) | ((r >> 8) & 7u));
    }
    dl.data = codes.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.shape = shape.data();
    dl.dtype = DLDataType{STRIA_DL_FLOAT8_E4M3FN, 8, 1};
  }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A CPU context of `threads` threads (0: every core).
stria_context_t CpuContext(int threads) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = threads;
  stria_context_t ctx;
  if (stria_context_create(&cfg, &ctx) != STRIA_SUCCESS) Die("stria_context_create");
  return ctx;
}

int Kernel(const Args& a) {
  stria_context_t ctx = CpuContext(a.threads);
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.causal = a.causal;
  const int64_t L = a.len, H = a.heads, D = a.dim;
  Buf q({1, L, H, D}, a.bf16), k({1, L, H, D}, a.bf16), v({1, L, H, D}, a.bf16), o({1, L, H, D}, a.bf16),
      lse({1, H, L}, a.bf16, true), dout({1, L, H, D}, a.bf16), dq({1, L, H, D}, a.bf16), dk({1, L, H, D}, a.bf16),
      dv({1, L, H, D}, a.bf16);
  std::vector<int64_t> cu;  // --docs: n documents of (nearly) equal length
  for (int64_t d = 0; a.docs > 0 && d <= a.docs; ++d) cu.push_back(d * L / a.docs);
  p.cu_seqlens = a.docs > 0 ? cu.data() : nullptr;
  p.num_seqs = a.docs;
  p.softcap = a.softcap;
  Buf z({H}, false, true), dz({H}, false, true);  // sink logits and their gradient, float32
  p.sinks = a.sinks ? &z.dl : nullptr;
  p.dsinks = a.sinks ? &dz.dl : nullptr;
  std::vector<double> tf, tb;
  for (int rep = 0; rep < a.reps + 1; ++rep) {
    double t0 = Now();
    if (stria_attention_forward(ctx, &p, &q.dl, &k.dl, &v.dl, &o.dl, &lse.dl, nullptr) != STRIA_SUCCESS) Die("forward");
    double t1 = Now();
    if (stria_attention_backward(ctx, &p, &q.dl, &k.dl, &v.dl, &o.dl, &lse.dl, &dout.dl, &dq.dl, &dk.dl, &dv.dl,
                                 nullptr) != STRIA_SUCCESS)
      Die("backward");
    double t2 = Now();
    if (rep > 0) {  // the first call sizes the workspaces
      tf.push_back(t1 - t0);
      tb.push_back(t2 - t1);
    }
  }
  const double flops = 4.0 * L * L * H * D * (a.causal ? 0.5 : 1.0);
  const double mf = Median(tf), mb = Median(tb);
  std::printf(
      "kernel impl=stria dtype=%s causal=%d D=%lld L=%lld H=%lld threads=%d docs=%lld softcap=%g sinks=%d fwd_s=%.6f "
      "bwd_s=%.6f fwd_gflops=%.1f bwd_gflops=%.1f\n",
      a.bf16 ? "bf16" : "f32", a.causal, (long long)D, (long long)L, (long long)H, a.threads, (long long)a.docs,
      static_cast<double>(a.softcap), a.sinks, mf, mb, flops / mf / 1e9, 2.5 * flops / mb / 1e9);
  stria_context_destroy(ctx);
  return 0;
}

int Fp8(const Args& a) {
  stria_context_t ctx = CpuContext(a.threads);
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.causal = a.causal;
  const int64_t L = a.len, H = a.heads, D = a.dim;
  Fp8Buf q8({1, L, H, D}), k8({1, L, H, D}), v8({1, L, H, D});
  Buf q({1, L, H, D}, a.bf16), k({1, L, H, D}, a.bf16), v({1, L, H, D}, a.bf16), o({1, L, H, D}, a.bf16),
      lse({1, H, L}, a.bf16, true);
  Buf q_scale({H}, false, true), kv_scale({1}, false, true);
  for (float& x : q_scale.f) x = 0.5f + 0.01f * std::fabs(x);
  kv_scale.f[0] = 0.75f;
  std::vector<double> times[2];
  for (int rep = 0; rep < a.reps + 1; ++rep)
    for (int fp8 = 0; fp8 < 2; ++fp8) {  // alternating, so that both see the machine alike
      p.q_descale = fp8 ? &q_scale.dl : nullptr;
      p.k_descale = p.v_descale = fp8 ? &kv_scale.dl : nullptr;
      const double t0 = Now();
      const stria_status_t st = fp8 ? stria_attention_forward(ctx, &p, &q8.dl, &k8.dl, &v8.dl, &o.dl, &lse.dl, nullptr)
                                    : stria_attention_forward(ctx, &p, &q.dl, &k.dl, &v.dl, &o.dl, &lse.dl, nullptr);
      if (st != STRIA_SUCCESS) Die("forward");
      if (rep > 0) times[fp8].push_back(Now() - t0);  // the first call sizes the workspaces
    }
  const double flops = 4.0 * L * L * H * D * (a.causal ? 0.5 : 1.0);
  const char* dt = a.bf16 ? "bf16" : "f32";
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    const double m = Median(times[fp8]);
    std::printf(
        "fp8 impl=stria inputs=%s out=%s causal=%d D=%lld L=%lld H=%lld threads=%d fwd_s=%.6f fwd_gflops=%.1f\n",
        fp8 ? "float8_e4m3fn" : dt, dt, a.causal, (long long)D, (long long)L, (long long)H, a.threads, m,
        flops / m / 1e9);
  }
  stria_context_destroy(ctx);
  return 0;
}

int Ring(const Args& a) {
  const int n = static_cast<int>(a.world);
  const int64_t L = a.len, H = a.heads, D = a.dim;
  const stria_layout_t layouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG, STRIA_LAYOUT_STRIPED};
  const char* names[] = {"contiguous", "zigzag", "striped"};
  std::vector<int64_t> cu;  // --docs: n documents, cut at fixed random positions
  if (a.docs > 0) {
    std::mt19937_64 rng(12345);
    std::uniform_int_distribution<int64_t> pos(0, L * n);
    cu.push_back(0);
    for (int64_t d = 1; d < a.docs; ++d) cu.push_back(pos(rng));
    cu.push_back(L * n);
    std::sort(cu.begin(), cu.end());
  }
  for (int li = 0; li < 3; ++li) {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.num_threads = a.threads > 0 ? a.threads : 1;
    std::vector<stria_context_t> ctx(static_cast<size_t>(n));
    if (stria_context_create_local_group(&cfg, n, ctx.data()) != STRIA_SUCCESS) Die("local group");
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    p.layout = layouts[li];
    std::vector<double> walls, slowest, best(static_cast<size_t>(n * n), 0.0);
    std::vector<std::vector<stria_step_time_t>> steps(static_cast<size_t>(n),
                                                      std::vector<stria_step_time_t>(static_cast<size_t>(n)));
    std::vector<double> rank_compute(static_cast<size_t>(n));
    std::vector<int> step_counts(static_cast<size_t>(n), n);  // the ring steps each rank's last call ran
    struct RankBufs {
      Buf q, k, v, o, lse;
    };
    std::vector<RankBufs*> bufs;
    for (int r = 0; r < n; ++r)
      bufs.push_back(new RankBufs{Buf({1, L, H, D}, a.bf16), Buf({1, L, H, D}, a.bf16), Buf({1, L, H, D}, a.bf16),
                                  Buf({1, L, H, D}, a.bf16), Buf({1, H, L}, a.bf16, true)});
    for (int rep = 0; rep < a.reps + 1; ++rep) {
      double t0 = Now();
      std::vector<std::thread> ts;
      for (int r = 0; r < n; ++r)
        ts.emplace_back([&, r] {
          RankBufs& b = *bufs[static_cast<size_t>(r)];
          stria_context_t cx = ctx[static_cast<size_t>(r)];
          const stria_status_t st =
              a.window >= 0 ? stria_attention_forward_window(cx, &p, a.window, -1, a.docs > 0 ? cu.data() : nullptr,
                                                             a.docs > 0 ? a.docs : 0, &b.q.dl, &b.k.dl, &b.v.dl,
                                                             &b.o.dl, &b.lse.dl, nullptr)
              : a.docs > 0  ? stria_attention_forward_documents(cx, &p, cu.data(), a.docs, &b.q.dl, &b.k.dl, &b.v.dl,
                                                                &b.o.dl, &b.lse.dl, nullptr)
                            : stria_attention_forward(cx, &p, &b.q.dl, &b.k.dl, &b.v.dl, &b.o.dl, &b.lse.dl, nullptr);
          if (st != STRIA_SUCCESS) Die("ring forward");
          int count = 0;
          auto& mine = steps[static_cast<size_t>(r)];
          std::fill(mine.begin(), mine.end(), stria_step_time_t{});  // steps the ring did not run stay 0
          stria_context_get_step_times(cx, mine.data(), n, &count);
          step_counts[static_cast<size_t>(r)] = count;
          double c = 0;
          for (int s = 0; s < n; ++s) c += mine[static_cast<size_t>(s)].compute_s;
          rank_compute[static_cast<size_t>(r)] = c;
        });
      for (auto& t : ts) t.join();
      const double w = Now() - t0;
      if (rep == 0) continue;
      walls.push_back(w);
      slowest.push_back(*std::max_element(rank_compute.begin(), rank_compute.end()));
      // Per (rank, step), the fastest repetition: noise from the shared machine only ever adds.
      for (int r = 0; r < n; ++r)
        for (int s = 0; s < n; ++s) {
          double& b = best[static_cast<size_t>(r * n + s)];
          const double t = steps[static_cast<size_t>(r)][static_cast<size_t>(s)].compute_cpu_s;
          b = b == 0 ? t : std::min(b, t);
        }
    }
    double model = 0, total = 0;  // sum over steps of the slowest rank; all ranks' compute
    for (int s = 0; s < n; ++s) {
      double mx = 0;
      for (int r = 0; r < n; ++r) {
        mx = std::max(mx, best[static_cast<size_t>(r * n + s)]);
        total += best[static_cast<size_t>(r * n + s)];
      }
      model += mx;
    }
    stria_balance_t bal;
    bal.struct_size = sizeof bal;
    stria_analyze_balance(layouts[li], 1, L * n, n, 64, &bal);
    std::printf(
        "ring layout=%s N=%d L=%lld H=%lld D=%lld threads_per_rank=%d docs=%lld window=%lld steps=%d wall_s=%.6f "
        "slowest_compute_s=%.6f overhead=%.3f model_latency_s=%.6f imbalance=%.3f analytic_latency_pairs=%.0f\n",
        names[li], n, (long long)L, (long long)H, (long long)D, cfg.num_threads, (long long)a.docs, (long long)a.window,
        *std::max_element(step_counts.begin(), step_counts.end()), Median(walls), Median(slowest),
        Median(walls) / Median(slowest) - 1.0, model, model / (total / n), bal.ring_latency);
    for (auto* b : bufs) delete b;
    for (auto c : ctx) stria_context_destroy(c);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: stria-bench kernel|fp8|ring [--dim D] [--len L] [--heads H] [--causal 0|1] "
                 "[--dtype f32|bf16] [--threads T] [--world N] [--reps R] [--docs n] [--window w] [--softcap c] "
                 "[--sinks 0|1]\n");
    return 2;
  }
  a.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--dim")
      a.dim = std::atoll(v);
    else if (k == "--len")
      a.len = std::atoll(v);
    else if (k == "--heads")
      a.heads = std::atoll(v);
    else if (k == "--causal")
      a.causal = std::atoi(v);
    else if (k == "--dtype")
      a.bf16 = std::string(v) == "bf16";
    else if (k == "--threads")
      a.threads = std::atoi(v);
    else if (k == "--world")
      a.world = std::atoll(v);
    else if (k == "--reps")
      a.reps = std::atoi(v);
    else if (k == "--docs")
      a.docs = std::atoll(v);
    else if (k == "--softcap")
      a.softcap = std::strtof(v, nullptr);
    else if (k == "--sinks")
      a.sinks = std::atoi(v);
    else if (k == "--window")
      a.window = std::atoll(v);
  }
  if (a.mode == "kernel") return Kernel(a);
  if (a.mode == "fp8") return Fp8(a);
  if (a.mode == "ring") return Ring(a);
  std::fprintf(stderr, "unknown mode %s\n", a.mode.c_str());
  return 2;
}

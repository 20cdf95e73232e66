// Packed documents: the ring on a document plan against the fixed layouts, through the public API.
//
//   stria-plan-bench analysis [--seqs 32768,131072,262144,1048576] [--worlds 2,4,8,16]
//                             [--tiles 64,128] [--seed s]
//       for each document-length distribution, sequence length, world size and tile size: the
//       ring latency of the plan and of each fixed layout as a fraction of the ideal (one device
//       computing every document on its own, tiles from each document's start, over N), counted
//       from the masks as the kernels compute them (stria_plan_analyze_balance); the ring steps;
//       the K/V the plan's ring sends per forward call (blocks trimmed to the rows later ranks see,
//       in whole tiles) against the striped layout's whole blocks; and the time to compute the plan.
//   stria-plan-bench cpu [--world 8] [--seq 32768] [--heads 4] [--dim 64] [--reps 3] [--seed s]
//                        [--dist lognormal]
//       the CPU ring in one process (one thread per rank), forward and backward: the ring latency
//       modelled from every rank's measured compute per step (the sum over steps of the slowest
//       rank's CPU time: N dedicated cores), against the ideal (one rank computing the whole packed
//       sequence, its measured time over N), for the plan and for each fixed layout; and the bytes
//       every rank together sent per forward and backward call (stria_context_get_traffic).
//
// Distributions: lognormal (median 1k tokens, sigma 1, capped at 15k: many short documents and a
// heavy tail), fewlong (three documents of S/8 and many of 50..600 tokens), uniform (1..4096
// tokens), single (one document: plain causal attention).
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

#include "document_lengths.h"

namespace {

void Die(const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, stria_get_last_error());
  std::exit(1);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return out;
}

// Document boundaries [0, .., S] of one batch row (document_lengths.h); exits on an unknown name.
std::vector<int64_t> Documents(const std::string& dist, int64_t S, uint64_t seed) {
  std::vector<int64_t> cu = stria_bench::DocumentBoundaries(dist, S, seed);
  if (cu.empty()) {
    std::fprintf(stderr, "unknown distribution %s (lognormal, fewlong, uniform, single)\n", dist.c_str());
    std::exit(2);
  }
  return cu;
}

struct Plan {
  stria_plan_t plan = nullptr;
  Plan(const std::vector<int64_t>& cu, int64_t S, int world, int64_t tile, int strategy, stria_layout_t layout) {
    stria_plan_config_t cfg;
    stria_plan_config_init(&cfg);
    cfg.world_size = world;
    cfg.tile = tile;
    cfg.strategy = static_cast<stria_plan_strategy_t>(strategy);
    cfg.layout = layout;
    if (stria_plan_create(&cfg, cu.data(), static_cast<int64_t>(cu.size()) - 1, 1, S, &plan) != STRIA_SUCCESS)
      Die("stria_plan_create");
  }
  ~Plan() { stria_plan_destroy(plan); }
  int64_t local_len() const {
    stria_plan_info_t info;
    info.struct_size = sizeof info;
    if (stria_plan_get_info(plan, &info) != STRIA_SUCCESS) Die("stria_plan_get_info");
    return info.local_len;
  }
};

struct Who {
  const char* name;
  int strategy;
  stria_layout_t layout;
};
const Who kWho[] = {{"plan", STRIA_PLAN_BALANCED, STRIA_LAYOUT_STRIPED},
                    {"striped", STRIA_PLAN_LAYOUT, STRIA_LAYOUT_STRIPED},
                    {"zigzag", STRIA_PLAN_LAYOUT, STRIA_LAYOUT_ZIGZAG},
                    {"contiguous", STRIA_PLAN_LAYOUT, STRIA_LAYOUT_CONTIGUOUS}};

int Analysis(int argc, char** argv) {
  std::vector<int64_t> seqs{32768, 131072, 262144, 1048576}, worlds{2, 4, 8, 16}, tiles{64, 128};
  uint64_t seed = 1;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--seqs")
      seqs = ParseList(argv[i + 1]);
    else if (k == "--worlds")
      worlds = ParseList(argv[i + 1]);
    else if (k == "--tiles")
      tiles = ParseList(argv[i + 1]);
    else if (k == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::printf(
      "| distribution | S | N | tile | docs | plan | striped | zigzag | contiguous | plan steps | plan K/V bytes / "
      "striped's | plan ms |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const char* dist : {"lognormal", "fewlong", "uniform", "single"})
    for (int64_t S : seqs)
      for (int64_t N : worlds)
        for (int64_t tile : tiles) {
          if (S % (2 * N) != 0) continue;  // the fixed layouts' rule (a plan takes any S)
          const std::vector<int64_t> cu = Documents(dist, S, seed);
          double of[4] = {0, 0, 0, 0};
          int steps[4] = {0, 0, 0, 0};
          int64_t local[4] = {0, 0, 0, 0};
          double plan_ms = 0, rows_sent = 0;
          for (int w = 0; w < 4; ++w) {
            const double t0 = Now();
            Plan plan(cu, S, static_cast<int>(N), tile, kWho[w].strategy, kWho[w].layout);
            if (w == 0) plan_ms = (Now() - t0) * 1e3;
            stria_balance_t b;
            b.struct_size = sizeof b;
            std::vector<double> work(static_cast<size_t>(N * N));
            if (stria_plan_analyze_balance(plan.plan, tile, &b, work.data()) != STRIA_SUCCESS) Die("analyze");
            of[w] = b.ideal_latency / b.ring_latency;
            for (int64_t s = 0; s < N; ++s)
              for (int64_t r = 0; r < N; ++r)
                if (work[static_cast<size_t>(s * N + r)] > 0) steps[w] = static_cast<int>(s) + 1;
            local[w] = plan.local_len();
            if (w == 0) rows_sent = b.kv_rows_sent;
          }
          // K/V rows sent per forward call: the plan's trimmed blocks against the striped layout's
          // ring on the same documents, which sends whole blocks at every step but the last.
          const double bytes = rows_sent / static_cast<double>((N - 1) * local[1] * N);
          std::printf("| %s | %lld | %lld | %lld | %zu | %.3f | %.3f | %.3f | %.3f | %d | %.3f | %.3f |\n", dist,
                      static_cast<long long>(S), static_cast<long long>(N), static_cast<long long>(tile), cu.size() - 1,
                      of[0], of[1], of[2], of[3], steps[0], bytes, plan_ms);
          std::fflush(stdout);
        }
  // The plan's cost at a million tokens in ten thousand documents (median 60 tokens).
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> len(std::log(60.0), 1.0);
  const int64_t S = 1 << 20;
  std::vector<int64_t> cu{0};
  while (cu.back() < S) cu.push_back(std::min(S, cu.back() + std::max<int64_t>(1, std::llround(len(g)))));
  for (int N : {8, 16}) {
    Plan warm(cu, S, N, 128, STRIA_PLAN_BALANCED, STRIA_LAYOUT_STRIPED);
    const int reps = 20;
    const double t0 = Now();
    for (int i = 0; i < reps; ++i) Plan p(cu, S, N, 128, STRIA_PLAN_BALANCED, STRIA_LAYOUT_STRIPED);
    std::printf("\nplan_cost tokens=%lld documents=%zu world=%d ms=%.3f\n", static_cast<long long>(S), cu.size() - 1, N,
                (Now() - t0) * 1e3 / reps);
  }
  return 0;
}

// Float32 [dims] filled with N(0,1), compact, on the host.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  DLTensor dl{};
  explicit Tensor(std::vector<int64_t> s, uint64_t seed = 0) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    data.resize(static_cast<size_t>(n));
    std::mt19937_64 g(seed);
    std::normal_distribution<float> nd;
    for (float& x : data) x = nd(g);
    dl.data = data.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.shape = shape.data();
    dl.dtype = DLDataType{kDLFloat, 32, 1};
  }
};

// The modelled ring latency of forward and backward (sum over steps of the slowest rank's compute
// CPU time), the medians of `reps` calls.
struct Timing {
  double fwd = 0, bwd = 0;
  double fwd_bytes = 0, bwd_bytes = 0;  // sent per call, all ranks (the last call's)
};
Timing RunRing(int world, const std::vector<int64_t>& cu, int64_t S, int64_t H, int64_t D, const Plan* plan,
               stria_layout_t layout, int reps) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = 1;  // per rank, in a local group
  std::vector<stria_context_t> ctx(static_cast<size_t>(world));
  if (stria_context_create_local_group(&cfg, world, ctx.data()) != STRIA_SUCCESS) Die("local group");
  const int64_t L = plan != nullptr ? plan->local_len() : S / world;
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = layout;
  params.plan = plan != nullptr ? plan->plan : nullptr;
  const int64_t num_seqs = static_cast<int64_t>(cu.size()) - 1;
  std::vector<std::vector<double>> fwd(static_cast<size_t>(reps)), bwd(static_cast<size_t>(reps));
  std::vector<std::thread> threads;
  std::vector<std::vector<std::vector<double>>> steps_f(static_cast<size_t>(world)),
      steps_b(static_cast<size_t>(world));
  std::vector<double> sent_f(static_cast<size_t>(world)), sent_b(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      Tensor q({1, L, H, D}, 1 + r), k({1, L, H, D}, 100 + r), v({1, L, H, D}, 200 + r), dout({1, L, H, D}, 300 + r);
      Tensor out({1, L, H, D}), lse({1, H, L}), dq({1, L, H, D}), dk({1, L, H, D}), dv({1, L, H, D});
      stria_context_t c = ctx[static_cast<size_t>(r)];
      auto sent = [&](double* into) {
        stria_traffic_t t;
        t.struct_size = sizeof t;
        if (stria_context_get_traffic(c, &t) != STRIA_SUCCESS) Die("traffic");
        *into = static_cast<double>(t.kv_bytes + t.dkv_bytes);
      };
      auto times = [&](std::vector<std::vector<double>>* into) {
        stria_step_time_t st[64];
        int n = 0;
        stria_context_get_step_times(c, st, 64, &n);
        std::vector<double> t;
        for (int s = 0; s < std::min(n, 64); ++s) t.push_back(st[s].compute_cpu_s);
        into->push_back(t);
      };
      for (int rep = 0; rep < reps; ++rep) {
        if (stria_attention_forward_documents(c, &params, cu.data(), num_seqs, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl,
                                              nullptr) != STRIA_SUCCESS)
          Die("forward");
        times(&steps_f[static_cast<size_t>(r)]);
        sent(&sent_f[static_cast<size_t>(r)]);
        if (stria_attention_backward_documents(c, &params, cu.data(), num_seqs, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl,
                                               &dout.dl, &dq.dl, &dk.dl, &dv.dl, nullptr) != STRIA_SUCCESS)
          Die("backward");
        times(&steps_b[static_cast<size_t>(r)]);
        sent(&sent_b[static_cast<size_t>(r)]);
      }
    });
  for (auto& t : threads) t.join();
  for (auto c : ctx) stria_context_destroy(c);
  auto model = [&](const std::vector<std::vector<std::vector<double>>>& steps) {
    std::vector<double> lat;
    for (int rep = 0; rep < reps; ++rep) {
      const size_t n = steps[0][static_cast<size_t>(rep)].size();
      double sum = 0;
      for (size_t s = 0; s < n; ++s) {
        double most = 0;
        for (int r = 0; r < world; ++r)
          most = std::max(most, steps[static_cast<size_t>(r)][static_cast<size_t>(rep)][s]);
        sum += most;
      }
      lat.push_back(sum);
    }
    std::sort(lat.begin(), lat.end());
    return lat[lat.size() / 2];
  };
  double all_f = 0, all_b = 0;
  for (int r = 0; r < world; ++r) {
    all_f += sent_f[static_cast<size_t>(r)];
    all_b += sent_b[static_cast<size_t>(r)];
  }
  return Timing{model(steps_f), model(steps_b), all_f, all_b};
}

int Cpu(int argc, char** argv) {
  int world = 8, reps = 3;
  int64_t S = 32768, H = 4, D = 64;
  uint64_t seed = 1;
  std::string dist = "lognormal";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--world")
      world = std::atoi(argv[i + 1]);
    else if (k == "--seq")
      S = std::atoll(argv[i + 1]);
    else if (k == "--heads")
      H = std::atoll(argv[i + 1]);
    else if (k == "--dim")
      D = std::atoll(argv[i + 1]);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (k == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--dist")
      dist = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const std::vector<int64_t> cu = Documents(dist, S, seed);
  // The CPU kernels' tile is 64 tokens: the plan is made for it.
  const Timing ideal = RunRing(1, cu, S, H, D, nullptr, STRIA_LAYOUT_STRIPED, reps);
  std::printf("cpu dist=%s S=%lld N=%d H=%lld D=%lld docs=%zu ideal_fwd_ms=%.2f ideal_bwd_ms=%.2f\n", dist.c_str(),
              static_cast<long long>(S), world, static_cast<long long>(H), static_cast<long long>(D), cu.size() - 1,
              ideal.fwd * 1e3 / world, ideal.bwd * 1e3 / world);
  std::printf(
      "| who | fwd latency ms | fwd of ideal | bwd latency ms | bwd of ideal | fwd MB sent | bwd MB sent |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Who& who : kWho) {
    if (who.strategy == STRIA_PLAN_LAYOUT && S % (2 * world) != 0) continue;
    Plan plan(cu, S, world, 64, who.strategy, who.layout);
    const Timing t =
        RunRing(world, cu, S, H, D, who.strategy == STRIA_PLAN_BALANCED ? &plan : nullptr, who.layout, reps);
    std::printf("| %s | %.2f | %.3f | %.2f | %.3f | %.1f | %.1f |\n", who.name, t.fwd * 1e3, ideal.fwd / world / t.fwd,
                t.bwd * 1e3, ideal.bwd / world / t.bwd, t.fwd_bytes / 1e6, t.bwd_bytes / 1e6);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "analysis") return Analysis(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "cpu") return Cpu(argc, argv);
  std::fprintf(stderr, "usage: stria-plan-bench analysis|cpu [options] (see the file's comment)\n");
  return 2;
}

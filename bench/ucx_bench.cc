// One rank of the UCX benchmarks (bench/ucx_run.sh starts two, one core each).
//   ring:     the striped/zigzag/contiguous causal ring, forward and backward; prints each call's
//             wall time and its per-step compute and wait, so the report can set the wall time
//             against the compute-only ring latency (sum over steps of the slowest rank).
//   transfer: K/V-block-sized messages from rank 0 to rank 1 through the UCX transport module
//             itself, one at a time as the ring sends them; prints the bandwidth.
//   alltoall: every rank sends every other rank a message of the given size at once and waits for
//             all of them, as a grid's all-to-all does (post every receive, then every send);
//             prints the bytes each rank sent per second, to set beside `transfer` of as many
//             bytes.
// `ring` takes a grid's group size as its sixth argument (stria_context_set_grid; default 1).
// Ranks come from RANK/WORLD_SIZE and the rendezvous from STRIA_ROOT, as for any launch.
// Times are CLOCK_MONOTONIC (steady_clock), which all processes of one host share: a call's ring
// time is from the last rank's entry to the last rank's exit, so a rank that arrives early (it
// finished the previous call sooner) does not count its wait for the others.
#include <dlfcn.h>
#include <stria/stria.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "transport/module_abi.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

DLTensor Tensor(void* data, int ndim, int64_t* shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

int Ring(int rank, int world, int64_t L, int64_t H, int64_t D, int reps, int ulysses) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = STRIA_TRANSPORT_UCX;
  cfg.num_threads = 1;
  cfg.timeout_s = 600;
  stria_context_t ctx;
  if (stria_context_create(&cfg, &ctx) != STRIA_SUCCESS ||
      (ulysses != 1 && stria_context_set_grid(ctx, ulysses) != STRIA_SUCCESS)) {
    std::fprintf(stderr, "rank %d: %s\n", rank, stria_get_last_error());
    return 1;
  }
  const size_t n = static_cast<size_t>(L * H * D);
  std::vector<float> q(n), k(n), v(n), out(n), dout(n), dq(n), dk(n), dv(n), lse(static_cast<size_t>(H * L));
  for (size_t i = 0; i < n; ++i) {
    q[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.f - 0.5f;
    k[i] = static_cast<float>((i * 40503u) % 997) / 997.f - 0.5f;
    v[i] = static_cast<float>((i * 9973u) % 991) / 991.f - 0.5f;
    dout[i] = 0.01f * v[i];
  }
  int64_t shape[4] = {1, L, H, D}, lse_shape[3] = {1, H, L};
  DLTensor tq = Tensor(q.data(), 4, shape), tk = Tensor(k.data(), 4, shape), tv = Tensor(v.data(), 4, shape),
           to = Tensor(out.data(), 4, shape), tdo = Tensor(dout.data(), 4, shape), tdq = Tensor(dq.data(), 4, shape),
           tdk = Tensor(dk.data(), 4, shape), tdv = Tensor(dv.data(), 4, shape), tl = Tensor(lse.data(), 3, lse_shape);
  const stria_layout_t layouts[3] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG, STRIA_LAYOUT_STRIPED};
  const char* names[3] = {"contiguous", "zigzag", "striped"};
  std::vector<stria_step_time_t> steps(static_cast<size_t>(world));
  for (int li = 0; li < 3; ++li) {
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    p.layout = layouts[li];
    p.causal = 1;
    for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms up
      for (int pass = 0; pass < 2; ++pass) {
        const double t0 = Now();
        stria_status_t s =
            pass == 0 ? stria_attention_forward(ctx, &p, &tq, &tk, &tv, &to, &tl, nullptr)
                      : stria_attention_backward(ctx, &p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv, nullptr);
        const double wall = Now() - t0;
        if (s != STRIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: %s\n", rank, stria_get_last_error());
          return 1;
        }
        int num = 0;
        stria_context_get_step_times(ctx, steps.data(), world, &num);
        if (rep < 0) continue;
        if (num == 0) {  // a grid of one group (pure all-to-all) runs no ring step: the call alone
          std::printf("STEP %s %s %d %d %d %.6f %.6f %.6f %.6f %.6f\n", names[li], pass == 0 ? "fwd" : "bwd", rep, rank,
                      0, 0.0, 0.0, 0.0, t0, t0 + wall);
        }
        for (int st = 0; st < num; ++st)
          std::printf("STEP %s %s %d %d %d %.6f %.6f %.6f %.6f %.6f\n", names[li], pass == 0 ? "fwd" : "bwd", rep, rank,
                      st, steps[static_cast<size_t>(st)].compute_s, steps[static_cast<size_t>(st)].compute_cpu_s,
                      steps[static_cast<size_t>(st)].wait_s, t0, t0 + wall);
      }
    }
  }
  stria_context_destroy(ctx);
  return 0;
}

// The UCX transport module, created for this rank (no context: the bare transport).
stria::Transport* OpenTransport(int rank, int world) {
  void* lib = dlopen(STRIA_UCX_MODULE, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return nullptr;
  }
  auto* module = static_cast<const stria::TransportModule*>(dlsym(lib, "stria_ucx_module_v3"));
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = STRIA_TRANSPORT_UCX;
  stria::Transport* t = nullptr;
  stria::Status s = module->create(cfg, nullptr, 600, &t);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.message().c_str());
    return nullptr;
  }
  return t;
}

int Transfer(int rank, int world, size_t bytes, int iters) {
  stria::Transport* t = OpenTransport(rank, world);
  if (t == nullptr) return 1;
  stria::Status s;
  std::vector<char> buf(bytes, static_cast<char>(rank + 1));
  char token[8] = {}, all[64] = {};
  for (int round = 0; round < 2; ++round) {  // round 0 warms up (connection, registration)
    (void)t->AllGather(token, all, 8, 600, "start");
    const double t0 = Now();
    const int n = round == 0 ? 3 : iters;
    for (int i = 0; i < n; ++i) {
      stria::RequestId r = 0;
      s = rank == 0 ? t->Isend(1, (int64_t{i} << 24) | 1, buf.data(), bytes, &r)
                    : t->Irecv(0, (int64_t{i} << 24) | 1, buf.data(), bytes, &r);
      if (s.ok()) s = t->Wait(r, 600, "transfer");
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.message().c_str());
        return 1;
      }
    }
    const double dt = Now() - t0;
    if (round == 1 && rank == 1)
      std::printf("TRANSFER %zu %d %.6f %.3f\n", bytes, iters, dt, static_cast<double>(bytes) * iters / dt / 1e9);
  }
  (void)t->AllGather(token, all, 8, 600, "end");
  delete t;
  return 0;
}

int AllToAll(int rank, int world, size_t bytes, int iters) {
  stria::Transport* t = OpenTransport(rank, world);
  if (t == nullptr) return 1;
  const size_t peers = static_cast<size_t>(world - 1);
  std::vector<char> out(bytes * peers, static_cast<char>(rank + 1)), in(bytes * peers);
  std::vector<char> token(8), all(8 * static_cast<size_t>(world));
  std::vector<stria::RequestId> reqs;
  for (int round = 0; round < 2; ++round) {  // round 0 warms up (connections, registration)
    (void)t->AllGather(token.data(), all.data(), 8, 600, "start");
    const double t0 = Now();
    const int n = round == 0 ? 3 : iters;
    for (int i = 0; i < n; ++i) {
      reqs.clear();
      stria::Status s;
      const int64_t tag = (int64_t{i} << 24) | 1;
      for (int j = 1; j < world && s.ok(); ++j) {  // from the ranks before this one, nearest first
        const int peer = (rank - j + world) % world;
        stria::RequestId r = 0;
        s = t->Irecv(peer, tag, in.data() + static_cast<size_t>(j - 1) * bytes, bytes, &r);
        reqs.push_back(r);
      }
      for (int j = 1; j < world && s.ok(); ++j) {  // to the ranks after it, nearest first
        const int peer = (rank + j) % world;
        stria::RequestId r = 0;
        s = t->Isend(peer, tag, out.data() + static_cast<size_t>(j - 1) * bytes, bytes, &r);
        reqs.push_back(r);
      }
      for (stria::RequestId r : reqs)
        if (s.ok()) s = t->Wait(r, 600, "all-to-all");
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.message().c_str());
        return 1;
      }
    }
    const double dt = Now() - t0;
    if (round == 1)
      std::printf("ALLTOALL %d %d %zu %d %.6f %.3f\n", world, rank, bytes, iters, dt,
                  static_cast<double>(bytes * peers) * iters / dt / 1e9);
  }
  (void)t->AllGather(token.data(), all.data(), 8, 600, "end");
  delete t;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = EnvInt("RANK", -1), world = EnvInt("WORLD_SIZE", -1);
  const std::string mode = argc > 1 ? argv[1] : "ring";
  if (rank < 0 || world < 1) {
    std::fprintf(stderr, "set RANK, WORLD_SIZE and STRIA_ROOT\n");
    return 2;
  }
  if (mode == "ring")
    return Ring(rank, world, argc > 2 ? std::atoll(argv[2]) : 4096, argc > 3 ? std::atoll(argv[3]) : 2,
                argc > 4 ? std::atoll(argv[4]) : 128, argc > 5 ? std::atoi(argv[5]) : 3,
                argc > 6 ? std::atoi(argv[6]) : 1);
  if (mode == "alltoall")
    return AllToAll(rank, world, argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (4u << 20),
                    argc > 3 ? std::atoi(argv[3]) : 20);
  if (mode == "transfer")
    return Transfer(rank, world, argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (16u << 20),
                    argc > 3 ? std::atoi(argv[3]) : 50);
  std::fprintf(stderr, "mode: ring | transfer | alltoall\n");
  return 2;
}

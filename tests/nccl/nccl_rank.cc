// One rank of a ring of processes over the NCCL transport, for the multi-GPU tests (and by hand:
// RANK/WORLD_SIZE or Open MPI's variables, STRIA_ROOT or --id-file). Every rank draws the same
// full-sequence inputs from a seed, takes its shard, copies it to its GPU (device rank % the
// number of visible GPUs, or LOCAL_RANK), runs forward and backward and compares its own rows with
// a float64 dense reference. It can also play a fault: be killed, or be aborted from a thread.
//
// It prints a line per finished call and ends with
//   RESULT rank=R code=C seconds=T message=(status name) ...
// (tests/ucx/launcher.h reads it), C being the stria_status_t of the first failing call.
#include <cuda_runtime_api.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "rank_process.h"
#include "test_util.h"

using namespace stria_test;

namespace {

struct Options : RankOptions {
  int device = -1;  // LOCAL_RANK, --device, else rank % the number of visible GPUs
  // Faults (kill | abort) are played in the last iteration.
  Options() {
    dtypes = {Dt::kBF16};
    L = 128;
    D = 64;
    timeout = 60;
  }
};

Options Parse(int argc, char** argv) {
  Options o;
  o.ReadEnvironment();
  o.device = EnvInt("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (o.RankOptions::Parse(k, v)) continue;
    if (k == "--device") o.device = std::stoi(v);
  }
  return o;
}

void Result(const Options& o, stria_status_t s, double t0, const std::string& msg) {
  PrintResult(o.rank, s, t0, msg);
}

// A device copy of a host tensor.
struct OnDevice {
  void* ptr = nullptr;
  DLTensor dl{};
  size_t bytes = 0;
  OnDevice(const Tensor& host, int device) {
    bytes = host.storage.size();
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
    if (ptr) cudaMemcpy(ptr, host.storage.data(), bytes, cudaMemcpyHostToDevice);
    dl = host.dl;
    dl.data = ptr;
    dl.device = DLDevice{kDLCUDA, device};
  }
  ~OnDevice() { cudaFree(ptr); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  void Poison() { cudaMemset(ptr, 0xFF, bytes); }
  void CopyTo(Tensor* host) const { cudaMemcpy(host->storage.data(), ptr, bytes, cudaMemcpyDeviceToHost); }
};

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o = Parse(argc, argv);
  const double t0 = Now();
  if (o.rank < 0 || o.world < 1) {
    std::fprintf(stderr, "usage: %s --rank R --world N (or RANK/WORLD_SIZE) [options]\n", argv[0]);
    return 2;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    Result(o, STRIA_ERROR_UNSUPPORTED, t0, "no CUDA device");
    return 0;
  }
  if (o.device < 0) o.device = o.rank % gpus;
  cudaSetDevice(o.device);

  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = o.rank;
  cfg.world_size = o.world;
  cfg.transport = STRIA_TRANSPORT_NCCL;
  cfg.device = DLDevice{kDLCUDA, o.device};
  cfg.timeout_s = o.timeout;
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
  std::printf("rank %d: joined on GPU %d after %.3f s\n", o.rank, o.device, Now() - t0);

  const RankTokens tokens(o);
  if (tokens.status != STRIA_SUCCESS) {
    stria_context_destroy(ctx);
    Result(o, tokens.status, t0, stria_get_last_error());
    return 0;
  }
  const int64_t S = tokens.S, L = tokens.L;
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = o.layout;
  params.causal = o.causal;
  params.plan = tokens.plan;
  const bool odd = o.rank == o.fault_rank;
  const std::string msg = "all results match the float64 reference";
  for (Dt dt : o.dtypes) {
    std::mt19937_64 rng(42);
    Tensor q({1, S, o.Hq, o.D}, dt), k({1, S, o.Hkv, o.D}, dt), v({1, S, o.Hkv, o.D}, dt), dout({1, S, o.Hq, o.D}, dt);
    for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
    Tensor ql({1, L, o.Hq, o.D}, dt), kl({1, L, o.Hkv, o.D}, dt), vl({1, L, o.Hkv, o.D}, dt),
        dol({1, L, o.Hq, o.D}, dt);
    tokens.Shard(o, q, &ql);
    tokens.Shard(o, k, &kl);
    tokens.Shard(o, v, &vl);
    tokens.Shard(o, dout, &dol);
    Tensor out({1, L, o.Hq, o.D}, dt), lse({1, o.Hq, L}, Dt::kF32), dq({1, L, o.Hq, o.D}, dt),
        dk({1, L, o.Hkv, o.D}, dt), dv({1, L, o.Hkv, o.D}, dt);
    OnDevice qd(ql, o.device), kd(kl, o.device), vd(vl, o.device), dod(dol, o.device), outd(out, o.device),
        lsed(lse, o.device), dqd(dq, o.device), dkd(dk, o.device), dvd(dv, o.device);
    if (!qd.ptr || !kd.ptr || !vd.ptr || !dod.ptr || !outd.ptr || !lsed.ptr || !dqd.ptr || !dkd.ptr || !dvd.ptr) {
      stria_context_destroy(ctx);
      Result(o, STRIA_ERROR_OUT_OF_MEMORY, t0, "cudaMalloc failed");
      return 0;
    }
    for (int it = 0; it < o.iters; ++it) {
      for (OnDevice* t : {&outd, &lsed, &dqd, &dkd, &dvd}) t->Poison();
      cudaDeviceSynchronize();
      std::thread fault;
      if (odd && it == o.iters - 1 && o.fault == "kill") fault = AfterDelay(o.fault_delay_ms, [] { raise(SIGKILL); });
      if (odd && it == o.iters - 1 && o.fault == "abort")
        fault = AfterDelay(o.fault_delay_ms, [ctx] { stria_context_abort(ctx); });
      // --window-left: a window that may shorten the ring; --plan-docs: documents on a plan.
      s = AttentionForward(ctx, &params, tokens.documents, tokens.num_seqs(), &qd.dl, &kd.dl, &vd.dl, &outd.dl,
                           &lsed.dl, nullptr, o.window);
      if (s == STRIA_SUCCESS)
        s = AttentionBackward(ctx, &params, tokens.documents, tokens.num_seqs(), &qd.dl, &kd.dl, &vd.dl, &outd.dl,
                              &lsed.dl, &dod.dl, &dqd.dl, &dkd.dl, &dvd.dl, nullptr, o.window);
      const std::string call_error = stria_get_last_error();
      if (fault.joinable()) fault.join();
      if (s != STRIA_SUCCESS) {
        // A failed context must refuse more work and still be destroyed cleanly (and soon).
        const std::string m = AfterFailure(
            ctx, call_error,
            [&] { return stria_attention_forward(ctx, &params, &qd.dl, &kd.dl, &vd.dl, &outd.dl, &lsed.dl, nullptr); },
            15);
        Result(o, s, t0, m);
        return 0;
      }
      std::printf("rank %d: %s iteration %d done at %.3f s\n", o.rank, DtName(dt), it, Now() - t0);
    }
    cudaDeviceSynchronize();
    outd.CopyTo(&out);
    lsed.CopyTo(&lse);
    dqd.CopyTo(&dq);
    dkd.CopyTo(&dk);
    dvd.CopyTo(&dv);
    const std::string mismatch = CompareWithReference(o.rank, dt, q, k, v, dout, RankResults{&out, &lse, &dq, &dk, &dv},
                                                      tokens.pos, o.causal, dt == Dt::kF32 ? 1e-5 : 1e-3, o.window,
                                                      tokens.documents.empty() ? nullptr : &tokens.documents);
    if (!mismatch.empty()) {
      stria_context_destroy(ctx);
      Result(o, STRIA_ERROR_INTERNAL, t0, mismatch);
      return 1;
    }
  }
  s = stria_context_destroy(ctx);
  Result(o, s, t0, s == STRIA_SUCCESS ? msg : stria_get_last_error());
  return 0;
}

// The extern "C" layer: argument checks that need no engine state, handle lookup, and the
// conversion of every outcome — Status, std::bad_alloc, any other exception — into a status code
// plus this thread's last-error message. Nothing escapes across the ABI.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "backend/backend.h"
#include "core/raw_enum.h"
#include "core/struct_size.h"
#include "core/thread_pool.h"
#include "engine/plan_registry.h"
#include "engine/registry.h"
#include "layout/balance.h"
#include "layout/grid_layout.h"
#include "layout/layout.h"
#include "layout/plan.h"
#include "layout/plan_balance.h"
#include "layout/shard.h"
#include "ring/ring.h"
#include "ring/ring_order.h"
#include "serve/decode.h"
#include "serve/prefill.h"
#include "transport/module_abi.h"

using stria::Error;
using stria::Status;

namespace {

// A fixed buffer, not a std::string: thread_local objects with destructors complicate dlclose.
thread_local char g_last_error[2048];

stria_status_t Finish(const Status& s) {
  if (s.ok()) {
    g_last_error[0] = '\0';
    return STRIA_SUCCESS;
  }
  std::snprintf(g_last_error, sizeof g_last_error, "%s", s.message().c_str());
  return s.code();
}

template <typename F>
stria_status_t Guard(F&& body) {
  try {
    return Finish(body());
  } catch (const std::bad_alloc&) {
    return Finish(Error(STRIA_ERROR_OUT_OF_MEMORY, "out of host memory"));
  } catch (const std::exception& e) {
    return Finish(Error(STRIA_ERROR_INTERNAL, "internal error: %s", e.what()));
  } catch (...) {
    return Finish(Error(STRIA_ERROR_INTERNAL, "internal error: unknown exception"));
  }
}

Status Lookup(stria_context_t handle, std::shared_ptr<stria::Context>* out) {
  if (handle == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  *out = stria::LookupContext(handle);
  if (!*out)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "ctx %p is not a live context (destroyed already?)",
                 static_cast<void*>(handle));
  return Status::Ok();
}

// Threads of one context's CPU backend, and of a local group's as a whole: far more than any
// machine's cores, small enough that a mistaken value is an error rather than a process that
// exhausts the system's threads.
constexpr int kMaxThreads = 1024, kMaxGroupThreads = 8192;
constexpr int kMaxLocalGroup = 1024;

Status CheckConfig(const stria_context_config_t* c) {
  if (c == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "config is NULL (use stria_context_config_init)");
  STRIA_RETURN_IF_ERROR(
      stria::CheckStructSize(c, c->struct_size, sizeof(stria_context_config_t), "config", "stria_context_config_init"));
  if (!std::isfinite(c->timeout_s) || c->timeout_s < 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->timeout_s %g must be finite and >= 0 (0: default)",
                 c->timeout_s);
  if (c->num_threads < 0 || c->num_threads > kMaxThreads)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->num_threads %d is out of range 0..%d (0: all)", c->num_threads,
                 kMaxThreads);
  if (!stria::ValidTransport(stria::RawEnum(c->transport)))
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->transport %d is not a transport (0 local, 1 ucx, 2 nccl)",
                 stria::RawEnum(c->transport));
  return stria::CheckRingOrderSwitch();
}

double Timeout(const stria_context_config_t* c) {
  return c->timeout_s > 0 ? c->timeout_s : stria::kDefaultTimeoutS;
}

// stria_context_create and stria_context_create_with_nccl_comm (nccl_comm NULL for the first).
Status CreateContext(const stria_context_config_t* config, void* nccl_comm, stria_context_t* ctx) {
  if (ctx == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "ctx (the output) is NULL");
  *ctx = nullptr;
  STRIA_RETURN_IF_ERROR(CheckConfig(config));
  if (nccl_comm != nullptr && stria::RawEnum(config->transport) != STRIA_TRANSPORT_NCCL)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "config->transport is %d: a caller's NCCL communicator goes with STRIA_TRANSPORT_NCCL (2)",
                 stria::RawEnum(config->transport));
  if (config->world_size < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->world_size %d is not positive", config->world_size);
  if (config->rank < 0 || config->rank >= config->world_size)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->rank %d is out of range for world_size %d", config->rank,
                 config->world_size);
  const int threads = config->num_threads > 0 ? config->num_threads : stria::HardwareThreads();
  std::unique_ptr<stria::Backend> backend;
  STRIA_RETURN_IF_ERROR(stria::CreateBackend(config->device, threads, &backend));
  std::unique_ptr<stria::Transport> transport;
  STRIA_RETURN_IF_ERROR(stria::CreateTransport(*config, nccl_comm, Timeout(config), &transport));
  auto c = std::make_shared<stria::Context>(config->rank, config->world_size, config->device, Timeout(config),
                                            std::move(backend), std::move(transport));
  *ctx = stria::RegisterContext(std::move(c));
  return Status::Ok();
}

Status CheckLayoutArg(const stria_layout_t& layout) {
  const int v = stria::RawEnum(layout);
  if (!stria::ValidLayout(v))
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "unknown layout %d (expected 0 contiguous, 1 striped, 2 zigzag)", v);
  return Status::Ok();
}

// stria_balance_t grew ideal_latency and then kv_rows_sent at its end: a caller built against an
// older header passes a smaller struct, which gets the fields it has.
constexpr size_t kBalanceV1 = offsetof(stria_balance_t, ideal_latency);
Status CheckBalanceOut(const stria_balance_t* out) {
  if (out == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "out is NULL");
  if (out->struct_size < kBalanceV1)
    return stria::CheckStructSize(out, out->struct_size, sizeof(stria_balance_t), "out", "sizeof(stria_balance_t)");
  return stria::CheckStructSize(out, out->struct_size, std::min(out->struct_size, sizeof(stria_balance_t)), "out",
                                "sizeof(stria_balance_t)");
}
void WriteBalance(const stria_balance_t& b, stria_balance_t* out) {
  const size_t size = out->struct_size;
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(size_t), reinterpret_cast<const char*>(&b) + sizeof(size_t),
              std::min(size, sizeof(stria_balance_t)) - sizeof(size_t));
}

Status LookupPlanArg(stria_plan_t handle, std::shared_ptr<const stria::Plan>* out) {
  if (handle == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan is NULL");
  *out = stria::LookupPlan(handle);
  if (!*out)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan %p is not a live plan (destroyed already?)",
                 static_cast<void*>(handle));
  return Status::Ok();
}

// A local group's output array: checked, and cleared so that a failure leaves no handle in it.
Status ClearGroupOutput(int world_size, stria_context_t* ctxs) {
  if (ctxs == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "ctxs (the output array) is NULL");
  if (world_size < 1 || world_size > kMaxLocalGroup)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "world_size %d is out of range 1..%d", world_size, kMaxLocalGroup);
  for (int i = 0; i < world_size; ++i) ctxs[i] = nullptr;
  return Status::Ok();
}

// A local group into ctxs (cleared already): rank r on devices[r], or every rank on
// config->device (devices == NULL).
Status MakeLocalGroup(const stria_context_config_t* config, const DLDevice* devices, int world_size,
                      stria_context_t* ctxs) {
  STRIA_RETURN_IF_ERROR(CheckConfig(config));
  if (stria::RawEnum(config->transport) != STRIA_TRANSPORT_LOCAL)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "a local group uses the local transport (config->transport = %d)",
                 stria::RawEnum(config->transport));
  std::vector<DLDevice> device(static_cast<size_t>(world_size), config->device);
  if (devices != nullptr) {
    for (int r = 0; r < world_size; ++r) {
      device[static_cast<size_t>(r)] = devices[r];
      // One ring moves one wire format between like backends: all CPU ranks, or all CUDA ranks.
      if (stria::RawEnum(devices[r].device_type) != stria::RawEnum(devices[0].device_type)) {
        char a[32], b[32];
        return Error(STRIA_ERROR_INVALID_ARGUMENT,
                     "devices[%d] is %s but devices[0] is %s: the ranks of a local group are all CPU or all CUDA", r,
                     stria::DeviceName(devices[r], a, sizeof a), stria::DeviceName(devices[0], b, sizeof b));
      }
    }
  }
  // "All threads" is shared out among the group's ranks, which run concurrently.
  const int threads =
      config->num_threads > 0 ? config->num_threads : std::max(1, stria::HardwareThreads() / world_size);
  if (static_cast<int64_t>(threads) * world_size > kMaxGroupThreads)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "config->num_threads %d for each of %d ranks is %lld threads, more than a local group's %d", threads,
                 world_size, static_cast<long long>(threads) * world_size, kMaxGroupThreads);
  std::vector<std::unique_ptr<stria::Backend>> backends(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const Status made =
        stria::CreateBackend(device[static_cast<size_t>(r)], threads, &backends[static_cast<size_t>(r)]);
    if (!made.ok() && devices != nullptr)
      return Status(made.code(), stria::Format("devices[%d]: ", r) + made.message());
    STRIA_RETURN_IF_ERROR(made);
  }
  // Device memory needs the backend's copies between ranks (host memory: memcpy); the copier
  // serves ranks on any of the process's GPUs.
  auto transports = stria::CreateLocalGroup(world_size, backends[0]->CreateLocalCopier());
  std::vector<std::shared_ptr<stria::Context>> made;
  for (int r = 0; r < world_size; ++r) {
    made.push_back(std::make_shared<stria::Context>(r, world_size, device[static_cast<size_t>(r)], Timeout(config),
                                                    std::move(backends[static_cast<size_t>(r)]),
                                                    std::move(transports[static_cast<size_t>(r)])));
  }
  for (int r = 0; r < world_size; ++r) ctxs[r] = stria::RegisterContext(made[static_cast<size_t>(r)]);
  return Status::Ok();
}

}  // namespace

extern "C" {

STRIA_API int stria_get_version(void) {
  return STRIA_VERSION;
}

STRIA_API const char* stria_status_string(stria_status_t status) {
  const int s = stria::RawEnum(status);
  switch (s) {
    case STRIA_SUCCESS:
      return "success";
    case STRIA_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case STRIA_ERROR_UNSUPPORTED:
      return "unsupported";
    case STRIA_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case STRIA_ERROR_TRANSPORT:
      return "transport error";
    case STRIA_ERROR_TIMEOUT:
      return "timeout";
    case STRIA_ERROR_CUDA:
      return "CUDA error";
    case STRIA_ERROR_ABORTED:
      return "aborted";
    case STRIA_ERROR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

STRIA_API const char* stria_get_last_error(void) {
  return g_last_error;
}

STRIA_API stria_status_t stria_context_config_init(stria_context_config_t* config) {
  return Guard([&] {
    if (config == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "config is NULL");
    std::memset(config, 0, sizeof *config);
    config->struct_size = sizeof *config;
    config->rank = 0;
    config->world_size = 1;
    config->device.device_type = kDLCPU;
    config->device.device_id = 0;
    config->transport = STRIA_TRANSPORT_LOCAL;
    config->timeout_s = 0;
    config->num_threads = 0;
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_get_unique_id(stria_unique_id_t* id) {
  return Guard([&] {
    if (id == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "id is NULL");
    return stria::GetUniqueId(id);
  });
}

STRIA_API stria_status_t stria_context_create(const stria_context_config_t* config, stria_context_t* ctx) {
  return Guard([&] { return CreateContext(config, nullptr, ctx); });
}

STRIA_API stria_status_t stria_context_create_with_nccl_comm(const stria_context_config_t* config, void* nccl_comm,
                                                             stria_context_t* ctx) {
  return Guard([&] {
    if (ctx != nullptr) *ctx = nullptr;
    if (nccl_comm == nullptr)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "nccl_comm is NULL (stria_context_create makes stria's own communicators from unique_id)");
    return CreateContext(config, nccl_comm, ctx);
  });
}

STRIA_API stria_status_t stria_context_create_local_group(const stria_context_config_t* config, int world_size,
                                                          stria_context_t* ctxs) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(ClearGroupOutput(world_size, ctxs));
    return MakeLocalGroup(config, nullptr, world_size, ctxs);
  });
}

STRIA_API stria_status_t stria_context_create_local_group_on_devices(const stria_context_config_t* config,
                                                                     const DLDevice* devices, int world_size,
                                                                     stria_context_t* ctxs) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(ClearGroupOutput(world_size, ctxs));
    if (devices == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "devices (one per rank) is NULL");
    return MakeLocalGroup(config, devices, world_size, ctxs);
  });
}

STRIA_API stria_status_t stria_context_get_rank(stria_context_t ctx, int* rank) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (rank == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "rank (the output) is NULL");
    *rank = c->rank();
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_get_world_size(stria_context_t ctx, int* world_size) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (world_size == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "world_size (the output) is NULL");
    *world_size = c->world_size();
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_abort(stria_context_t ctx) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    c->Abort();
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_destroy(stria_context_t ctx) {
  return Guard([&] {
    if (ctx == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    std::shared_ptr<stria::Context> c = stria::UnregisterContext(ctx);
    if (!c)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "ctx %p is not a live context (destroyed already?)",
                   static_cast<void*>(ctx));
    // A call still running on another thread (misuse, but survivable) holds its own reference:
    // it is aborted, and the context goes when that call returns. Otherwise the context closes
    // without an abort: its transport lets its last sends leave, and peers still finishing the
    // call this rank has finished get everything it sent (an abort would tell them this rank
    // left mid-call, and a UCX peer waiting for this rank's last dK/dV partial would fail).
    if (c.use_count() > 1) c->Abort();
    return Status::Ok();
  });
}

namespace {
// The defaults of stria_attention_params_t in its first `size` bytes.
stria_status_t InitParams(stria_attention_params_t* params, size_t size) {
  return Guard([&] {
    if (params == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "params is NULL");
    std::memset(params, 0, size);
    params->struct_size = size;
    params->layout = STRIA_LAYOUT_STRIPED;
    params->causal = 1;
    params->softmax_scale = 0.f;
    if (size >= offsetof(stria_attention_params_t, window_right) + sizeof params->window_right) {
      params->window_left = -1;
      params->window_right = -1;
    }
    return Status::Ok();
  });
}
}  // namespace

// stria_attention_params_init. The struct grew `plan` in 0.3, the mask and score fields from
// `cu_seqlens` on in 0.4 and the FP8 descales in 0.7: programs built against an older header pass
// the older, smaller struct to their _init. They bind to that version's definition (libstria.map),
// which fills that much, and the calls read no further than its struct_size; programs built now
// bind to STRIA_0.7's. None of
// the implementations' own names is exported (libstria.map keeps everything outside stria_*
// local), only the versions of the C name.
extern "C" __attribute__((visibility("default"))) stria_status_t params_init_0_2(stria_attention_params_t* params) {
  return InitParams(params, offsetof(stria_attention_params_t, plan));
}
extern "C" __attribute__((visibility("default"))) stria_status_t params_init_0_3(stria_attention_params_t* params) {
  return InitParams(params, offsetof(stria_attention_params_t, cu_seqlens));
}
extern "C" __attribute__((visibility("default"))) stria_status_t params_init_0_4(stria_attention_params_t* params) {
  return InitParams(params, offsetof(stria_attention_params_t, q_descale));
}
extern "C" __attribute__((visibility("default"))) stria_status_t params_init_0_7(stria_attention_params_t* params) {
  return InitParams(params, sizeof *params);
}
__asm__(".symver params_init_0_2,stria_attention_params_init@STRIA_0.2");
__asm__(".symver params_init_0_3,stria_attention_params_init@STRIA_0.3");
__asm__(".symver params_init_0_4,stria_attention_params_init@STRIA_0.4");
__asm__(".symver params_init_0_7,stria_attention_params_init@@STRIA_0.7");

STRIA_API stria_status_t stria_attention_forward(stria_context_t ctx, const stria_attention_params_t* params,
                                                 const DLTensor* q, const DLTensor* k, const DLTensor* v, DLTensor* out,
                                                 DLTensor* lse, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_forward");
    STRIA_RETURN_IF_ERROR(call.status());
    return stria::RingForward(*c, stria::ForwardCall{params, q, k, v, out, lse, stream});
  });
}

STRIA_API stria_status_t stria_kv_cache_init(stria_kv_cache_t* cache) {
  return Guard([&] {
    if (cache == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache is NULL");
    std::memset(cache, 0, sizeof *cache);
    cache->struct_size = sizeof *cache;
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_attention_decode(stria_context_t ctx, const stria_attention_params_t* params,
                                                const stria_kv_cache_t* cache, const DLTensor* q, const DLTensor* k_new,
                                                const DLTensor* v_new, DLTensor* out, DLTensor* lse, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_decode");
    STRIA_RETURN_IF_ERROR(call.status());
    return stria::AttentionDecode(*c, stria::DecodeCall{params, cache, q, k_new, v_new, out, lse, stream});
  });
}

STRIA_API stria_status_t stria_attention_prefill(stria_context_t ctx, const stria_attention_params_t* params,
                                                 const stria_kv_cache_t* cache, stria_prefill_t mode, const DLTensor* q,
                                                 const DLTensor* k, const DLTensor* v, DLTensor* out, DLTensor* lse,
                                                 void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_prefill");
    STRIA_RETURN_IF_ERROR(call.status());
    return stria::AttentionPrefill(*c,
                                   stria::PrefillCall{params, cache, stria::RawEnum(mode), q, k, v, out, lse, stream});
  });
}

STRIA_API stria_status_t stria_attention_backward(stria_context_t ctx, const stria_attention_params_t* params,
                                                  const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                                  const DLTensor* out, const DLTensor* lse, const DLTensor* dout,
                                                  DLTensor* dq, DLTensor* dk, DLTensor* dv, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_backward");
    STRIA_RETURN_IF_ERROR(call.status());
    return stria::RingBackward(*c, stria::BackwardCall{params, q, k, v, out, lse, dout, dq, dk, dv, stream});
  });
}

STRIA_API stria_status_t stria_attention_forward_documents(stria_context_t ctx, const stria_attention_params_t* params,
                                                           const int64_t* cu_seqlens, int64_t num_seqs,
                                                           const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                                           DLTensor* out, DLTensor* lse, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_forward_documents");
    STRIA_RETURN_IF_ERROR(call.status());
    stria::ForwardCall f{params, q, k, v, out, lse, stream};
    f.documents = stria::DocumentsArg{true, cu_seqlens, num_seqs};
    return stria::RingForward(*c, f);
  });
}

STRIA_API stria_status_t stria_attention_backward_documents(stria_context_t ctx, const stria_attention_params_t* params,
                                                            const int64_t* cu_seqlens, int64_t num_seqs,
                                                            const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                                            const DLTensor* out, const DLTensor* lse,
                                                            const DLTensor* dout, DLTensor* dq, DLTensor* dk,
                                                            DLTensor* dv, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_backward_documents");
    STRIA_RETURN_IF_ERROR(call.status());
    stria::BackwardCall b{params, q, k, v, out, lse, dout, dq, dk, dv, stream};
    b.documents = stria::DocumentsArg{true, cu_seqlens, num_seqs};
    return stria::RingBackward(*c, b);
  });
}

namespace {
// The mask of a _window call: the window, and documents unless cu_seqlens is NULL and num_seqs 0
// (a NULL with documents, or boundaries with none, is refused by the documents' checks).
stria::DocumentsArg WindowMask(int64_t window_left, int64_t window_right, const int64_t* cu_seqlens, int64_t num_seqs) {
  const bool documents = cu_seqlens != nullptr || num_seqs != 0;
  return stria::DocumentsArg{documents, cu_seqlens, num_seqs, window_left, window_right};
}
}  // namespace

STRIA_API stria_status_t stria_attention_forward_window(stria_context_t ctx, const stria_attention_params_t* params,
                                                        int64_t window_left, int64_t window_right,
                                                        const int64_t* cu_seqlens, int64_t num_seqs, const DLTensor* q,
                                                        const DLTensor* k, const DLTensor* v, DLTensor* out,
                                                        DLTensor* lse, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_forward_window");
    STRIA_RETURN_IF_ERROR(call.status());
    stria::ForwardCall f{params, q, k, v, out, lse, stream};
    f.documents = WindowMask(window_left, window_right, cu_seqlens, num_seqs);
    return stria::RingForward(*c, f);
  });
}

STRIA_API stria_status_t stria_attention_backward_window(stria_context_t ctx, const stria_attention_params_t* params,
                                                         int64_t window_left, int64_t window_right,
                                                         const int64_t* cu_seqlens, int64_t num_seqs, const DLTensor* q,
                                                         const DLTensor* k, const DLTensor* v, const DLTensor* out,
                                                         const DLTensor* lse, const DLTensor* dout, DLTensor* dq,
                                                         DLTensor* dk, DLTensor* dv, void* stream) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    stria::CallScope call(*c, "stria_attention_backward_window");
    STRIA_RETURN_IF_ERROR(call.status());
    stria::BackwardCall b{params, q, k, v, out, lse, dout, dq, dk, dv, stream};
    b.documents = WindowMask(window_left, window_right, cu_seqlens, num_seqs);
    return stria::RingBackward(*c, b);
  });
}

STRIA_API stria_status_t stria_context_set_call_tag(stria_context_t ctx, uint64_t tag) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    // Under the call guard: a tag set while another thread's call runs would name that call, or
    // the one after it, depending on timing.
    stria::CallScope call(*c, "stria_context_set_call_tag");
    STRIA_RETURN_IF_ERROR(call.status());
    STRIA_RETURN_IF_ERROR(c->Usable());
    c->SetCallTag(tag);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_set_deterministic(stria_context_t ctx, int deterministic) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (deterministic != 0 && deterministic != 1)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "deterministic is %d: use 1 (on) or 0 (off)", deterministic);
    // Under the call guard, like the call tag: a call running on another thread keeps the
    // setting it started with.
    stria::CallScope call(*c, "stria_context_set_deterministic");
    STRIA_RETURN_IF_ERROR(call.status());
    STRIA_RETURN_IF_ERROR(c->Usable());
    c->backend().SetDeterministic(deterministic == 1);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_set_grid(stria_context_t ctx, int ulysses_size) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (ulysses_size < 1 || c->world_size() % ulysses_size != 0)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "ulysses_size %d must be >= 1 and divide the world size %d (all-to-all groups of ulysses_size "
                   "consecutive ranks; 1: the plain ring)",
                   ulysses_size, c->world_size());
    stria::CallScope call(*c, "stria_context_set_grid");  // a running call keeps its grid
    STRIA_RETURN_IF_ERROR(call.status());
    STRIA_RETURN_IF_ERROR(c->Usable());
    c->SetUlyssesSize(ulysses_size);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_get_grid(stria_context_t ctx, int* ulysses_size) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (ulysses_size == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "ulysses_size is NULL");
    stria::CallScope call(*c, "stria_context_get_grid");
    STRIA_RETURN_IF_ERROR(call.status());
    *ulysses_size = c->ulysses_size();
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_grid_positions(stria_layout_t layout, int64_t seq_len, int world_size, int ulysses_size,
                                              int rank, int64_t* positions) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    STRIA_RETURN_IF_ERROR(stria::CheckGrid(layout, seq_len, world_size, ulysses_size, rank));
    if (positions == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "positions is NULL");
    const int64_t L = seq_len / world_size;
    for (int64_t i = 0; i < L; ++i) positions[i] = stria::GridPosition(layout, L, world_size, ulysses_size, rank, i);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_grid_shard(stria_layout_t layout, int world_size, int ulysses_size, int rank,
                                          int seq_dim, const DLTensor* full, DLTensor* local, void* stream) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    return stria::GridShardCopy(layout, world_size, ulysses_size, rank, seq_dim, full, local, true, stream);
  });
}

STRIA_API stria_status_t stria_grid_unshard(stria_layout_t layout, int world_size, int ulysses_size, int rank,
                                            int seq_dim, const DLTensor* local, DLTensor* full, void* stream) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    return stria::GridShardCopy(layout, world_size, ulysses_size, rank, seq_dim, full, local, false, stream);
  });
}

STRIA_API stria_status_t stria_layout_positions(stria_layout_t layout, int64_t seq_len, int world_size, int rank,
                                                int64_t* positions) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    STRIA_RETURN_IF_ERROR(stria::CheckLayout(layout, seq_len, world_size, rank));
    if (positions == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "positions is NULL");
    const int64_t L = seq_len / world_size;
    for (int64_t i = 0; i < L; ++i) positions[i] = stria::GlobalPosition(layout, L, world_size, rank, i);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_shard(stria_layout_t layout, int world_size, int rank, int seq_dim, const DLTensor* full,
                                     DLTensor* local, void* stream) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    return stria::ShardCopy(layout, world_size, rank, seq_dim, full, local, true, stream);
  });
}

STRIA_API stria_status_t stria_unshard(stria_layout_t layout, int world_size, int rank, int seq_dim,
                                       const DLTensor* local, DLTensor* full, void* stream) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    return stria::ShardCopy(layout, world_size, rank, seq_dim, full, local, false, stream);
  });
}

STRIA_API stria_status_t stria_analyze_balance(stria_layout_t layout, int causal, int64_t seq_len, int world_size,
                                               int64_t tile, stria_balance_t* out) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    if (out == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "out is NULL");
    STRIA_RETURN_IF_ERROR(CheckBalanceOut(out));
    stria_balance_t b{};
    STRIA_RETURN_IF_ERROR(stria::AnalyzeBalance(layout, causal != 0, seq_len, world_size, tile, &b));
    b.ideal_latency = stria::IdealLatency(causal != 0, seq_len, world_size, tile);
    b.kv_rows_sent = static_cast<double>(world_size - 1) * static_cast<double>(seq_len);
    WriteBalance(b, out);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_grid_analyze_balance(stria_layout_t layout, int causal, int64_t seq_len, int world_size,
                                                    int ulysses_size, int64_t tile, stria_balance_t* out) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    STRIA_RETURN_IF_ERROR(stria::CheckGrid(layout, seq_len, world_size, ulysses_size, 0));
    if (out == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "out is NULL");
    STRIA_RETURN_IF_ERROR(CheckBalanceOut(out));
    // The ring of R groups; each member computes its group's blocks for 1/U of the heads, so the
    // busiest member's step is the ring rank's over U.
    const int ring = world_size / ulysses_size;
    stria_balance_t b{};
    STRIA_RETURN_IF_ERROR(stria::AnalyzeBalance(layout, causal != 0, seq_len, ring, tile, &b));
    b.ring_latency /= ulysses_size;
    b.speedup = b.ring_latency > 0 ? b.total_work / b.ring_latency : 0;
    b.imbalance = b.total_work > 0 ? b.ring_latency / (b.total_work / world_size) : 0;
    b.ideal_latency = stria::IdealLatency(causal != 0, seq_len, world_size, tile);
    b.kv_rows_sent = static_cast<double>(ring - 1) * static_cast<double>(seq_len);
    WriteBalance(b, out);
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_analyze_balance_steps(stria_layout_t layout, int causal, int64_t seq_len, int world_size,
                                                     int64_t tile, double* work) {
  return Guard([&] {
    STRIA_RETURN_IF_ERROR(CheckLayoutArg(layout));
    if (work == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "work is NULL");
    return stria::BalanceSteps(layout, causal != 0, seq_len, world_size, tile, work);
  });
}

STRIA_API stria_status_t stria_context_get_step_times(stria_context_t ctx, stria_step_time_t* steps, int capacity,
                                                      int* num_steps) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (num_steps == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "num_steps is NULL");
    if (capacity < 0) return Error(STRIA_ERROR_INVALID_ARGUMENT, "capacity %d is negative", capacity);
    if (capacity > 0 && steps == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "steps is NULL");
    stria::CallScope call(*c, "stria_context_get_step_times");  // the times are written by the calls
    STRIA_RETURN_IF_ERROR(call.status());
    const auto& t = c->step_times();
    *num_steps = static_cast<int>(t.size());
    for (int i = 0; i < capacity && i < static_cast<int>(t.size()); ++i) {
      steps[i].compute_s = t[static_cast<size_t>(i)].compute_s;
      steps[i].compute_cpu_s = t[static_cast<size_t>(i)].compute_cpu_s;
      steps[i].wait_s = t[static_cast<size_t>(i)].wait_s;
    }
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_context_get_traffic(stria_context_t ctx, stria_traffic_t* out) {
  return Guard([&] {
    std::shared_ptr<stria::Context> c;
    STRIA_RETURN_IF_ERROR(Lookup(ctx, &c));
    if (out == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "out is NULL");
    // An output struct: a caller built against a newer header may pass a larger one (zeroed past
    // what this library knows), which gets the fields this library has.
    // Before 0.6 the struct ended at `messages`: such a caller gets the fields its struct has.
    constexpr size_t kTrafficV1 = offsetof(stria_traffic_t, all_to_all_bytes);
    const size_t known = out->struct_size == kTrafficV1 ? kTrafficV1 : sizeof(stria_traffic_t);
    if (out->struct_size < known)
      return stria::CheckStructSize(out, out->struct_size, known, "out", "sizeof(stria_traffic_t)");
    STRIA_RETURN_IF_ERROR(stria::CheckStructSize(out, out->struct_size, known, "out", "sizeof(stria_traffic_t)"));
    stria::CallScope call(*c, "stria_context_get_traffic");  // written by the calls
    STRIA_RETURN_IF_ERROR(call.status());
    const stria::Traffic& t = c->traffic();
    out->kv_bytes = t.kv_bytes;
    out->dkv_bytes = t.dkv_bytes;
    out->messages = t.messages;
    if (out->struct_size >= offsetof(stria_traffic_t, all_to_all_bytes) + sizeof(out->all_to_all_bytes))
      out->all_to_all_bytes = t.all_to_all_bytes;
    return Status::Ok();
  });
}

}  // extern "C"

STRIA_API stria_status_t stria_plan_config_init(stria_plan_config_t* config) {
  return Guard([&] {
    if (config == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "config is NULL");
    std::memset(config, 0, sizeof *config);
    config->struct_size = sizeof *config;
    config->world_size = 1;
    config->causal = 1;
    config->window_left = config->window_right = -1;
    config->tile = 128;
    config->strategy = STRIA_PLAN_BALANCED;
    config->layout = STRIA_LAYOUT_STRIPED;
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_plan_create(const stria_plan_config_t* config, const int64_t* cu_seqlens,
                                           int64_t num_seqs, int64_t batch, int64_t seq_len, stria_plan_t* plan) {
  return Guard([&] {
    if (plan == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan (the output) is NULL");
    *plan = nullptr;
    if (config == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "config is NULL (use stria_plan_config_init)");
    STRIA_RETURN_IF_ERROR(stria::CheckStructSize(config, config->struct_size, sizeof(stria_plan_config_t), "config",
                                                 "stria_plan_config_init"));
    const int strategy = stria::RawEnum(config->strategy);
    if (strategy != STRIA_PLAN_BALANCED && strategy != STRIA_PLAN_LAYOUT)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->strategy %d is not a strategy (0 balanced, 1 layout)",
                   strategy);
    if (strategy == STRIA_PLAN_LAYOUT) STRIA_RETURN_IF_ERROR(CheckLayoutArg(config->layout));
    if (config->local_len < 0)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->local_len %lld is negative (0: what the plan needs)",
                   static_cast<long long>(config->local_len));
    if (config->tile < 0)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "config->tile %lld is negative (0: 128)",
                   static_cast<long long>(config->tile));
    stria::Plan::Options o;
    o.world_size = config->world_size;
    o.tile = config->tile == 0 ? 128 : config->tile;
    o.mask.causal = config->causal != 0;
    o.mask.window_left = config->window_left;
    o.mask.window_right = config->window_right;
    o.strategy = strategy == STRIA_PLAN_LAYOUT ? stria::Plan::Strategy::kLayout : stria::Plan::Strategy::kBalanced;
    o.layout = config->layout;
    o.local_len = config->local_len;
    std::unique_ptr<stria::Plan> p;
    STRIA_RETURN_IF_ERROR(stria::Plan::Create(cu_seqlens, batch, num_seqs, seq_len, o, &p));
    *plan = stria::RegisterPlan(std::shared_ptr<const stria::Plan>(std::move(p)));
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_plan_destroy(stria_plan_t plan) {
  return Guard([&] {
    if (plan == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan is NULL");
    if (!stria::UnregisterPlan(plan))
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan %p is not a live plan (destroyed already?)",
                   static_cast<void*>(plan));
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_plan_get_info(stria_plan_t plan, stria_plan_info_t* info) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    if (info == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "info is NULL");
    STRIA_RETURN_IF_ERROR(stria::CheckStructSize(info, info->struct_size, sizeof(stria_plan_info_t), "info",
                                                 "sizeof(stria_plan_info_t)"));
    info->world_size = p->world_size();
    info->batch = p->batch();
    info->num_seqs = p->num_seqs();
    info->seq_len = p->seq_len();
    info->local_len = p->local_len();
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_plan_positions(stria_plan_t plan, int rank, int64_t* positions) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    if (rank < 0 || rank >= p->world_size())
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "rank %d is out of range for the plan's world_size %d", rank,
                   p->world_size());
    if (positions == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "positions is NULL");
    for (int64_t b = 0; b < p->batch(); ++b) p->Positions(b, rank, positions + b * p->local_len());
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_plan_shard(stria_plan_t plan, int rank, int seq_dim, const DLTensor* full,
                                          DLTensor* local, void* stream) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    return stria::PlanShardCopy(*p, rank, seq_dim, full, local, true, stream);
  });
}

STRIA_API stria_status_t stria_plan_unshard(stria_plan_t plan, int rank, int seq_dim, const DLTensor* local,
                                            DLTensor* full, void* stream) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    return stria::PlanShardCopy(*p, rank, seq_dim, full, local, false, stream);
  });
}

STRIA_API stria_status_t stria_plan_grid_positions(stria_plan_t plan, int ulysses_size, int rank, int64_t* positions) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    int ring_rank = 0;
    int64_t first = 0, count = 0;
    STRIA_RETURN_IF_ERROR(stria::PlanGridRank(*p, ulysses_size, rank, &ring_rank, &first, &count));
    if (positions == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "positions is NULL");
    std::vector<int64_t> slots(static_cast<size_t>(p->local_len()));
    for (int64_t b = 0; b < p->batch(); ++b) {
      p->Positions(b, ring_rank, slots.data());
      std::copy(slots.begin() + first, slots.begin() + first + count, positions + b * count);
    }
    return Status::Ok();
  });
}

STRIA_API stria_status_t stria_plan_grid_shard(stria_plan_t plan, int ulysses_size, int rank, int seq_dim,
                                               const DLTensor* full, DLTensor* local, void* stream) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    return stria::PlanShardCopy(*p, rank, seq_dim, full, local, true, stream, ulysses_size);
  });
}

STRIA_API stria_status_t stria_plan_grid_unshard(stria_plan_t plan, int ulysses_size, int rank, int seq_dim,
                                                 const DLTensor* local, DLTensor* full, void* stream) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    return stria::PlanShardCopy(*p, rank, seq_dim, full, local, false, stream, ulysses_size);
  });
}

STRIA_API stria_status_t stria_plan_analyze_balance(stria_plan_t plan, int64_t tile, stria_balance_t* out,
                                                    double* work) {
  return Guard([&] {
    std::shared_ptr<const stria::Plan> p;
    STRIA_RETURN_IF_ERROR(LookupPlanArg(plan, &p));
    STRIA_RETURN_IF_ERROR(CheckBalanceOut(out));
    if (tile < 1)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "tile %lld is not positive (1 counts exact pairs)",
                   static_cast<long long>(tile));
    if (p->world_size() > stria::kMaxBalanceWorldSize)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "balance analysis: world_size %d exceeds the supported maximum %d",
                   p->world_size(), stria::kMaxBalanceWorldSize);
    const int n = p->world_size();
    std::vector<double> steps(static_cast<size_t>(n) * static_cast<size_t>(n), 0.0);
    const stria::MaskSpec& mask = p->options().mask;
    stria::PlanStepWork(*p, mask, tile, steps.data());
    stria_balance_t b{};
    for (int s = 0; s < n; ++s) {
      double most = 0.0;
      for (int r = 0; r < n; ++r) {
        const double w = steps[static_cast<size_t>(s * n + r)];
        b.total_work += w;
        most = std::max(most, w);
      }
      b.ring_latency += most;
    }
    b.speedup = b.ring_latency > 0 ? b.total_work / b.ring_latency : 0.0;
    b.imbalance = b.total_work > 0 ? b.ring_latency / (b.total_work / n) : 0.0;
    b.ideal_latency = stria::PlanIdealWork(*p, mask, tile) / n;
    b.kv_rows_sent = stria::PlanKVRowsSent(*p, mask, tile);
    WriteBalance(b, out);
    if (work != nullptr) std::copy(steps.begin(), steps.end(), work);
    return Status::Ok();
  });
}

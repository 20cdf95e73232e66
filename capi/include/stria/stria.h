/*
 * stria: exact attention over a sequence sharded across ranks (Ring Attention with striped,
 * zigzag or contiguous token layouts).
 *
 * This header is the whole public C ABI. It is plain C99, includes only <stddef.h>, <stdint.h>
 * and DLPack, and never the CUDA headers: a stream is passed as `void*`. Every function
 * validates its arguments and returns a status; on failure it leaves a message for
 * stria_get_last_error() on the calling thread. Nothing aborts, exits or throws.
 *
 * On a CUDA context a call queues its work on its stream and returns without synchronising it. A
 * call on a stream being captured into a CUDA graph is refused (STRIA_ERROR_UNSUPPORTED) before it
 * queues anything, the capture left valid: its work depends on host state at the call (tables,
 * workspaces, peers' transfers) that a graph's replay would not reproduce.
 *
 * A context is driven by one thread at a time; different contexts may run concurrently, and
 * stria_context_abort/stria_context_destroy may come from any thread. A call on a context that
 * is in a call on another thread (an attention call, or stria_context_get_step_times during one)
 * is refused with STRIA_ERROR_INVALID_ARGUMENT and changes nothing; the running call goes on.
 *
 * The bindings (Python/SWIG, Rust/bindgen, Julia) are generated from this file: keep it free of
 * function-like macros in declarations, and add fields to the structs only at their end.
 */
#ifndef STRIA_STRIA_H_
#define STRIA_STRIA_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

/* The CMake project reads the version from these three lines: they are the single source. */
#define STRIA_VERSION_MAJOR 0
#define STRIA_VERSION_MINOR 7
#define STRIA_VERSION_PATCH 0
#define STRIA_VERSION (STRIA_VERSION_MAJOR * 10000 + STRIA_VERSION_MINOR * 100 + STRIA_VERSION_PATCH)

#if defined(_WIN32)
#define STRIA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define STRIA_API __attribute__((visibility("default")))
#else
#define STRIA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  STRIA_SUCCESS = 0,
  STRIA_ERROR_INVALID_ARGUMENT = 1,
  STRIA_ERROR_UNSUPPORTED = 2,
  STRIA_ERROR_OUT_OF_MEMORY = 3,
  STRIA_ERROR_TRANSPORT = 4,
  STRIA_ERROR_TIMEOUT = 5,
  STRIA_ERROR_CUDA = 6,
  STRIA_ERROR_ABORTED = 7,
  STRIA_ERROR_INTERNAL = 8
} stria_status_t;

typedef enum { STRIA_LAYOUT_CONTIGUOUS = 0, STRIA_LAYOUT_STRIPED = 1, STRIA_LAYOUT_ZIGZAG = 2 } stria_layout_t;

typedef enum { STRIA_TRANSPORT_LOCAL = 0, STRIA_TRANSPORT_UCX = 1, STRIA_TRANSPORT_NCCL = 2 } stria_transport_t;

/* An opaque handle. It is a token, not a pointer the library dereferences: a destroyed or
 * made-up handle is reported as STRIA_ERROR_INVALID_ARGUMENT, never followed. */
typedef struct stria_context* stria_context_t;

/* Rank 0's rendezvous identity, handed by the caller to every rank (like ncclUniqueId). */
typedef struct {
  char internal[128];
} stria_unique_id_t;

/* STRIA_VERSION of the loaded library (may differ from the header the caller compiled with). */
STRIA_API int stria_get_version(void);
/* A static English name of a status; never NULL (unknown values give "unknown status"). */
STRIA_API const char* stria_status_string(stria_status_t s);
/* The message of this thread's last failed call, "" if none; never NULL. Valid until the next
 * stria call on this thread. A successful call clears it. */
STRIA_API const char* stria_get_last_error(void);

typedef struct {
  size_t struct_size; /* sizeof as the caller compiled it: the struct may grow */
  int rank, world_size;
  DLDevice device; /* {kDLCPU,0} or {kDLCUDA,ordinal} */
  stria_transport_t transport;
  stria_unique_id_t unique_id; /* UCX/NCCL: rank 0's id, handed to every rank by the caller */
  double timeout_s;            /* a wait longer than this fails with STRIA_ERROR_TIMEOUT; 0 = default (300 s).
                                  Ranks joining a rendezvous wait 2 s longer, so that rank 0, giving up
                                  first, can tell them which rank never came */
  int num_threads;             /* CPU backend threads; 0 = all (a local group shares them out); at most
                                  1024, and 8192 for a local group's ranks together */
} stria_context_config_t;
/* The struct is exactly DESIGN.md's, and stays so: stria_context_config_init cannot know how large
 * its caller's struct is, so options added later come as functions, not fields (an older caller's
 * struct would be written past its end). */

/* Fills the defaults: rank 0 of 1, CPU, local transport, default timeout, all threads. */
STRIA_API stria_status_t stria_context_config_init(stria_context_config_t* config);
/* Opens rank 0's rendezvous and describes it in *id (UCX and NCCL transports). */
STRIA_API stria_status_t stria_get_unique_id(stria_unique_id_t* id);
STRIA_API stria_status_t stria_context_create(const stria_context_config_t* config, stria_context_t* ctx);
/* stria_context_create for STRIA_TRANSPORT_NCCL on a communicator the caller already has: nccl_comm
 * is an ncclComm_t (void* here, so that this header needs no NCCL), whose rank, size and device
 * must be config->rank, config->world_size and config->device; config->unique_id is not used.
 * Every rank calls it (stria forms its own communicators with one broadcast over the caller's).
 * stria never aborts or destroys nccl_comm. timeout_s bounds that broadcast on a nonblocking
 * nccl_comm; on a blocking one NCCL may wait inside it for every rank (it connects a communicator
 * at its first collective). NCCL contexts refuse NCCL_COMM_BLOCKING=1 and NCCL_COMM_ID in the
 * environment (STRIA_ERROR_UNSUPPORTED): the first would take away the timeouts, the second the
 * distinct ids of stria's two communicators. Several NCCL contexts of one process on one GPU may be
 * driven by different threads: their launches take turns (NCCL forbids issuing to two communicators
 * of a device at once), a wait for the turn counting against timeout_s. */
STRIA_API stria_status_t stria_context_create_with_nccl_comm(const stria_context_config_t* config, void* nccl_comm,
                                                             stria_context_t* ctx);
/* world_size contexts in this process joined by the in-process transport;
   config->rank/world_size are ignored; each context is then driven by its own thread.
   On failure no context is left behind and ctxs[] is set to NULL. */
STRIA_API stria_status_t stria_context_create_local_group(const stria_context_config_t* config, int world_size,
                                                          stria_context_t* ctxs);
/* stria_context_create_local_group with rank r on devices[r] (world_size entries, all {kDLCUDA,
   ordinal} or all {kDLCPU, 0}; ordinals may repeat): a ring over the GPUs of one process, without
   NCCL. config->device is not used. Blocks move by device-to-device copies, over peer access
   (NVLink, PCIe) where the GPUs allow it, which stria enables for the pairs it copies between.
   Rank r's tensors and stream are on devices[r]. (An extension of DESIGN.md.) */
STRIA_API stria_status_t stria_context_create_local_group_on_devices(const stria_context_config_t* config,
                                                                     const DLDevice* devices, int world_size,
                                                                     stria_context_t* ctxs);
STRIA_API stria_status_t stria_context_get_rank(stria_context_t ctx, int* rank);
STRIA_API stria_status_t stria_context_get_world_size(stria_context_t ctx, int* world_size);
/* Makes a call in progress on ctx (on another thread) return STRIA_ERROR_ABORTED, and every
 * later call too: an aborted context can only be destroyed (the queries get_rank, get_world_size
 * and get_step_times still answer). Its peers see it leave. */
STRIA_API stria_status_t stria_context_abort(stria_context_t ctx); /* from any thread */
/* Frees ctx and leaves its group. After a finished call this is no abort: peers still finishing
 * that call get everything this rank sent; a later call of theirs fails (the rank left). A call
 * still running on ctx in another thread (a misuse) is aborted first. */
STRIA_API stria_status_t stria_context_destroy(stria_context_t ctx);

/* Extension: a document plan (see "Document plans" below); an opaque handle like a context's. */
typedef struct stria_plan* stria_plan_t;

typedef struct {
  size_t struct_size;
  stria_layout_t layout;
  int causal;
  float softmax_scale; /* 0 means 1/sqrt(D); otherwise finite and > 0, or the call fails with
                          STRIA_ERROR_INVALID_ARGUMENT */
  /* Extension, 0.3 (a field added at the end: a caller built against an older header passes the
   * smaller struct and has no plan; such a program's stria_attention_params_init is the 0.2 one,
   * which the library keeps under that symbol version and which fills the smaller struct): a
   * document plan (stria_plan_create) for the ring to run on instead
   * of `layout`, which is then not used. Every rank passes a plan made from the same boundaries
   * and config. The tensors hold the plan's local_len tokens per rank (stria_plan_get_info),
   * B must be the plan's batch, and the document mask is the plan's boundaries: the plain calls
   * apply it, and a _documents or _window call must pass the same boundaries. The plan is read
   * during the call only; it may be shared by any number of contexts and threads. */
  stria_plan_t plan;
  /* Extension, 0.4 (fields added at the end, as `plan` was): the whole attention of a call in this
   * one struct, read by stria_attention_forward and stria_attention_backward alike.
   *
   * Documents: cu_seqlens and num_seqs as stria_attention_forward_documents takes them (NULL and 0:
   * one document a batch row; with a plan, NULL takes the plan's boundaries). Window: window_left
   * and window_right as stria_attention_forward_window takes them (-1: unbounded). The _documents
   * and _window calls remain, and refuse params that set these fields too. */
  const int64_t* cu_seqlens;
  int64_t num_seqs;
  int64_t window_left;
  int64_t window_right;
  /* Logit softcapping (Gemma 2's attn_logit_softcapping): 0 for none, or finite and > 0, when a score
   * s = softmax_scale * q.k becomes softcap * tanh(s / softcap) before the mask. */
  float softcap;
  /* Attention sinks (gpt-oss): NULL, or a float32 tensor [Hq] of logits, one per query head, in the
   * context's memory. Head h's logit z joins the softmax denominator of every row of head h once
   * (whatever the ring) and carries no value: out = sum_j e^(s_j) v_j / (e^z + sum_j e^(s_j)); the
   * LSE includes it, and a row that sees no key gives out 0 and LSE z. Every rank passes the same
   * values. The backward takes the forward's sinks and writes dsinks. */
  const DLTensor* sinks;
  /* Backward with sinks: a float32 tensor [Hq] (the context's memory) that gets this rank's part of
   * the sinks' gradient, summed over its rows and batch; the sum over ranks is the whole gradient,
   * as for any weight every rank holds. NULL with sinks: the gradient is not computed. Unused by the
   * forward. */
  DLTensor* dsinks;
  /* Extension, 0.7 (fields added at the end, as above): FP8 inputs. stria_attention_forward takes q,
   * k and v of DLPack dtype float8_e4m3fn (code STRIA_DL_FLOAT8_E4M3FN, 8 bits; torch.float8_e4m3fn,
   * ml_dtypes.float8_e4m3fn), all three or none; out is then float32, float16 or bfloat16, and the
   * call computes in out's dtype. The values the attention sees are q * q_descale, k * k_descale and
   * v * v_descale: each NULL (a scale of 1) or a float32 tensor in the context's memory of shape [1]
   * (one scale for the tensor) or [H] (one per head: Hq for q, Hkv for k and v). A descale with
   * inputs of another dtype is refused; so are FP8 inputs in the backward, decode and prefill. */
  const DLTensor* q_descale;
  const DLTensor* k_descale;
  const DLTensor* v_descale;
} stria_attention_params_t;

/* DLPack's type code of float8_e4m3fn (DLPack 1.0 on; the dlpack.h of some systems predates it). */
#define STRIA_DL_FLOAT8_E4M3FN 10

/* Fills the defaults: striped, causal, scale 1/sqrt(D), no plan, no documents, no window, no
 * softcap, no sinks, no FP8 descales. */
STRIA_API stria_status_t stria_attention_params_init(stria_attention_params_t* params);

/* q: [B, L, Hq, D]; k, v: [B, L, Hkv, D]; out like q; lse: [B, Hq, L] float32.
 * A collective: every rank of the context's ring calls it with the same shapes and params.
 * A rank that cannot start the call (bad arguments, no memory for its workspace) makes every
 * rank fail at once: with STRIA_ERROR_INVALID_ARGUMENT for bad arguments, with that rank's own
 * status otherwise; the contexts stay usable. After a failure in the middle of the ring, every
 * call on the contexts involved fails: they can only be destroyed. */
STRIA_API stria_status_t stria_attention_forward(stria_context_t ctx, const stria_attention_params_t* params,
                                                 const DLTensor* q, const DLTensor* k, const DLTensor* v, DLTensor* out,
                                                 DLTensor* lse, void* stream);
/* dout like out; dq like q; dk, dv like k. out and lse are the forward's. */
STRIA_API stria_status_t stria_attention_backward(stria_context_t ctx, const stria_attention_params_t* params,
                                                  const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                                  const DLTensor* out, const DLTensor* lse, const DLTensor* dout,
                                                  DLTensor* dq, DLTensor* dk, DLTensor* dv, void* stream);

/* Extension: document masks for packed sequences. The same calls as stria_attention_forward and
 * stria_attention_backward, for a sequence that packs several documents: a query sees only the
 * keys of its own document (when causal, those at or before it). cu_seqlens holds B rows of
 * num_seqs + 1 global positions, the same on every rank, in host memory (on a CUDA context also
 * memory of its GPU, which stria reads on `stream` and waits for): batch row b packs the
 * documents [cu_seqlens[b*(num_seqs+1) + d], cu_seqlens[b*(num_seqs+1) + d + 1]), d < num_seqs.
 * Each row starts at 0, never decreases (a row with fewer documents repeats its end) and ends at
 * the global sequence length S = L * world_size; num_seqs >= 1 (1: one document, the plain call).
 * Read during the call only. The backward takes the forward's boundaries. CPU and CUDA contexts. */
STRIA_API stria_status_t stria_attention_forward_documents(stria_context_t ctx, const stria_attention_params_t* params,
                                                           const int64_t* cu_seqlens, int64_t num_seqs,
                                                           const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                                           DLTensor* out, DLTensor* lse, void* stream);
STRIA_API stria_status_t stria_attention_backward_documents(stria_context_t ctx, const stria_attention_params_t* params,
                                                            const int64_t* cu_seqlens, int64_t num_seqs,
                                                            const DLTensor* q, const DLTensor* k, const DLTensor* v,
                                                            const DLTensor* out, const DLTensor* lse,
                                                            const DLTensor* dout, DLTensor* dq, DLTensor* dk,
                                                            DLTensor* dv, void* stream);

/* Extension: sliding-window (local) attention, as in Mistral's or Gemma's local layers. The query at
 * global position i sees the keys at positions i - window_left .. i + window_right (when causal,
 * up to i only), and, when cu_seqlens is given, only those of its own document (as in
 * stria_attention_forward_documents; cu_seqlens NULL and num_seqs 0: one document a row).
 * window_left and window_right are >= 0, or -1 for unbounded on that side (both -1: the plain or
 * the _documents call). Every rank passes the same window. Blocks that no query's window reaches
 * cost no compute, and the ring stops after the last step at which some rank's block is reached
 * (contiguous layout, causal, window_left <= L: two steps instead of world_size; the step times
 * then have that many entries). */
STRIA_API stria_status_t stria_attention_forward_window(stria_context_t ctx, const stria_attention_params_t* params,
                                                        int64_t window_left, int64_t window_right,
                                                        const int64_t* cu_seqlens, int64_t num_seqs, const DLTensor* q,
                                                        const DLTensor* k, const DLTensor* v, DLTensor* out,
                                                        DLTensor* lse, void* stream);
STRIA_API stria_status_t stria_attention_backward_window(stria_context_t ctx, const stria_attention_params_t* params,
                                                         int64_t window_left, int64_t window_right,
                                                         const int64_t* cu_seqlens, int64_t num_seqs, const DLTensor* q,
                                                         const DLTensor* k, const DLTensor* v, const DLTensor* out,
                                                         const DLTensor* lse, const DLTensor* dout, DLTensor* dq,
                                                         DLTensor* dk, DLTensor* dv, void* stream);

/* Extension: tags this context's next stria_attention_forward or stria_attention_backward, which
 * consumes the tag whatever its outcome (an untagged call has tag 0). The ranks' calls pair up in
 * the order each rank makes them, and calls whose signatures match (same operation, shapes and
 * params) would pair up even if they came from different places of the caller's program: ranks
 * that made independent calls in different orders would exchange blocks of different calls and
 * get wrong numbers. With a tag per call site, such a pairing fails on every rank with
 * STRIA_ERROR_INVALID_ARGUMENT naming both tags, before any block moves; the contexts stay usable.
 * For callers whose calls may run in an order they do not control (a compiled XLA program: see
 * stria.jax). Driven by the thread that drives the context, like the calls. */
STRIA_API stria_status_t stria_context_set_call_tag(stria_context_t ctx, uint64_t tag);

/* Extension: deterministic backward. With deterministic = 1, this context's backward calls give
 * the same bits every time they run on the same inputs, world size, layout and device (as the
 * forward always does); 0 (the default) lets the CUDA backend add dQ with float atomics, whose
 * order, and so the last bits of dQ, the GPU's scheduling decides. On CUDA contexts the Hopper
 * TMA kernels (head dims 64 and 128) then add each query tile's dQ in the order of the key tiles,
 * in the same one pass; the other tensor-core kernels run their dK/dV pass without dQ and compute
 * dQ in a pass of its own over the query tiles (7 tile products per tile pair instead of 5). CPU
 * contexts, and the CUDA kernels for float32 and other head dims, are deterministic either way.
 * Ranks may differ in this setting. Driven by the thread that drives the context, like the calls;
 * deterministic other than 0 or 1 is STRIA_ERROR_INVALID_ARGUMENT. */
STRIA_API stria_status_t stria_context_set_deterministic(stria_context_t ctx, int deterministic);

/* Extension: document plans. Packed sequences hold documents of very different lengths, and no
 * fixed layout serves them: striping cuts short documents into slivers that fill a kernel's tiles
 * partly, contiguous and zigzag layouts leave one rank with most of a step's work. A plan, computed
 * from the boundaries and the world size (and the kernels' tile size), says which tokens each rank
 * holds and in which order: long documents are cut into whole tiles spread over the ranks, short
 * ones are kept whole and spread by their cost, so that every rank does about the same work at
 * every ring step and the tiles stay dense. Any S works with any N: a rank's slots without a token
 * are padding (position -1) that attends to nothing and that nothing attends to. Every rank derives
 * the same plan from the same boundaries and config. A plan is immutable, and may be used from any
 * thread. docs/plans.md describes the solver and its measured balance. */
typedef enum {
  STRIA_PLAN_BALANCED = 0, /* the balancing solver */
  STRIA_PLAN_LAYOUT = 1    /* config->layout's positions with the documents' masks: the fixed
                              layouts on packed data, for comparison (S must suit the layout) */
} stria_plan_strategy_t;

typedef struct {
  size_t struct_size;
  int world_size;
  int causal;           /* the mask whose work the plan balances (default 1); the calls'
                           own mask is what they compute, whatever the plan was made for */
  int64_t window_left;  /* a sliding window to balance for, as in stria_attention_forward_window */
  int64_t window_right; /* (-1: unbounded; the default) */
  int64_t tile;         /* the tile size of the kernels that will run it; 0: 128 (the GPU
                           kernels'; the CPU kernels' 64 divides it) */
  stria_plan_strategy_t strategy;
  stria_layout_t layout; /* STRIA_PLAN_LAYOUT only */
  int64_t local_len;     /* 0: the slots the plan needs; else at least these (a fixed L keeps the
                            shapes of compiled programs the same from batch to batch); fewer than
                            the plan needs is STRIA_ERROR_INVALID_ARGUMENT */
} stria_plan_config_t;

/* Fills the defaults: world_size 1, causal, no window, tile 128, the balancing solver. */
STRIA_API stria_status_t stria_plan_config_init(stria_plan_config_t* config);
/* A plan for batch rows of seq_len tokens whose documents are cu_seqlens ([batch][num_seqs + 1]
 * in host memory, each row from 0 to seq_len, never decreasing; read during the call only). */
STRIA_API stria_status_t stria_plan_create(const stria_plan_config_t* config, const int64_t* cu_seqlens,
                                           int64_t num_seqs, int64_t batch, int64_t seq_len, stria_plan_t* plan);
STRIA_API stria_status_t stria_plan_destroy(stria_plan_t plan);

typedef struct {
  size_t struct_size;
  int world_size;
  int64_t batch, num_seqs, seq_len;
  int64_t local_len; /* slots per rank: the L of every rank's [B, L, H, D] tensors; ceil(seq_len /
                        world_size), or a few tiles more where the plan pads a document's last
                        tile (or config->local_len) */
} stria_plan_info_t;
/* What a plan was made for, and its local_len. info->struct_size must be set (it may grow). */
STRIA_API stria_status_t stria_plan_get_info(stria_plan_t plan, stria_plan_info_t* info);
/* positions[b * local_len + i] = global position of local slot i of `rank` in batch row b, -1 for
 * padding (batch * local_len entries). */
STRIA_API stria_status_t stria_plan_positions(stria_plan_t plan, int rank, int64_t* positions);
/* stria_shard and stria_unshard by a plan: full [.., seq_len, ..] <-> local [.., local_len, ..]
 * along seq_dim. With a plan of several batch rows, dimension 0 is the batch (of the plan's batch
 * size) and seq_dim is another. shard writes zeros to padding slots; unshard leaves the full
 * tensor's positions to the ranks that hold them. Host tensors (cpu, cuda_host). */
STRIA_API stria_status_t stria_plan_shard(stria_plan_t plan, int rank, int seq_dim, const DLTensor* full,
                                          DLTensor* local, void* stream);
STRIA_API stria_status_t stria_plan_unshard(stria_plan_t plan, int rank, int seq_dim, const DLTensor* local,
                                            DLTensor* full, void* stream);

/* positions[i] = global position of local token i (for RoPE ids and labels); seq_len/world_size
 * entries. */
STRIA_API stria_status_t stria_layout_positions(stria_layout_t layout, int64_t seq_len, int world_size, int rank,
                                                int64_t* positions);
/* copy this rank's tokens out of a full-sequence tensor along seq_dim, and back. Any dtype;
 * seq_dim may be negative (counted from the end). */
STRIA_API stria_status_t stria_shard(stria_layout_t layout, int world_size, int rank, int seq_dim, const DLTensor* full,
                                     DLTensor* local, void* stream);
STRIA_API stria_status_t stria_unshard(stria_layout_t layout, int world_size, int rank, int seq_dim,
                                       const DLTensor* local, DLTensor* full, void* stream);

/* Work of one attention call under a layout, counted in visible (q,k) pairs
   at tile granularity (tile = 1: exact pairs): a tile is computed when any
   pair in it is visible. Ring latency = sum over steps of the busiest rank. */
typedef struct {
  size_t struct_size;
  double total_work;   /* pairs computed, all ranks, all steps */
  double ring_latency; /* sum over steps of max over ranks */
  double speedup;      /* total_work / ring_latency (N is perfect) */
  double imbalance;    /* ring_latency / (total_work / N) (1 is perfect) */
  /* Extension (written where struct_size holds it): one device's work on the whole sequence at the
   * same tile size, over N, where each document starts its own tiles (a variable-length kernel):
   * the latency a ring cannot beat. ideal_latency / ring_latency is the ring's "of ideal". */
  double ideal_latency;
  /* Extension: the K/V token rows one forward call sends, summed over ranks, ring steps and batch
   * rows: a layout's whole blocks at every step but the last; a plan's
   * blocks trimmed to the rows that ranks further along the ring see, in whole tiles of `tile` keys,
   * over the steps the plan runs. */
  double kv_rows_sent;
} stria_balance_t;
STRIA_API stria_status_t stria_analyze_balance(stria_layout_t layout, int causal, int64_t seq_len, int world_size,
                                               int64_t tile, stria_balance_t* out);
/* The per-rank, per-step work behind stria_analyze_balance: work[s * world_size + r] is the
 * work of rank r at ring step s (world_size * world_size entries). */
STRIA_API stria_status_t stria_analyze_balance_steps(stria_layout_t layout, int causal, int64_t seq_len, int world_size,
                                                     int64_t tile, double* work);

/* The balance of a plan's ring (stria_balance_t, at `tile`; 1: exact pairs) under the mask the plan
 * was made for, counted as the kernels compute: each query tile computes the key tiles from its
 * first row's lowest visible key to its last row's highest. work, if not NULL, gets the per-step
 * table of stria_analyze_balance_steps (world_size * world_size entries). */
STRIA_API stria_status_t stria_plan_analyze_balance(stria_plan_t plan, int64_t tile, stria_balance_t* out,
                                                    double* work);

/* Extension: where the time of this context's last attention call went, one entry per ring
 * step, so a caller can model ring latency (sum over steps of the slowest rank) from measured
 * compute times. */
typedef struct {
  double compute_s;     /* wall time of this rank's compute in the step */
  double compute_cpu_s; /* CPU time its compute threads spent, divided by their number: the step's
                           compute on dedicated cores, whatever else the machine ran meanwhile */
  double wait_s;        /* time blocked on the ring's transfers after the compute */
} stria_step_time_t;
/* Writes min(capacity, steps) entries; *num_steps gets the number of steps of the last call. */
STRIA_API stria_status_t stria_context_get_step_times(stria_context_t ctx, stria_step_time_t* steps, int capacity,
                                                      int* num_steps);

/* Extension: what this rank sent over its transport in the context's last attention call. A call
 * on a document plan sends only the K/V rows that ranks further along the ring see (and dK/dV
 * partials of only the rows other ranks see); other calls send whole blocks. A call that failed
 * leaves what it had sent. */
typedef struct {
  size_t struct_size;
  uint64_t kv_bytes;  /* K/V blocks */
  uint64_t dkv_bytes; /* dK/dV partials (backward calls) */
  uint64_t messages;  /* ring messages (a trimmed message with nothing left to carry is still one, of 0 bytes) */
  /* 0.6: what a context with a grid sent the other members of its all-to-all group (written where
   * struct_size holds it; the messages are counted in `messages`). */
  uint64_t all_to_all_bytes;
} stria_traffic_t;
STRIA_API stria_status_t stria_context_get_traffic(stria_context_t ctx, stria_traffic_t* out);

/* Extension, 0.5: serving over a KV cache sharded across the ranks (DESIGN.md, "Sharded KV cache").
 *
 * A batch of B sequences, each with a cache of lens[b] tokens spread over the N ranks by
 * params->layout. Each rank holds its share in `k` and `v`, local slot s of sequence b holding one
 * cached position:
 *   striped:    position t on rank t mod N, slot t / N (every rank's share grows evenly);
 *   contiguous: position t on rank t / C, slot t mod C;
 *   zigzag:     position t in chunk c = t / (C/2) of 2N; chunk c on rank c (c < N, slots from 0)
 *               or 2N-1-c (slots from C/2); C must be even;
 * where C is the per-rank capacity: k's dimension 1 for a contiguous cache, max_blocks * block_size
 * for a paged one. A position past N * C does not fit, and a call that would use it fails.
 *
 * Contiguous cache (block_table NULL): k, v are [B, C, Hkv, D] on each rank. Paged cache (as vLLM
 * and SGLang keep theirs): k, v are [num_blocks, block_size, Hkv, D] pools and block_table is an
 * int32 [B, max_blocks] tensor in the context's memory or in host memory: slot s of sequence b is
 * row s mod block_size of block block_table[b][s / block_size]. Only the entries a call uses are read
 * (-1 elsewhere is fine; with a window, a block that holds only positions before the first new
 * token's window start is not used, so an engine may reclaim it), on the host: a table in GPU
 * memory is copied to the host after the work queued on the call's stream, which the call waits
 * for; one in host memory (as engines keep a copy there) is read where it is, and the call never
 * waits for the stream. */
typedef struct {
  size_t struct_size;
  DLTensor* k;
  DLTensor* v;
  const DLTensor* block_table; /* NULL: a contiguous cache */
  /* [B] tokens cached per sequence before the call, in host memory or (CUDA) the context's device
     memory; the same on every rank. */
  const int64_t* lens;
} stria_kv_cache_t;
/* Fills the defaults: no tensors, no block table, no lengths. */
STRIA_API stria_status_t stria_kv_cache_init(stria_kv_cache_t* cache);

/* Attention of T new query tokens per sequence to the sharded cache: decode (T = 1) and speculative
 * decode (a few tokens). A collective: every rank passes the same q, k_new, v_new and cache lengths
 * and gets the same out and lse, bit for bit.
 *   q: [B, T, Hq, D], query t of sequence b at position lens[b] + t.
 *   k_new, v_new: [B, T, Hkv, D], the new tokens' keys and values, or both NULL. Given, the rank
 *   holding position lens[b] + t writes them into its share of the cache first (the caller then
 *   advances lens by T), and query t sees the new keys at positions up to its own (causal) or all of
 *   them (params->causal 0). NULL: the queries see the cache alone.
 *   out like q; lse [B, Hq, T] float32, or NULL.
 * A query at p sees cached position t <= p within params->window_left (p - t <= window_left; -1:
 * unbounded); params->softcap and params->sinks apply as in stria_attention_forward; plan,
 * cu_seqlens and window_right must be unset. Each rank attends the queries to its share (spread
 * over its threads), and the partial outputs and LSEs are merged exactly across the ranks in one
 * all-gather; the result equals attention over the whole cache on one device. */
STRIA_API stria_status_t stria_attention_decode(stria_context_t ctx, const stria_attention_params_t* params,
                                                const stria_kv_cache_t* cache, const DLTensor* q, const DLTensor* k_new,
                                                const DLTensor* v_new, DLTensor* out, DLTensor* lse, void* stream);

/* Extension, 0.5: prefill with a cache (chunked prefill, a new turn of a conversation). P new tokens
 * per sequence are sharded over the ranks by params->layout as the training calls shard a sequence of
 * P tokens: q [B, L, Hq, D] and k, v [B, L, Hkv, D] with L = P / N (the layout's divisibility rule;
 * zigzag: L even), local token i at chunk position c = stria_layout_positions(layout, P, N, rank)[i],
 * which is position lens[b] + c of sequence b. Each new token attends to the whole cache and to the
 * new tokens at positions up to its own (causal; params->causal 0: all of them), within
 * params->window_left; softcap and sinks as in stria_attention_forward. The new keys and values are
 * stored into the cache where params->layout puts their positions (the caller then advances lens by
 * P). out [B, L, Hq, D]; lse [B, Hq, L] float32, or NULL.
 *
 * How the ranks meet: STRIA_PREFILL_PASS_KV sends each rank's keys and values (its share of the
 * cache and its new tokens) around the ring, as the training forward does; STRIA_PREFILL_PASS_Q sends
 * the new tokens' queries around instead, and each rank returns the partial result of every visiting
 * query to its owner, where they are merged. Pass-Q moves less when few new tokens meet a long cache
 * (a new turn), pass-KV when the new tokens are many (a first prefill); STRIA_PREFILL_AUTO picks the
 * one that moves fewer bytes per ring step. Both give the same result (to rounding) and every rank
 * passes the same mode. */
typedef enum { STRIA_PREFILL_AUTO = 0, STRIA_PREFILL_PASS_KV = 1, STRIA_PREFILL_PASS_Q = 2 } stria_prefill_t;
STRIA_API stria_status_t stria_attention_prefill(stria_context_t ctx, const stria_attention_params_t* params,
                                                 const stria_kv_cache_t* cache, stria_prefill_t mode, const DLTensor* q,
                                                 const DLTensor* k, const DLTensor* v, DLTensor* out, DLTensor* lse,
                                                 void* stream);

/* Extension, 0.6: hybrid context parallelism (DESIGN.md, "Hybrid grid"). The N ranks form a grid
 * of R = N / U all-to-all groups of U consecutive ranks: rank r = g*U + u is member u of group g.
 * Ring group g holds the tokens the layout gives rank g of a ring of R, and its member u the u-th of
 * U equal contiguous pieces of them (stria_grid_positions; L = S / N tokens per rank, as on a
 * ring). An attention call then swaps sequence shards for head shards within each group (an
 * all-to-all of q, k, v: member u gets query heads [u*Hq/U, (u+1)*Hq/U) of the group's S / R
 * tokens, and the K/V heads they read), runs the ring across the R groups on those heads, and swaps
 * the outputs back; the backward likewise. The result equals the plain ring's. U = 1 is the plain
 * ring, U = N pure all-to-all (no ring). U must divide Hq, and divide Hkv or be a multiple of it
 * (fewer K/V heads than members: each member takes the one K/V head its query heads read).
 * Documents and windows (params or the _documents and _window calls), softcap and sinks work as on
 * a ring, and so do document plans: a plan made for world_size R (the ring of groups) with a
 * local_len divisible by U, member u of group g holding the u-th of U pieces of the plan's slots of
 * rank g (stria_plan_grid_positions, _shard, _unshard; q's L is then local_len / U). The serving
 * calls spread their cache over all N ranks whatever the grid. CPU and CUDA contexts, every
 * transport; on a CUDA context a grid call's work is queued on its stream as a ring call's is.
 *
 * stria_context_set_grid sets U (a divisor of the world size; 1 on a new context). Every rank of
 * the context sets the same U before its next call (the call's agreement checks it), between
 * calls, like stria_context_set_deterministic. A backward's dsinks is this rank's part: its own
 * heads' entries (over its group's tokens), 0 for the others, so the ranks' parts still add up. */
STRIA_API stria_status_t stria_context_set_grid(stria_context_t ctx, int ulysses_size);
STRIA_API stria_status_t stria_context_get_grid(stria_context_t ctx, int* ulysses_size);
/* stria_layout_positions, stria_shard and stria_unshard for rank `rank` of a grid of all-to-all
 * groups of ulysses_size ranks (ulysses_size 1: the plain functions). */
STRIA_API stria_status_t stria_grid_positions(stria_layout_t layout, int64_t seq_len, int world_size, int ulysses_size,
                                              int rank, int64_t* positions);
STRIA_API stria_status_t stria_grid_shard(stria_layout_t layout, int world_size, int ulysses_size, int rank,
                                          int seq_dim, const DLTensor* full, DLTensor* local, void* stream);
STRIA_API stria_status_t stria_grid_unshard(stria_layout_t layout, int world_size, int ulysses_size, int rank,
                                            int seq_dim, const DLTensor* local, DLTensor* full, void* stream);
/* stria_analyze_balance for a grid of all-to-all groups of ulysses_size ranks: the ring of
 * world_size / ulysses_size groups, each member computing 1 / ulysses_size of the heads of its
 * group's blocks, so work counts (query, key) pairs of all heads over their number; ideal_latency
 * is one device's work over world_size; kv_rows_sent the ring's K/V token rows, all heads' worth
 * (the all-to-all within the groups is not in it). */
STRIA_API stria_status_t stria_grid_analyze_balance(stria_layout_t layout, int causal, int64_t seq_len, int world_size,
                                                    int ulysses_size, int64_t tile, stria_balance_t* out);
/* stria_plan_positions ([batch][local_len / ulysses_size]), stria_plan_shard and stria_plan_unshard
 * for rank `rank` (of the plan's world_size times ulysses_size) of a grid on the plan's ring. */
STRIA_API stria_status_t stria_plan_grid_positions(stria_plan_t plan, int ulysses_size, int rank, int64_t* positions);
STRIA_API stria_status_t stria_plan_grid_shard(stria_plan_t plan, int ulysses_size, int rank, int seq_dim,
                                               const DLTensor* full, DLTensor* local, void* stream);
STRIA_API stria_status_t stria_plan_grid_unshard(stria_plan_t plan, int ulysses_size, int rank, int seq_dim,
                                                 const DLTensor* local, DLTensor* full, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRIA_STRIA_H_ */

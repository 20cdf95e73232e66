// The compute-backend interface the ring is written against. A backend owns the per-call state
// of one rank (its queries, the running softmax state, gradient accumulators) and computes one
// ring block at a time; the ring engine owns the schedule and the transfers.
//
// Implementations: the CPU backend (backend/cpu) and the CUDA module (libstria-cuda.so, loaded
// at run time by backend_factory.cc). All memory the ring's messages live in comes from the
// backend, so a GPU backend hands device memory to its transport.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "layout/layout.h"
#include "transport/transport.h"

namespace stria {

// A forward's float8_e4m3fn q, k and v that the backend takes as they are (Backend::TakesFp8;
// stria.h, params->q_descale): each descale NULL (1) or float32 [1] (step 0) or [H] (step 1), in the
// backend's memory. The call's dtype (AttentionShape::dtype) is then that of its outputs and state.
struct Fp8Inputs {
  bool on = false;
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int q_step = 0, k_step = 0, v_step = 0;
};

struct AttentionShape {
  int64_t B = 0, L = 0, Hq = 0, Hkv = 0, D = 0;
  DType dtype = DType::kF32;
  float scale = 0.f;    // resolved: never 0
  float softcap = 0.f;  // > 0: a score s = scale·q·k becomes softcap·tanh(s / softcap); 0: none
  Fp8Inputs fp8{};      // on: q, k and v are float8_e4m3fn (a forward only)
};

// Bytes of one K/V ring message: K then V, each compact [B, L, Hkv, D] in the storage dtype.
inline size_t KVWireBytes(const AttentionShape& s) {
  return 2 * static_cast<size_t>(s.B * s.L * s.Hkv * s.D) * static_cast<size_t>(DTypeSize(s.dtype));
}
// How a backend lays out its K/V ring messages. Every rank of a ring must use the same one (the
// call signature carries it), and it may depend only on the call, never on the machine: ranks in
// different processes can run on different CPUs.
enum class KVWireFormat : uint32_t {
  kRows = 0,          // KVWireBytes: K then V, compact [B, L, Hkv, D], storage dtype
  kCpuF32Tiles = 1,   // the CPU kernels' float32 operands (backend/cpu/cpu_backend.cc)
  kCpuBf16Tiles = 2,  // the CPU AMX kernels' bf16 operands (likewise)
  kCudaE4m3 = 3       // FP8 inputs on Hopper: K's e4m3 rows, then V transposed (kernels/cuda/tma_forward_fp8.cuh)
};
inline const char* KVWireFormatName(KVWireFormat f) {
  switch (f) {
    case KVWireFormat::kRows:
      return "rows";
    case KVWireFormat::kCpuF32Tiles:
      return "cpu-f32-tiles";
    case KVWireFormat::kCpuBf16Tiles:
      return "cpu-bf16-tiles";
    case KVWireFormat::kCudaE4m3:
      return "cuda-e4m3";
  }
  return "unknown";
}
struct KVWire {
  KVWireFormat format = KVWireFormat::kRows;
  size_t bytes = 0;
};

// Floats of one dK/dV ring message: dK then dV, each compact [B, L, Hkv, D] float32.
inline size_t DKVWireFloats(const AttentionShape& s) {
  return 2 * static_cast<size_t>(s.B * s.L * s.Hkv * s.D);
}

// A byte range of a whole ring message. A trimmed message (a document plan's block, which sheds
// the rows no later rank sees) carries some pieces of the whole one back to back, in order.
struct WirePiece {
  size_t offset = 0, bytes = 0;
};
// Appends [offset, offset + bytes), joined to the last piece where the two meet.
inline void AddPiece(size_t offset, size_t bytes, std::vector<WirePiece>* pieces) {
  if (bytes == 0) return;
  if (!pieces->empty() && pieces->back().offset + pieces->back().bytes == offset) {
    pieces->back().bytes += bytes;
    return;
  }
  pieces->push_back(WirePiece{offset, bytes});
}
inline size_t PiecesBytes(const std::vector<WirePiece>& pieces) {
  size_t n = 0;
  for (const WirePiece& p : pieces) n += p.bytes;
  return n;
}
// Rows [0, min(L, rows[b] rounded up to `tile`)) of each batch row b of the operands of a message
// made of `operands` arrays [B, L, H, row_bytes]: the pieces, operand by operand.
inline void RowPieces(const AttentionShape& s, int operands, int64_t heads, size_t row_bytes, const int64_t* rows,
                      int64_t tile, std::vector<WirePiece>* pieces) {
  const size_t token = static_cast<size_t>(heads) * row_bytes, batch_row = static_cast<size_t>(s.L) * token;
  for (int op = 0; op < operands; ++op)
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t n = std::min(s.L, (rows[b] + tile - 1) / tile * tile);
      AddPiece((static_cast<size_t>(op * s.B + b)) * batch_row, static_cast<size_t>(n) * token, pieces);
    }
}
// The pieces of a dK/dV message that hold rows [0, rows[b]) of each batch row b.
inline std::vector<WirePiece> DKVPieces(const AttentionShape& s, const int64_t* rows) {
  std::vector<WirePiece> pieces;
  RowPieces(s, 2, s.Hkv, static_cast<size_t>(s.D) * sizeof(float), rows, 1, &pieces);
  return pieces;
}
// The largest key tile any kernel reads a kRows message by (the CUDA families: 32, 64 or 128).
constexpr int64_t kRowsKeyTile = 128;

// Where a forward block call stands in its ring call.
struct ForwardStep {
  bool local = false;  // kv_wire is this rank's own block, packed by this call's PackKV (ring step 0)
  // The call's outputs when no block call of the call follows this one (ForwardEnd comes next,
  // with the same tensors), so that a backend may finish the rows in this block's kernels rather
  // than in a pass of its own; nullptr before the last block.
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;
  // On the local block of a document plan's call whose rank keeps documents of its own (the
  // plan's HomeBegin, a multiple of kRowsKeyTile; -1 otherwise): rows at or past it, in every batch
  // row, see keys of this block only, and, backward, its keys at or past it are seen by those rows
  // only. A backend that DetachesHome may compute that part of the block apart from the rest,
  // concurrently with the blocks that follow: it then reads kv_wire (which the engine keeps as it
  // is) and writes only those rows (forward: their out and lse, in place of the state; backward:
  // their dQ and the rows of dkv) until ForwardEnd / BackwardEnd, or JoinDetached.
  int64_t home_begin = -1;
  // With home_begin: the call's outputs (those of ForwardEnd), which the home part may write.
  const TensorView* home_out = nullptr;
  const TensorView* home_lse = nullptr;
};

// Where a backward block call stands in its ring call.
struct BackwardStep {
  bool local = false;  // as ForwardStep::local
  // The call's dK and dV when this block's partial is the call's whole result (a ring of one
  // step: nothing is added to it or sent on), so that a backend may write them from the block's
  // kernels rather than convert the partial in BackwardEnd (which gets the same tensors);
  // nullptr otherwise.
  const TensorView* dk = nullptr;
  const TensorView* dv = nullptr;
  // The rows of the dK/dV partial (`dkv`) that the engine reads after the call, per batch row
  // (B entries): rows [0, dkv_rows[b]), which hold every key this rank sees in the block; a backend
  // may leave the others unwritten. nullptr: every row (the block's owner keeps its partial whole,
  // and a call without a document plan sends it whole).
  const int64_t* dkv_rows = nullptr;
  int64_t home_begin = -1;  // as ForwardStep::home_begin
};

// A decode call's work on one rank (serve/decode.cc; stria.h, stria_attention_decode).
struct DecodeShape {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  DType dtype = DType::kF32;
  float scale = 0.f, softcap = 0.f;
  bool causal = true;
  int64_t window_left = -1;  // -1: unbounded
};
// Keys of one sequence that lie at a fixed stride in memory: a run of a cache's slots (within one
// page of a paged cache), or of a message's rows. Key j's row of K/V head h starts at
// k + j * k_row + h * k_head (bytes; likewise v), its position is pos0 + j * pos_stride.
struct CacheSegment {
  int64_t b = 0;
  const char *k = nullptr, *v = nullptr;
  int64_t k_row = 0, v_row = 0, k_head = 0, v_head = 0;
  int64_t count = 0;
  int64_t pos0 = 0, pos_stride = 1;
};
// A new token's rows this rank stores into its cache before attending: D elements per K/V head,
// from src (head stride src_head, bytes) to dst (dst_head).
struct CacheAppend {
  const char *k_src = nullptr, *v_src = nullptr;
  char *k_dst = nullptr, *v_dst = nullptr;
  int64_t k_src_head = 0, v_src_head = 0, k_dst_head = 0, v_dst_head = 0;
};
// The queries of a decode call (or of one step of a prefill) and the keys this rank holds for them.
struct DecodeWork {
  DecodeShape shape;                   // T: the query tokens per sequence
  TensorView q;                        // [B, T, Hq, D]
  std::vector<int64_t> q_pos;          // [B][T]: query t of sequence b's position
  std::vector<CacheSegment> segments;  // the keys, sequence by sequence, positions increasing
  std::vector<CacheAppend> appends;    // written before the attention
  void* stream = nullptr;              // the call's (a cudaStream_t on CUDA)
  // A world of one: the call's out, lse (or null) and sinks (or null), which Decode then writes
  // itself, the sinks merged in, instead of `partial`. Null out: write `partial` (several ranks, a
  // prefill's step).
  const TensorView* finish_out = nullptr;
  const TensorView* finish_lse = nullptr;
  const TensorView* finish_sinks = nullptr;
};
// A rank's decode result, before the merge across ranks: per (b, t, h) a record of D + 1 floats,
// the output normalised over this rank's keys, then its natural-log LSE (-inf: saw no key).
inline size_t DecodePartialFloats(const DecodeShape& s) {
  return static_cast<size_t>(s.B * s.T * s.Hq * (s.D + 1));
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Checks what this backend supports (head dim, stream) before any rank communicates.
  virtual Status CheckSupported(const AttentionShape& shape, void* stream) const = 0;
  // Device backends: `data` of the tensor `name` must be memory this backend can compute on.
  virtual Status CheckMemory(const void* /*data*/, const char* /*name*/) const { return Status::Ok(); }
  // The `count` integers at `src` (a call's document boundaries, `name`) where the host can read
  // them: `src` itself for host memory (the default), or a copy in `staged` read on `stream` after
  // the work queued there, for memory of a device backend's GPU (a framework's tensor).
  virtual Status ReadOnHost(const int64_t* src, size_t count, void* stream, const char* name,
                            std::vector<int64_t>* staged, const int64_t** host) {
    (void)count, (void)stream, (void)name, (void)staged;
    *host = src;
    return Status::Ok();
  }
  // The same for `bytes` bytes of any type (a paged cache's int32 block table).
  virtual Status ReadBytesOnHost(const void* src, size_t bytes, void* stream, const char* name,
                                 std::vector<char>* staged, const void** host) {
    (void)bytes, (void)stream, (void)name, (void)staged;
    *host = src;
    return Status::Ok();
  }
  // Memory for ring messages, reused across calls by the engine.
  virtual Status Allocate(size_t bytes, void** ptr) = 0;
  virtual void Free(void* ptr) = 0;
  // The K/V ring message of a call; the default is kRows.
  virtual KVWire KVWireFor(const AttentionShape& shape, bool backward) const {
    (void)backward;
    return KVWire{KVWireFormat::kRows, KVWireBytes(shape)};
  }
  // The pieces of a K/V message (KVWireFor's) that carry rows [0, rows[b]) of each batch row b,
  // rounded up so that every key tile a kernel reads whole is sent whole: a receiver's kernels then
  // read past the sent rows only tiles that no query of theirs sees (the document mask skips
  // them), never a stale row beside a visible one. The default is kRows's, by kRowsKeyTile.
  virtual void KVWirePieces(const AttentionShape& shape, bool backward, const int64_t* rows,
                            std::vector<WirePiece>* pieces) const {
    (void)backward;
    RowPieces(shape, 2, shape.Hkv, static_cast<size_t>(shape.D) * DTypeSize(shape.dtype), rows, kRowsKeyTile, pieces);
  }
  // Copies the pieces between a whole ring message and a trimmed one: gather (whole `src` into
  // trimmed `dst`) or scatter (trimmed `src` into whole `dst`). Ordered like the block calls, so
  // FenceBuffers covers it; the default is host memory's memcpy.
  virtual Status CopyPieces(void* dst, const void* src, const std::vector<WirePiece>& pieces, bool gather) {
    size_t packed = 0;
    for (const WirePiece& p : pieces) {
      if (gather)
        std::memcpy(static_cast<char*>(dst) + packed, static_cast<const char*>(src) + p.offset, p.bytes);
      else
        std::memcpy(static_cast<char*>(dst) + p.offset, static_cast<const char*>(src) + packed, p.bytes);
      packed += p.bytes;
    }
    return Status::Ok();
  }
  // Packs this rank's K/V block into `wire` (KVWireFor's format). `sent`: whether the engine sends the wire to another
  // rank. When it does not (a world of 1), only this backend's own block call with `local` reads
  // it, so a backend that stages its local block elsewhere (the CPU one) may leave it unwritten.
  virtual Status PackKV(const AttentionShape& shape, const TensorView& k, const TensorView& v, void* wire,
                        bool sent) = 0;

  // FP8 inputs (stria.h, params->q_descale and the others): `src`, a float8_e4m3fn tensor [B, L, H, D]
  // in this backend's memory (last dimension contiguous), into a compact tensor of its shape in
  // dtype `to` at `dst`, each value times its head's descale: `descale` NULL (1) or a contiguous
  // float32 [1] or [H]. On `stream`, before the call's Begin (which takes the widened tensors).
  // Whether the backend takes FP8 inputs of this shape as they are (`shape`: the call's, its dtype
  // out's, its fp8 unset; q: the caller's float8_e4m3fn view), so that nothing is widened: then
  // the call's shape has fp8 on, and PackKV, ForwardBegin, the blocks and ForwardEnd get the e4m3
  // tensors, ForwardEnd applying v's descale to the outputs.
  virtual bool TakesFp8(const AttentionShape& shape, const TensorView& q) {
    (void)shape, (void)q;
    return false;
  }
  virtual Status WidenFp8(const TensorView& src, const TensorView* descale, DType to, void* dst, void* stream) {
    (void)src, (void)descale, (void)to, (void)dst, (void)stream;
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s backend does not take float8_e4m3fn inputs", name());
  }

  // `stream`: the call's stream (a cudaStream_t on CUDA; NULL on the CPU), checked by CheckSupported.
  virtual Status ForwardBegin(const AttentionShape& shape, const TensorView& q, void* stream) = 0;
  virtual Status ForwardBlock(const void* kv_wire, const BlockMask& mask, const ForwardStep& step) = 0;
  // Writes the call's outputs, unless its last block call (ForwardStep::out) already has.
  virtual Status ForwardEnd(const TensorView& out, const TensorView& lse) = 0;

  // Attention sinks (stria.h, params->sinks: [Hq] float32 logits, contiguous, in this backend's
  // memory), after ForwardEnd: row (b, h, i) joins head h's logit z to its softmax denominator,
  // lse' = log(e^lse + e^z) and out *= e^(lse - lse') (a row that saw no key: lse' = z, out 0).
  // Once per row, so the sink counts once whatever the ring.
  virtual Status ApplySinks(const TensorView& sinks, const TensorView& out, const TensorView& lse) = 0;

  virtual Status BackwardBegin(const AttentionShape& shape, const TensorView& q, const TensorView& out,
                               const TensorView& lse, const TensorView& dout, void* stream) = 0;
  // Sets `dkv` (a dK/dV message) to this rank's contribution for the block, or writes the call's
  // dK and dV (BackwardStep::dk) and leaves `dkv` as it is.
  virtual Status BackwardBlock(const void* kv_wire, const BlockMask& mask, float* dkv, const BackwardStep& step) = 0;
  // dst += src over the pieces of a dK/dV message: dst whole, src the pieces back to back (one
  // piece of every byte: two whole messages).
  virtual Status AccumulateDKV(float* dst, const float* src, const std::vector<WirePiece>& pieces) = 0;
  // Writes dQ, and dK and dV from `dkv` unless the block call has written them.
  virtual Status BackwardEnd(const TensorView& dq, const float* dkv, const TensorView& dk, const TensorView& dv) = 0;
  // Any time after BackwardBegin (whose out and lse include the sinks): this rank's part of the
  // sinks' gradient, dsinks[h] = -sum over b, i of e^(z_h - lse) * rowsum(dO∘O) for the rows of head
  // h (the sink's probability times the rows' delta: the sink carries no value, so dP is 0 there).
  // A fixed order of summation: the same bits every run.
  virtual Status SinksGradient(const TensorView& sinks, const TensorView& dsinks) = 0;

  // Whether this backend runs the serving calls (a decode, or a prefill): checked with the call's
  // arguments, before any rank communicates, so that a backend without them fails every rank and
  // leaves it usable.
  virtual Status CheckServingSupported(bool prefill) const {
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s backend has no %s over a sharded KV cache yet", name(),
                 prefill ? "prefill" : "decode");
  }
  // Decode (stria_attention_decode): stores the new tokens this rank holds (work.appends), then
  // attends the queries to this rank's share of the cache, writing `partial`
  // (DecodePartialFloats, the backend's memory), or in a world of one the result (work.finish_out).
  // DecodeMerge takes every rank's partial, rank by rank in `all` (the backend's memory), and
  // writes out ([B, T, Hq, D]) and, if given, lse ([B, Hq, T]) after the sinks (if given); in a
  // fixed order, so every rank writes the same bits.
  virtual Status Decode(const DecodeWork& work, float* partial) {
    (void)work, (void)partial;
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s backend has no decode over a sharded KV cache", name());
  }
  // Stores new tokens' rows into a cache (a prefill's, after its attention), on `stream`.
  virtual Status StoreTokens(const DecodeShape& shape, const std::vector<CacheAppend>& appends, void* stream) {
    (void)shape, (void)appends, (void)stream;
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s backend has no decode over a sharded KV cache", name());
  }
  virtual Status DecodeMerge(const DecodeWork& work, const float* all, int world_size, const TensorView* sinks,
                             const TensorView& out, const TensorView* lse) {
    (void)work, (void)all, (void)world_size, (void)sinks, (void)out, (void)lse;
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s backend has no decode over a sharded KV cache", name());
  }
  // Whether this backend's records lie in device memory (a device backend's): the engine then
  // gathers them where they lie, device to device (Transport::AllGatherInPlace), and DecodeMerge
  // writes out and lse on the call's stream with no trip through the host. Otherwise they lie in
  // host memory, where the transport's all-gather gathers them.
  virtual bool MergesOnDevice() const { return false; }

  // A grid's all-to-all (ring/grid_exchange.cc) on `stream` (the call's; the exchange comes before
  // the Begin call that would set it). A box is a strided region of a tensor in this backend's
  // memory, its last dimension contiguous. PackBox copies `box` into `dst`, compact; SumIntoBox
  // sets `box` to the sum of `count` compact arrays, the first at `src` and each `src_step` bytes
  // after the one before (one: a copy), added in float32 in their order and rounded once to the
  // box's dtype. SyncStream returns once everything queued on `stream` is done. Whether the
  // backend has them is said before any rank communicates.
  virtual Status CheckGridSupported() const {
    return Error(STRIA_ERROR_UNSUPPORTED, "the %s backend has no grid (all-to-all groups) yet", name());
  }
  virtual Status PackBox(const TensorView& box, void* dst, void* stream) {
    (void)box, (void)dst, (void)stream;
    return CheckGridSupported();
  }
  virtual Status SumIntoBox(const void* src, size_t src_step, int count, const TensorView& box, void* stream) {
    (void)src, (void)src_step, (void)count, (void)box, (void)stream;
    return CheckGridSupported();
  }
  virtual Status SyncStream(void* stream) {
    (void)stream;
    return Status::Ok();
  }

  // Asynchronous backends (CUDA) queue their work on a stream and return. Before the engine hands
  // a ring buffer to the transport (to send it, or to receive into it), everything queued so far
  // that writes or reads ring buffers must be complete: this waits for it. The transfer of the
  // next block then overlaps the compute queued after it. (With a transport that orders its
  // transfers on the device, the engine calls MarkBuffers instead: src/ring/ring_order.h.)
  virtual Status FenceBuffers() { return Status::Ok(); }
  // Device ordering, with a transport that has it (Transport::OrdersOnDevice): instead of
  // FenceBuffers (or SyncStream), MarkBuffers records an event after everything queued so far on
  // `stream` and returns it (a cudaEvent_t, recorded again by the next MarkBuffers), for the
  // transport's OrderAfter; ComputeStream is the stream the ring's work goes to (the training
  // calls'; a serving call's is the caller's). A backend whose work the host runs (the CPU's) has
  // neither.
  virtual bool OrdersOnDevice() const { return false; }
  virtual Status MarkBuffers(void* stream, void** event) {
    (void)stream;
    *event = nullptr;
    return Status(STRIA_ERROR_INTERNAL, "this backend does not order work on a device");
  }
  virtual void* ComputeStream() { return nullptr; }
  // Whether this backend may run a local block's home part (ForwardStep::home_begin) apart from
  // the ring's: the engine then keeps that block in a buffer of its own for the whole call, since
  // the ring's two K/V buffers are received into while the part may still read it. CUDA runs it
  // on a stream of its own, at a lower priority than the ring's kernels, so that it fills the
  // SMs the later steps' small blocks leave idle and the gaps while the host waits for their
  // transfers (docs/plans.md).
  virtual bool DetachesHome() const { return false; }
  // Joins the work a call queued apart from its stream (DetachesHome) back into it: the engine
  // calls it when a call's steps end, on every path, so that a failed call's work, too, is
  // ordered before whatever the caller queues next.
  virtual Status JoinDetached() { return Status::Ok(); }
  // How a local group of contexts of this backend moves ring messages between its ranks; nullptr
  // means plain memcpy (host memory).
  virtual std::shared_ptr<BufferCopier> CreateLocalCopier() { return nullptr; }

  // The context's abort flag: a backend may stop its work early once it is true (the ring then
  // fails the call, so unfinished outputs are never reported as a result). The CPU backend stops
  // handing out work items; kernels already queued on a GPU run to their end.
  virtual void SetCancelFlag(const std::atomic<bool>* /*flag*/) {}

  // stria_context_set_deterministic: whether backward calls must give the same bits every time
  // they run on the same inputs. A backend whose every call already does (the CPU backend: a
  // fixed order of work per output row) has nothing to change.
  virtual void SetDeterministic(bool /*on*/) {}

  // CPU seconds the compute threads spent so far, and how many there are (for step profiles).
  virtual double cpu_seconds() const = 0;
  virtual int num_threads() const = 0;
};

// The CPU backend, always available.
std::unique_ptr<Backend> CreateCpuBackend(int num_threads);
// The backend of `device`: the CPU one, or a module loaded on first use (CUDA).
Status CreateBackend(DLDevice device, int num_threads, std::unique_ptr<Backend>* out);

}  // namespace stria

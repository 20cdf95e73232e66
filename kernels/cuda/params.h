// Plain parameter structs shared by the CUDA host code and the kernels (no CUDA types, so the
// host engine and the host emulator include it too). Strides are in elements; the head dim is
// always contiguous.
#pragma once

#include <cstdint>

namespace stria {
namespace cuda {

// log2(e): the kernels work in the log2 domain (exp2), so scores are scaled by scale * kLog2e.
constexpr float kLog2e = 1.4426950408889634f;

// The visible part of one ring block (layout::BlockMask): query i sees key j iff
// q_begin <= i < q_end, k_begin <= j < k_end and (!diagonal || j <= i + offset), and, with a
// document mask, doc_lo[i] <= j < doc_hi[i] (device arrays, both ends never decreasing in i; batch
// row b's start doc_stride * b later: kernels take their row's with BatchMask).
struct MaskArgs {
  int64_t q_begin, q_end, k_begin, k_end;
  int diagonal;
  int64_t offset;
  const int64_t* doc_lo = nullptr;  // nullptr: no document mask
  const int64_t* doc_hi = nullptr;
  int64_t doc_stride = 0;
  // Where only some query tiles of `tile_rows` rows have work (a block of a document mask in the
  // middle of its call, src/backend/cuda/busy_tiles.h): those tiles' indices, longest first. A
  // launch over query tiles of that size then takes only these (QueryTileCount, QueryTileStart);
  // nullptr: every tile of [q_begin, q_end).
  const int32_t* tiles = nullptr;
  int32_t tile_count = 0;
  int32_t tile_rows = 0;
};

// The query tile of the tensor-core forwards: the size their lists of busy tiles are made for
// (MaskArgs::tile_rows; ForwardTileRows in launch.h). 128 rows, 64 a warpgroup, but where the TMA
// family's forward at head dim 64 is chosen with three consumer warpgroups: 192 there
// (tma_forward.cuh, TmaForwardRows). The SIMT kernels' tiles are smaller and take the whole grid.
constexpr int kForwardTileRows = 128;

struct Dims {
  int B, L, Hq, Hkv, D;
};

// A [B, L, H, D] tensor of the caller: row (b, i, h) starts at data + b*sb + i*sl + h*sh.
struct RowsArg {
  const void* data;
  int64_t sb, sl, sh;
};

// Whether a [B, L, H, D] view with d's B, L, D lies as compact rows, the layout of a K/V ring
// message (the strides of extent-1 dimensions do not matter).
inline bool CompactRows(const RowsArg& v, const Dims& d, int H) {
  return (H == 1 || v.sh == d.D) && (d.L == 1 || v.sl == int64_t{H} * d.D) &&
         (d.B == 1 || v.sb == int64_t{d.L} * H * d.D);
}

// A writable [B, L, H, D] tensor of the caller.
struct RowsOut {
  void* data;
  int64_t sb, sl, sh;
};

// Logit softcapping (softcap.cuh): cap_log2 = softcap·log2(e) and cap_in = scale / softcap, or 0
// and 0 for none.
struct Softcap {
  float cap_log2;
  float cap_in;
};

// One forward ring block, merged into the running softmax state of this rank's queries.
struct FwdParams {
  Dims dims;
  RowsArg q;         // the caller's queries (storage dtype)
  const void* k;     // the block's keys, compact [B, L, Hkv, D] (storage dtype)
  const void* v;     // the block's values, same layout
  float* acc;        // [B, Hq, L, D] unnormalised output so far
  float* m;          // [B, Hq, L] running max of the scaled scores, log2 domain
  float* l;          // [B, Hq, L] running sum of exp2(score - m)
  float scale_log2;  // softmax scale * log2(e)
  Softcap softcap;
  MaskArgs mask;
  // Where the block stands in its call (forward_state.cuh); either may be set only for a block
  // whose mask covers every query row (CoversEveryRow), so that every row has a CTA that owns it.
  // first: no block of the call ran before this one: the state starts empty and is not read.
  int first;
  // out.data non-null: no block of the call runs after this one: the kernel writes the normalised
  // output (storage dtype, the caller's strides) and the LSE ([B, Hq, L] float32, strides lb, lh,
  // li), ForwardFinishKernel's work, in place of the state.
  RowsOut out;
  float* lse;
  int64_t lb, lh, li;
  // The heads of a group whose CTAs start together (CtaSlotAt; the launchers set it: head_groups.cuh).
  // 0: one group of every head.
  uint32_t head_group;
};

// Whether a block's mask leaves no query row without a CTA of its launch (the grid covers the
// query tiles of [q_begin, q_end)): the condition for FwdParams::first and ::out.
inline bool CoversEveryRow(const MaskArgs& m, int64_t L) {
  return m.q_begin == 0 && m.q_end == L;
}

// One backward ring block: adds this block's share of dQ into dq_acc and writes the block's
// dK/dV contribution (fp32, compact [B, L, Hkv, D], already times the softmax scale for dK).
struct BwdParams {
  Dims dims;
  RowsArg q, dout;
  const void* k;
  const void* v;
  const float* lse2;   // [B, Hq, L] log-sum-exp * log2(e); +inf for a row with no key
  const float* delta;  // [B, Hq, L] rowsum(dO * O)
  float* dq_acc;       // [B, Hq, L, D], unscaled
  float* dk;           // [B, L, Hkv, D]
  float* dv;
  float scale_log2;
  float scale;
  Softcap softcap;
  MaskArgs mask;
  // dk_out.data non-null: this block's dK/dV are the call's whole result (a world of one): the
  // kernels write them in the storage dtype at the caller's strides (dk_out, dv_out: [B, L, Hkv,
  // D]) instead of fp32 into dk and dv (key_grads.cuh).
  RowsOut dk_out, dv_out;
  // > 0: the caller reads rows [0, key_rows) of dk and dv only, and no query of the block sees a
  // key past them: the launch covers only the key tiles up to there (KeyTileCount), and the rows
  // after stay unwritten. 0: every row.
  int64_t key_rows;
  // A multiple of 128 (every family's key tile divides it): the launch starts at this key row, and
  // rows [0, key_begin) of dk and dv are another launch's (a document plan's kept documents,
  // computed apart from the ring's part of the same block: src/backend/cuda). 0: from the first.
  int64_t key_begin;
  // The deterministic backward's ordered dQ (ordered_dq.cuh), where the family has it: a ticket,
  // then a count per batch row, K/V head and query tile; at least OrderedDqInts(dims) ints, which
  // the launch zeroes on its stream. One launch at a time may use them. Null: no ordered dQ (the
  // deterministic backward then takes its two passes).
  int* dq_order;
  // As FwdParams::head_group, over the launch's heads (a key-tile grid's are K/V heads).
  uint32_t head_group;
};

// The ints BwdParams::dq_order needs for blocks of these dims (query tiles of 64 rows, the
// shortest any family's ordered dQ takes).
inline int64_t OrderedDqInts(const Dims& d) {
  return 1 + static_cast<int64_t>(d.B) * d.Hkv * ((d.L + 63) / 64);
}

// The key tiles of kN rows a backward launch covers: those holding rows [key_begin, key_rows), or
// from key_begin to the last row (BwdParams::key_rows). Tile t starts at key_begin + t kN.
inline unsigned KeyTileCount(const BwdParams& p, int kN) {
  const int64_t rows = p.key_rows > 0 && p.key_rows < p.dims.L ? p.key_rows : p.dims.L;
  return rows > p.key_begin ? static_cast<unsigned>((rows - p.key_begin + kN - 1) / kN) : 0u;
}

// Shard/unshard of a device tensor: one element per thread over the local tensor; along
// seq_dim, local index i maps to the layout's global position (DESIGN.md).
struct ShardArgs {
  int ndim, seq_dim, layout, world, rank;
  int64_t L;
  int64_t shape[8];          // the local tensor's shape
  int64_t local_strides[8];  // in elements
  int64_t full_strides[8];
  char* local;
  char* full;
  int elem_bytes;
  int to_local;
};

// A grid's exchange (Backend::PackBox, SumIntoBox): dst = the sum of `count` sources over a region
// of up to four dimensions, the last one contiguous (width w) and the outer ones n0 x n1 x n2 (1
// where unused); the sources lie src_step elements apart and share their strides. count 1 is a
// strided copy, 0 writes zeros.
struct BoxArgs {
  int64_t n0, n1, n2, w;
  const void* src;
  int64_t src_step;
  int count;
  int64_t ss0, ss1, ss2;  // source strides, in elements
  void* dst;
  int64_t ds0, ds1, ds2;  // destination strides
};

}  // namespace cuda
}  // namespace stria

// CPU attention tile kernels: the interface between the CPU backend (src/backend/cpu), which
// packs operands and schedules work items on its thread pool, and the per-ISA kernel builds
// (attention_kernels.cc compiled for generic x86-64, AVX2, AVX-512, AVX-512 + AVX512-BF16 and
// AVX-512 + AMX, the last two with the bf16 kernels bf16_*.cc too; picked at run time).
//
// Every operand is float32 (bf16 for the bf16 kernels) in a packed, zero-padded layout (see
// PackedShape): the kernels never see strides, storage dtypes or edge cases other than the mask.
#pragma once

#include <cstdint>

#include "layout/layout.h"

namespace stria {
namespace cpu {

constexpr int64_t kBlockQ = 64;  // query rows per tile
constexpr int64_t kBlockK = 64;  // key columns per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Sizes of the packed layouts. Dp: D rounded up to the kernel's vector width; Lqp/Lkp: the
// local lengths rounded up to whole tiles. Padding is zero.
//   Q32, dO32, acc: [B][Hq][Lqp][Dp]      m, l, lse2, delta: [B][Hq][Lqp]
//   V32, K32:       [B][Hkv][Lkp][Dp]     Kt, Vt: [B][Hkv][Lkp/kBlockK][Dp][kBlockK]
struct PackedShape {
  int64_t B, Lq, Lk, Hq, Hkv, D, Dp, Lqp, Lkp;
};

// One forward work item: query tile q0 of head (b, h), against one ring block.
struct FwdTileArgs {
  const float* q;   // Q32 rows of (b, h), pre-scaled by softmax_scale * log2(e)
  const float* kt;  // Kt tiles of (b, h / group)
  const float* v;   // V32 rows of (b, h / group)
  float* acc;       // running unnormalised output rows of (b, h)
  float* m;         // running row maximum (log2 domain), -inf before any visible key
  float* l;         // running row sum
  int64_t q0;
  const PackedShape* shape;
  const BlockMask* mask;
  float softcap2;  // > 0: logit softcapping, softcap * log2(e) (scores are in the log2 domain); 0: none
  float* scratch;  // kBlockQ * kBlockK floats, this thread's
};

// One backward work item: the key tiles kt0, kt0 + stride, ... < kt_end of kv head (b, hkv),
// against every query head of its group. Owns those dK/dV rows; adds dQ into its own partial.
struct BwdItemArgs {
  const float* q;           // Q32 of (b, first head of the group); heads are head_stride apart
  const float* dout;        // dO32, same layout as q
  const float* lse2;        // [Lqp] per head, lse * log2(e); -inf for a row that sees no key
  const float* delta;       // [Lqp] per head, rowsum(dO * O)
  float* dq;                // this item's dQ partial (same layout as q), unscaled: dQ = scale * dq
  int64_t head_stride;      // floats between heads in q / dout / dq
  int64_t row_head_stride;  // floats between heads in lse2 / delta
  int group;                // query heads per kv head
  const float* kt;          // Kt tiles of (b, hkv)
  const float* k;           // K32 rows of (b, hkv)
  const float* vt;          // Vt tiles of (b, hkv)
  float* dk;                // wire rows: dk[j * dkv_row_stride + d] for local key j, d < D
  float* dv;
  int64_t dkv_row_stride;
  int64_t kt0, kt_end, kt_stride;
  const PackedShape* shape;
  const BlockMask* mask;
  float softcap2;  // as in FwdTileArgs
  float* scratch;  // BwdScratchFloats(Dp) floats, this thread's
};

// One forward work item of the bf16 path (AMX tiles or AVX512-BF16): FwdTileArgs with the caller's bf16 values
// (Dp a multiple of kBf16TileDim) in the layouts the tile products read.
//   Qb: [B][Hq][Lqp][Dp], not scaled.
//   Kb: per key tile [Dp/2][kBlockK][2]: Kᵀ with dims d, d+1 of a key side by side.
//   Vb: per key tile [kBlockK/2][Dp][2]: V with keys j, j+1 of a dim side by side.
struct FwdTileArgsBf16 {
  const uint16_t* q;   // Qb rows of (b, h)
  const uint16_t* kt;  // Kb tiles of (b, h / group)
  const uint16_t* v;   // Vb tiles of (b, h / group)
  float scale;         // softmax_scale * log2(e), applied to the float32 scores
  float* acc;
  float* m;
  float* l;
  int64_t q0;       // the first of q_tiles consecutive query tiles
  int64_t q_tiles;  // 1 .. kBf16QueryTiles
  const PackedShape* shape;
  const BlockMask* mask;
  float softcap2;  // as in FwdTileArgs
  float* scratch;  // kBlockQ * kBlockK floats, then as many bf16
};
constexpr int64_t kBf16TileDim = 32;
// Query tiles per bf16 work item: each K/V tile is read from memory once for all of them. With
// tile products this fast, a K/V stream per query tile is bound by memory (a 4k-token head's
// bf16 K and V already fill a core's L2).
constexpr int kBf16QueryTiles = 4;

// One backward work item of the bf16 path: BwdItemArgs with the caller's bf16
// values in the layouts the tile products read (bf16_backward.cc). Q and dO come twice: as rows
// [Lqp][Dp], and as their query tiles transposed, [Lqp/kBlockQ][Dp][kBlockQ].
struct BwdItemArgsBf16 {
  const uint16_t* q;      // Q rows of (b, first head of the group); heads head_stride apart
  const uint16_t* qt;     // Q tiles transposed, same head stride
  const uint16_t* dout;   // dO rows
  const uint16_t* doutt;  // dO tiles transposed
  const float* lse2;      // as in BwdItemArgs
  const float* delta;
  float* dq;                // float32 dQ partial [Lqp][Dp], unscaled: dQ = softmax_scale * dq
  int64_t head_stride;      // elements between heads in q, qt, dout, doutt and dq
  int64_t row_head_stride;  // floats between heads in lse2 / delta
  int group;
  const uint16_t* kt;  // Kb tiles of (b, hkv): Kᵀ paired along Dp, [Dp/2][kBlockK][2]
  const uint16_t* kv;  // K tiles paired along keys, [kBlockK/2][Dp][2]
  const uint16_t* vt;  // V tiles as Kb: Vᵀ paired along Dp
  float scale;         // softmax_scale * log2(e)
  float dk_scale;      // softmax_scale
  float* dk;           // wire rows, as in BwdItemArgs
  float* dv;
  int64_t dkv_row_stride;
  int64_t kt0, kt_end, kt_stride;
  const PackedShape* shape;
  const BlockMask* mask;
  float softcap2;  // as in FwdTileArgs
  float* scratch;  // BwdScratchFloats(Dp) floats, this thread's
};

inline int64_t BwdScratchFloats(int64_t dp) {
  // The bf16 backward's need (its tiles, dKᵀ and dVᵀ, and softcapping's slope tile); float32 takes less.
  return 5 * kBlockQ * kBlockK + 2 * kBlockK * dp;
}

// One decode work item (backend/cpu/cpu_decode.cc): `rows` query rows against `count` cached keys
// that lie at a fixed stride in memory (one run of a rank's cache slots, within one page of a paged
// cache). Row r is query token r / group of the item's query heads; every row is causal against,
// or within the window of, its token's position.
constexpr int64_t kDecodeKeys = 64;  // keys converted to float32 at a time
struct DecodeChunkArgs {
  const float* q;  // [rows][dp] float32, pre-scaled by softmax_scale * log2(e), zero-padded
  int64_t rows, group;
  const int64_t* q_pos;  // [rows / group] the query tokens' positions
  const char *k, *v;     // key j's row of D elements at k + j * k_stride (bytes), likewise v
  int64_t k_stride, v_stride;
  // Or, where not NULL, key j's row already in float32, zero-padded to dp, at k32 + j * dp (the
  // backend's staging of a block for every head at once); likewise v32.
  const float *k32, *v32;
  int dtype;                 // DType of k and v
  int64_t d, dp;             // head dim, and it padded to the vector width
  int64_t count;             // keys
  int64_t pos0, pos_stride;  // key j is at position pos0 + j * pos_stride
  bool causal;
  int64_t window_left;  // -1: unbounded
  float softcap2;       // as in FwdTileArgs
  bool init;            // start the state below afresh, or go on from it (the item's next run)
  float *m, *l, *acc;   // [rows] log2-domain maximum (-inf: saw no key), [rows] sum, [rows][dp]
  float* scratch;       // DecodeScratchFloats(rows, dp) floats, this thread's
};
inline int64_t DecodeScratchFloats(int64_t rows, int64_t dp) {
  return kDecodeKeys * (2 * dp + rows);
}

struct KernelTable {
  const char* isa;
  int vector_floats;  // Dp must be a multiple of this
  void (*forward_tile)(const FwdTileArgs&);
  void (*backward_item)(const BwdItemArgs&);
  void (*forward_tile_bf16)(const FwdTileArgsBf16&);   // the amx and avx512bf16 builds; NULL elsewhere
  void (*backward_item_bf16)(const BwdItemArgsBf16&);  // likewise
  // Packing (pack.cc): src [kBlockK][ld] -> dst [ld][kBlockK], 32-bit elements moved as they are;
  // one row of n elements of `dtype` (a DType) times mul, to float32;
  void (*transpose_tile)(const uint32_t* src, int64_t ld, uint32_t* dst);
  void (*load_row)(const void* src, int dtype, int64_t n, float mul, float* dst);
  void (*store_row)(const float* src, int64_t n, float mul, int dtype, void* dst);  // and back;
  // rows a and b of 16-bit elements interleaved, out[2d] = a[d], out[2d + 1] = b[d] (NULL: zeros).
  void (*pair_rows)(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out);
  void (*decode_chunk)(const DecodeChunkArgs&);  // decode.cc
};

// The best table this CPU runs (AMX > AVX512-BF16 > AVX-512 > AVX2 > generic);
// STRIA_CPU_ISA=generic|avx2|avx512|avx512bf16|amx in the environment forces one (for tests and
// benchmarks), as it is when each context is created.
const KernelTable& SelectKernels();
// Whether STRIA_CPU_ISA can be honoured: unset, empty or runnable here (kOk), not a build's name
// (kUnknown) or a build this CPU cannot run (kUnsupported); `why` gets the message for the last
// two. Context creation refuses them, so a forced build is never quietly replaced by another.
enum class ForcedIsa { kOk, kUnknown, kUnsupported };
ForcedIsa CheckForcedIsa(char* why, int size);
const KernelTable* KernelsFor(const char* isa);  // NULL if not built or not supported here

}  // namespace cpu
}  // namespace stria

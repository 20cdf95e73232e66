// Parameter structs of the decode kernels (decode.cuh), shared with the CUDA backend's host code
// (no CUDA types). Strides of q are in elements, those of the cache in bytes.
#pragma once

#include <cstdint>

#include "cuda/params.h"

namespace stria {
namespace cuda {

// A piece is a run of one sequence's cached keys at a fixed stride in memory: key j's row of K/V
// head h starts at k + j * k_row + h * k_head (bytes; likewise v) and its position is pos0 + j *
// pos_stride. A work item is pieces [first, last) of sequence b, of about equal key counts across
// items (the split of flash-decoding).
struct DecodePiece {
  const char* k;
  const char* v;
  int64_t k_row, v_row, k_head, v_head;
  int64_t count, pos0, pos_stride;
  // Whether every K and V row of the piece is 16-bit elements in whole 16-byte chunks at 16-byte
  // aligned addresses (D a multiple of 8, the base and both strides multiples of 16 bytes): the
  // kernel then loads them 16 bytes at a time.
  int rows16;
};
struct DecodeItem {
  int64_t b, first, last;
};

constexpr int kDecodeRows = 8;      // query rows per CTA of the SIMT decode (decode.cuh)
constexpr int kDecodeMmaRows = 16;  // and of the tensor-core decode (decode_mma.cuh): one m16 tile
// The tensor-core decode's wide form: four m16 tiles, a warp's each, so that a K/V tile read once
// serves 64 rows (many new tokens, or a wide GQA group): taken when a head has more than 16 rows.
constexpr int kDecodeMmaWideRows = 64;
inline int DecodeMmaRowsPerCta(int rows) {
  return rows > kDecodeMmaRows ? kDecodeMmaWideRows : kDecodeMmaRows;
}
constexpr int kDecodeMaxHeadDim = 512;  // the merge's per-lane registers (kMaxHeadDim, launch.h)

// One CTA per (work item, K/V head, chunk of kDecodeRows or DecodeMmaRowsPerCta query rows): the rows of a K/V head are
// its GQA group's query heads times the T new tokens (row r: token r / group, head
// hkv * group + r % group). Each writes its rows' softmax state over the item's keys to
// states[((item * Hkv + hkv) * rows + r) * (D + 2)]: the running maximum (log2 domain), the sum,
// then the D unnormalised outputs.
struct DecodeArgs {
  const DecodePiece* pieces;
  const DecodeItem* items;
  const void* q;  // [B, T, Hq, D]
  int64_t qb, qt, qh;
  const int64_t* q_pos;  // [B][T]: the position of new token t of sequence b
  int T, Hq, Hkv, D;
  float scale_log2;
  Softcap softcap;
  int causal;
  int64_t window_left;  // -1: none
  float* states;
};

// The states of each sequence's items merged in item order into partial records: per (b, t, h)
// the D outputs normalised over this rank's keys, then the natural-log LSE (-inf: no key here).
struct DecodeMergeArgs {
  const float* states;
  const int64_t* first_item;  // [B + 1]: sequence b's items are [first_item[b], first_item[b + 1])
  float* partial;             // [B, T, Hq, D + 1]
  int B, T, Hq, Hkv, D;
};

// The call's result from every rank's partial records (a world of one: its own), with the sinks
// merged in, written straight into the call's out [B, T, Hq, D] (its dtype) and lse [B, Hq, T]
// (float32, or none) at their strides (elements): the merge across ranks on the device.
struct DecodeFinishArgs {
  const float* partial;   // world records [B, T, Hq, D + 1], rank r's at partial + r * record_stride
  int world;              // >= 1
  int64_t record_stride;  // floats
  const float* sinks;     // [Hq] at sinks_stride, or null
  int64_t sinks_stride;
  void* out;
  int64_t out_strides[4];
  float* lse;  // or null
  int64_t lse_strides[3];
  int B, T, Hq, D;
};

// New tokens' rows into a cache: per entry and K/V head, D elements.
struct TokenCopy {
  const char* k_src;
  const char* v_src;
  char* k_dst;
  char* v_dst;
  int64_t k_src_head, v_src_head, k_dst_head, v_dst_head;
};

}  // namespace cuda
}  // namespace stria

// Document masks (packed sequences): several documents share one sequence and a query sees only
// the keys of its own document (when causal, those at or before it).
//
// Why the ring and the kernels barely change: every layout orders a rank's local tokens by
// global position (LocalCountBelow), and a document is one range of positions, so the keys of one
// document in any rank's block are one range of local indices. A ring block's mask becomes, per
// local query, an interval [lo, hi) of local keys that the kernels intersect with the block's own
// (diagonal) mask, and both bounds never decrease along the queries, so a whole tile is tested at
// its corners. Nothing travels with K/V: every rank derives the bounds of every block from the
// boundaries, which all ranks share.
//
// A sliding window (local attention: the query at position p sees the keys at p - left .. p +
// right) is the same kind of mask: it cuts each query's interval further, at bounds that grow with
// p too. So it takes the same path, with one document a row where the call gives none.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "layout/layout.h"

namespace stria {

class Documents {
 public:
  // Checks num_seqs and the pointer of boundaries of sequences of seq_len tokens, before any is read.
  static Status CheckCount(const int64_t* cu_seqlens, int64_t num_seqs, int64_t seq_len);
  // Validates and keeps the boundaries ([batch][num_seqs + 1] global positions in host memory, see
  // stria_attention_forward_documents) of sequences of seq_len tokens.
  Status Set(const int64_t* cu_seqlens, int64_t num_seqs, int64_t batch, int64_t seq_len);
  // Adds a sliding window (stria_attention_forward_window: left, right >= 0, or -1 for unbounded)
  // to the boundaries Set kept, or to one document a row where Set was not called. A window
  // unbounded on both sides adds nothing.
  Status SetWindow(int64_t left, int64_t right, int64_t batch, int64_t seq_len);
  bool active() const { return num_seqs_ > 0; }
  // Equal on ranks given equal masks (the call signature carries it); 0 without a mask. Without a
  // window, the hash of the boundaries alone (as before windows existed).
  uint64_t Hash() const;

  // Fills `bounds` with the document bounds of rank q_rank's local queries against rank k_rank's
  // keys, [batch][local_len] each, points mask->doc_* at them and narrows the mask's key range to
  // what any query can see, so that a block no query sees is empty().
  struct Bounds {
    std::vector<int64_t> lo, hi;
  };
  void Apply(stria_layout_t layout, int world_size, int64_t local_len, int q_rank, int k_rank, Bounds* bounds,
             BlockMask* mask) const;
  // Whether some query of rank q_rank may see a key of rank k_rank's block `mask` (the layout's)
  // through the documents and the window: false only where none can. From the block's first and
  // last queries alone (the bounds' ends grow with the position), two binary searches per batch
  // row: cheap enough for every (rank, block) pair of a call.
  bool Reaches(stria_layout_t layout, int world_size, int64_t local_len, int q_rank, int k_rank,
               const BlockMask& mask) const;

 private:
  int64_t num_seqs_ = 0, batch_ = 0;
  std::vector<int64_t> cu_;                       // [batch][num_seqs + 1]
  int64_t window_left_ = -1, window_right_ = -1;  // -1: unbounded; else below the sequence length
};

}  // namespace stria

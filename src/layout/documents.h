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
  bool active() const { return num_seqs_ > 0; }
  // Equal on ranks given equal boundaries (the call signature carries it); 0 without documents.
  uint64_t Hash() const;

  // Fills `bounds` with the document bounds of rank q_rank's local queries against rank k_rank's
  // keys, [batch][local_len] each, points mask->doc_* at them and narrows the mask's key range to
  // what any query can see, so that a block no query sees is empty().
  struct Bounds {
    std::vector<int64_t> lo, hi;
  };
  void Apply(stria_layout_t layout, int world_size, int64_t local_len, int q_rank, int k_rank, Bounds* bounds,
             BlockMask* mask) const;

 private:
  int64_t num_seqs_ = 0, batch_ = 0;
  std::vector<int64_t> cu_;  // [batch][num_seqs + 1]
};

}  // namespace stria

// Document plans (DESIGN.md, "Document plans"): which tokens of a packed sequence each rank holds,
// and in which order, computed from the document boundaries alone, so every rank derives the same
// plan.
//
// A plan is kept as runs, not as a table of S positions: a run is an arithmetic progression of
// positions of one document (first, first + stride, ...) that sits at consecutive local slots of
// one rank. A document kept whole on a rank is one run of stride 1; one striped across N ranks
// is one run of stride N on each. So building a plan costs O(D log D) for D documents, not O(S),
// and a rank's positions are written out only when asked for.
//
// Why the ring's masks and kernels need nothing new: a rank's local order sorts its tokens by
// (segment, position), where a segment is a set of whole documents (the plans here use two: the
// documents shared across ranks, then those a rank keeps for itself). A query sees only keys of
// its own document at positions in an interval, and one document's keys on any rank are
// consecutive slots sorted by position; so every query's visible keys in any rank's block are one
// interval of local slots, and both its ends never decrease along the queries. That is exactly the
// document mask the kernels take (BlockMask::doc_lo/doc_hi). Padding slots follow a rank's
// tokens: they see no key and no query sees them.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "layout/layout.h"

namespace stria {

// What the solver balances for, and what a call's mask cuts: causal or not, and a sliding window.
struct MaskSpec {
  bool causal = true;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
};

// Largest world size a plan takes: a plan stores runs per (rank, document), and the analysis a
// world_size² table.
constexpr int kMaxPlanWorldSize = 65536;

class Plan {
 public:
  struct Run {
    int64_t doc = 0;          // the document's index in its batch row (cu_seqlens order)
    int32_t segment = 0;      // 0: documents spread over ranks; 1: documents kept whole by a rank
    int64_t first = 0;        // global position of the run's first token
    int64_t stride = 1;       // positions first, first + stride, ...
    int64_t count = 0;        // tokens in the run
    int64_t local_begin = 0;  // the local slot of its first token
    int64_t pad_after = 0;    // padding slots that follow the run (so that the next one starts on a tile)
  };

  // How a plan assigns documents: the balancing solver, or a fixed layout's rule (for comparison
  // and for the analysis of packed documents under a layout; S must then suit the layout).
  enum class Strategy { kBalanced, kLayout };
  struct Options {
    int world_size = 1;
    int64_t tile = 128;  // the tile size of the backend that will run the plan
    MaskSpec mask;
    Strategy strategy = Strategy::kBalanced;
    stria_layout_t layout = STRIA_LAYOUT_STRIPED;  // kLayout only
    int64_t local_len = 0;                         // > 0: at least this many slots per rank (the solver's room)
  };

  // Checks the boundaries ([batch][num_seqs + 1], each row from 0 up to seq_len, never decreasing)
  // and the options, and builds the plan.
  static Status Create(const int64_t* cu_seqlens, int64_t batch, int64_t num_seqs, int64_t seq_len,
                       const Options& options, std::unique_ptr<Plan>* out);

  int world_size() const { return options_.world_size; }
  int64_t batch() const { return batch_; }
  int64_t num_seqs() const { return num_seqs_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t local_len() const { return local_len_; }
  const Options& options() const { return options_; }
  const std::vector<int64_t>& boundaries() const { return cu_; }  // [batch][num_seqs + 1]
  // Equal for plans built from equal boundaries and options (what ranks compare).
  uint64_t Hash() const { return hash_; }
  // Whether `cu_seqlens` ([batch][num_seqs + 1]) are this plan's boundaries.
  bool SameBoundaries(const int64_t* cu_seqlens, int64_t batch, int64_t num_seqs) const;

  // The runs of `rank` in batch row b, in local order.
  const std::vector<Run>& runs(int64_t b, int rank) const {
    return runs_[static_cast<size_t>(b * options_.world_size + rank)];
  }
  // How many real tokens `rank` holds in batch row b (the rest of its local_len slots are padding).
  int64_t count(int64_t b, int rank) const;
  // How many of its local slots hold its tokens or the padding between them (the rest is padding).
  int64_t used(int64_t b, int rank) const;
  // positions[i] = the global position of local slot i of `rank` in batch row b, -1 for padding;
  // local_len entries.
  void Positions(int64_t b, int rank, int64_t* positions) const;

  // The document mask of rank q_rank's queries against rank k_rank's keys in batch row b under
  // `mask`: query i sees key j iff lo[i] <= j < hi[i] (local_len entries each, both never
  // decreasing). Returns whether any query sees any key.
  bool Bounds(int64_t b, int q_rank, int k_rank, const MaskSpec& mask, int64_t* lo, int64_t* hi) const;
  // Whether any query of q_rank sees any key of k_rank, in any batch row, under `mask`.
  bool Reaches(int q_rank, int k_rank, const MaskSpec& mask) const;
  // The ring steps a call under `mask` needs: one past the last step at which some rank's block
  // reaches it (a plan that keeps every document whole needs one). Kept per mask: a plan serves
  // many calls.
  int RingSteps(const MaskSpec& mask) const;

  // One past the highest local slot of k_rank that some query of q_rank sees in batch row b under
  // `mask`; 0 when none does. The ring sends no K/V row at or past it to q_rank.
  int64_t KeyExtent(int64_t b, int q_rank, int k_rank, const MaskSpec& mask) const;
  // The rows of k_rank's K/V block that a call under `mask` must still carry after `step` hops:
  // rows[b] (batch() entries) = the highest KeyExtent over the ranks the block reaches at later
  // steps (k_rank + step + 1, ..., k_rank + RingSteps - 1). So a block keeps only its documents
  // shared with other ranks, and sheds rows as the ranks that see them fall behind; a rank that
  // keeps every document whole sends nothing. Kept per mask, like RingSteps; a world too large
  // for the table (world_size * RingSteps * batch above 2^22) keeps every row (local_len).
  void RowsStillNeeded(int k_rank, int step, const MaskSpec& mask, int64_t* rows) const;

  // The first local slot, a multiple of `align`, from which rank's slots in every batch row hold
  // only documents it keeps whole (and padding), no such document crossing it: local_len() when
  // there is none past it. Queries at or past it see keys of their own rank only, and their keys
  // are seen by those queries only, under any mask; so a call may compute that part of the local
  // block apart from the ring's, concurrently with the later steps (ForwardStep::home_begin).
  int64_t HomeBegin(int rank, int64_t align) const;

 private:
  Plan() = default;
  void BuildFromLayout();
  void BuildBalanced();
  // Sets local_begin of every run and local_len: ceil(S / N), or more where a rank's runs need it
  // (or options.local_len); fails where options.local_len is too small.
  Status Finish();
  uint64_t ComputeHash() const;

  Options options_;
  int64_t batch_ = 0, num_seqs_ = 0, seq_len_ = 0, local_len_ = 0;
  std::vector<int64_t> cu_;
  std::vector<std::vector<Run>> runs_;  // [batch][world_size]
  uint64_t hash_ = 0;
  struct StepsEntry {
    MaskSpec mask;
    int steps;
  };
  mutable std::mutex steps_mu_;
  mutable std::vector<StepsEntry> steps_;  // RingSteps' answers so far
  struct RowsEntry {
    MaskSpec mask;
    int steps;
    std::vector<int64_t> rows;  // [k_rank][step][b], empty: too large to keep (every row is sent)
  };
  mutable std::mutex rows_mu_;
  mutable std::vector<std::shared_ptr<const RowsEntry>> rows_;  // RowsStillNeeded's tables so far
};

// The balancing solver (layout/plan_solver.cc): the runs of every rank of one batch row of
// seq_len tokens, without their local slots (Plan::Finish sets those), for the documents
// [cu[d], cu[d + 1]).
// min_local_len > 0 gives each rank at least that much room.
void SolvePlan(const int64_t* cu, int64_t num_seqs, int64_t seq_len, int world_size, int64_t tile, const MaskSpec& mask,
               int64_t min_local_len, std::vector<std::vector<Plan::Run>>* runs);

}  // namespace stria

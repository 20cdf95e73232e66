#include "layout/grid_layout.h"

#include <algorithm>
#include <vector>

#include "core/raw_enum.h"
#include "core/tensor.h"
#include "layout/layout.h"
#include "layout/shard.h"

namespace stria {

Status CheckGrid(stria_layout_t layout, int64_t seq_len, int world_size, int ulysses_size, int rank) {
  if (ulysses_size < 1 || world_size < 1 || world_size % ulysses_size != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "ulysses_size %d must be >= 1 and divide world_size %d (a grid of world_size / ulysses_size "
                 "all-to-all groups of ulysses_size ranks)",
                 ulysses_size, world_size);
  if (rank < 0 || rank >= world_size)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "rank %d is out of range for world_size %d", rank, world_size);
  if (seq_len >= 1 && seq_len % world_size != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "seq_len %lld is not divisible by world_size %d: every rank of a grid holds seq_len / world_size "
                 "tokens",
                 static_cast<long long>(seq_len), world_size);
  return CheckLayout(layout, seq_len, world_size / ulysses_size, rank / ulysses_size);
}

int64_t GridPosition(stria_layout_t layout, int64_t local_len, int world_size, int ulysses_size, int rank, int64_t i) {
  const int u = rank % ulysses_size, g = rank / ulysses_size;
  return GlobalPosition(layout, local_len * ulysses_size, world_size / ulysses_size, g, u * local_len + i);
}

namespace {

// `t` restricted to [begin, begin + count) along `dim`, with its strides written out (a compact
// tensor's implied strides would change with the shape). shape and strides back the view.
DLTensor Slice(const DLTensor& t, int dim, int64_t begin, int64_t count, std::vector<int64_t>* shape,
               std::vector<int64_t>* strides) {
  shape->assign(t.shape, t.shape + t.ndim);
  strides->resize(static_cast<size_t>(t.ndim));
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    (*strides)[static_cast<size_t>(d)] = t.strides != nullptr ? t.strides[d] : stride;
    stride *= t.shape[d];
  }
  DLTensor s = t;
  s.byte_offset +=
      static_cast<uint64_t>(begin * (*strides)[static_cast<size_t>(dim)] * ((t.dtype.bits * t.dtype.lanes + 7) / 8));
  (*shape)[static_cast<size_t>(dim)] = count;
  s.shape = shape->data();
  s.strides = strides->data();
  return s;
}

}  // namespace

Status GridShardCopy(stria_layout_t layout, int world_size, int ulysses_size, int rank, int seq_dim,
                     const DLTensor* full, const DLTensor* local, bool to_local, void* stream) {
  if (ulysses_size == 1) return ShardCopy(layout, world_size, rank, seq_dim, full, local, to_local, stream);
  if (full == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "full is NULL");
  if (local == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "local is NULL");
  if (full->ndim < 1 || full->ndim > kMaxDims || full->shape == nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full has %d dimensions (1 to %d)", full->ndim, kMaxDims);
  if (local->ndim != full->ndim || local->shape == nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full has %d dimensions but local %d", full->ndim, local->ndim);
  const int dim = seq_dim < 0 ? seq_dim + full->ndim : seq_dim;
  if (dim < 0 || dim >= full->ndim)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "seq_dim %d is out of range for %d dimensions", seq_dim, full->ndim);
  const int64_t seq_len = full->shape[dim];
  STRIA_RETURN_IF_ERROR(CheckGrid(layout, seq_len, world_size, ulysses_size, rank));
  const int64_t L = seq_len / world_size;
  for (int i = 0; i < full->ndim; ++i)
    if (local->shape[i] != (i == dim ? L : full->shape[i]))
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "local has %lld along dimension %d but full %lld: local must match full except along seq_dim %d, "
                   "where it holds seq_len / world_size = %lld tokens",
                   static_cast<long long>(local->shape[i]), i, static_cast<long long>(full->shape[i]), dim,
                   static_cast<long long>(L));
  const int R = world_size / ulysses_size, g = rank / ulysses_size, u = rank % ulysses_size;
  // Each case is a copy the plain layouts already do, on slices of the two tensors.
  std::vector<int64_t> fs, fst, ls, lst;
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:  // the group's tokens are contiguous, so are their pieces
      return ShardCopy(layout, world_size, rank, dim, full, local, to_local, stream);
    case STRIA_LAYOUT_STRIPED: {  // piece u is the striping of R over the u-th U-th of the sequence
      const DLTensor part = Slice(*full, dim, u * L * R, L * R, &fs, &fst);
      return ShardCopy(layout, R, g, dim, &part, local, to_local, stream);
    }
    case STRIA_LAYOUT_ZIGZAG: {  // the group's two chunks; piece u lies in one of them or spans both
      const int64_t chunk = L * ulysses_size / 2;
      const int64_t first = u * L, last = first + L;  // the piece, in the group's tokens
      const int64_t starts[2] = {g * chunk, (2 * static_cast<int64_t>(R) - 1 - g) * chunk};
      for (int c = 0; c < 2; ++c) {
        const int64_t lo = std::max(first, c * chunk), hi = std::min(last, (c + 1) * chunk);
        if (lo >= hi) continue;
        const DLTensor f = Slice(*full, dim, starts[c] + lo - c * chunk, hi - lo, &fs, &fst);
        const DLTensor l = Slice(*local, dim, lo - first, hi - lo, &ls, &lst);
        STRIA_RETURN_IF_ERROR(ShardCopy(STRIA_LAYOUT_CONTIGUOUS, 1, 0, dim, &f, &l, to_local, stream));
      }
      return Status::Ok();
    }
  }
  return Error(STRIA_ERROR_INVALID_ARGUMENT, "unknown layout %d", RawEnum(layout));
}

}  // namespace stria

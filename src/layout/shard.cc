#include "layout/shard.h"

#include <cstring>
#include <vector>

#include "backend/module_abi.h"
#include "core/raw_enum.h"
#include "core/tensor.h"
#include "layout/layout.h"

namespace stria {
namespace {

// Copies an n-dimensional strided block; the innermost dimension becomes one memcpy when it is
// contiguous on both sides.
void CopyStrided(int ndim, const int64_t* shape, char* dst, const int64_t* dst_strides, const char* src,
                 const int64_t* src_strides, int64_t elem) {
  if (ndim == 0) {
    std::memcpy(dst, src, static_cast<size_t>(elem));
    return;
  }
  if (ndim == 1) {
    if (dst_strides[0] == 1 && src_strides[0] == 1) {
      std::memcpy(dst, src, static_cast<size_t>(shape[0] * elem));
      return;
    }
    for (int64_t i = 0; i < shape[0]; ++i)
      std::memcpy(dst + i * dst_strides[0] * elem, src + i * src_strides[0] * elem, static_cast<size_t>(elem));
    return;
  }
  for (int64_t i = 0; i < shape[0]; ++i)
    CopyStrided(ndim - 1, shape + 1, dst + i * dst_strides[0] * elem, dst_strides + 1, src + i * src_strides[0] * elem,
                src_strides + 1, elem);
}

// Removes dimension `dim` from a shape/stride list.
void Drop(const TensorView& v, int dim, int64_t* shape, int64_t* strides) {
  int o = 0;
  for (int i = 0; i < v.ndim; ++i) {
    if (i == dim) continue;
    shape[o] = v.shape[i];
    strides[o] = v.strides[i];
    ++o;
  }
}

// Zeros an n-dimensional strided block.
void ZeroStrided(int ndim, const int64_t* shape, char* dst, const int64_t* strides, int64_t elem) {
  if (ndim == 0) {
    std::memset(dst, 0, static_cast<size_t>(elem));
    return;
  }
  for (int64_t i = 0; i < shape[0]; ++i)
    ZeroStrided(ndim - 1, shape + 1, dst + i * strides[0] * elem, strides + 1, elem);
}

// What both copies check of their tensors once the device is known: views of full and local on it,
// the written one not broadcast, the same rank and dtype, and seq_dim within range (made
// non-negative in *dim).
Status PairOfViews(const DLTensor* full_t, const DLTensor* local_t, DLDevice dev, bool to_local, int seq_dim,
                   TensorView* full, TensorView* local, int* dim) {
  STRIA_RETURN_IF_ERROR(ViewOf(full_t, "full", dev, full));
  STRIA_RETURN_IF_ERROR(ViewOf(local_t, "local", dev, local, "full's device: both tensors of a copy on one device"));
  STRIA_RETURN_IF_ERROR(to_local ? CheckNoBroadcast(*local, "local") : CheckNoBroadcast(*full, "full"));
  if (full->ndim != local->ndim)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full has %d dimensions but local %d", full->ndim, local->ndim);
  if (full->dl_dtype.code != local->dl_dtype.code || full->dl_dtype.bits != local->dl_dtype.bits ||
      full->dl_dtype.lanes != local->dl_dtype.lanes) {
    char a[32], b[32];
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full is %s but local is %s", DLDataTypeName(full->dl_dtype, a, 32),
                 DLDataTypeName(local->dl_dtype, b, 32));
  }
  *dim = seq_dim < 0 ? seq_dim + full->ndim : seq_dim;
  if (*dim < 0 || *dim >= full->ndim)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "seq_dim %d is out of range for %d dimensions", seq_dim, full->ndim);
  return Status::Ok();
}

}  // namespace

Status PlanGridRank(const Plan& plan, int ulysses, int rank, int* ring_rank, int64_t* first, int64_t* count) {
  if (ulysses < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "ulysses_size %d must be >= 1 (1: the plan's own ring)", ulysses);
  const int64_t world = static_cast<int64_t>(plan.world_size()) * ulysses;
  if (rank < 0 || rank >= world)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "rank %d is out of range for the plan's world_size %d times ulysses_size %d", rank, plan.world_size(),
                 ulysses);
  if (plan.local_len() % ulysses != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "the plan's local_len %lld is not divisible by ulysses_size %d: a grid's group splits its ring "
                 "rank's slots into equal pieces (make the plan with local_len a multiple of it)",
                 static_cast<long long>(plan.local_len()), ulysses);
  *ring_rank = rank / ulysses;
  *count = plan.local_len() / ulysses;
  *first = (rank % ulysses) * *count;
  return Status::Ok();
}

Status PlanShardCopy(const Plan& plan, int grid_rank, int seq_dim, const DLTensor* full_t, const DLTensor* local_t,
                     bool to_local, void* stream, int ulysses) {
  if (full_t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "full is NULL");
  if (local_t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "local is NULL");
  int rank = 0;
  int64_t first = 0, L = 0;
  STRIA_RETURN_IF_ERROR(PlanGridRank(plan, ulysses, grid_rank, &rank, &first, &L));
  const DLDevice dev = full_t->device;
  const int dev_type = RawEnum(dev.device_type);
  if (dev_type != kDLCPU && dev_type != kDLCUDAHost) {
    char b[32];
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "plan shard/unshard supports host tensors (cpu, cuda_host), not %s: on a GPU, gather by "
                 "stria_plan_positions (padding slots are -1)",
                 DeviceName(dev, b, sizeof b));
  }
  if (stream != nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "stream must be NULL for host tensors");
  TensorView full, local;
  int dim = 0;
  STRIA_RETURN_IF_ERROR(PairOfViews(full_t, local_t, dev, to_local, seq_dim, &full, &local, &dim));
  const int64_t B = plan.batch();
  if (full.shape[dim] != plan.seq_len())
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full has %lld tokens along seq_dim %d but the plan's seq_len is %lld",
                 static_cast<long long>(full.shape[dim]), dim, static_cast<long long>(plan.seq_len()));
  if (B > 1 && (dim == 0 || full.shape[0] != B))
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "the plan has %lld batch rows: dimension 0 must be the batch (of %lld) and seq_dim another; full has "
                 "shape %s and seq_dim %d",
                 static_cast<long long>(B), static_cast<long long>(B), ShapeString(full).c_str(), dim);
  for (int i = 0; i < full.ndim; ++i) {
    const int64_t want = i == dim ? L : full.shape[i];
    if (local.shape[i] != want)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "local has shape %s but full %s: local must match full except along seq_dim %d, where it holds "
                   "the plan's local_len%s = %lld slots",
                   ShapeString(local).c_str(), ShapeString(full).c_str(), dim, ulysses > 1 ? " / ulysses_size" : "",
                   static_cast<long long>(L));
  }
  if (local.numel() == 0) return Status::Ok();
  // Each batch row of the plan is the slice of dimension 0 at b (all of it for one row): the copy
  // drops seq_dim, and dimension 0 too when it is the batch.
  const bool batched = B > 1;
  int64_t shape[kMaxDims], fs[kMaxDims], ls[kMaxDims];
  Drop(full, dim, shape, fs);
  Drop(local, dim, shape, ls);
  int nd = full.ndim - 1;
  const int64_t* sub_shape = shape;
  const int64_t *sub_fs = fs, *sub_ls = ls;
  if (batched) {  // dim != 0, so dimension 0 is the first of the dropped lists
    --nd;
    ++sub_shape;
    ++sub_fs;
    ++sub_ls;
  }
  const int64_t elem = full.elem_bytes();
  std::vector<int64_t> slots(static_cast<size_t>(plan.local_len()));
  const int64_t* positions = slots.data() + first;  // this grid rank's piece of its ring rank's slots
  for (int64_t b = 0; b < B; ++b) {
    plan.Positions(b, rank, slots.data());
    char* f0 = static_cast<char*>(full.data) + (batched ? b * full.strides[0] * elem : 0);
    char* l0 = static_cast<char*>(local.data) + (batched ? b * local.strides[0] * elem : 0);
    for (int64_t i = 0; i < L; ++i) {
      const int64_t p = positions[i];
      char* l = l0 + i * local.strides[dim] * elem;
      if (p < 0) {
        if (to_local) ZeroStrided(nd, sub_shape, l, sub_ls, elem);
        continue;
      }
      char* f = f0 + p * full.strides[dim] * elem;
      if (to_local) {
        CopyStrided(nd, sub_shape, l, sub_ls, f, sub_fs, elem);
      } else {
        CopyStrided(nd, sub_shape, f, sub_fs, l, sub_ls, elem);
      }
    }
  }
  return Status::Ok();
}

Status ShardCopy(stria_layout_t layout, int world_size, int rank, int seq_dim, const DLTensor* full_t,
                 const DLTensor* local_t, bool to_local, void* stream) {
  if (full_t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "full is NULL");
  if (local_t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "local is NULL");
  const DLDevice dev = full_t->device;
  const int dev_type = RawEnum(dev.device_type);  // any int may come through the C ABI
  const bool on_gpu = dev_type == kDLCUDA;
  if (!on_gpu && dev_type != kDLCPU && dev_type != kDLCUDAHost) {
    char b[32];
    return Error(STRIA_ERROR_UNSUPPORTED, "shard/unshard supports host tensors (cpu, cuda_host) and cuda, not %s",
                 DeviceName(dev, b, sizeof b));
  }
  if (!on_gpu && stream != nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "stream must be NULL for host tensors");
  TensorView full, local;
  int dim = 0;
  STRIA_RETURN_IF_ERROR(PairOfViews(full_t, local_t, dev, to_local, seq_dim, &full, &local, &dim));
  const int64_t seq_len = full.shape[dim];
  STRIA_RETURN_IF_ERROR(CheckLayout(layout, seq_len, world_size, rank));
  const int64_t L = seq_len / world_size;
  for (int i = 0; i < full.ndim; ++i) {
    const int64_t want = i == dim ? L : full.shape[i];
    if (local.shape[i] != want)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "local has shape %s but full %s: local must match full except along seq_dim %d, where it holds "
                   "seq_len / world_size = %lld tokens",
                   ShapeString(local).c_str(), ShapeString(full).c_str(), dim, static_cast<long long>(L));
  }
  if (local.numel() == 0) return Status::Ok();  // nothing to copy (and other dimensions may be huge)
  if (on_gpu) {
    const BackendModuleV1* module = nullptr;
    STRIA_RETURN_IF_ERROR(LoadCudaModule(&module));
    return module->shard(dev, layout, world_size, rank, dim, full, local, to_local, stream);
  }
  int64_t shape[kMaxDims], fs[kMaxDims], ls[kMaxDims];
  Drop(full, dim, shape, fs);
  Drop(local, dim, shape, ls);
  const int64_t elem = full.elem_bytes();
  for (int64_t i = 0; i < L; ++i) {
    const int64_t p = GlobalPosition(layout, L, world_size, rank, i);
    char* f = static_cast<char*>(full.data) + p * full.strides[dim] * elem;
    char* l = static_cast<char*>(local.data) + i * local.strides[dim] * elem;
    if (to_local) {
      CopyStrided(full.ndim - 1, shape, l, ls, f, fs, elem);
    } else {
      CopyStrided(full.ndim - 1, shape, f, fs, l, ls, elem);
    }
  }
  return Status::Ok();
}

}  // namespace stria

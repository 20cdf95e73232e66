#include "layout/shard.h"

#include <cstring>

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

}  // namespace

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
  STRIA_RETURN_IF_ERROR(ViewOf(full_t, "full", dev, &full));
  STRIA_RETURN_IF_ERROR(ViewOf(local_t, "local", dev, &local, "full's device: both tensors of a copy on one device"));
  STRIA_RETURN_IF_ERROR(to_local ? CheckNoBroadcast(local, "local") : CheckNoBroadcast(full, "full"));
  if (full.ndim != local.ndim)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full has %d dimensions but local %d", full.ndim, local.ndim);
  if (full.dl_dtype.code != local.dl_dtype.code || full.dl_dtype.bits != local.dl_dtype.bits ||
      full.dl_dtype.lanes != local.dl_dtype.lanes) {
    char a[32], b[32];
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "full is %s but local is %s", DLDataTypeName(full.dl_dtype, a, 32),
                 DLDataTypeName(local.dl_dtype, b, 32));
  }
  const int dim = seq_dim < 0 ? seq_dim + full.ndim : seq_dim;
  if (dim < 0 || dim >= full.ndim)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "seq_dim %d is out of range for %d dimensions", seq_dim, full.ndim);
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

// libstria-cuda.so's one export: the backend module table the core dlopens on first use.
#include "backend/cuda/cuda_backend.h"
#include "backend/module_abi.h"
#include "cuda/launch.h"
#include "cuda_common/cuda_status.h"

namespace stria {
namespace {

Status Create(DLDevice device, int /*num_threads*/, Backend** out) {
  return CreateCudaBackend(device, out);
}

Status Shard(DLDevice dev, stria_layout_t layout, int world_size, int rank, int dim, const TensorView& full,
             const TensorView& local, bool to_local, void* stream) {
  STRIA_RETURN_IF_ERROR(CheckCudaDevice(dev.device_id));
  int device = dev.device_id;
  cudaPointerAttributes fa, la;
  cudaError_t e = cudaPointerGetAttributes(&fa, full.data);
  if (e == cudaSuccess) e = cudaPointerGetAttributes(&la, local.data);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "shard/unshard: a tensor's data is not CUDA memory (%s)",
                 cudaGetErrorString(e));
  }
  for (const cudaPointerAttributes* a : {&fa, &la}) {
    if (a->type != cudaMemoryTypeDevice && a->type != cudaMemoryTypeManaged)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "shard/unshard: %s.data is host memory, but the tensor says cuda",
                   a == &fa ? "full" : "local");
  }
  for (const cudaPointerAttributes* a : {&fa, &la}) {
    if (a->type == cudaMemoryTypeDevice && a->device != device)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "shard/unshard: %s.data is memory of cuda:%d, the tensor says cuda:%d",
                   a == &fa ? "full" : "local", a->device, device);
  }
  if (full.ndim > 8) return Error(STRIA_ERROR_UNSUPPORTED, "shard/unshard of CUDA tensors takes up to 8 dimensions");
  DeviceScope scope(device);
  STRIA_RETURN_IF_ERROR(scope.status());
  cuda::ShardArgs a{};
  a.ndim = local.ndim;
  a.seq_dim = dim;
  a.layout = static_cast<int>(layout);
  a.world = world_size;
  a.rank = rank;
  a.L = local.shape[dim];
  for (int i = 0; i < local.ndim; ++i) {
    a.shape[i] = local.shape[i];
    a.local_strides[i] = local.strides[i];
    a.full_strides[i] = full.strides[i];
  }
  a.local = static_cast<char*>(local.data);
  a.full = static_cast<char*>(full.data);
  a.elem_bytes = static_cast<int>(full.elem_bytes());
  a.to_local = to_local ? 1 : 0;
  STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchShard(a, static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

}  // namespace
}  // namespace stria

extern "C" __attribute__((visibility("default"))) const stria::BackendModuleV1 stria_cuda_module_v1 = {
    stria::kBackendModuleAbiVersion, "cuda", &stria::Create, &stria::Shard};

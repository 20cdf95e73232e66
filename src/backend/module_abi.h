// What a backend module (libstria-cuda.so) exports: `extern "C" const BackendModuleV1
// stria_cuda_module_v1`. Core and modules are built from one tree by one compiler, so the table
// carries C++ objects; the version field guards against mixing installs.
#pragma once

#include "backend/backend.h"

namespace stria {

// 3: BlockMask::doc_*; 4: Backend::ReadOnHost, and AttentionShape without the documents flag that
// no backend read (a block's mask says whether it has document bounds); 5: Backend::SetDeterministic;
// 6: trimmed ring messages (Backend::KVWirePieces, CopyPieces, AccumulateDKV over pieces); 7:
// AttentionShape::softcap, Backend::ApplySinks and SinksGradient; 8: Backend::Decode and DecodeMerge;
// 9: a grid's exchange (Backend::CheckGridSupported, PackBox, SumIntoBox, SyncStream); 10: decode on
// device backends (CheckServingSupported by call, PartialsOnHost, ReadBytesOnHost,
// DecodeWork::stream, StoreTokens' stream); 11: Backend::DecodeFinishAlone; 12: Backend::WidenFp8;
// 13: the merge on the device (MergesOnDevice; DecodeMerge reads the backend's memory; a world of
// one finishes in Decode, DecodeFinishAlone and PartialsOnHost gone); 14: a plan's home part
// (ForwardStep/BackwardStep::home_begin, Backend::DetachesHome and JoinDetached).
constexpr int kBackendModuleAbiVersion = 14;

struct BackendModuleV1 {
  int abi_version;  // kBackendModuleAbiVersion
  const char* name;
  Status (*create)(DLDevice device, int num_threads, Backend** out);
  // stria_shard / stria_unshard of device tensors, after the core validated them: copies the
  // tokens of `rank` along `dim` between `full` and `local` on `stream` (NULL: the default stream).
  Status (*shard)(DLDevice device, stria_layout_t layout, int world_size, int rank, int dim, const TensorView& full,
                  const TensorView& local, bool to_local, void* stream);
};

// The CUDA module's table, loaded on first use.
Status LoadCudaModule(const BackendModuleV1** out);

}  // namespace stria

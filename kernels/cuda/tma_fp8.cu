// The FP8 forward's launchers (fp8_launch.h): the kernels of tma_forward_fp8.cuh, sm_90a only.
#include <cuda_runtime.h>

#include "cuda/fp8_launch.h"
#include "cuda/launch_tiles.cuh"
#include "cuda/tma_forward_fp8.cuh"

namespace stria {
namespace cuda {
namespace {

unsigned Blocks(int64_t items, int per_block) {
  const int64_t n = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(n < 1 ? 1 : n > 4096 ? 4096 : n);
}

}  // namespace

int64_t Fp8KvWireBytes(const Dims& d) {
  return PackedKvE4m3Bytes(d.B, d.L, d.Hkv);
}

cudaError_t LaunchPackKvE4m3(const Dims& d, RowsArg k, RowsArg v, void* wire, cudaStream_t s) {
  PackKvE4m3Args a{d.B,
                   d.L,
                   d.Hkv,
                   PaddedKeys(d.L),
                   static_cast<const unsigned char*>(k.data),
                   k.sb,
                   k.sl,
                   k.sh,
                   static_cast<const unsigned char*>(v.data),
                   v.sb,
                   v.sl,
                   v.sh,
                   static_cast<unsigned char*>(wire)};
  const cudaError_t e = STRIA_LAUNCH(PackKE4m3Kernel, Blocks(int64_t{d.B} * d.L * d.Hkv * 8, 256), 256, 0, s)(a);
  if (e != cudaSuccess) return e;
  const dim3 tiles(static_cast<unsigned>(a.Lp / 128), static_cast<unsigned>(d.B * d.Hkv));
  return STRIA_LAUNCH(TransposeVE4m3Kernel, tiles, 256, kVtTileSmemBytes, s)(a);
}

bool Fp8QueriesMappable(const RowsArg& q, const Dims& d) {
  TensorMap map;
  return EncodeBytesMap(&map, q.data, d.B, d.L, d.Hq, TmaFp8FwdTile::D, q.sb, q.sl, q.sh, TmaFp8FwdTile::kM);
}

cudaError_t LaunchFp8ForwardBlock(Elem e, const FwdParams& p, Descale q, Descale k, cudaStream_t s) {
  using Tile = TmaFp8FwdTile;
  static_assert(Tile::kM == kForwardTileRows, "a forward's busy-tile lists are made for kForwardTileRows");
  TmaFp8FwdParams tp;
  if (!Fp8ForwardParams(p, q.data, q.step, k.data, k.step, &tp)) return cudaErrorNotSupported;
  if (!QueryTileHeadGroup(p.dims, 1, &tp.p.head_group)) return cudaErrorInvalidValue;  // e4m3 K/V: a byte a value
  const bool docs = p.mask.doc_lo != nullptr;
  void (*kernel)(TmaFp8FwdParams) = nullptr;
  switch (e) {
    case Elem::kF32:
      kernel = docs ? WgmmaTmaFp8ForwardKernel<Float, true> : WgmmaTmaFp8ForwardKernel<Float, false>;
      break;
    case Elem::kF16:
      kernel = docs ? WgmmaTmaFp8ForwardKernel<Half, true> : WgmmaTmaFp8ForwardKernel<Half, false>;
      break;
    case Elem::kBF16:
      kernel = docs ? WgmmaTmaFp8ForwardKernel<BFloat, true> : WgmmaTmaFp8ForwardKernel<BFloat, false>;
      break;
  }
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(tp);
}

}  // namespace cuda
}  // namespace stria

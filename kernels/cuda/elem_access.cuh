// One element of a caller's tensor in its storage dtype (Float, Half, BFloat), read or written as
// float: what the memory-bound kernels and the tile kernels' epilogues share.
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/tile_mask.cuh"  // STRIA_HD

namespace stria {
namespace cuda {

template <typename T>
STRIA_DEVICE float LoadElem(const void* p, int64_t i);
template <>
STRIA_DEVICE float LoadElem<Float>(const void* p, int64_t i) {
  return static_cast<const float*>(p)[i];
}
template <>
STRIA_DEVICE float LoadElem<Half>(const void* p, int64_t i) {
  return to_float<Half>(static_cast<const uint16_t*>(p)[i]);
}
template <>
STRIA_DEVICE float LoadElem<BFloat>(const void* p, int64_t i) {
  return to_float<BFloat>(static_cast<const uint16_t*>(p)[i]);
}
template <typename T>
STRIA_DEVICE void StoreElem(void* p, int64_t i, float v);
template <>
STRIA_DEVICE void StoreElem<Float>(void* p, int64_t i, float v) {
  static_cast<float*>(p)[i] = v;
}
template <>
STRIA_DEVICE void StoreElem<Half>(void* p, int64_t i, float v) {
  static_cast<uint16_t*>(p)[i] = from_float<Half>(v);
}
template <>
STRIA_DEVICE void StoreElem<BFloat>(void* p, int64_t i, float v) {
  static_cast<uint16_t*>(p)[i] = from_float<BFloat>(v);
}

template <typename T>
STRIA_HD constexpr int ElemBytes() {
  return 2;
}
template <>
STRIA_HD constexpr int ElemBytes<Float>() {
  return 4;
}

}  // namespace cuda
}  // namespace stria

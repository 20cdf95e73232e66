// FP8 inputs on the CPU backend (Backend::WidenFp8): a float8_e4m3fn tensor [B, L, H, D] widened
// into a compact tensor of the call's compute dtype, each value times its head's descale.
#pragma once

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace stria {

// descale: NULL (1) or a contiguous float32 [1] or [H]; rows of (b, l) split over the pool.
void HostWidenFp8(ThreadPool& pool, const TensorView& src, const TensorView* descale, DType to, void* dst);

}  // namespace stria

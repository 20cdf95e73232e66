// A grid's exchange on host memory (Backend::PackBox and SumIntoBox of the CPU backend): strided
// regions of tensors to compact buffers and back, summing where several members send one region.
#pragma once

#include <cstddef>

#include "core/tensor.h"

namespace stria {

void HostPackBox(const TensorView& box, void* dst);
void HostSumIntoBox(const void* src, size_t src_step, int count, const TensorView& box);

}  // namespace stria

// A ring block's mask (layout/layout.h) as the CUDA kernels take it (cuda/params.h), for the
// backend and for the benchmark that times the block kernels directly.
#pragma once

#include "cuda/params.h"
#include "layout/layout.h"

namespace stria {

// The block's mask without its document bounds (the backend's UploadDocuments adds their device copy).
inline cuda::MaskArgs MaskOf(const BlockMask& m) {
  return cuda::MaskArgs{m.q_begin, m.q_end, m.k_begin, m.k_end, m.diagonal ? 1 : 0, m.offset};
}

}  // namespace stria

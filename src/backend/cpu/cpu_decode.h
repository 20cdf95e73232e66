// Decode over a sharded KV cache on the CPU backend (Backend::Decode and Backend::DecodeMerge):
// the host side of kernels/cpu/decode.cc.
#pragma once

#include "backend/backend.h"
#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "cpu/attention_kernels.h"

namespace stria {

// Memory a CPU context keeps across decode calls (grown, never shrunk).
struct CpuDecodeBuffers {
  AlignedBuffer q;        // packed queries
  AlignedBuffer states;   // work items' softmax states
  AlignedBuffer scratch;  // per-thread key blocks and scores
  AlignedBuffer staged;   // per-thread key blocks of every head in float32 (decode's few rows)
};

Status CpuDecode(ThreadPool& pool, const cpu::KernelTable& kern, const DecodeWork& w, float* partial,
                 CpuDecodeBuffers* bufs);
void CpuStoreTokens(const DecodeShape& s, const std::vector<CacheAppend>& appends);
Status CpuDecodeMerge(ThreadPool& pool, const cpu::KernelTable& kern, const DecodeWork& w, const float* all,
                      int world_size, const TensorView* sinks, const TensorView& out, const TensorView* lse);

}  // namespace stria

#include "backend/cuda/cuda_decode.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/decode_split.h"
#include "core/dtype.h"
#include "cuda/decode_launch.h"
#include "cuda_common/device_scope.h"

namespace stria {
namespace {

cuda::Elem ElemOfDType(DType t) {
  return t == DType::kF16 ? cuda::Elem::kF16 : t == DType::kBF16 ? cuda::Elem::kBF16 : cuda::Elem::kF32;
}

// The call's outputs and sinks as the finishing kernels take them (records: none yet).
cuda::DecodeFinishArgs FinishArgs(const DecodeWork& w, const TensorView& out, const TensorView* lse,
                                  const TensorView* sinks) {
  const DecodeShape& s = w.shape;
  cuda::DecodeFinishArgs a{};
  a.world = 1;
  a.sinks = sinks != nullptr ? static_cast<const float*>(sinks->data) : nullptr;
  a.sinks_stride = sinks != nullptr ? sinks->strides[0] : 0;
  a.out = out.data;
  for (int i = 0; i < 4; ++i) a.out_strides[i] = out.strides[i];
  a.lse = lse != nullptr ? static_cast<float*>(lse->data) : nullptr;
  for (int i = 0; i < 3 && lse != nullptr; ++i) a.lse_strides[i] = lse->strides[i];
  a.B = static_cast<int>(s.B);
  a.T = static_cast<int>(s.T);
  a.Hq = static_cast<int>(s.Hq);
  a.D = static_cast<int>(s.D);
  return a;
}

}  // namespace

// The uploads may still be reading the page-locked tables (the pool waits for them); the device
// buffers are freed by cudaFree, which waits for the device.
CudaDecoder::~CudaDecoder() {
  DeviceScope scope(device_);
  for (DeviceBuffer* b : {&tables_dev_, &states_}) b->Release();
  staging_.Release();
}

// The call's tables, laid out in staging_ by Stage, in one copy: one copy's fixed cost however many
// tables a call has.
Status CudaDecoder::UploadTables(cudaStream_t stream) {
  STRIA_RETURN_IF_ERROR(tables_dev_.Reserve(std::max<size_t>(staged_, 16), "decode tables", nullptr));
  if (staged_ > 0)
    STRIA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(tables_dev_.data(), slot_->buffer.data(), staged_, cudaMemcpyHostToDevice, stream));
  return StagingPool::Copied(slot_, stream);
}

// Tables go back to back at 16-byte boundaries: Layout gives each one's offset, then Stage fills
// them in (page-locked memory grown to the call's total first).
size_t CudaDecoder::Layout(size_t bytes) {
  const size_t start = staged_;
  staged_ = (staged_ + bytes + 15) / 16 * 16;
  return start;
}

Status CudaDecoder::Stage(std::initializer_list<Table> tables) {
  STRIA_RETURN_IF_ERROR(staging_.Take(staged_, "decode tables (page-locked)", &slot_));
  // A rank with no key has no pieces and no items: an empty vector's data() may be null, which
  // memcpy may not take even for no bytes.
  for (const Table& t : tables)
    if (t.bytes > 0) std::memcpy(slot_->buffer.data() + t.at, t.src, t.bytes);
  return Status::Ok();
}

int CudaDecoder::SmCount() {
  if (sms_ == 0) {
    int n = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device_);
    ForgetError(e);
    sms_ = e == cudaSuccess && n > 0 ? n : 1;
  }
  return sms_;
}

Status CudaDecoder::StoreTokens(const DecodeShape& s, const std::vector<CacheAppend>& appends, cudaStream_t stream) {
  if (appends.empty()) return Status::Ok();
  DeviceScope scope(device_);
  STRIA_RETURN_IF_ERROR(scope.status());
  staged_ = 0;
  const size_t copies_at = CollectCopies(appends);
  STRIA_RETURN_IF_ERROR(Stage({{copies_at, copies_.data(), copies_.size() * sizeof(cuda::TokenCopy)}}));
  STRIA_RETURN_IF_ERROR(UploadTables(stream));
  STRIA_RETURN_IF_ERROR(LaunchStore(s, copies_at, stream));
  return Status::Ok();
}

size_t CudaDecoder::CollectCopies(const std::vector<CacheAppend>& appends) {
  copies_.clear();
  for (const CacheAppend& a : appends)
    copies_.push_back(
        cuda::TokenCopy{a.k_src, a.v_src, a.k_dst, a.v_dst, a.k_src_head, a.v_src_head, a.k_dst_head, a.v_dst_head});
  return Layout(copies_.size() * sizeof(cuda::TokenCopy));
}

Status CudaDecoder::LaunchStore(const DecodeShape& s, size_t copies_at, cudaStream_t stream) {
  if (copies_.empty()) return Status::Ok();
  const auto* copies =
      reinterpret_cast<const cuda::TokenCopy*>(static_cast<const char*>(tables_dev_.data()) + copies_at);
  STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchStoreTokens(static_cast<int>(DTypeSize(s.dtype)), copies,
                                                     static_cast<int64_t>(copies_.size()), static_cast<int>(s.Hkv),
                                                     static_cast<int>(s.D), stream));
  return Status::Ok();
}

Status CudaDecoder::Decode(const DecodeWork& w, float* partial) {
  const DecodeShape& s = w.shape;
  cudaStream_t stream = static_cast<cudaStream_t>(w.stream);
  DeviceScope scope(device_);
  STRIA_RETURN_IF_ERROR(scope.status());

  // The tensor-core kernel takes 16-bit rows of whole 16-byte chunks at its head dims; whether
  // the cache's rows are such is a property of its base address and strides, segment by segment.
  auto whole16 = [](const void* base, int64_t a, int64_t b) {
    return reinterpret_cast<uintptr_t>(base) % 16 == 0 && a % 16 == 0 && b % 16 == 0;
  };
  auto rows16 = [&](const CacheSegment& seg) {
    return s.dtype != DType::kF32 && s.D % 8 == 0 && whole16(seg.k, seg.k_row, seg.k_head) &&
           whole16(seg.v, seg.v_row, seg.v_head);
  };
  bool mma = tensor_cores_ && s.dtype != DType::kF32 && (s.D == 64 || s.D == 128);
  for (const CacheSegment& seg : w.segments) mma = mma && rows16(seg);

  // Items of about equal key counts: enough CTAs (items x K/V heads x row chunks) for a wave of
  // the kernel's resident CTAs (two per SM of the tensor-core kernel's 100 KB of stages, four of
  // the SIMT one), but never so short that a CTA's setup and the items' merge show (256 keys at
  // least).
  const int64_t group = s.Hq / s.Hkv, rows = s.T * group;
  const int64_t rows_per_cta = mma ? cuda::DecodeMmaRowsPerCta(static_cast<int>(rows)) : cuda::kDecodeRows;
  const int64_t ctas_per_sm = mma ? 2 : 4;
  const int64_t chunks = (rows + rows_per_cta - 1) / rows_per_cta;
  const int64_t keys = DecodeKeyCount(w);
  const int64_t per_head = std::max<int64_t>(1, (ctas_per_sm * SmCount() + s.Hkv * chunks - 1) / (s.Hkv * chunks));
  const int64_t target = std::max<int64_t>(256, (keys + per_head - 1) / per_head);
  std::vector<DecodeKeyPiece> pieces;
  std::vector<DecodeWorkItem> items;
  PlanDecodeItems(w, target, &pieces, &items);
  pieces_.clear();
  for (const DecodeKeyPiece& p : pieces) {
    const CacheSegment& seg = w.segments[static_cast<size_t>(p.seg)];
    cuda::DecodePiece dp{seg.k + p.j0 * seg.k_row,
                         seg.v + p.j0 * seg.v_row,
                         seg.k_row,
                         seg.v_row,
                         seg.k_head,
                         seg.v_head,
                         p.count,
                         seg.pos0 + p.j0 * seg.pos_stride,
                         seg.pos_stride,
                         0};
    dp.rows16 = rows16(seg) ? 1 : 0;  // a piece starts at a whole row of its segment
    pieces_.push_back(dp);
  }
  items_.clear();
  first_item_.assign(static_cast<size_t>(s.B + 1), 0);
  for (const DecodeWorkItem& it : items) {
    items_.push_back(cuda::DecodeItem{it.b, it.first, it.last});
    ++first_item_[static_cast<size_t>(it.b + 1)];
  }
  for (int64_t b = 0; b < s.B; ++b) first_item_[static_cast<size_t>(b + 1)] += first_item_[static_cast<size_t>(b)];

  // The call's tables (the new tokens' copies, key runs, work items, items per sequence, query
  // positions) in one upload from page-locked memory, which the host keeps until the call's work is
  // done (the class comment).
  staged_ = 0;
  const size_t copies_at = CollectCopies(w.appends);
  const size_t pieces_at = Layout(pieces_.size() * sizeof(cuda::DecodePiece));
  const size_t items_at = Layout(items_.size() * sizeof(cuda::DecodeItem));
  const size_t first_at = Layout(first_item_.size() * sizeof(int64_t));
  const size_t q_pos_at = Layout(w.q_pos.size() * sizeof(int64_t));
  STRIA_RETURN_IF_ERROR(Stage({{copies_at, copies_.data(), copies_.size() * sizeof(cuda::TokenCopy)},
                               {pieces_at, pieces_.data(), pieces_.size() * sizeof(cuda::DecodePiece)},
                               {items_at, items_.data(), items_.size() * sizeof(cuda::DecodeItem)},
                               {first_at, first_item_.data(), first_item_.size() * sizeof(int64_t)},
                               {q_pos_at, w.q_pos.data(), w.q_pos.size() * sizeof(int64_t)}}));
  STRIA_RETURN_IF_ERROR(UploadTables(stream));
  // The new tokens first: the queries see them.
  STRIA_RETURN_IF_ERROR(LaunchStore(s, copies_at, stream));
  const char* tables = static_cast<const char*>(tables_dev_.data());
  const size_t state_floats = items_.size() * static_cast<size_t>(s.Hkv * rows * (s.D + 2));
  STRIA_RETURN_IF_ERROR(states_.Reserve(std::max<size_t>(state_floats, 1) * 4, "decode work items' states", nullptr));

  cuda::DecodeArgs a{};
  a.pieces = reinterpret_cast<const cuda::DecodePiece*>(tables + pieces_at);
  a.items = reinterpret_cast<const cuda::DecodeItem*>(tables + items_at);
  a.q = w.q.data;
  a.qb = w.q.strides[0];
  a.qt = w.q.strides[1];
  a.qh = w.q.strides[2];
  a.q_pos = reinterpret_cast<const int64_t*>(tables + q_pos_at);
  a.T = static_cast<int>(s.T);
  a.Hq = static_cast<int>(s.Hq);
  a.Hkv = static_cast<int>(s.Hkv);
  a.D = static_cast<int>(s.D);
  a.scale_log2 = s.scale * cuda::kLog2e;
  a.softcap = s.softcap > 0.f ? cuda::Softcap{s.softcap * cuda::kLog2e, s.scale / s.softcap} : cuda::Softcap{0.f, 0.f};
  a.causal = s.causal ? 1 : 0;
  a.window_left = s.window_left;
  a.states = states_.f32();
  const int64_t n_items = static_cast<int64_t>(items_.size());
  STRIA_CUDA_RETURN_IF_ERROR(mma ? cuda::LaunchDecodeMma(ElemOfDType(s.dtype), a, n_items, stream)
                                 : cuda::LaunchDecode(ElemOfDType(s.dtype), a, n_items, stream));
  cuda::DecodeMergeArgs m{};
  m.states = states_.f32();
  m.first_item = reinterpret_cast<const int64_t*>(tables + first_at);
  m.partial = partial;
  m.B = static_cast<int>(s.B);
  m.T = static_cast<int>(s.T);
  m.Hq = static_cast<int>(s.Hq);
  m.Hkv = static_cast<int>(s.Hkv);
  m.D = static_cast<int>(s.D);
  if (w.finish_out == nullptr) {
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchDecodeMerge(m, stream));
  } else {
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchDecodeMergeFinish(
        ElemOfDType(s.dtype), m, FinishArgs(w, *w.finish_out, w.finish_lse, w.finish_sinks), stream));
  }
  return Status::Ok();
}

Status CudaDecoder::MergeOnDevice(const DecodeWork& w, const float* all, int world_size, const TensorView* sinks,
                                  const TensorView& out, const TensorView* lse, cudaStream_t stream) {
  const DecodeShape& s = w.shape;
  DeviceScope scope(device_);
  STRIA_RETURN_IF_ERROR(scope.status());
  cuda::DecodeFinishArgs a = FinishArgs(w, out, lse, sinks);
  a.partial = all;
  a.world = world_size;
  a.record_stride = static_cast<int64_t>(DecodePartialFloats(s));
  STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchDecodeFinish(ElemOfDType(s.dtype), a, stream));
  return Status::Ok();
}

}  // namespace stria

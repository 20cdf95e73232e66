// The CPU backend: converts the caller's tensors (any strides, float32/float16/bfloat16) into the
// packed layouts of kernels/cpu once per call (queries, and the K/V block it sends: float32 and
// bf16 blocks travel packed, see KVWireFor), and runs the tile kernels on its thread pool.
//
// Memory is O(B·L·H·D) per rank: packed Q/dO, the running output, one packed K/V block where
// the kernels cannot read the ring message in place, and dQ partials for a few key-tile chunks
// (so backward work items never write the same dQ row).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_boxes.h"
#include "backend/cpu/cpu_decode.h"
#include "backend/cpu/cpu_widen.h"
#include "core/aligned_buffer.h"
#include "core/thread_pool.h"
#include "cpu/attention_kernels.h"
#include "cpu/transpose.h"

namespace stria {
namespace {

using cpu::kBlockK;
using cpu::kBlockQ;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t RoundUp(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// The float32 kernels' head dim padding: a multiple of every build's vector width, so that the
// packed K/V blocks ranks send each other (KVWireFormat::kCpuF32Tiles) are the same bytes
// whichever CPU packed them and whichever reads them.
constexpr int64_t kF32DimPad = 16;
// Elements of one packed K/V operand ([B][Hkv][Lkp][Dp], or the same size as tiles), the head dim
// padded to dim_pad: kF32DimPad for the float32 kernels, cpu::kBf16TileDim for the bf16 ones.
int64_t PackedKVElems(const AttentionShape& s, int64_t dim_pad) {
  return s.B * s.Hkv * RoundUp(std::max<int64_t>(s.L, 1), kBlockK) * RoundUp(s.D, dim_pad);
}

// Key j's K or V row of head h in batch b, through byte strides: the caller's tensors or a wire.
struct KVRows {
  const char *k, *v;
  int64_t kb, kj, kh, vb, vj, vh;
  const char* operator()(bool is_v, int64_t b, int64_t j, int64_t h) const {
    return is_v ? v + b * vb + j * vj + h * vh : k + b * kb + j * kj + h * kh;
  }
};

// Where the float32 kernels read one K/V block: Kᵀ tiles always; V rows for the forward, or K
// rows and Vᵀ tiles for the backward (vt is then unused in the forward).
struct F32Block {
  float* kt = nullptr;
  float* rows = nullptr;
  float* vt = nullptr;
};
// Where the bf16 kernels read one K/V block: Kᵀ paired along the head dim ([Dp/2][kBlockK][2] per
// key tile); V (forward) or K (backward) paired along keys ([kBlockK/2][Dp][2]); for the
// backward Vᵀ paired along the head dim.
struct Bf16Block {
  uint16_t* kt = nullptr;
  uint16_t* kv = nullptr;
  uint16_t* vt = nullptr;
};
struct BlockOperands {
  F32Block f;
  Bf16Block h;
};

// Element (b, i, h, 0) of a [B, L, H, D] view.
inline const char* Row4(const TensorView& v, int64_t b, int64_t i, int64_t h) {
  return static_cast<const char*>(v.data) + (b * v.strides[0] + i * v.strides[1] + h * v.strides[2]) * v.elem_bytes();
}
inline char* Row4(TensorView& v, int64_t b, int64_t i, int64_t h) {
  return static_cast<char*>(v.data) + (b * v.strides[0] + i * v.strides[1] + h * v.strides[2]) * v.elem_bytes();
}
// Element (b, h, i) of a [B, H, L] float32 view.
inline float* Row3(const TensorView& v, int64_t b, int64_t h, int64_t i) {
  return static_cast<float*>(v.data) + b * v.strides[0] + h * v.strides[1] + i * v.strides[2];
}

class CpuBackend final : public Backend {
 public:
  // The kernels take any head dim (their tiles and workspaces are sized by it at run time); the
  // bound is the widest the open model families use, Gemma 4's global layers (512), so that a
  // mistaken shape still fails at validation instead of asking for gigabytes of workspace.
  static constexpr int kMaxHeadDim = 512;

  explicit CpuBackend(int num_threads) : pool_(num_threads), kern_(cpu::SelectKernels()) {}

  const char* name() const override { return "cpu"; }
  void SetCancelFlag(const std::atomic<bool>* flag) override { pool_.set_cancel_flag(flag); }
  double cpu_seconds() const override { return pool_.cpu_seconds(); }
  int num_threads() const override { return pool_.size(); }

  Status CheckSupported(const AttentionShape& shape, void* stream) const override {
    if (stream != nullptr)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "stream must be NULL on a CPU context (got %p)", stream);
    if (shape.D < 1 || shape.D > kMaxHeadDim)
      return Error(STRIA_ERROR_UNSUPPORTED, "head dim %lld is not supported by the CPU backend (supported: 1..%d)",
                   static_cast<long long>(shape.D), kMaxHeadDim);
    return Status::Ok();
  }

  Status CheckServingSupported(bool /*prefill*/) const override { return Status::Ok(); }
  Status CheckGridSupported() const override { return Status::Ok(); }
  Status PackBox(const TensorView& box, void* dst, void* /*stream*/) override {
    HostPackBox(box, dst);
    return Status::Ok();
  }
  Status SumIntoBox(const void* src, size_t src_step, int count, const TensorView& box, void* /*stream*/) override {
    HostSumIntoBox(src, src_step, count, box);
    return Status::Ok();
  }
  Status WidenFp8(const TensorView& src, const TensorView* descale, DType to, void* dst, void* /*stream*/) override {
    HostWidenFp8(pool_, src, descale, to, dst);
    return Status::Ok();
  }
  Status Decode(const DecodeWork& work, float* partial) override {
    STRIA_RETURN_IF_ERROR(CpuDecode(pool_, kern_, work, partial, &decode_bufs_));
    if (work.finish_out == nullptr) return Status::Ok();
    // A world of one: its records are the result, merged with the sinks as any world's.
    return CpuDecodeMerge(pool_, kern_, work, partial, 1, work.finish_sinks, *work.finish_out, work.finish_lse);
  }
  Status StoreTokens(const DecodeShape& shape, const std::vector<CacheAppend>& appends, void* /*stream*/) override {
    CpuStoreTokens(shape, appends);
    return Status::Ok();
  }
  Status DecodeMerge(const DecodeWork& work, const float* all, int world_size, const TensorView* sinks,
                     const TensorView& out, const TensorView* lse) override {
    return CpuDecodeMerge(pool_, kern_, work, all, world_size, sinks, out, lse);
  }

  Status Allocate(size_t bytes, void** ptr) override {
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0 || p == nullptr)
      return Error(STRIA_ERROR_OUT_OF_MEMORY, "cannot allocate a %zu-byte ring buffer", bytes);
    *ptr = p;
    return Status::Ok();
  }
  void Free(void* ptr) override { std::free(ptr); }

  // Blocks travel as the kernels' operands, packed once by the sender and read in place by every
  // receiver, so a ring step is only its kernels: float32 as the float32 kernels' (kCpuF32Tiles:
  // Kᵀ tiles and V rows for the forward; Kᵀ tiles, K rows and Vᵀ tiles for the backward), bf16
  // as the bf16 kernels' (kCpuBf16Tiles: the three Bf16Block operands). The price is padding, and
  // for the backward a message of 1.5 blocks. Both layouts depend only on the call, so ranks on
  // different CPUs agree; a rank without bf16 kernels converts a bf16 block to float32 operands at each
  // step (it converted rows before). float16 blocks travel as rows.
  KVWire KVWireFor(const AttentionShape& s, bool backward) const override {
    const int64_t operands = backward ? 3 : 2;
    if (s.dtype == DType::kF32)
      return KVWire{KVWireFormat::kCpuF32Tiles, static_cast<size_t>(operands * PackedKVElems(s, kF32DimPad)) * 4};
    if (s.dtype == DType::kBF16)
      return KVWire{KVWireFormat::kCpuBf16Tiles,
                    static_cast<size_t>(operands * PackedKVElems(s, cpu::kBf16TileDim)) * 2};
    return Backend::KVWireFor(s, backward);
  }

  // A tiles message is `operands` arrays [B][Hkv][Lkp][Dp], each head's keys in whole tiles of
  // kBlockK: the rows of a batch row are the first tiles of each of its heads in every operand.
  void KVWirePieces(const AttentionShape& s, bool backward, const int64_t* rows,
                    std::vector<WirePiece>* pieces) const override {
    const KVWireFormat format = KVWireFor(s, backward).format;
    if (format == KVWireFormat::kRows) return Backend::KVWirePieces(s, backward, rows, pieces);
    const bool f32 = format == KVWireFormat::kCpuF32Tiles;
    const int64_t dp = RoundUp(s.D, f32 ? kF32DimPad : cpu::kBf16TileDim), es = f32 ? 4 : 2;
    AttentionShape tiled = s;
    tiled.L = RoundUp(std::max<int64_t>(s.L, 1), kBlockK);
    // Each (batch row, head) is a row of RowPieces's layout: [B * Hkv][Lkp][Dp].
    tiled.B = s.B * s.Hkv;
    std::vector<int64_t> per_head(static_cast<size_t>(tiled.B));
    for (int64_t b = 0; b < s.B; ++b)
      std::fill(per_head.begin() + b * s.Hkv, per_head.begin() + (b + 1) * s.Hkv, rows[b]);
    RowPieces(tiled, backward ? 3 : 2, 1, static_cast<size_t>(dp * es), per_head.data(), kBlockK, pieces);
  }

  // A sent block is packed into the wire here (rows: copied). The local block is read from the
  // wire where the kernels read it in place; else it is unpacked straight from the caller's
  // tensors by the step-0 block call (after the send has started), which saves a world of 1 a
  // copy of K and V.
  Status PackKV(const AttentionShape& s, const TensorView& k, const TensorView& v, void* wire, bool sent) override {
    wire_format_ = KVWireFor(s, backward_).format;
    local_k_ = k;
    local_v_ = v;
    const bool in_place =
        wire_format_ == KVWireFormat::kCpuF32Tiles || (wire_format_ == KVWireFormat::kCpuBf16Tiles && bf16_tiles_);
    local_pending_ = !(sent && in_place);
    if (local_pending_) STRIA_RETURN_IF_ERROR(ReserveBlock());  // this rank's own operands
    if (!sent) return Status::Ok();
    if (wire_format_ == KVWireFormat::kCpuF32Tiles) {
      UnpackBlockF32(CallerRows(), WireF32(wire));
    } else if (wire_format_ == KVWireFormat::kCpuBf16Tiles) {
      UnpackBlockBf16(CallerRows(), WireBf16(wire));
    } else {
      // The rows layout is WireRows's, the one the receivers read.
      const KVRows from = CallerRows(), to = WireRows(wire);
      const size_t row_bytes = static_cast<size_t>(s.D * DTypeSize(s.dtype));
      pool_.ParallelFor(s.B * s.L, [&](int64_t item, int) {
        const int64_t b = item / s.L, i = item % s.L;
        for (int64_t h = 0; h < s.Hkv; ++h)
          for (bool is_v : {false, true})
            std::memcpy(const_cast<char*>(to(is_v, b, i, h)), from(is_v, b, i, h), row_bytes);
      });
    }
    return Status::Ok();
  }

  Status ForwardBegin(const AttentionShape& s, const TensorView& q, void* /*stream: NULL, checked*/) override {
    // bf16 inputs go to the bf16 tile forward where this CPU has one (AMX or AVX512-BF16);
    // everything else computes in float32.
    bf16_tiles_ = s.dtype == DType::kBF16 && kern_.forward_tile_bf16 != nullptr;
    backward_ = false;
    local_pending_ = false;
    STRIA_RETURN_IF_ERROR(SetShape(s));
    const size_t rows = static_cast<size_t>(s.B * s.Hq * ps_.Lqp);
    if (bf16_tiles_)
      STRIA_RETURN_IF_ERROR(qb_.Reserve(rows * ps_.Dp * 2, "packed queries"));
    else
      STRIA_RETURN_IF_ERROR(q32_.Reserve(rows * ps_.Dp * 4, "packed queries"));
    STRIA_RETURN_IF_ERROR(acc_.Reserve(rows * ps_.Dp * 4, "the running output"));
    STRIA_RETURN_IF_ERROR(m_.Reserve(rows * 4, "row maxima"));
    STRIA_RETURN_IF_ERROR(l_.Reserve(rows * 4, "row sums"));
    if (bf16_tiles_)
      PackRowsBf16(q, qb_.bf16(), nullptr);
    else
      PackQueries(q, s.scale * cpu::kLog2e, q32_.f32());
      // acc_ is not cleared: the kernels set a row at its first visible key (online_softmax.h),
      // and ForwardEnd writes zeros for a row that never saw one. Sanitizer and debug builds fill
      // it with NaN instead, so that every test there checks nothing reads a row before that.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(NDEBUG)
    std::fill(acc_.f32(), acc_.f32() + rows * ps_.Dp, std::numeric_limits<float>::quiet_NaN());
#endif
    std::fill(m_.f32(), m_.f32() + rows, kNegInf);
    std::memset(l_.data(), 0, rows * 4);
    return Status::Ok();
  }

  // The CPU backend finishes rows in ForwardEnd (a pass over host memory costs little beside the
  // blocks), so it takes only `local` from the step.
  Status ForwardBlock(const void* kv_wire, const BlockMask& mask, const ForwardStep& step) override {
    const BlockOperands blk = BlockFor(kv_wire, step.local);
    SetBatchMasks(mask);
    const int64_t nqt = ps_.Lqp / kBlockQ;
    const int64_t heads = s_.B * s_.Hq;
    const int64_t group = s_.Hq / s_.Hkv;
    // What the float32 and the bf16 work items share: the running state of head bh, the tile.
    auto set_common = [&](auto* a, int64_t bh, int tid) {
      a->acc = acc_.f32() + bh * ps_.Lqp * ps_.Dp;
      a->m = m_.f32() + bh * ps_.Lqp;
      a->l = l_.f32() + bh * ps_.Lqp;
      a->shape = &ps_;
      a->mask = &batch_masks_[static_cast<size_t>(bh / s_.Hq)];
      a->softcap2 = s_.softcap * cpu::kLog2e;
      a->scratch = scratch_.f32() + tid * scratch_floats_;
    };
    if (bf16_tiles_) {
      // Items of up to kBf16QueryTiles query tiles (fewer when that would leave threads with
      // less than two items each); later ones (more keys when causal) first.
      const int64_t per_item = std::max<int64_t>(
          1, std::min<int64_t>(cpu::kBf16QueryTiles, heads * nqt / (2 * static_cast<int64_t>(pool_.size()))));
      const int64_t items = (nqt + per_item - 1) / per_item;
      pool_.ParallelFor(heads * items, [&](int64_t item, int tid) {
        const int64_t first = (items - 1 - item / heads) * per_item;
        const int64_t bh = item % heads;
        const int64_t b = bh / s_.Hq, h = bh % s_.Hq, hk = h / group;
        cpu::FwdTileArgsBf16 a;
        a.q = qb_.bf16() + bh * ps_.Lqp * ps_.Dp;
        a.kt = blk.h.kt + (b * s_.Hkv + hk) * ps_.Lkp * ps_.Dp;
        a.v = blk.h.kv + (b * s_.Hkv + hk) * ps_.Lkp * ps_.Dp;
        a.scale = s_.scale * cpu::kLog2e;
        a.q0 = first * kBlockQ;
        a.q_tiles = std::min(per_item, nqt - first);
        set_common(&a, bh, tid);
        kern_.forward_tile_bf16(a);
      });
      return Status::Ok();
    }
    pool_.ParallelFor(heads * nqt, [&](int64_t item, int tid) {
      // Later query tiles see more keys under a causal mask: hand them out first.
      const int64_t qt = nqt - 1 - item / heads;
      const int64_t bh = item % heads;
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq, hk = h / group;
      cpu::FwdTileArgs a;
      a.q = q32_.f32() + bh * ps_.Lqp * ps_.Dp;
      a.kt = blk.f.kt + (b * s_.Hkv + hk) * ps_.Lkp * ps_.Dp;
      a.v = blk.f.rows + (b * s_.Hkv + hk) * ps_.Lkp * ps_.Dp;
      a.q0 = qt * kBlockQ;
      set_common(&a, bh, tid);
      kern_.forward_tile(a);
    });
    return Status::Ok();
  }

  Status ForwardEnd(const TensorView& out_in, const TensorView& lse_in) override {
    TensorView out = out_in;
    const TensorView& lse = lse_in;
    pool_.ParallelFor(s_.B * s_.Hq, [&](int64_t bh, int) {
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq;
      for (int64_t i = 0; i < s_.L; ++i) {
        const int64_t row = bh * ps_.Lqp + i;
        const float l = l_.f32()[row];
        const float m = m_.f32()[row];
        float* acc = acc_.f32() + row * ps_.Dp;
        if (l == 0.f) std::memset(acc, 0, static_cast<size_t>(s_.D) * 4);  // no key: output 0, lse -inf
        const float inv = l > 0.f ? 1.f / l : 0.f;
        kern_.store_row(acc, s_.D, inv, static_cast<int>(s_.dtype), Row4(out, b, i, h));
        *Row3(lse, b, h, i) = l > 0.f ? (m + std::log2(l)) * cpu::kLn2 : kNegInf;
      }
    });
    return Status::Ok();
  }

  Status ApplySinks(const TensorView& sinks, const TensorView& out_in, const TensorView& lse) override {
    TensorView out = out_in;
    const float* z = static_cast<const float*>(sinks.data);
    pool_.ParallelFor(s_.B * s_.Hq, [&](int64_t bh, int) {
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq;
      std::vector<float> o(static_cast<size_t>(s_.D));
      for (int64_t i = 0; i < s_.L; ++i) {
        float* l = Row3(lse, b, h, i);
        float merged = std::numeric_limits<float>::quiet_NaN(), keep = merged;  // a NaN logit poisons the row
        if (!std::isnan(z[h]) && !std::isnan(*l)) {
          // log(e^lse + e^z) from the larger of the two; a row with no key keeps out 0 and gets z.
          const float hi = std::max(*l, z[h]), lo = std::min(*l, z[h]);
          merged = hi == kNegInf ? kNegInf : hi + std::log1p(std::exp(lo - hi));
          keep = *l == kNegInf ? 0.f : std::exp(*l - merged);
        }
        char* row = Row4(out, b, i, h);
        kern_.load_row(row, static_cast<int>(s_.dtype), s_.D, keep, o.data());
        kern_.store_row(o.data(), s_.D, 1.f, static_cast<int>(s_.dtype), row);
        *l = merged;
      }
    });
    return Status::Ok();
  }

  Status BackwardBegin(const AttentionShape& s, const TensorView& q, const TensorView& out, const TensorView& lse,
                       const TensorView& dout, void* /*stream: NULL, checked*/) override {
    bf16_tiles_ = s.dtype == DType::kBF16 && kern_.backward_item_bf16 != nullptr;  // as in the forward
    backward_ = true;
    local_pending_ = false;
    STRIA_RETURN_IF_ERROR(SetShape(s));
    const size_t rows = static_cast<size_t>(s.B * s.Hq * ps_.Lqp);
    // Enough chunks of key tiles that every thread has work even when B·Hkv is small.
    const int64_t nkt = ps_.Lkp / kBlockK;
    const int64_t want = (2 * pool_.size() + s.B * s.Hkv - 1) / (s.B * s.Hkv);
    chunks_ = std::max<int64_t>(1, std::min(want, nkt));
    if (bf16_tiles_) {
      STRIA_RETURN_IF_ERROR(qb_.Reserve(rows * ps_.Dp * 2, "packed queries"));
      STRIA_RETURN_IF_ERROR(qtb_.Reserve(rows * ps_.Dp * 2, "transposed query tiles"));
      STRIA_RETURN_IF_ERROR(dob_.Reserve(rows * ps_.Dp * 2, "packed output gradients"));
      STRIA_RETURN_IF_ERROR(dotb_.Reserve(rows * ps_.Dp * 2, "transposed output gradient tiles"));
    } else {
      STRIA_RETURN_IF_ERROR(q32_.Reserve(rows * ps_.Dp * 4, "packed queries"));
      STRIA_RETURN_IF_ERROR(dout32_.Reserve(rows * ps_.Dp * 4, "packed output gradients"));
    }
    STRIA_RETURN_IF_ERROR(lse2_.Reserve(rows * 4, "log-sum-exp rows"));
    STRIA_RETURN_IF_ERROR(delta_.Reserve(rows * 4, "rowsum(dO*O)"));
    STRIA_RETURN_IF_ERROR(dq32_.Reserve(static_cast<size_t>(chunks_) * rows * ps_.Dp * 4, "dQ partials"));
    if (bf16_tiles_) {
      PackRowsBf16(q, qb_.bf16(), qtb_.bf16());
      PackRowsBf16(dout, dob_.bf16(), dotb_.bf16());
    } else {
      PackQueries(q, s.scale * cpu::kLog2e, q32_.f32());
      PackQueries(dout, 1.f, dout32_.f32());
    }
    std::memset(dq32_.data(), 0, static_cast<size_t>(chunks_) * rows * ps_.Dp * 4);
    pool_.ParallelFor(s.B * s.Hq, [&](int64_t bh, int) {
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq;
      float* lse2 = lse2_.f32() + bh * ps_.Lqp;
      float* delta = delta_.f32() + bh * ps_.Lqp;
      std::vector<float> o(static_cast<size_t>(s_.D)), d(static_cast<size_t>(s_.D));
      for (int64_t i = 0; i < s_.L; ++i) {
        lse2[i] = *Row3(lse, b, h, i) * cpu::kLog2e;
        kern_.load_row(Row4(out, b, i, h), static_cast<int>(s_.dtype), s_.D, 1.f, o.data());
        kern_.load_row(Row4(dout, b, i, h), static_cast<int>(s_.dtype), s_.D, 1.f, d.data());
        float acc = 0.f;
        for (size_t k = 0; k < o.size(); ++k) acc += d[k] * o[k];
        delta[i] = acc;
      }
      for (int64_t i = s_.L; i < ps_.Lqp; ++i) {
        lse2[i] = kNegInf;
        delta[i] = 0.f;
      }
    });
    return Status::Ok();
  }

  // Like ForwardBlock, only `local` of the step: BackwardEnd converts the partial.
  Status BackwardBlock(const void* kv_wire, const BlockMask& mask, float* dkv, const BackwardStep& step) override {
    const bool local = step.local;
    const int64_t per = s_.B * s_.L * s_.Hkv * s_.D;
    std::memset(dkv, 0, static_cast<size_t>(2 * per) * 4);
    if (mask.empty()) {
      local_pending_ = false;
      return Status::Ok();
    }
    const BlockOperands blk = BlockFor(kv_wire, local);
    SetBatchMasks(mask);
    const int64_t group = s_.Hq / s_.Hkv;
    const int64_t rows = s_.B * s_.Hq * ps_.Lqp;
    const int64_t nkt = ps_.Lkp / kBlockK;
    pool_.ParallelFor(s_.B * s_.Hkv * chunks_, [&](int64_t item, int tid) {
      const int64_t c = item % chunks_;
      const int64_t bk = item / chunks_;
      const int64_t b = bk / s_.Hkv, hk = bk % s_.Hkv;
      const int64_t bh0 = b * s_.Hq + hk * group;
      // What the float32 and the bf16 work items share: rows, dQ partial, dK/dV rows, key tiles.
      auto SetCommon = [&](auto* a) {
        a->lse2 = lse2_.f32() + bh0 * ps_.Lqp;
        a->delta = delta_.f32() + bh0 * ps_.Lqp;
        a->dq = dq32_.f32() + (c * rows + bh0 * ps_.Lqp) * ps_.Dp;
        a->head_stride = ps_.Lqp * ps_.Dp;
        a->row_head_stride = ps_.Lqp;
        a->group = static_cast<int>(group);
        a->dk = dkv + (b * s_.L * s_.Hkv + hk) * s_.D;
        a->dv = a->dk + per;
        a->dkv_row_stride = s_.Hkv * s_.D;
        a->kt0 = c;
        a->kt_end = nkt;
        a->kt_stride = chunks_;
        a->shape = &ps_;
        a->mask = &batch_masks_[static_cast<size_t>(b)];
        a->softcap2 = s_.softcap * cpu::kLog2e;
        a->scratch = scratch_.f32() + tid * scratch_floats_;
      };
      if (bf16_tiles_) {
        cpu::BwdItemArgsBf16 a;
        const int64_t qoff = bh0 * ps_.Lqp * ps_.Dp;
        a.q = qb_.bf16() + qoff;
        a.qt = qtb_.bf16() + qoff;
        a.dout = dob_.bf16() + qoff;
        a.doutt = dotb_.bf16() + qoff;
        a.kt = blk.h.kt + bk * ps_.Lkp * ps_.Dp;
        a.kv = blk.h.kv + bk * ps_.Lkp * ps_.Dp;
        a.vt = blk.h.vt + bk * ps_.Lkp * ps_.Dp;
        a.scale = s_.scale * cpu::kLog2e;
        a.dk_scale = s_.scale;
        SetCommon(&a);
        kern_.backward_item_bf16(a);
        return;
      }
      cpu::BwdItemArgs a;
      a.q = q32_.f32() + bh0 * ps_.Lqp * ps_.Dp;
      a.dout = dout32_.f32() + bh0 * ps_.Lqp * ps_.Dp;
      a.kt = blk.f.kt + bk * ps_.Lkp * ps_.Dp;
      a.k = blk.f.rows + bk * ps_.Lkp * ps_.Dp;
      a.vt = blk.f.vt + bk * ps_.Lkp * ps_.Dp;
      SetCommon(&a);
      kern_.backward_item(a);
    });
    return Status::Ok();
  }

  Status AccumulateDKV(float* dst, const float* src, const std::vector<WirePiece>& pieces) override {
    const int64_t chunk = 1 << 16;
    for (const WirePiece& p : pieces) {
      float* to = dst + p.offset / sizeof(float);
      const int64_t n = static_cast<int64_t>(p.bytes / sizeof(float));
      pool_.ParallelFor((n + chunk - 1) / chunk, [&](int64_t c, int) {
        const int64_t end = std::min(n, (c + 1) * chunk);
        for (int64_t i = c * chunk; i < end; ++i) to[i] += src[i];
      });
      src += n;
    }
    return Status::Ok();
  }

  Status BackwardEnd(const TensorView& dq_in, const float* dkv, const TensorView& dk_in,
                     const TensorView& dv_in) override {
    TensorView dq = dq_in, dk = dk_in, dv = dv_in;
    const int64_t rows = s_.B * s_.Hq * ps_.Lqp;
    pool_.ParallelFor(s_.B * s_.Hq, [&](int64_t bh, int) {
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq;
      std::vector<float> sum(static_cast<size_t>(ps_.Dp));
      for (int64_t i = 0; i < s_.L; ++i) {
        std::fill(sum.begin(), sum.end(), 0.f);
        for (int64_t c = 0; c < chunks_; ++c) {
          const float* p = dq32_.f32() + (c * rows + bh * ps_.Lqp + i) * ps_.Dp;
          for (int64_t d = 0; d < s_.D; ++d) sum[static_cast<size_t>(d)] += p[d];
        }
        kern_.store_row(sum.data(), s_.D, s_.scale, static_cast<int>(s_.dtype), Row4(dq, b, i, h));
      }
    });
    const int64_t per = s_.B * s_.L * s_.Hkv * s_.D;
    pool_.ParallelFor(s_.B * s_.L, [&](int64_t item, int) {
      const int64_t b = item / s_.L, j = item % s_.L;
      for (int64_t h = 0; h < s_.Hkv; ++h) {
        const float* src = dkv + ((b * s_.L + j) * s_.Hkv + h) * s_.D;
        kern_.store_row(src, s_.D, 1.f, static_cast<int>(s_.dtype), Row4(dk, b, j, h));
        kern_.store_row(src + per, s_.D, 1.f, static_cast<int>(s_.dtype), Row4(dv, b, j, h));
      }
    });
    return Status::Ok();
  }

  Status SinksGradient(const TensorView& sinks, const TensorView& dsinks) override {
    const float* z = static_cast<const float*>(sinks.data);
    float* dz = static_cast<float*>(dsinks.data);
    pool_.ParallelFor(s_.Hq, [&](int64_t h, int) {
      double sum = 0.0;  // rows in order, batch rows in order: the same bits every run
      for (int64_t b = 0; b < s_.B; ++b) {
        const int64_t bh = b * s_.Hq + h;
        const float* lse2 = lse2_.f32() + bh * ps_.Lqp;
        const float* delta = delta_.f32() + bh * ps_.Lqp;
        for (int64_t i = 0; i < s_.L; ++i) {
          if (lse2[i] == kNegInf) continue;  // no key and no sink (z = -inf): no gradient
          sum += std::exp2(static_cast<double>(z[h]) * cpu::kLog2e - lse2[i]) * delta[i];
        }
      }
      dz[h * dsinks.strides[0]] = static_cast<float>(-sum);
    });
    return Status::Ok();
  }

 private:
  // The block's mask for each batch row (their document bounds differ).
  void SetBatchMasks(const BlockMask& mask) {
    batch_masks_.resize(static_cast<size_t>(s_.B));
    for (int64_t b = 0; b < s_.B; ++b) batch_masks_[static_cast<size_t>(b)] = mask.ForBatch(b);
  }

  Status SetShape(const AttentionShape& s) {
    s_ = s;
    ps_.B = s.B;
    ps_.Lq = ps_.Lk = s.L;
    ps_.Hq = s.Hq;
    ps_.Hkv = s.Hkv;
    ps_.D = s.D;
    static_assert(cpu::kBf16TileDim % kF32DimPad == 0, "PackedKVFloats bounds the bf16 operands too");
    ps_.Dp = RoundUp(s.D, bf16_tiles_ ? cpu::kBf16TileDim : kF32DimPad);
    ps_.Lqp = RoundUp(std::max<int64_t>(s.L, 1), kBlockQ);
    ps_.Lkp = RoundUp(std::max<int64_t>(s.L, 1), kBlockK);
    if (kF32DimPad % kern_.vector_floats != 0)
      return Error(STRIA_ERROR_INTERNAL, "the %s kernels' %d-float vectors do not divide the head dim padding",
                   kern_.isa, kern_.vector_floats);
    scratch_floats_ = RoundUp(cpu::BwdScratchFloats(ps_.Dp), 16);
    const size_t scratch = static_cast<size_t>(pool_.size() * scratch_floats_);
    STRIA_RETURN_IF_ERROR(scratch_.Reserve(scratch * 4, "per-thread tiles"));
    // The kernels write every scratch value before they read it. Sanitizer and debug builds fill
    // the tiles with NaN at every call (as ForwardBegin does the output rows), so that every test
    // there checks it: a stale value read would reach a result as NaN.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(NDEBUG)
    std::fill(scratch_.f32(), scratch_.f32() + scratch, std::numeric_limits<float>::quiet_NaN());
#endif
    return Status::Ok();
  }

  Status ReserveBlock() {
    const size_t n = static_cast<size_t>(s_.B * s_.Hkv * ps_.Lkp * ps_.Dp) * 4;
    if (bf16_tiles_) {
      STRIA_RETURN_IF_ERROR(kb_.Reserve(n / 2, "packed keys"));
      STRIA_RETURN_IF_ERROR(vb_.Reserve(n / 2, backward_ ? "packed keys" : "packed values"));  // K or V
      return backward_ ? vtb_.Reserve(n / 2, "packed values") : Status::Ok();
    }
    STRIA_RETURN_IF_ERROR(kt_.Reserve(n, "packed keys"));
    if (backward_) {
      STRIA_RETURN_IF_ERROR(k32_.Reserve(n, "packed keys"));
      return vt_.Reserve(n, "packed values");
    }
    return v32_.Reserve(n, "packed values");
  }

  // q [B, L, Hq, D] -> [B][Hq][Lqp][Dp] float32, times `mul`, zero padding.
  void PackQueries(const TensorView& q, float mul, float* dst) {
    pool_.ParallelFor(s_.B * s_.Hq, [&](int64_t bh, int) {
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq;
      float* base = dst + bh * ps_.Lqp * ps_.Dp;
      for (int64_t i = 0; i < s_.L; ++i) {
        float* row = base + i * ps_.Dp;
        kern_.load_row(Row4(q, b, i, h), static_cast<int>(s_.dtype), s_.D, mul, row);
        std::fill(row + s_.D, row + ps_.Dp, 0.f);
      }
      std::fill(base + s_.L * ps_.Dp, base + ps_.Lqp * ps_.Dp, 0.f);
    });
  }
  // x [B, L, Hq, D] bf16 -> rows [B][Hq][Lqp][Dp] bf16, zero padding: the values as they are;
  // and, when `tiles` is given, each query tile transposed, [B][Hq][Lqp/kBlockQ][Dp][kBlockQ].
  void PackRowsBf16(const TensorView& x, uint16_t* rows, uint16_t* tiles) {
    pool_.ParallelFor(s_.B * s_.Hq, [&](int64_t bh, int) {
      const int64_t b = bh / s_.Hq, h = bh % s_.Hq;
      uint16_t* base = rows + bh * ps_.Lqp * ps_.Dp;
      for (int64_t i = 0; i < s_.L; ++i) {
        uint16_t* row = base + i * ps_.Dp;
        std::memcpy(row, Row4(x, b, i, h), static_cast<size_t>(s_.D) * 2);
        std::fill(row + s_.D, row + ps_.Dp, uint16_t{0});
      }
      std::fill(base + s_.L * ps_.Dp, base + ps_.Lqp * ps_.Dp, uint16_t{0});
      if (tiles == nullptr) return;
      for (int64_t i0 = 0; i0 < ps_.Lqp; i0 += kBlockQ)
        cpu::BlockedTranspose(base + i0 * ps_.Dp, ps_.Dp,
                              tiles + bh * ps_.Lqp * ps_.Dp + i0 * ps_.Dp);  // once per call
    });
  }

  // The caller's K and V rows (the local block), and the same in a rows wire.
  KVRows CallerRows() const {
    const int64_t e = local_k_.elem_bytes();
    return KVRows{static_cast<const char*>(local_k_.data),
                  static_cast<const char*>(local_v_.data),
                  local_k_.strides[0] * e,
                  local_k_.strides[1] * e,
                  local_k_.strides[2] * e,
                  local_v_.strides[0] * e,
                  local_v_.strides[1] * e,
                  local_v_.strides[2] * e};
  }
  KVRows WireRows(const void* kv_wire) const {
    const int64_t row = s_.D * DTypeSize(s_.dtype);
    const char* kw = static_cast<const char*>(kv_wire);
    const int64_t sb = s_.L * s_.Hkv * row, sj = s_.Hkv * row;
    return KVRows{kw, kw + s_.B * sb, sb, sj, row, sb, sj, row};
  }
  // The operands inside a tiles wire, and in this backend's own buffers.
  F32Block WireF32(const void* kv_wire) const {
    float* base = static_cast<float*>(const_cast<void*>(kv_wire));  // read-only once packed
    const int64_t n = PackedKVElems(s_, kF32DimPad);
    return F32Block{base, base + n, backward_ ? base + 2 * n : nullptr};
  }
  Bf16Block WireBf16(const void* kv_wire) const {
    uint16_t* base = static_cast<uint16_t*>(const_cast<void*>(kv_wire));
    const int64_t n = PackedKVElems(s_, cpu::kBf16TileDim);
    return Bf16Block{base, base + n, backward_ ? base + 2 * n : nullptr};
  }
  BlockOperands OwnBlock() {
    return BlockOperands{F32Block{kt_.f32(), backward_ ? k32_.f32() : v32_.f32(), vt_.f32()},
                         Bf16Block{kb_.bf16(), vb_.bf16(), vtb_.bf16()}};
  }

  // The operands of the block the kernels are about to read: the local one (ring step 0) from
  // the caller's tensors PackKV noted, a tiles wire in place, else the wire converted.
  BlockOperands BlockFor(const void* kv_wire, bool local) {
    const BlockOperands own = OwnBlock();
    if (local && local_pending_) {
      local_pending_ = false;
      UnpackBlock(CallerRows(), own);
      return own;
    }
    switch (wire_format_) {
      case KVWireFormat::kCpuF32Tiles:
        return BlockOperands{WireF32(kv_wire), Bf16Block{}};
      case KVWireFormat::kCpuBf16Tiles:
        if (bf16_tiles_) return BlockOperands{F32Block{}, WireBf16(kv_wire)};
        Bf16TilesToF32(WireBf16(kv_wire), own.f);  // no bf16 kernels here
        return own;
      case KVWireFormat::kRows:
      case KVWireFormat::kCudaE4m3:  // never this backend's (its FP8 inputs are widened)
        break;
    }
    UnpackBlock(WireRows(kv_wire), own);
    return own;
  }

  // Rows -> the operands of the kernels this call runs.
  void UnpackBlock(const KVRows& row_of, const BlockOperands& dst) {
    if (bf16_tiles_)
      UnpackBlockBf16(row_of, dst.h);
    else
      UnpackBlockF32(row_of, dst.f);
  }

  // A K/V block -> the float32 kernels' operands (dst): Kt tiles always; V rows for the forward;
  // K rows and Vt tiles for the backward. row_of(is_v, b, j, h) points at key j's K or V row.
  // A tile's rows are converted first and then transposed whole, so the transposed tiles are
  // written in long runs instead of one float per 256-byte row.
  void UnpackBlockF32(const KVRows& row_of, const F32Block& dst) {
    const bool backward = backward_;
    const int64_t Dp = ps_.Dp, D = s_.D;
    const int64_t nkt = ps_.Lkp / kBlockK;
    pool_.ParallelFor(s_.B * s_.Hkv * nkt, [&](int64_t item, int tid) {
      const int64_t t = item % nkt, bk = item / nkt;
      const int64_t b = bk / s_.Hkv, h = bk % s_.Hkv;
      const int64_t head_off = bk * ps_.Lkp * Dp;
      float* tmp = scratch_.f32() + tid * scratch_floats_;  // kBlockK rows, for the transpose
      float* rows = dst.rows + head_off + t * kBlockK * Dp;
      float* k_rows = backward ? rows : tmp;  // K rows (backward) or V rows (forward) are kept
      float* v_rows = backward ? tmp : rows;
      for (int64_t c = 0; c < kBlockK; ++c) {
        const int64_t j = t * kBlockK + c;
        float* kr = k_rows + c * Dp;
        float* vr = v_rows + c * Dp;
        if (j < s_.L) {
          kern_.load_row(row_of(false, b, j, h), static_cast<int>(s_.dtype), D, 1.f, kr);
          kern_.load_row(row_of(true, b, j, h), static_cast<int>(s_.dtype), D, 1.f, vr);
          std::fill(kr + D, kr + Dp, 0.f);
          std::fill(vr + D, vr + Dp, 0.f);
        } else {
          std::fill(kr, kr + Dp, 0.f);
          std::fill(vr, vr + Dp, 0.f);
        }
      }
      TransposeTile32(k_rows, Dp, dst.kt + head_off + t * Dp * kBlockK);
      if (backward) TransposeTile32(v_rows, Dp, dst.vt + head_off + t * Dp * kBlockK);
    });
  }

  // The bf16 kernels' layouts (dst), straight from the bf16 rows, per key tile: Kᵀ paired along Dp
  // ([Dp/2][kBlockK][2]); V (forward) or K (backward) paired along keys ([kBlockK/2][Dp][2]); for
  // the backward also Vᵀ paired along Dp. Padding (dims past D, keys past L) is zero. Pairing
  // along Dp is the transpose of the tile's rows read as pairs of bf16 (uint32), so it takes the
  // float transpose; pairing along keys interleaves the rows of each key pair. Every build runs
  // it: a rank without bf16 kernels packs the same bf16 wire.
  void UnpackBlockBf16(const KVRows& row_of, const Bf16Block& dst) {
    const int64_t Dp = RoundUp(s_.D, cpu::kBf16TileDim), D = s_.D;  // ps_.Dp where the bf16 kernels run
    const int64_t nkt = ps_.Lkp / kBlockK;
    pool_.ParallelFor(s_.B * s_.Hkv * nkt, [&](int64_t item, int tid) {
      const int64_t t = item % nkt, bk = item / nkt;
      const int64_t b = bk / s_.Hkv, h = bk % s_.Hkv;
      const int64_t tile_off = bk * ps_.Lkp * Dp + t * Dp * kBlockK;
      uint16_t* kt = dst.kt + tile_off;
      uint16_t* vt = dst.kv + tile_off;
      uint16_t* rows = reinterpret_cast<uint16_t*>(scratch_.f32() + tid * scratch_floats_);  // [kBlockK][Dp]
      // The tile's K (or V) rows, paired along Dp into dst: a transpose of bf16 pairs.
      auto pair_along_dp = [&](bool is_v, uint16_t* dst) {
        for (int64_t c = 0; c < kBlockK; ++c) {
          const int64_t j = t * kBlockK + c;
          uint16_t* row = rows + c * Dp;
          if (j < s_.L) std::memcpy(row, row_of(is_v, b, j, h), static_cast<size_t>(D) * 2);
          std::fill(row + (j < s_.L ? D : 0), row + Dp, uint16_t{0});
        }
        kern_.transpose_tile(reinterpret_cast<const uint32_t*>(rows), Dp / 2, reinterpret_cast<uint32_t*>(dst));
      };
      pair_along_dp(false, kt);
      if (backward_) pair_along_dp(true, dst.vt + tile_off);
      // Paired along keys: V for the forward's P·V, K for the backward's dS·K.
      const bool keys_of_v = !backward_;
      for (int64_t c = 0; c < kBlockK; c += 2) {
        uint16_t* out = vt + (c / 2) * Dp * 2;
        const int64_t j = t * kBlockK + c;
        const uint16_t* v0 = j < s_.L ? reinterpret_cast<const uint16_t*>(row_of(keys_of_v, b, j, h)) : nullptr;
        const uint16_t* v1 = j + 1 < s_.L ? reinterpret_cast<const uint16_t*>(row_of(keys_of_v, b, j + 1, h)) : nullptr;
        kern_.pair_rows(v0, v1, D, out);
        std::fill(out + 2 * D, out + 2 * Dp, uint16_t{0});
      }
    });
  }

  // A kCpuBf16Tiles block -> the float32 kernels' operands, on a CPU without bf16 kernels: each paired
  // layout read back element by element (Kᵀ and Vᵀ paired along the head dim are already
  // transposed; rows paired along keys are rows).
  void Bf16TilesToF32(const Bf16Block& src, const F32Block& dst) {
    const int64_t Dpb = RoundUp(s_.D, cpu::kBf16TileDim), Dp = ps_.Dp, D = s_.D;
    const int64_t nkt = ps_.Lkp / kBlockK;
    // [Dpb/2][kBlockK][2] -> [Dp][kBlockK]
    auto along_dim = [&](const uint16_t* in, float* out) {
      for (int64_t d = 0; d < Dp; ++d)
        for (int64_t c = 0; c < kBlockK; ++c)
          out[d * kBlockK + c] = d < D ? BF16ToF32(in[(d / 2) * kBlockK * 2 + c * 2 + (d & 1)]) : 0.f;
    };
    // [kBlockK/2][Dpb][2] -> [kBlockK][Dp]
    auto along_keys = [&](const uint16_t* in, float* out) {
      for (int64_t c = 0; c < kBlockK; ++c)
        for (int64_t d = 0; d < Dp; ++d)
          out[c * Dp + d] = d < D ? BF16ToF32(in[(c / 2) * Dpb * 2 + d * 2 + (c & 1)]) : 0.f;
    };
    pool_.ParallelFor(s_.B * s_.Hkv * nkt, [&](int64_t item, int) {
      const int64_t t = item % nkt, bk = item / nkt;
      const int64_t in_off = bk * ps_.Lkp * Dpb + t * Dpb * kBlockK;
      const int64_t out_off = bk * ps_.Lkp * Dp + t * Dp * kBlockK;
      along_dim(src.kt + in_off, dst.kt + out_off);
      along_keys(src.kv + in_off, dst.rows + out_off);
      if (backward_) along_dim(src.vt + in_off, dst.vt + out_off);
    });
  }

  // src [kBlockK][Dp] -> dst [Dp][kBlockK], floats, by the kernel build's transpose.
  void TransposeTile32(const float* src, int64_t Dp, float* dst) const {
    kern_.transpose_tile(reinterpret_cast<const uint32_t*>(src), Dp, reinterpret_cast<uint32_t*>(dst));
  }
  ThreadPool pool_;
  CpuDecodeBuffers decode_bufs_;
  const cpu::KernelTable& kern_;
  AttentionShape s_;
  std::vector<BlockMask> batch_masks_;  // SetBatchMasks
  cpu::PackedShape ps_{};
  int64_t chunks_ = 1;
  int64_t scratch_floats_ = 0;
  bool backward_ = false;         // the direction of the call in progress
  bool local_pending_ = false;    // the local block is local_k_/local_v_, not unpacked yet
  TensorView local_k_, local_v_;  // the caller's K and V, valid for the call in progress
  bool bf16_tiles_ = false;       // this call runs the bf16 kernels (bf16 inputs, AMX or AVX512-BF16 here)
  KVWireFormat wire_format_ = KVWireFormat::kRows;  // this call's
  AlignedBuffer q32_, acc_, m_, l_, kt_, v32_, k32_, vt_, dout32_, lse2_, delta_, dq32_, scratch_;
  AlignedBuffer qb_, kb_, vb_;            // the bf16 kernels' operands (vb_: K in the backward)
  AlignedBuffer qtb_, dob_, dotb_, vtb_;  // and the bf16 backward's others
};

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace stria

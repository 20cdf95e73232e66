// The CUDA backend. Per call it keeps the running softmax state (forward) or the dQ accumulator
// and per-row LSE/delta (backward) in device workspaces that are reused across calls, and queues
// every kernel on the caller's stream. It never synchronizes except where the engine asks
// (FenceBuffers, before a ring buffer is handed to a transport that does not order its transfers
// on the device; with one that does, MarkBuffers records an event instead), on errors, when a
// workspace grows or the context is destroyed (queued work still reads the old allocation), and,
// for a document mask, before refilling a host staging buffer whose last copy has not run (the
// ring's order makes that never happen: UploadDocuments).
//
// The forward's state makes no round trip it does not need: a block that covers every query row
// starts the state when it is the call's first and writes the outputs when it is the last
// (ForwardBlock, kernels/cuda/forward_state.cuh), so a world of one, and every causal or dense
// ring (their first and last blocks cover every row), needs neither a clearing pass before its
// blocks nor a finishing pass after them. A world of one also reads its K and V where the caller
// keeps them when they are compact, instead of packing a copy that no peer receives (PackKV).
//
// Document masks run on every family: the tile mask clamps each query's keys to its document
// (tile_mask.cuh), each CTA reading its batch row's bounds.
//
// Kernel choice per call: the tensor-core kernels for float16/bfloat16 with D in {64, 128} when
// q (and dO) rows are 16-byte aligned; the SIMT kernels otherwise (float32, other head dims,
// odd strides). STRIA_CUDA_KERNELS picks among the families (tests and benchmarks compare them):
// "simt" forces SIMT; "wgmma" takes the Hopper wgmma forward and backward on compute capability
// 9.0 devices, and "tma" the same products with their loads by TMA in warp-specialised CTAs; "mma"
// forces mma.sync. Unset, the choice is the fastest family that passed the GPU suite on the device:
// TMA on compute capability 9.0 (on an H200, 1.6-2.4x mma.sync's forward and 1.2-1.9x its
// backward, docs/performance.md), mma.sync on every other device. A deterministic backward
// (stria_context_set_deterministic) runs the TMA family's one pass with its dQ added in the order
// of the key tiles (kernels/cuda/ordered_dq.cuh, counters in order_ and home_order_); elsewhere
// the family's dK/dV pass without dQ, then a dQ pass (wgmma's on Hopper, mma.sync's otherwise).
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <strings.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "backend/cuda/busy_tiles.h"
#include "backend/cuda/cuda_decode.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/mask_args.h"
#include "cuda/fp8_launch.h"
#include "cuda/head_groups.cuh"
#include "cuda/launch.h"
#include "cuda/tma_schedule.h"
#include "cuda/widen.h"
#include "cuda_common/cuda_status.h"

namespace stria {

Status CheckCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "libstria-cuda.so.%d is loaded but no CUDA device is usable: cudaGetDeviceCount: %s (%s)",
                 STRIA_VERSION_MAJOR, cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (ordinal < 0 || ordinal >= count)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "CUDA device ordinal %d is out of range: this machine has %d", ordinal,
                 count);
  return Status::Ok();
}

namespace {

using cuda::Elem;

Elem ElemOf(DType t) {
  switch (t) {
    case DType::kF16:
      return Elem::kF16;
    case DType::kBF16:
      return Elem::kBF16;
    case DType::kF32:
      break;
  }
  return Elem::kF32;
}

// The kernels' form of the call's logit softcapping (kernels/cuda/softcap.cuh): zeros for none.
cuda::Softcap SoftcapOf(const AttentionShape& s) {
  if (s.softcap <= 0.f) return cuda::Softcap{0.f, 0.f};
  return cuda::Softcap{s.softcap * cuda::kLog2e, s.scale / s.softcap};
}

cuda::RowsArg Rows(const TensorView& v) {
  return cuda::RowsArg{v.data, v.strides[0], v.strides[1], v.strides[2]};
}
cuda::RowsOut RowsW(const TensorView& v) {
  return cuda::RowsOut{v.data, v.strides[0], v.strides[1], v.strides[2]};
}

// The tensor-core kernels read rows with 16-byte cp.async.
bool RowsAligned16(const TensorView& v) {
  const int64_t per16 = 16 / v.elem_bytes();
  return reinterpret_cast<uintptr_t>(v.data) % 16 == 0 && v.strides[0] % per16 == 0 && v.strides[1] % per16 == 0 &&
         v.strides[2] % per16 == 0;
}

// Whether two views may share a byte: their address spans [lowest, highest element] meet. (The
// module does not link TensorView's methods: the checks here are its own.)
bool MayOverlap(const TensorView& a, const TensorView& b) {
  auto empty = [](const TensorView& v) { return std::find(v.shape, v.shape + v.ndim, 0) != v.shape + v.ndim; };
  if (empty(a) || empty(b)) return false;
  auto span = [](const TensorView& v, uintptr_t* lo, uintptr_t* hi) {
    int64_t below = 0, above = 0;
    for (int i = 0; i < v.ndim; ++i) {
      const int64_t reach = (v.shape[i] - 1) * v.strides[i];
      (reach < 0 ? below : above) += reach;
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(v.data);
    *lo = base + below * v.elem_bytes();
    *hi = base + (above + 1) * v.elem_bytes();
  };
  uintptr_t alo, ahi, blo, bhi;
  span(a, &alo, &ahi);
  span(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}
bool SameView(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.ndim == b.ndim && std::equal(a.strides, a.strides + a.ndim, b.strides) &&
         std::equal(a.shape, a.shape + a.ndim, b.shape);
}

// Copies ring messages between the ranks of a local group on one or several GPUs of the process:
// on a non-blocking stream per receiving rank, on that rank's GPU (the device of the destination
// buffer, learnt at its first copy), so a transfer overlaps the compute of both ranks. Between two
// GPUs it first enables peer access where the pair allows it, so the copy runs GPU to GPU over
// NVLink or PCIe rather than staged through host memory (cudaMemcpyDefault works either way).
class CudaCopier final : public BufferCopier {
 public:
  // `home`: a device of the group, current while the copier asks where a buffer lives (a copy
  // thread has no device of its own, and must not wake device 0 on a machine where the group
  // uses others).
  explicit CudaCopier(int home) : home_(home) {}
  ~CudaCopier() override {
    for (const Lane& lane : lanes_) {
      if (lane.stream == nullptr) continue;
      DeviceScope scope(lane.device);
      cudaStreamDestroy(lane.stream);
    }
    DeviceScope scope(home_);
    for (cudaStream_t s : marker_streams_)
      if (s != nullptr) cudaStreamDestroy(s);
  }
  Status Copy(int dst_rank, void* dst, const void* src, size_t bytes) override {
    Lane lane;
    STRIA_RETURN_IF_ERROR(LaneFor(dst_rank, dst, src, &lane));
    DeviceScope scope(lane.device);
    STRIA_RETURN_IF_ERROR(scope.status());
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane.stream));
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(lane.stream));
    return Status::Ok();
  }

  // Device ordering (transport.h): a rank's marker is an event recorded on a stream of the rank's
  // own (on the home device; a stream may wait for another device's event) after it waited for
  // the engine's event, so that the engine may record its event again at once; a copy waits on
  // the receiver's lane for both halves' markers and records its completion there.
  bool OrdersOnDevice() const override { return true; }
  Status Mark(int rank, void* event, void** marker) override {
    *marker = nullptr;
    cudaStream_t stream = nullptr;
    STRIA_RETURN_IF_ERROR(MarkerStream(rank, &stream));
    DeviceScope scope(home_);
    STRIA_RETURN_IF_ERROR(scope.status());
    cudaEvent_t m = nullptr;
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&m, cudaEventDisableTiming));
    cudaError_t e = cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event), 0);
    if (e == cudaSuccess) e = cudaEventRecord(m, stream);
    if (e != cudaSuccess) {
      cudaEventDestroy(m);
      STRIA_CUDA_RETURN_IF_ERROR(e);
    }
    *marker = m;
    return Status::Ok();
  }
  Status CopyAfter(int dst_rank, void* dst, const void* src, size_t bytes, void* after_send, void* after_receive,
                   void** done) override {
    *done = nullptr;
    Lane lane;
    STRIA_RETURN_IF_ERROR(LaneFor(dst_rank, dst, src, &lane));
    DeviceScope scope(lane.device);
    STRIA_RETURN_IF_ERROR(scope.status());
    for (void* m : {after_send, after_receive})
      if (m != nullptr) STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane.stream, static_cast<cudaEvent_t>(m), 0));
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, lane.stream));
    cudaEvent_t e = nullptr;
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(e, lane.stream);
    if (recorded != cudaSuccess) {
      cudaEventDestroy(e);
      STRIA_CUDA_RETURN_IF_ERROR(recorded);
    }
    *done = e;
    return Status::Ok();
  }
  Status StreamWait(void* stream, void* done) override {
    STRIA_CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(done), 0));
    return Status::Ok();
  }
  Status Poll(void* done, bool* complete) override {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(done));
    *complete = e == cudaSuccess;
    if (e == cudaErrorNotReady) {
      ForgetError(e);
      return Status::Ok();
    }
    STRIA_CUDA_RETURN_IF_ERROR(e);
    return Status::Ok();
  }
  void Finish(void* done) override { ForgetError(cudaEventSynchronize(static_cast<cudaEvent_t>(done))); }
  void Release(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 private:
  struct Lane {
    int device = -1;
    cudaStream_t stream = nullptr;
  };

  Status DeviceOf(const void* p, const char* what, int* device) const {
    DeviceScope scope(home_);
    STRIA_RETURN_IF_ERROR(scope.status());
    cudaPointerAttributes attr;
    STRIA_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, p));
    if (attr.type != cudaMemoryTypeDevice)
      return Error(STRIA_ERROR_INTERNAL, "a local group's %s ring buffer %p is not device memory", what, p);
    *device = attr.device;
    return Status::Ok();
  }

  // The receiving rank's stream (made on its first copy), and peer access from its GPU to the
  // sender's (once per pair).
  Status LaneFor(int dst_rank, const void* dst, const void* src, Lane* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (lanes_.size() <= static_cast<size_t>(dst_rank)) lanes_.resize(static_cast<size_t>(dst_rank) + 1);
    Lane& lane = lanes_[static_cast<size_t>(dst_rank)];
    if (lane.stream == nullptr) {
      int device = 0;
      STRIA_RETURN_IF_ERROR(DeviceOf(dst, "receiving", &device));
      DeviceScope scope(device);
      STRIA_RETURN_IF_ERROR(scope.status());
      STRIA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
      lane.device = device;
    }
    int from = 0;
    STRIA_RETURN_IF_ERROR(DeviceOf(src, "sending", &from));
    if (from != lane.device && peers_.insert({lane.device, from}).second) EnablePeerAccess(lane.device, from);
    *out = lane;
    return Status::Ok();
  }

  // Best effort: a pair without peer access (or with too many peers) still copies, staged.
  static void EnablePeerAccess(int device, int peer) {
    int can = 0;
    const cudaError_t asked = cudaDeviceCanAccessPeer(&can, device, peer);
    ForgetError(asked);
    if (asked != cudaSuccess || !can) return;
    DeviceScope scope(device);
    if (!scope.status().ok()) return;
    ForgetError(cudaDeviceEnablePeerAccess(peer, 0));  // already on, or refused: copies are staged then
  }

  // Rank `rank`'s marker stream, made on its first marker.
  Status MarkerStream(int rank, cudaStream_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (marker_streams_.size() <= static_cast<size_t>(rank)) marker_streams_.resize(static_cast<size_t>(rank) + 1);
    cudaStream_t& s = marker_streams_[static_cast<size_t>(rank)];
    if (s == nullptr) {
      DeviceScope scope(home_);
      STRIA_RETURN_IF_ERROR(scope.status());
      STRIA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    }
    *out = s;
    return Status::Ok();
  }

  const int home_;
  std::mutex mu_;
  std::vector<cudaStream_t> marker_streams_;  // by rank (Mark)
  std::vector<Lane> lanes_;                   // by receiving rank
  std::set<std::pair<int, int>> peers_;       // (device, peer) pairs already seen
};

// The kernel family a context asked for: STRIA_CUDA_KERNELS, or the device's best when unset.
struct KernelChoice {
  cuda::Kernels family = cuda::Kernels::kMma;
  bool automatic = true;  // unset: TMA on compute capability 9.0, mma.sync elsewhere
};

// STRIA_CUDA_KERNELS: unset or empty (the default: the device's best family), "mma", "simt",
// "wgmma" or "tma", in any case. Anything else is refused at context creation: a misspelt family
// must not quietly time or test the default one.
Status ParseKernelChoice(const char* env, KernelChoice* out) {
  *out = KernelChoice{};
  if (env == nullptr || *env == '\0') return Status::Ok();
  for (cuda::Kernels k : {cuda::Kernels::kMma, cuda::Kernels::kSimt, cuda::Kernels::kWgmma, cuda::Kernels::kTma}) {
    if (strcasecmp(env, cuda::KernelsName(k)) == 0) {
      *out = KernelChoice{k, false};
      return Status::Ok();
    }
  }
  return Error(STRIA_ERROR_INVALID_ARGUMENT,
               "STRIA_CUDA_KERNELS=\"%.64s\" is not a kernel family: use simt, mma, wgmma or tma, or leave it unset",
               env);
}

// The kernel switches that the launchers read at every launch: the TMA family's STRIA_CUDA_TMA_DQ
// (bulk, atomic), STRIA_CUDA_TMA_SCHEDULE (tiles, persistent) and STRIA_CUDA_TMA_FORWARD_ROWS
// (128, 192), in any case, unset or empty for the default (kernels/cuda/tma_schedule.h); and every
// tensor-core family's STRIA_CUDA_HEAD_GROUP_BYTES (a number; kernels/cuda/head_groups.cuh). A
// misspelt value is refused here, by name, rather than as a launch's "invalid argument" in the
// middle of a ring call; the launchers still refuse a value set after the context was created.
Status CheckKernelSwitches() {
  struct Switch {
    const char* name;
    const char* a;
    const char* b;
  };
  for (const Switch& sw :
       {Switch{"STRIA_CUDA_TMA_DQ", "bulk", "atomic"}, Switch{"STRIA_CUDA_TMA_SCHEDULE", "tiles", "persistent"},
        Switch{"STRIA_CUDA_TMA_FORWARD_ROWS", "128", "192"}}) {
    const char* env = std::getenv(sw.name);
    if (env == nullptr || *env == '\0' || strcasecmp(env, sw.a) == 0 || strcasecmp(env, sw.b) == 0) continue;
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s=\"%.64s\" is not one of %s, %s: use one, or leave it unset", sw.name,
                 env, sw.a, sw.b);
  }
  int64_t budget = 0;
  if (!cuda::HeadGroupBudget(&budget))
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "STRIA_CUDA_HEAD_GROUP_BYTES=\"%.64s\" is not a number of bytes: use one (0: no head groups), or "
                 "leave it unset",
                 std::getenv("STRIA_CUDA_HEAD_GROUP_BYTES"));
  return Status::Ok();
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, KernelChoice want)
      : device_(device), want_(want), decoder_(device, want.automatic || want.family != cuda::Kernels::kSimt) {}
  // The last call's kernels may still be queued (calls return without waiting): they finish
  // before the workspaces they use are freed, on this context's device, whatever device the
  // destroying thread has current.
  ~CudaBackend() override {
    DeviceScope scope(device_);
    if (handoff_ != nullptr) cudaEventSynchronize(handoff_);
    staging_.Release();  // each waits for its copies
    home_staging_.Release();
    // A call's home part joins its stream before the call returns (JoinDetached); these wait for
    // a call that failed before it could.
    for (cudaStream_t st : {side_, ring_stream_})
      if (st != nullptr) cudaStreamSynchronize(st);
    for (DeviceBuffer* b : {&acc_, &m_, &l_, &dq_acc_, &docs_, &home_docs_, &order_, &home_order_}) b->Release();
    for (cudaEvent_t e : {handoff_, fork_, home_done_, join_, buffers_ready_})
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaStream_t st : {side_, ring_stream_})
      if (st != nullptr) cudaStreamDestroy(st);
  }
  const char* name() const override { return "cuda"; }
  void SetDeterministic(bool on) override { deterministic_ = on; }
  double cpu_seconds() const override { return 0.0; }
  int num_threads() const override { return 1; }

  Status CheckSupported(const AttentionShape& s, void* stream) const override {
    STRIA_RETURN_IF_ERROR(CheckNotCapturing(stream));
    if (s.D < 1 || s.D > cuda::kMaxHeadDim)
      return Error(STRIA_ERROR_UNSUPPORTED,
                   "head dim %lld is not supported by the CUDA backend (supported: 1..%d; the tensor-core kernels "
                   "take 64 and 128 in float16/bfloat16, the others run on CUDA cores)",
                   static_cast<long long>(s.D), cuda::kMaxHeadDim);
    if (s.D > cuda::kNarrowHeadDim) STRIA_RETURN_IF_ERROR(CheckWideHeads(static_cast<int>(s.D)));
    if (s.B * s.Hq > 65535)
      return Error(STRIA_ERROR_UNSUPPORTED, "B*Hq = %lld exceeds the CUDA backend's 65535 (batch x heads per launch)",
                   static_cast<long long>(s.B * s.Hq));
    // The kernels index global memory in 64 bits throughout; what stays 32-bit is bounded by these
    // caps: L (an int in Dims, and grid arithmetic L + kN - 1) and, through the product cap, the
    // Hopper backward's step count q_tiles * (Hq / Hkv) (below 2^27). Relaxing either cap means
    // widening those first.
    if (s.L > (int64_t{1} << 30) || s.B * s.L * s.Hq * s.D > (int64_t{1} << 40))
      return Error(STRIA_ERROR_UNSUPPORTED, "tensors of %lld tokens per rank are too large for the CUDA backend",
                   static_cast<long long>(s.L));
    return Status::Ok();
  }

  // FP8 inputs as they are: the Hopper e4m3 kernel (tma_forward_fp8.cuh) at head dim 128, where
  // the TMA family would run (the automatic choice or STRIA_CUDA_KERNELS=tma on compute capability
  // 9.0) and TMA can describe q. Elsewhere the engine widens them (fp8_inputs.h).
  bool TakesFp8(const AttentionShape& s, const TensorView& q) override {
    if (s.D != 128 || !(want_.automatic || want_.family == cuda::Kernels::kTma)) return false;
    DeviceScope scope(device_);
    if (!scope.status().ok() || !ComputeCapability().ok() || cc_ != 90) return false;
    return cuda::Fp8QueriesMappable(Rows(q), DimsOf(s));
  }
  // The e4m3 message: K's rows, then V transposed (tma_forward_fp8.cuh). A plan's trimmed message
  // carries K's rows as the rows format does and Vt whole (its tokens are its columns).
  KVWire KVWireFor(const AttentionShape& s, bool backward) const override {
    if (!s.fp8.on) return Backend::KVWireFor(s, backward);
    return KVWire{KVWireFormat::kCudaE4m3, static_cast<size_t>(cuda::Fp8KvWireBytes(DimsOf(s)))};
  }
  void KVWirePieces(const AttentionShape& s, bool backward, const int64_t* rows,
                    std::vector<WirePiece>* pieces) const override {
    if (!s.fp8.on) return Backend::KVWirePieces(s, backward, rows, pieces);
    RowPieces(s, 1, s.Hkv, static_cast<size_t>(s.D), rows, kRowsKeyTile, pieces);
    const size_t k_bytes = static_cast<size_t>(s.B * s.L * s.Hkv * s.D);
    AddPiece(k_bytes, static_cast<size_t>(cuda::Fp8KvWireBytes(DimsOf(s))) - k_bytes, pieces);
  }

  // A call's work depends on the host's state at the call: its tables in page-locked staging that
  // later calls refill, workspaces a later call may grow (and free), its peers' transfers matched
  // on the host. A CUDA graph's replay reproduces none of that, so a call on a stream being
  // captured is refused before it queues anything (the capture stays valid; the caller runs the
  // call outside it). The legacy stream reports an implicit capture while another stream
  // captures in the global mode, where queuing on it would invalidate that capture.
  Status CheckNotCapturing(void* stream) const {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture);
    if (e == cudaErrorStreamCaptureImplicit) {
      cudaGetLastError();
      capture = cudaStreamCaptureStatusActive;
    } else {
      STRIA_RETURN_IF_ERROR(CudaStatus(e, "cudaStreamIsCapturing"));
    }
    if (capture == cudaStreamCaptureStatusNone) return Status::Ok();
    return Error(STRIA_ERROR_UNSUPPORTED,
                 "the call's stream is %s a CUDA graph: stria calls cannot be captured (a call's work depends on "
                 "host state a graph's replay would not reproduce: its tables, its workspaces, its peers' "
                 "transfers); make the call outside the capture",
                 capture == cudaStreamCaptureStatusActive ? "being captured into" : "in an invalidated capture of");
  }

  Status CheckMemory(const void* data, const char* name) const override {
    if (data == nullptr) return Status::Ok();  // empty tensors: the shape checks decide
    // Asked on this context's device: a thread with no device of its own must not wake device 0.
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    cudaPointerAttributes attr;
    const cudaError_t e = cudaPointerGetAttributes(&attr, data);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s.data %p is not CUDA memory (cudaPointerGetAttributes: %s)", name,
                   data, cudaGetErrorString(e));
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s.data %p is %s memory, not device memory of cuda:%d", name, data,
                   attr.type == cudaMemoryTypeHost ? "pinned host" : "unregistered host", device_);
    if (attr.type == cudaMemoryTypeDevice && attr.device != device_)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s.data %p is memory of cuda:%d, but the context is on cuda:%d", name,
                   data, attr.device, device_);
    return Status::Ok();
  }

  // Boundaries in host memory (pageable or pinned) are read where they are. Device or managed
  // memory of this GPU (a framework's tensor) is copied on the call's stream, after the work
  // queued there (whatever wrote them), and the host waits for it: a wait each ring step makes
  // anyway, so it costs only the pipeline's head start on this call.
  Status ReadOnHost(const int64_t* src, size_t count, void* stream, const char* name, std::vector<int64_t>* staged,
                    const int64_t** host) override {
    *host = src;
    bool device = false;
    STRIA_RETURN_IF_ERROR(OnDevice(src, count * sizeof(int64_t), name, &device));
    if (!device) return Status::Ok();
    staged->resize(count);
    STRIA_RETURN_IF_ERROR(CopyToHost(staged->data(), src, count * sizeof(int64_t), stream));
    *host = staged->data();
    return Status::Ok();
  }
  Status ReadBytesOnHost(const void* src, size_t bytes, void* stream, const char* name, std::vector<char>* staged,
                         const void** host) override {
    *host = src;
    bool device = false;
    STRIA_RETURN_IF_ERROR(OnDevice(src, bytes, name, &device));
    if (!device) return Status::Ok();
    staged->resize(bytes);
    STRIA_RETURN_IF_ERROR(CopyToHost(staged->data(), src, bytes, stream));
    *host = staged->data();
    return Status::Ok();
  }

  Status Allocate(size_t bytes, void** ptr) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    return DeviceMalloc(bytes, "a ring buffer", ptr);
  }
  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    DeviceScope scope(device_);
    cudaFree(ptr);
  }

  Status FenceBuffers() override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  // Device ordering (backend.h): one event serves every step, as the transport's wait takes it as
  // last recorded.
  bool OrdersOnDevice() const override { return true; }
  Status MarkBuffers(void* stream, void** event) override {
    *event = nullptr;
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    if (buffers_ready_ == nullptr)
      STRIA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&buffers_ready_, cudaEventDisableTiming));
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventRecord(buffers_ready_, static_cast<cudaStream_t>(stream)));
    *event = buffers_ready_;
    return Status::Ok();
  }
  void* ComputeStream() override { return stream_; }

  std::shared_ptr<BufferCopier> CreateLocalCopier() override { return std::make_shared<CudaCopier>(device_); }

  // A plan's home part (ForwardStep::home_begin) runs on side_, at the device's lowest stream
  // priority, and the ring's work from there to the call's end on ring_stream_, at its highest:
  // the home part's CTAs then fill what the ring leaves idle (its later steps' small blocks, and
  // the time each step's kernel waits while the host fences and posts the next transfer), and a
  // ring kernel's CTAs go first wherever both wait for an SM. The caller's stream forks to both at
  // the local block and joins them when the call ends (JoinDetached).
  bool DetachesHome() const override { return true; }
  Status JoinDetached() override {
    if (!detached_) return Status::Ok();
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    detached_ = false;
    ring_rows_ = s_.L;
    const cudaError_t recorded = cudaEventRecord(join_, stream_);
    stream_ = caller_;  // whatever fails below, the call's later work goes to the caller's stream
    Queued queued(this);
    STRIA_CUDA_RETURN_IF_ERROR(recorded);
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(caller_, join_, 0));
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(caller_, home_done_, 0));
    return Status::Ok();
  }

  // The block kernels read K/V from the wire. A world of one sends nothing, and when the caller's
  // K and V already lie as the wire's rows (compact [B, L, Hkv, D], a framework's usual tensor)
  // its block is read in place: the copy, a pass over both tensors each way, is skipped.
  Status PackKV(const AttentionShape& s, const TensorView& k, const TensorView& v, void* wire, bool sent) override {
    // In place: compact at a 16-byte aligned address, as the tensor-core kernels and TMA load a
    // message.
    const int H = static_cast<int>(s.Hkv);
    auto as_message = [&](const TensorView& t) {
      return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && cuda::CompactRows(Rows(t), dims_, H);
    };
    kv_in_place_ = !s.fp8.on && !sent && as_message(k) && as_message(v);
    local_k_ = k;
    local_v_ = v;
    if (kv_in_place_) return Status::Ok();
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    if (s.fp8.on) {
      STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchPackKvE4m3(dims_, Rows(k), Rows(v), wire, stream_));
      return Status::Ok();
    }
    const int eb = static_cast<int>(DTypeSize(s.dtype));
    char* kd = static_cast<char*>(wire);
    char* vd = kd + s.B * s.L * s.Hkv * s.D * eb;
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchPackRows(eb, dims_, H, Rows(k), kd, stream_));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchPackRows(eb, dims_, H, Rows(v), vd, stream_));
    return Status::Ok();
  }

  Status ForwardBegin(const AttentionShape& s, const TensorView& q, void* stream) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    STRIA_RETURN_IF_ERROR(SetShape(s, stream));
    Queued queued(this);
    const size_t rows = static_cast<size_t>(s.B * s.Hq * s.L);
    STRIA_RETURN_IF_ERROR(acc_.Reserve(rows * static_cast<size_t>(s.D) * 4, "the running output", handoff_));
    STRIA_RETURN_IF_ERROR(m_.Reserve(rows * 4, "row maxima", handoff_));
    STRIA_RETURN_IF_ERROR(l_.Reserve(rows * 4, "row sums", handoff_));
    q_ = Rows(q);
    q_view_ = q;
    if (s.fp8.on) {
      kernels_ = cuda::Kernels::kTma;  // TakesFp8 said so: the e4m3 kernel of the TMA family
    } else {
      STRIA_RETURN_IF_ERROR(Choose(s, RowsAligned16(q)));
    }
    state_ = State::kUnset;
    return Status::Ok();
  }

  // A block whose mask covers every query row starts the state when it is the call's first (no
  // clearing pass before it) and finishes the rows when it is the last (no finishing pass after
  // it): forward_state.cuh. Any other block needs the state cleared before it and finished after.
  Status ForwardBlock(const void* kv_wire, const BlockMask& block, const ForwardStep& step) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    const bool home = step.local && step.home_begin >= 0 && step.home_begin < s_.L && step.home_out != nullptr &&
                      Detachable() && OutputsClear(*step.home_out, *step.home_lse, true);
    if (home) STRIA_RETURN_IF_ERROR(Detach(step.home_begin));
    Queued queued(this);
    last_kv_ = kv_wire;
    // While detached, the ring's blocks own rows [0, ring_rows_) only (the rest see nothing in any
    // other block, and the home part has them). The ring's part goes first, ahead of the home
    // part's CTAs.
    BlockMask mask = block;
    mask.q_end = std::min(mask.q_end, ring_rows_);
    Status st = mask.empty() ? Status::Ok() : ForwardRing(kv_wire, mask, step);
    if (st.ok() && home) st = ForwardHome(kv_wire, block, *step.home_out, *step.home_lse);
    return st;
  }
  // A block's launch over the ring's rows (all of them, unless a home part has the rest).
  Status ForwardRing(const void* kv_wire, const BlockMask& mask, const ForwardStep& step) {
    cuda::FwdParams p = ForwardParams(kv_wire, step.local, mask);
    const bool every_row = cuda::CoversEveryRow(p.mask, ring_rows_);
    if (state_ == State::kUnset && every_row) {
      p.first = 1;
    } else if (state_ == State::kUnset) {
      STRIA_RETURN_IF_ERROR(ClearState());
    }
    if (step.out != nullptr && every_row && OutputsClear(*step.out, *step.lse, step.local))
      SetOutputs(*step.out, *step.lse, &p);
    // A block in the middle of its call: its CTAs own no rows, so a launch over only the query
    // tiles with work does the same (busy_tiles.h), and none with no tile at all.
    const bool middle = p.first == 0 && p.out.data == nullptr;
    STRIA_RETURN_IF_ERROR(UploadDocuments(mask, &p.mask, middle));
    if (p.mask.tiles != nullptr && p.mask.tile_count == 0) {
      state_ = State::kRunning;
      return Status::Ok();
    }
    if (s_.fp8.on) {
      p.k = kv_wire;  // the e4m3 message (never the caller's tensors: V travels transposed)
      p.v = nullptr;
      STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchFp8ForwardBlock(ElemOf(s_.dtype), p,
                                                             cuda::Descale{s_.fp8.q_descale, s_.fp8.q_step},
                                                             cuda::Descale{s_.fp8.k_descale, s_.fp8.k_step}, stream_));
    } else {
      STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchForwardBlock(ElemOf(s_.dtype), kernels_, p, stream_));
    }
    state_ = p.out.data != nullptr ? State::kFinished : State::kRunning;
    return Status::Ok();
  }

  // With FP8 inputs the rows so far are in units of v's codes: v's descale comes last.
  Status ForwardEnd(const TensorView& out, const TensorView& lse) override {
    const bool scale_v = s_.fp8.on && s_.fp8.v_descale != nullptr;
    if (state_ == State::kFinished && !scale_v && !detached_) return Status::Ok();
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    if (detached_) {
      // The home part's rows are finished (it wrote them); the ring's may not be.
      STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, home_done_, 0));
      if (state_ != State::kFinished && ring_rows_ > 0) STRIA_RETURN_IF_ERROR(FinishRingRows(out, lse));
    } else if (state_ != State::kFinished) {
      if (state_ == State::kUnset) STRIA_RETURN_IF_ERROR(ClearState());  // no block ran: every row saw no key
      STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchForwardFinish(ElemOf(s_.dtype), dims_, acc_.f32(), m_.f32(), l_.f32(),
                                                           RowsW(out), static_cast<float*>(lse.data), lse.strides[0],
                                                           lse.strides[1], lse.strides[2], stream_));
    }
    if (scale_v)
      STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchScaleRowsByHead(
          ElemOf(s_.dtype), dims_, cuda::Descale{s_.fp8.v_descale, s_.fp8.v_step}, RowsW(out), stream_));
    return Status::Ok();
  }

  Status ApplySinks(const TensorView& sinks, const TensorView& out, const TensorView& lse) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchSinksForward(ElemOf(s_.dtype), dims_, static_cast<const float*>(sinks.data),
                                                        RowsW(out), static_cast<float*>(lse.data), lse.strides[0],
                                                        lse.strides[1], lse.strides[2], stream_));
    return Status::Ok();
  }

  Status BackwardBegin(const AttentionShape& s, const TensorView& q, const TensorView& out, const TensorView& lse,
                       const TensorView& dout, void* stream) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    STRIA_RETURN_IF_ERROR(SetShape(s, stream));
    Queued queued(this);
    const size_t rows = static_cast<size_t>(s.B * s.Hq * s.L);
    STRIA_RETURN_IF_ERROR(dq_acc_.Reserve(rows * static_cast<size_t>(s.D) * 4, "the dQ accumulator", handoff_));
    STRIA_RETURN_IF_ERROR(m_.Reserve(rows * 4, "log-sum-exp rows", handoff_));
    STRIA_RETURN_IF_ERROR(l_.Reserve(rows * 4, "rowsum(dO*O)", handoff_));
    q_ = Rows(q);
    dout_ = Rows(dout);
    q_view_ = q;
    dout_view_ = dout;
    grads_written_ = false;
    STRIA_RETURN_IF_ERROR(Choose(s, RowsAligned16(q) && RowsAligned16(dout)));
    if (deterministic_) {  // the ordered dQ's counters, one set per stream that may run a block
      const size_t bytes = static_cast<size_t>(cuda::OrderedDqInts(dims_)) * 4;
      STRIA_RETURN_IF_ERROR(order_.Reserve(bytes, "the ordered dQ's counters", handoff_));
      STRIA_RETURN_IF_ERROR(home_order_.Reserve(bytes, "the ordered dQ's counters", handoff_));
    }
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_acc_.f32(), 0, rows * static_cast<size_t>(s.D) * 4, stream_));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchBackwardPrep(ElemOf(s.dtype), dims_, Rows(out), dout_,
                                                        static_cast<const float*>(lse.data), lse.strides[0],
                                                        lse.strides[1], lse.strides[2], m_.f32(), l_.f32(), stream_));
    return Status::Ok();
  }

  // With the call's dK and dV in the step (a world of one), the kernels write them directly,
  // unless they share memory with an input the kernels still read.
  Status BackwardBlock(const void* kv_wire, const BlockMask& block, float* dkv, const BackwardStep& step) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    const bool home =
        step.local && step.home_begin >= 0 && step.home_begin < s_.L && step.dk == nullptr && Detachable();
    if (home) STRIA_RETURN_IF_ERROR(Detach(step.home_begin));
    Queued queued(this);
    // While detached, the ring's part of the local block is its rows and keys [0, ring_rows_),
    // and the later blocks' rows past it see nothing. The ring's part goes first.
    BlockMask mask = block;
    mask.q_end = std::min(mask.q_end, ring_rows_);
    if (home) mask.k_end = std::min(mask.k_end, ring_rows_);
    Status st = BackwardRing(kv_wire, mask, dkv, step, home);
    if (st.ok() && home) st = BackwardHome(kv_wire, block, dkv);
    return st;
  }
  Status BackwardRing(const void* kv_wire, const BlockMask& mask, float* dkv, const BackwardStep& step, bool home) {
    const size_t per = static_cast<size_t>(s_.B * s_.L * s_.Hkv * s_.D);
    // The kernels write every row of dkv they are launched for (kernels/cuda/key_grads.cuh): all
    // of them, or the key tiles holding the rows the engine reads (step.dkv_rows: a trimmed
    // partial's, every key this rank sees among them). A block without work has no kernel, and
    // only zeros in those rows.
    int64_t rows = s_.L;
    if (step.dkv_rows != nullptr) rows = *std::max_element(step.dkv_rows, step.dkv_rows + s_.B);
    if (home) rows = std::min(rows, ring_rows_);
    if (mask.empty() || rows == 0) {
      if (rows == s_.L) {
        STRIA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dkv, 0, 2 * per * 4, stream_));
      } else if (rows > 0) {  // rows [0, rows) of each batch row of dK and dV: 2 B strips
        const size_t row_bytes = static_cast<size_t>(s_.Hkv * s_.D) * 4, pitch = static_cast<size_t>(s_.L) * row_bytes;
        STRIA_CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(dkv, pitch, 0, static_cast<size_t>(rows) * row_bytes,
                                                     static_cast<size_t>(2 * s_.B), stream_));
      }
      return Status::Ok();
    }
    cuda::BwdParams p = BackwardParams(kv_wire, step.local, mask, dkv);
    p.key_rows = rows;
    if (step.dk != nullptr && !MeetsInputs(*step.dk, step.local, true) && !MeetsInputs(*step.dv, step.local, true)) {
      p.dk_out = RowsW(*step.dk);
      p.dv_out = RowsW(*step.dv);
    }
    STRIA_RETURN_IF_ERROR(UploadDocuments(mask, &p.mask));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchBackwardBlock(ElemOf(s_.dtype), kernels_, deterministic_, p, stream_));
    grads_written_ = p.dk_out.data != nullptr;
    return Status::Ok();
  }

  Status AccumulateDKV(float* dst, const float* src, const std::vector<WirePiece>& pieces) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    for (const WirePiece& p : pieces) {
      const int64_t n = static_cast<int64_t>(p.bytes / sizeof(float));
      STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchAccumulate(dst + p.offset / sizeof(float), src, n, stream_));
      src += n;
    }
    return Status::Ok();
  }

  // A grid's exchange: the boxes through one strided-sum kernel (a copy is a sum of one part) on
  // the call's stream, which the engine passes (the exchange comes before the Begin call).
  Status CheckGridSupported() const override { return Status::Ok(); }
  Status PackBox(const TensorView& box, void* dst, void* stream) override {
    cuda::BoxArgs a = BoxArgsOf(box);
    a.src = box.data;
    a.count = 1;
    a.dst = dst;
    CompactStrides(box, &a.ds0, &a.ds1, &a.ds2);
    return LaunchBox(box, a, stream);
  }
  Status SumIntoBox(const void* src, size_t src_step, int count, const TensorView& box, void* stream) override {
    cuda::BoxArgs a = BoxArgsOf(box);
    a.src = src;
    a.src_step = static_cast<int64_t>(src_step) / box.elem_bytes();
    a.count = count;
    CompactStrides(box, &a.ss0, &a.ss1, &a.ss2);
    a.dst = box.data;
    OuterStrides(box, &a.ds0, &a.ds1, &a.ds2);
    return LaunchBox(box, a, stream);
  }
  Status WidenFp8(const TensorView& src, const TensorView* descale, DType to, void* dst, void* stream) override {
    cuda::WidenArgs a{};
    a.n0 = src.shape[0];
    a.n1 = src.shape[1];
    a.n2 = src.shape[2];
    a.w = src.shape[3];
    a.src = static_cast<const unsigned char*>(src.data);
    a.ss0 = src.strides[0];
    a.ss1 = src.strides[1];
    a.ss2 = src.strides[2];
    a.descale = descale != nullptr ? static_cast<const float*>(descale->data) : nullptr;
    a.descale_step = descale != nullptr && descale->shape[0] > 1 ? 1 : 0;
    a.dst = dst;
    OnStream on(this, stream);
    STRIA_RETURN_IF_ERROR(on.status());
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchWidenFp8(ElemOf(to), a, static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }
  Status SyncStream(void* stream) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

  // The pieces of a trimmed message, device to device on the call's stream, so that the block
  // kernels queued after a scatter read what it wrote.
  Status CopyPieces(void* dst, const void* src, const std::vector<WirePiece>& pieces, bool gather) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    size_t packed = 0;
    for (const WirePiece& p : pieces) {
      char* to = static_cast<char*>(dst) + (gather ? packed : p.offset);
      const char* from = static_cast<const char*>(src) + (gather ? p.offset : packed);
      STRIA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, from, p.bytes, cudaMemcpyDeviceToDevice, stream_));
      packed += p.bytes;
    }
    return Status::Ok();
  }

  Status BackwardEnd(const TensorView& dq, const float* dkv, const TensorView& dk, const TensorView& dv) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    const Elem e = ElemOf(s_.dtype);
    const size_t per = static_cast<size_t>(s_.B * s_.L * s_.Hkv * s_.D);
    if (detached_) STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, home_done_, 0));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchDqFinish(e, dims_, dq_acc_.f32(), s_.scale, RowsW(dq), stream_));
    if (grads_written_) return Status::Ok();
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchKvGradFinish(e, dims_, dkv, RowsW(dk), stream_));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchKvGradFinish(e, dims_, dkv + per, RowsW(dv), stream_));
    return Status::Ok();
  }

  // Decode and prefill over a sharded KV cache (cuda_decode.cc; prefill's ring packs its messages
  // with PackBox and attends with Decode).
  Status CheckServingSupported(bool /*prefill*/) const override { return Status::Ok(); }
  Status Decode(const DecodeWork& work, float* partial) override {
    OnStream on(this, work.stream);
    STRIA_RETURN_IF_ERROR(on.status());
    return decoder_.Decode(work, partial);
  }
  Status StoreTokens(const DecodeShape& shape, const std::vector<CacheAppend>& appends, void* stream) override {
    OnStream on(this, stream);
    STRIA_RETURN_IF_ERROR(on.status());
    return decoder_.StoreTokens(shape, appends, static_cast<cudaStream_t>(stream));
  }
  // Every rank's records are merged where they lie, by one kernel writing out and lse on the
  // call's stream (cuda_decode.h).
  bool MergesOnDevice() const override { return true; }
  Status DecodeMerge(const DecodeWork& work, const float* all, int world_size, const TensorView* sinks,
                     const TensorView& out, const TensorView* lse) override {
    OnStream on(this, work.stream);
    STRIA_RETURN_IF_ERROR(on.status());
    return decoder_.MergeOnDevice(work, all, world_size, sinks, out, lse, static_cast<cudaStream_t>(work.stream));
  }

  // From BackwardBegin's per-row state: m_ holds lse2, l_ delta (BackwardPrepKernel).
  Status SinksGradient(const TensorView& sinks, const TensorView& dsinks) override {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    Queued queued(this);
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchSinksGrad(dims_, static_cast<const float*>(sinks.data), m_.f32(), l_.f32(),
                                                     static_cast<float*>(dsinks.data), dsinks.strides[0], stream_));
    return Status::Ok();
  }

 private:
  // Records handoff_ on the call's stream when a method that queued work returns, on every path:
  // the event then marks the end of everything this backend has queued so far.
  // A box of up to four dimensions as BoxArgs: the outer ones right-aligned into n0 x n1 x n2 (1 in
  // front where the box has fewer), the last as the contiguous width; source strides the box's.
  static cuda::BoxArgs BoxArgsOf(const TensorView& box) {
    cuda::BoxArgs a{};
    a.n0 = a.n1 = a.n2 = 1;
    a.w = box.shape[box.ndim - 1];
    int64_t* n[3] = {&a.n0, &a.n1, &a.n2};
    const int outer = box.ndim - 1;
    for (int d = 0; d < outer; ++d) *n[3 - outer + d] = box.shape[d];
    OuterStrides(box, &a.ss0, &a.ss1, &a.ss2);
    return a;
  }
  // The box's own strides of its outer dimensions, right-aligned (0 in front).
  static void OuterStrides(const TensorView& box, int64_t* s0, int64_t* s1, int64_t* s2) {
    int64_t* s[3] = {s0, s1, s2};
    *s0 = *s1 = *s2 = 0;
    const int outer = box.ndim - 1;
    for (int d = 0; d < outer; ++d) *s[3 - outer + d] = box.strides[d];
  }
  // Strides of a compact array of the box's shape, right-aligned likewise.
  static void CompactStrides(const TensorView& box, int64_t* s0, int64_t* s1, int64_t* s2) {
    int64_t* s[3] = {s0, s1, s2};
    *s0 = *s1 = *s2 = 0;
    int64_t stride = box.shape[box.ndim - 1];
    for (int d = box.ndim - 2; d >= 0; --d) {
      *s[3 - (box.ndim - 1) + d] = stride;
      stride *= box.shape[d];
    }
  }
  Status LaunchBox(const TensorView& box, const cuda::BoxArgs& a, void* stream) {
    if (box.ndim < 1 || box.ndim > 4) return Error(STRIA_ERROR_INTERNAL, "a grid's box has %d dimensions", box.ndim);
    OnStream on(this, stream);
    STRIA_RETURN_IF_ERROR(on.status());
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchBoxSum(ElemOf(box.dtype), a, static_cast<cudaStream_t>(stream)));
    return Status::Ok();
  }

  // Whether `src` (`bytes` of it) is device or managed memory (of this GPU: another's is an
  // error); host memory, or a runtime that does not know the pointer, is the host's.
  Status OnDevice(const void* src, size_t bytes, const char* name, bool* device) const {
    *device = false;
    if (src == nullptr || bytes == 0) return Status::Ok();
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) {
      cudaGetLastError();  // a runtime that does not know host memory: it is the host's
      return Status::Ok();
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) return Status::Ok();
    if (attr.type == cudaMemoryTypeDevice && attr.device != device_)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s %p is memory of cuda:%d, but the context is on cuda:%d", name, src,
                   attr.device, device_);
    *device = true;
    return Status::Ok();
  }
  // `bytes` from `src` into `dst` (host), after the work queued on `stream`; waits for it.
  Status CopyToHost(void* dst, const void* src, size_t bytes, void* stream) {
    DeviceScope scope(device_);
    STRIA_RETURN_IF_ERROR(scope.status());
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return Status::Ok();
  }

  // Work queued on a stream the call names rather than the backend's (the serving calls, a grid's
  // boxes, FP8 widening) follows on the device everything this backend queued before, whatever its
  // stream, and marks its end for the next (handoff_): the ring buffers and workspaces are shared
  // by every kind of call, and consecutive calls may come on different streams.
  class OnStream {
   public:
    OnStream(CudaBackend* b, void* stream) : b_(b), scope_(b->device_), stream_(static_cast<cudaStream_t>(stream)) {
      status_ = scope_.status();
      if (status_.ok() && b_->handoff_ == nullptr) {
        const cudaError_t e = cudaEventCreateWithFlags(&b_->handoff_, cudaEventDisableTiming);
        if (e != cudaSuccess) status_ = CudaStatus(e, "cudaEventCreateWithFlags");
      }
      if (status_.ok()) {
        const cudaError_t e = cudaStreamWaitEvent(stream_, b_->handoff_, 0);
        if (e != cudaSuccess) status_ = CudaStatus(e, "cudaStreamWaitEvent");
      }
    }
    ~OnStream() {
      if (status_.ok()) ForgetError(cudaEventRecord(b_->handoff_, stream_));
    }
    OnStream(const OnStream&) = delete;
    OnStream& operator=(const OnStream&) = delete;
    const Status& status() const { return status_; }

   private:
    CudaBackend* b_;
    DeviceScope scope_;
    cudaStream_t stream_;
    Status status_;
  };

  class Queued {
   public:
    explicit Queued(CudaBackend* b) : b_(b) {}
    ~Queued() {
      if (b_->handoff_ != nullptr) ForgetError(cudaEventRecord(b_->handoff_, b_->stream_));
    }
    Queued(const Queued&) = delete;
    Queued& operator=(const Queued&) = delete;

   private:
    CudaBackend* b_;
  };

  // A call's setup. The workspaces and ring buffers are shared by consecutive calls, so a call's
  // stream first waits for everything the previous call queued (its finishing kernels may still
  // read the state this call overwrites). That wait is on handoff_, recorded while the previous
  // call ran, never on the previous call's stream: the caller may have destroyed that stream
  // since, or passed a handle (a new stream at a freed one's address, cudaStreamPerThread from
  // another thread) that names another stream now.
  Status SetShape(const AttentionShape& s, void* stream) {
    STRIA_RETURN_IF_ERROR(JoinDetached());  // never left set by the engine: a guard for direct use
    s_ = s;
    ring_rows_ = s.L;
    cudaStream_t next = static_cast<cudaStream_t>(stream);
    if (handoff_ == nullptr) STRIA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&handoff_, cudaEventDisableTiming));
    // Before the first record this wait is a no-op, as CUDA defines it for an event never recorded.
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(next, handoff_, 0));
    stream_ = next;
    dims_ = cuda::Dims{static_cast<int>(s.B), static_cast<int>(s.L), static_cast<int>(s.Hq), static_cast<int>(s.Hkv),
                       static_cast<int>(s.D)};
    return Status::Ok();
  }

  // Where a block kernel reads the block's K and V: the wire, or the caller's tensors (PackKV).
  void SetBlock(const void* kv_wire, bool local, const void** k, const void** v) const {
    if (local && kv_in_place_) {
      *k = local_k_.data;
      *v = local_v_.data;
      return;
    }
    *k = kv_wire;
    *v = static_cast<const char*>(kv_wire) + KVWireBytes(s_) / 2;
  }

  // Whether `w`, an output that a block kernel writes while its CTAs still read the call's
  // inputs, may share a byte with them: the block's K and V where they are read in place
  // (MeetsBlock), and the queries and, backward, dO. The kernels then leave the outputs to the
  // finishing kernels, which run after every block.
  bool MeetsBlock(const TensorView& w, bool local) const {
    return local && kv_in_place_ && (MayOverlap(w, local_k_) || MayOverlap(w, local_v_));
  }
  bool MeetsInputs(const TensorView& w, bool local, bool backward) const {
    return MeetsBlock(w, local) || MayOverlap(w, q_view_) || (backward && MayOverlap(w, dout_view_));
  }
  // The forward's out may also be q itself: a CTA reads its own query rows before it writes
  // their output, and no other CTA reads them.
  bool OutputsClear(const TensorView& out, const TensorView& lse, bool local) const {
    const bool out_clear = SameView(out, q_view_) ? !MeetsBlock(out, local) : !MeetsInputs(out, local, false);
    return out_clear && !MeetsInputs(lse, local, false);
  }

  // The empty state of every row of the call (forward_state.cuh), for a call whose first block
  // does not start it.
  Status ClearState() {
    const size_t rows = static_cast<size_t>(s_.B * s_.Hq * s_.L);
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(acc_.f32(), 0, rows * static_cast<size_t>(s_.D) * 4, stream_));
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(l_.f32(), 0, rows * 4, stream_));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchFill(m_.f32(), static_cast<int64_t>(rows), -__builtin_huge_valf(), stream_));
    return Status::Ok();
  }

  // A document mask's bounds for the block at hand ([B][L] lo, then hi, from the ring: host
  // memory it reuses at the next step) go to the device on the compute stream, through page-locked
  // staging (a copy from pageable memory may wait for the stream's earlier work on the host;
  // StagingPool hands out a buffer whose last copy has run). The host runs only a few blocks ahead
  // of the device (with the ring's order on the device it waits for each step's transfers a step
  // later; the last steps of a call and the first of the next are the most it gets ahead), so eight
  // buffers keep refilling from waiting. With busy_tiles, the forward's list of query tiles with
  // work goes in the same copy (MaskArgs::tiles).
  Status UploadDocuments(const BlockMask& mask, cuda::MaskArgs* m, bool busy_tiles = false) {
    return UploadDocumentsTo(mask, m, busy_tiles, &docs_, &staging_, stream_);
  }
  // The same into `dst` through `pool` on `stream`: the home part's bounds go to a buffer of their
  // own, which no later step of the ring overwrites while the part may still read it, through
  // staging of their own, so that the ring's uploads never wait for the home part's stream.
  Status UploadDocumentsTo(const BlockMask& mask, cuda::MaskArgs* m, bool busy_tiles, DeviceBuffer* dst,
                           StagingPool* pool, cudaStream_t stream) {
    if (mask.doc_lo == nullptr) return Status::Ok();
    const size_t n = static_cast<size_t>(s_.B * s_.L);
    // The query tiles of the forward kernel that will take the list (the FP8 one, or the family's).
    const int tile_rows = s_.fp8.on ? cuda::kForwardTileRows : cuda::ForwardTileRows(kernels_, static_cast<int>(s_.D));
    if (busy_tiles) BusyQueryTiles(mask, s_.B, s_.L, tile_rows, &tiles_);
    // The list as int32 pairs packed into the staging's int64 words, after the bounds.
    const size_t list_words = busy_tiles ? (tiles_.size() + 1) / 2 : 0, words = 2 * n + list_words;
    STRIA_RETURN_IF_ERROR(dst->Reserve(words * sizeof(int64_t), "document bounds", handoff_));
    StagingPool::Slot* slot = nullptr;
    STRIA_RETURN_IF_ERROR(pool->Take(words * sizeof(int64_t), "document bounds (page-locked)", &slot));
    int64_t* bounds = reinterpret_cast<int64_t*>(slot->buffer.data());
    std::memcpy(bounds, mask.doc_lo, n * sizeof(int64_t));
    std::memcpy(bounds + n, mask.doc_hi, n * sizeof(int64_t));
    if (!tiles_.empty() && busy_tiles) std::memcpy(bounds + 2 * n, tiles_.data(), tiles_.size() * 4);
    int64_t* dev = static_cast<int64_t*>(dst->data());
    STRIA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, bounds, words * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
    STRIA_RETURN_IF_ERROR(StagingPool::Copied(slot, stream));
    m->doc_lo = dev;
    m->doc_hi = dev + n;
    m->doc_stride = mask.doc_batch_stride;
    if (busy_tiles) {
      m->tiles = reinterpret_cast<const int32_t*>(dev + 2 * n);
      m->tile_count = static_cast<int32_t>(tiles_.size());
      m->tile_rows = tile_rows;
    }
    return Status::Ok();
  }

  // A forward block launch's parameters: the call's queries and running state, the block's K/V
  // (the wire, or the caller's tensors for the local block read in place) and `mask`.
  cuda::FwdParams ForwardParams(const void* kv_wire, bool local, const BlockMask& mask) const {
    cuda::FwdParams p{};
    p.dims = dims_;
    p.q = q_;
    SetBlock(kv_wire, local, &p.k, &p.v);
    p.acc = acc_.f32();
    p.m = m_.f32();
    p.l = l_.f32();
    p.scale_log2 = s_.scale * cuda::kLog2e;
    p.softcap = SoftcapOf(s_);
    p.mask = MaskOf(mask);
    return p;
  }
  // The launch writes the finished rows into the call's out and lse (FwdParams::out).
  static void SetOutputs(const TensorView& out, const TensorView& lse, cuda::FwdParams* p) {
    p->out = RowsW(out);
    p->lse = static_cast<float*>(lse.data);
    p->lb = lse.strides[0];
    p->lh = lse.strides[1];
    p->li = lse.strides[2];
  }
  // A backward block launch's parameters: the call's rows and their state, the block's K/V,
  // `mask`, and the block's dK/dV contribution into `dkv` (a dK/dV message: dK, then dV).
  cuda::BwdParams BackwardParams(const void* kv_wire, bool local, const BlockMask& mask, float* dkv) const {
    cuda::BwdParams p{};
    p.dims = dims_;
    p.q = q_;
    p.dout = dout_;
    SetBlock(kv_wire, local, &p.k, &p.v);
    p.lse2 = m_.f32();
    p.delta = l_.f32();
    p.dq_acc = dq_acc_.f32();
    p.dk = dkv;
    p.dv = dkv + static_cast<size_t>(s_.B * s_.L * s_.Hkv * s_.D);
    p.scale_log2 = s_.scale * cuda::kLog2e;
    p.scale = s_.scale;
    p.softcap = SoftcapOf(s_);
    p.mask = MaskOf(mask);
    if (deterministic_) p.dq_order = static_cast<int*>(order_.data());
    return p;
  }
  // Whether this call's kernels may run a home part on a stream of their own: the tensor-core
  // families, whose launches honour the part's row and key ranges (query tiles from q_begin's,
  // key tiles from BwdParams::key_begin) and write only the rows they own, or add into dQ
  // atomically. Not the SIMT kernels (their dQ pass rewrites rows that see nothing), the FP8
  // forward, or the persistent TMA schedule, whose grid holds every SM until it is done.
  bool Detachable() const {
    if (s_.fp8.on || kernels_ == cuda::Kernels::kSimt) return false;
    bool persistent = false;
    return kernels_ != cuda::Kernels::kTma || !cuda::TmaPersistent(&persistent) || !persistent;
  }
  // Forks the caller's stream to the ring's and the home part's (DetachesHome): rows and keys
  // [0, h) stay the ring's.
  Status Detach(int64_t h) {
    int least = 0, greatest = 0;
    if (side_ == nullptr || ring_stream_ == nullptr)
      STRIA_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    if (side_ == nullptr)
      STRIA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, least));
    if (ring_stream_ == nullptr)
      STRIA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&ring_stream_, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t* e : {&fork_, &home_done_, &join_})
      if (*e == nullptr) STRIA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream_));
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ring_stream_, fork_, 0));
    STRIA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side_, fork_, 0));
    // Recorded now as well, so that a join never waits on an earlier call's record.
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventRecord(home_done_, side_));
    caller_ = stream_;
    stream_ = ring_stream_;
    detached_ = true;
    ring_rows_ = h;
    return Status::Ok();
  }
  // The local block's rows [ring_rows_, L) on side_: the call's first and last block for them, so
  // the kernel writes their out and lse directly.
  Status ForwardHome(const void* kv_wire, const BlockMask& block, const TensorView& out, const TensorView& lse) {
    BlockMask mask = block;
    mask.q_begin = std::max(mask.q_begin, ring_rows_);
    cuda::FwdParams p = ForwardParams(kv_wire, true, mask);
    p.first = 1;
    SetOutputs(out, lse, &p);
    STRIA_RETURN_IF_ERROR(UploadDocumentsTo(block, &p.mask, false, &home_docs_, &home_staging_, side_));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchForwardBlock(ElemOf(s_.dtype), kernels_, p, side_));
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventRecord(home_done_, side_));
    return Status::Ok();
  }
  // The ring's rows when no block finished them (the last step's block saw none of this rank's):
  // a launch over rows [0, ring_rows_) with no key visible, whose CTAs finish their rows from the
  // state (forward_state.cuh, IdleRows) and leave the home part's alone.
  Status FinishRingRows(const TensorView& out, const TensorView& lse) {
    BlockMask none;
    none.q_end = ring_rows_;
    none.k_end = 0;
    cuda::FwdParams p = ForwardParams(last_kv_, false, none);
    p.first = state_ == State::kUnset ? 1 : 0;
    SetOutputs(out, lse, &p);
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchForwardBlock(ElemOf(s_.dtype), kernels_, p, stream_));
    state_ = State::kFinished;
    return Status::Ok();
  }
  // The local block's keys and rows [ring_rows_, L) on side_: their dK/dV rows of `dkv`, and their
  // dQ added into dq_acc.
  Status BackwardHome(const void* kv_wire, const BlockMask& block, float* dkv) {
    BlockMask mask = block;
    mask.q_begin = std::max(mask.q_begin, ring_rows_);
    mask.k_begin = std::max(mask.k_begin, ring_rows_);
    cuda::BwdParams p = BackwardParams(kv_wire, true, mask, dkv);
    p.key_begin = ring_rows_;
    if (deterministic_) p.dq_order = static_cast<int*>(home_order_.data());  // beside the ring's launches
    STRIA_RETURN_IF_ERROR(UploadDocumentsTo(block, &p.mask, false, &home_docs_, &home_staging_, side_));
    STRIA_CUDA_RETURN_IF_ERROR(cuda::LaunchBackwardBlock(ElemOf(s_.dtype), kernels_, deterministic_, p, side_));
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventRecord(home_done_, side_));
    return Status::Ok();
  }

  // Head dims above 256 run on the SIMT kernels' wide build, whose tiles need more shared memory a
  // block than GPUs before Hopper give (193 KB at 512; an A100 gives 163 KB): refused by name there
  // rather than failing at the launch. The device's limit is asked once.
  Status CheckWideHeads(int D) const {
    if (smem_optin_ < 0) {
      int bytes = 0;
      STRIA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
      smem_optin_ = bytes;
    }
    const int need = cuda::SimtSharedMemoryBytes(D);
    if (need > smem_optin_)
      return Error(STRIA_ERROR_UNSUPPORTED,
                   "head dim %d runs on CUDA cores with tiles of %d KB of shared memory a block, and this GPU gives "
                   "%d KB (Hopper and later give 227)",
                   D, (need + 1023) / 1024, smem_optin_ / 1024);
    return Status::Ok();
  }

  // The device's compute capability, asked once (cc_). Needs the device current.
  Status ComputeCapability() {
    if (cc_ >= 0) return Status::Ok();
    int major = 0, minor = 0;
    STRIA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
    STRIA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
    cc_ = 10 * major + minor;
    return Status::Ok();
  }
  static cuda::Dims DimsOf(const AttentionShape& s) {
    return cuda::Dims{static_cast<int>(s.B), static_cast<int>(s.L), static_cast<int>(s.Hq), static_cast<int>(s.Hkv),
                      static_cast<int>(s.D)};
  }

  // The kernel family of this call (see the top of the file). Needs the device current.
  Status Choose(const AttentionShape& s, bool rows_aligned) {
    if (want_.family == cuda::Kernels::kSimt || s.dtype == DType::kF32 ||
        !cuda::TensorCoreHeadDim(static_cast<int>(s.D)) || !rows_aligned) {
      kernels_ = cuda::Kernels::kSimt;
      return Status::Ok();
    }
    const bool hopper_family =
        want_.automatic || want_.family == cuda::Kernels::kWgmma || want_.family == cuda::Kernels::kTma;
    if (hopper_family) STRIA_RETURN_IF_ERROR(ComputeCapability());
    // sm_90a code runs on compute capability 9.0 only (not on later majors).
    const cuda::Kernels hopper = want_.automatic ? cuda::Kernels::kTma : want_.family;
    kernels_ = hopper_family && cc_ == 90 ? hopper : cuda::Kernels::kMma;
    return Status::Ok();
  }

  const int device_;
  const KernelChoice want_;      // STRIA_CUDA_KERNELS
  int cc_ = -1;                  // compute capability 10 * major + minor, once asked
  mutable int smem_optin_ = -1;  // the device's shared memory a block may ask for, once asked
  cuda::Kernels kernels_ = cuda::Kernels::kSimt;
  bool deterministic_ = false;  // stria_context_set_deterministic
  // The forward call's running state: no block has started it yet, blocks have, or the last
  // block has written the outputs (ForwardBlock).
  enum class State { kUnset, kRunning, kFinished } state_ = State::kUnset;
  cudaEvent_t handoff_ = nullptr;  // the end of the work queued so far (Queued)
  cudaStream_t stream_ = nullptr;
  AttentionShape s_;
  cuda::Dims dims_{};
  cuda::RowsArg q_{}, dout_{};
  TensorView q_view_, dout_view_;      // the call's queries and dO (MeetsInputs)
  bool grads_written_ = false;         // the backward's block call wrote dK and dV (BackwardStep::dk)
  TensorView local_k_, local_v_;       // this call's own K and V (PackKV)
  bool kv_in_place_ = false;           // the local block is read from local_k_/local_v_, not the wire
  DeviceBuffer acc_, m_, l_, dq_acc_;  // m_/l_ hold lse2/delta in the backward
  DeviceBuffer docs_;                  // the block's document bounds (UploadDocuments)
  DeviceBuffer order_, home_order_;    // a deterministic backward's dQ order (BwdParams::dq_order)
  std::vector<int32_t> tiles_;         // a forward block's query tiles with work (BusyQueryTiles)
  StagingPool staging_{8};             // UploadDocuments'
  // A plan's home part (DetachesHome): while detached_, stream_ is ring_stream_ and the caller's
  // stream is caller_; the ring's blocks own rows [0, ring_rows_) (L otherwise).
  bool detached_ = false;
  int64_t ring_rows_ = 0;
  cudaStream_t caller_ = nullptr, ring_stream_ = nullptr, side_ = nullptr;
  cudaEvent_t fork_ = nullptr, home_done_ = nullptr, join_ = nullptr;
  cudaEvent_t buffers_ready_ = nullptr;  // MarkBuffers'
  DeviceBuffer home_docs_;               // the home part's document bounds
  StagingPool home_staging_{1};          // and their host staging
  const void* last_kv_ = nullptr;        // the last forward block's K/V (FinishRingRows' pointers)
  CudaDecoder decoder_;                  // the serving calls' buffers
};

}  // namespace

Status CreateCudaBackend(DLDevice device, Backend** out) {
  KernelChoice kernels;  // the configuration first: its error does not depend on the machine
  STRIA_RETURN_IF_ERROR(ParseKernelChoice(std::getenv("STRIA_CUDA_KERNELS"), &kernels));
  STRIA_RETURN_IF_ERROR(CheckKernelSwitches());
  STRIA_RETURN_IF_ERROR(CheckCudaDevice(device.device_id));
  DeviceScope scope(device.device_id);
  STRIA_RETURN_IF_ERROR(scope.status());
  *out = new CudaBackend(device.device_id, kernels);
  return Status::Ok();
}

}  // namespace stria

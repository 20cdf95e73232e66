// A host model of the CUDA runtime: the part of its API that the CUDA backend module and the GPU
// tests call, with every kernel run by the warp-level emulator (tests/cuda_emu). Linked instead
// of libcudart, it lets the whole GPU stack — the module's launchers, workspaces, streams and
// events, the ring engine with the local group's device-to-device copies, and the GPU tests
// themselves — run on a machine without a GPU (CMakeLists.txt here says how it is put together).
//
// What it keeps of CUDA, and where it is stricter:
// - a stream is a worker thread that runs its work in order; the legacy default stream (null) is
//   one per device, shared by every thread of the process, as on the GPU; a launch, memset or
//   copy on a stream returns at once and runs later, on that thread;
// - an event completes when its stream has run everything queued before the record;
//   cudaStreamWaitEvent holds the waiting stream there;
// - device memory is host memory of exactly the requested size (so ASan sees overruns), filled
//   with 0xFF bytes (NaN in every float dtype) at cudaMalloc: reading what nothing wrote shows;
//   memsets and copies must fall inside one allocation where they touch device memory;
// - a kernel that the emulator stops (an out-of-bounds ldmatrix, a divergent barrier...) is a
//   sticky error of its device, as a fault is on the GPU: the synchronizing calls return
//   cudaErrorLaunchFailure from then on, and the emulator's message goes to stderr;
// - launches are checked as the runtime checks them (limits, the stream's device, the kernel's
//   dynamic shared memory attribute on that device); peer access between devices is recorded;
// - the last error behaves as measured on an H200 (docs/gpu-runs/2026-11-28-h200/run2): a failed
//   call records its error, a successful one leaves it, except cudaFuncSetAttribute, which clears
//   it even when it succeeds (so the suites see a launcher that would clear a caller's error);
// - devices: STRIA_CUDA_MODEL_DEVICES (default 2, so that tests of a second device run) of compute
//   capability STRIA_CUDA_MODEL_CC
//   (default 90, so the Hopper kernels run too), STRIA_CUDA_MODEL_MEMORY_MB each (default 80 GiB;
//   the host allocates only what is asked for) and STRIA_CUDA_MODEL_SMS SMs each (default 132, an
//   H200's; fewer make a persistent kernel's CTAs walk several work items each), whose kernels may
//   ask for STRIA_CUDA_MODEL_SMEM_OPTIN bytes of dynamic shared memory (default and most 232448, a
//   Hopper's; 166912 is an A100's), with STRIA_CUDA_MODEL_L2_BYTES of L2 (default 50 MiB, an
//   H200's; a few KiB make the launchers group every block's heads, head_groups.cuh);
// - stream priorities order nothing (each stream is a thread), but STRIA_CUDA_MODEL_LEAST_PRIORITY_DELAY_MS
//   runs the work of least-priority streams that much late, item by item.
// Streams are never freed (cudaStreamDestroy lets the worker end once its work is done): the
// model is for tests, and a late use then finds a stopped stream, not freed memory.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_api.cuh"

struct CUstream_st {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> work;
  uint64_t queued = 0, done = 0;  // items ever queued, items finished
  bool stopping = false;
  // -1 / +1: created with the device's least / greatest priority (cudaStreamCreateWithPriority),
  // for stria_cuda_runtime_model_priority_launches; 0 otherwise.
  int priority_class = 0;
  // How often the host waited for this stream's work: its synchronization, an event of it, the
  // device's, and copies between it and pageable host memory (which the runtime may do only
  // after the stream's earlier work), for stria_cuda_runtime_model_host_waits.
  std::atomic<uint64_t> host_waits{0};
  // Between cudaStreamBeginCapture and cudaStreamEndCapture. The model records no graph: work
  // queued while capturing runs as ever, which only a caller that refuses capture never meets.
  std::atomic<bool> capturing{false};
  std::thread worker;
};

// What cudaStreamEndCapture hands out: a graph of nothing (the model captures no work).
struct CUgraph_st {};

struct CUevent_st {
  std::mutex mu;
  CUstream_st* stream = nullptr;  // the last record: complete once stream->done >= ticket
  uint64_t ticket = 0;
  // When the stream reached the last record (steady clock, ns; -1 until then), for
  // cudaEventElapsedTime: the record's own work item writes it, and owns it with the event.
  std::shared_ptr<std::atomic<int64_t>> stamp;
};

namespace {

constexpr int kMaxDynamicSmem = 232448;

struct Allocation {
  size_t bytes;
  int device;
};

struct Device {
  CUstream_st* null_stream = nullptr;
  std::vector<CUstream_st*> streams;  // every stream of the device, the null one included
  size_t allocated = 0;
  cudaError_t sticky = cudaSuccess;
  std::map<const void*, int> smem_limit;  // per kernel: cudaFuncAttributeMaxDynamicSharedMemorySize
};

struct Model {
  std::mutex mu;
  std::vector<Device> devices;
  std::map<uintptr_t, Allocation> allocations;  // by start address
  std::map<uintptr_t, size_t> pinned;           // page-locked host memory: bytes by start address
  std::set<std::pair<int, int>> peer_access;    // (device, peer) pairs enabled
  int cc = 90;
  int sms = 132;
  int smem_optin = kMaxDynamicSmem;        // what a kernel may ask for (an A100's: 166912)
  int l2_bytes = 50 << 20;                 // an H200's L2 (head_groups.cuh sizes head groups by it)
  size_t device_bytes = size_t{80} << 30;  // each device's memory
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

Model& M() {
  static Model* m = [] {
    auto* model = new Model();  // never destroyed: worker threads may outlive static destructors
    model->devices.resize(static_cast<size_t>(std::max(0, EnvInt("STRIA_CUDA_MODEL_DEVICES", 2))));
    model->cc = EnvInt("STRIA_CUDA_MODEL_CC", 90);
    model->sms = std::max(1, EnvInt("STRIA_CUDA_MODEL_SMS", 132));
    model->smem_optin = std::min(kMaxDynamicSmem, EnvInt("STRIA_CUDA_MODEL_SMEM_OPTIN", kMaxDynamicSmem));
    model->l2_bytes = std::max(0, EnvInt("STRIA_CUDA_MODEL_L2_BYTES", 50 << 20));
    const int mib = EnvInt("STRIA_CUDA_MODEL_MEMORY_MB", 0);
    if (mib > 0) model->device_bytes = static_cast<size_t>(mib) << 20;
    return model;
  }();
  return *m;
}

thread_local int tls_device = 0;
thread_local cudaError_t tls_last = cudaSuccess;
// The device whose primary context is current on this thread (-1: none yet), and the devices
// whose primary context exists. As with CUDA 12 and later: cudaSetDevice makes the device's
// context current (creating it), and a call that works on the current device does the same for
// tls_device on a thread that has none.
thread_local int tls_context = -1;
std::atomic<bool> g_primary[64];

void MakeCurrent(int device) {
  tls_context = device;
  if (device >= 0 && device < 64) g_primary[device] = true;
}
void Touch() {
  if (tls_context < 0) MakeCurrent(tls_device);
}

// The two driver functions the modules and tests look up through the runtime (CUresult 0 is
// CUDA_SUCCESS; a context is represented by its device + 1).
int ModelCtxGetCurrent(void** ctx) {
  *ctx = tls_context < 0 ? nullptr : reinterpret_cast<void*>(static_cast<intptr_t>(tls_context + 1));
  return 0;
}
int ModelPrimaryCtxGetState(int device, unsigned int* flags, int* active) {
  if (device < 0 || device >= 64) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *flags = 0;
  *active = g_primary[device] ? 1 : 0;
  return 0;
}

bool DeviceOk(int d);

// The limit a launch on `device` checks a kernel's dynamic shared memory against.
bool SetSmemLimit(const void* func, int device, int value) {
  if (value < 0 || value > M().smem_optin) return false;
  std::lock_guard<std::mutex> lock(M().mu);
  M().devices[static_cast<size_t>(device)].smem_limit[func] = value;
  return true;
}

// The driver's cuKernelSetAttribute on a cudaGetKernel handle, for one device; like every driver
// call, it leaves the runtime's last error alone.
CUresult ModelKernelSetAttribute(CUfunction_attribute attr, int value, CUkernel kernel, CUdevice device) {
  if (!DeviceOk(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (kernel == nullptr || attr != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
  return SetSmemLimit(reinterpret_cast<const void*>(kernel), device, value) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

cudaError_t Set(cudaError_t e) {
  if (e != cudaSuccess) tls_last = e;
  return e;
}

void RunStream(CUstream_st* s) {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return !s->work.empty() || s->stopping; });
      if (s->work.empty()) return;
      fn = std::move(s->work.front());
      s->work.pop_front();
    }
    // STRIA_CUDA_MODEL_LEAST_PRIORITY_DELAY_MS: the least-priority streams' work runs that much
    // late, item by item, as a GPU busy with higher-priority work may run it: whatever waits for
    // such a stream must then really wait (a document plan's home part, src/backend/cuda).
    static const int delay_ms = [] {
      const char* env = std::getenv("STRIA_CUDA_MODEL_LEAST_PRIORITY_DELAY_MS");
      return env != nullptr ? std::atoi(env) : 0;
    }();
    if (s->priority_class < 0 && delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    fn();
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->done;
    }
    s->cv.notify_all();
  }
}

CUstream_st* NewStream(int device) {
  auto* s = new CUstream_st();
  s->device = device;
  s->worker = std::thread(RunStream, s);
  M().devices[static_cast<size_t>(device)].streams.push_back(s);
  return s;
}

bool DeviceOk(int d) {
  return d >= 0 && static_cast<size_t>(d) < M().devices.size();
}

// The stream a call names: null is the current device's legacy default stream.
CUstream_st* Resolve(cudaStream_t s) {
  if (s != nullptr) return s;
  std::lock_guard<std::mutex> lock(M().mu);
  Device& d = M().devices[static_cast<size_t>(tls_device)];
  if (d.null_stream == nullptr) d.null_stream = NewStream(tls_device);
  return d.null_stream;
}

uint64_t Enqueue(CUstream_st* s, std::function<void()> fn) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->work.push_back(std::move(fn));
    ticket = ++s->queued;
  }
  s->cv.notify_all();
  return ticket;
}

void WaitFor(CUstream_st* s, uint64_t ticket) {
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->done >= ticket || (s->stopping && s->work.empty()); });
}

void Drain(CUstream_st* s) {
  uint64_t queued;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    queued = s->queued;
  }
  WaitFor(s, queued);
}

cudaError_t Sticky(int device) {
  std::lock_guard<std::mutex> lock(M().mu);
  return M().devices[static_cast<size_t>(device)].sticky;
}

void Fault(int device, const char* what) {
  std::fprintf(stderr, "cuda model: device %d: %s\n", device, what);
  std::lock_guard<std::mutex> lock(M().mu);
  M().devices[static_cast<size_t>(device)].sticky = cudaErrorLaunchFailure;
}

// The allocation holding [p, p + bytes), if p is device memory; false if p is not; sets *bad
// when p is device memory but the range runs past its allocation.
bool Find(const void* p, size_t bytes, Allocation* out, bool* bad) {
  std::lock_guard<std::mutex> lock(M().mu);
  *bad = false;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = M().allocations.upper_bound(a);
  if (it == M().allocations.begin()) return false;
  --it;
  if (a >= it->first + std::max<size_t>(it->second.bytes, 1)) return false;
  *out = it->second;
  *bad = a + bytes > it->first + it->second.bytes;
  return true;
}

// Device ranges must stay inside their allocation; host ranges are the caller's business.
cudaError_t CheckRange(const void* p, size_t bytes, bool must_be_device) {
  Allocation al;
  bool bad = false;
  const bool device = Find(p, bytes, &al, &bad);
  if (bad || (must_be_device && !device)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// Whether `device` lies in device memory and `host` does not, by the addresses (as cudaMemcpyDefault
// finds a copy's direction).
bool IsCopyBetween(const void* device, const void* host, size_t bytes) {
  Allocation al;
  bool bad = false;
  return Find(device, bytes, &al, &bad) && !Find(host, bytes, &al, &bad);
}

// Gives an allocation back (cudaFree and cudaFreeAsync, once nothing may use it any more).
void Release(void* p) {
  std::lock_guard<std::mutex> lock(M().mu);
  auto it = M().allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == M().allocations.end()) return;
  M().devices[static_cast<size_t>(it->second.device)].allocated -= it->second.bytes;
  M().allocations.erase(it);
  ::operator delete (p, std::align_val_t{256});
}

cudaError_t CheckKind(const void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  cudaError_t e = CheckRange(dst, bytes, dst_dev);
  if (e == cudaSuccess) e = CheckRange(src, bytes, src_dev);
  return e;
}

// The stream and ticket of an event's last record (stream nullptr: never recorded).
CUstream_st* LastRecord(cudaEvent_t e, uint64_t* ticket) {
  std::lock_guard<std::mutex> lock(e->mu);
  *ticket = e->ticket;
  return e->stream;
}

}  // namespace

namespace stria {
namespace cuda {
namespace emu {

// stria_cuda_runtime_model_shuffle_blocks's seed (0: off), and the launches numbered under it.
std::atomic<uint64_t> g_shuffle_seed{0};
std::atomic<uint64_t> g_launches{0};
// What the process has queued so far (stria_cuda_runtime_model_counts): kernel launches, copies
// from host to device memory and from device to host memory.
std::atomic<uint64_t> g_all_launches{0}, g_copies_to_device{0}, g_copies_to_host{0};
// Launches on streams of the least and of the greatest priority.
std::atomic<uint64_t> g_least_priority_launches{0}, g_greatest_priority_launches{0};

int LaunchOnStream(const void* kernel, void* stream, Dim3 grid, Dim3 block, size_t smem_bytes,
                   std::function<void()> body) {
  Touch();
  if (!DeviceOk(tls_device)) return Set(cudaErrorInvalidDevice);
  CUstream_st* s = Resolve(static_cast<cudaStream_t>(stream));
  const int device = s->device;
  // What the runtime refuses at the launch, with its codes: a fault before, a stream of another
  // device, a shape outside the hardware's limits, more dynamic shared memory than the kernel's
  // attribute allows on this device (48 KB unless raised; the attribute is per device).
  if (const cudaError_t sticky = Sticky(tls_device)) return Set(sticky);
  if (device != tls_device) return Set(cudaErrorInvalidResourceHandle);
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
      threads == 0 || threads > 1024 || block.z > 64)
    return Set(cudaErrorInvalidConfiguration);
  {
    std::lock_guard<std::mutex> lock(M().mu);
    const auto& limits = M().devices[static_cast<size_t>(device)].smem_limit;
    const auto it = limits.find(kernel);
    if (smem_bytes > static_cast<size_t>(it == limits.end() ? 48 * 1024 : it->second))
      return Set(cudaErrorInvalidValue);
  }
  // stria_cuda_runtime_model_shuffle_blocks: this launch's own order of CTAs (and of warps).
  g_all_launches.fetch_add(1);
  if (s->priority_class < 0) g_least_priority_launches.fetch_add(1);
  if (s->priority_class > 0) g_greatest_priority_launches.fetch_add(1);
  const uint64_t shuffle = g_shuffle_seed.load();
  const uint64_t seed = shuffle == 0 ? 0 : shuffle ^ (g_launches.fetch_add(1) * 0x9e3779b97f4a7c15ull);
  Enqueue(s, [=] {
    if (Sticky(device) != cudaSuccess) return;  // a faulted device runs nothing more
    if (shuffle != 0) SetSchedule(Schedule::kWarpsShuffled, seed);
    try {
      Launch(grid, block, smem_bytes, body);
    } catch (const std::exception& e) {
      Fault(device, e.what());
    }
    if (shuffle != 0) ResetSchedule();
  });
  return cudaSuccess;
}

}  // namespace emu
}  // namespace cuda
}  // namespace stria

extern "C" {

// Not in the runtime: tests built for both (tests/gpu/gpu_util.h, OnRuntimeModel) find it through a
// weak reference, to tell the model from a GPU.
int stria_cuda_runtime_model(void) {
  return 1;
}

// Also not in the runtime (tests/gpu/gpu_util.h, ShuffledBlocks): from a nonzero seed on, every
// launch runs its CTAs, and the warps within them, in an order of its own drawn from the seed and
// the launch's number, as a GPU may schedule them; 0 goes back to STRIA_EMU_SCHEDULE's order.
void stria_cuda_runtime_model_shuffle_blocks(uint64_t seed) {
  stria::cuda::emu::g_shuffle_seed.store(seed);
}

// Also the model's (tests/gpu/gpu_util.h): how many kernel launches, copies to the device and
// copies to the host the process has queued so far, so that a suite can hold a call to what it
// queues.
void stria_cuda_runtime_model_counts(uint64_t* launches, uint64_t* to_device, uint64_t* to_host) {
  *launches = stria::cuda::emu::g_all_launches.load();
  *to_device = stria::cuda::emu::g_copies_to_device.load();
  *to_host = stria::cuda::emu::g_copies_to_host.load();
}

// Also the model's (tests/gpu/gpu_util.h, HostWaits): how often the host has waited for the work
// of `stream` (the calling thread's device's legacy stream for null), as CUstream_st counts it.
uint64_t stria_cuda_runtime_model_host_waits(cudaStream_t stream) {
  return Resolve(stream)->host_waits.load();
}

// Also the model's: the kernel launches queued so far on streams created with the device's least
// priority and with its greatest (a document plan's home part and its ring, src/backend/cuda).
void stria_cuda_runtime_model_priority_launches(uint64_t* least, uint64_t* greatest) {
  *least = stria::cuda::emu::g_least_priority_launches.load();
  *greatest = stria::cuda::emu::g_greatest_priority_launches.load();
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorPeerAccessAlreadyEnabled:
      return "cudaErrorPeerAccessAlreadyEnabled";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (the emulator's message is on stderr)";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorPeerAccessAlreadyEnabled:
      return "peer access is already enabled";
    default:
      return "unknown error";
  }
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = tls_last;
  tls_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return tls_last;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = static_cast<int>(M().devices.size());
  return Set(*count == 0 ? cudaErrorNoDevice : cudaSuccess);
}

cudaError_t cudaGetDevice(int* device) {
  *device = tls_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!DeviceOk(device)) return Set(cudaErrorInvalidDevice);
  tls_device = device;
  MakeCurrent(device);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int /*version*/,
                                             unsigned long long /*flags*/, cudaDriverEntryPointQueryResult* status) {
  const std::string name = symbol;
  *fn = name == "cuCtxGetCurrent"              ? reinterpret_cast<void*>(&ModelCtxGetCurrent)
        : name == "cuDevicePrimaryCtxGetState" ? reinterpret_cast<void*>(&ModelPrimaryCtxGetState)
        : name == "cuKernelSetAttribute"       ? reinterpret_cast<void*>(&ModelKernelSetAttribute)
                                               : nullptr;
  if (status != nullptr) *status = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (!DeviceOk(device)) return Set(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = M().cc / 10;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = M().cc % 10;
      return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported:
      *value = 1;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = M().sms;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = M().smem_optin;
      return cudaSuccess;
    case cudaDevAttrL2CacheSize:
      *value = M().l2_bytes;
      return cudaSuccess;
    default:
      return Set(cudaErrorInvalidValue);  // not modelled: a new use must be added here
  }
}

// The runtime's way: on the current device; as the H200's runtime does, a success clears the
// thread's last error (a caller's pending one included).
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  Touch();
  if (func == nullptr) return Set(cudaErrorInvalidValue);
  if (!DeviceOk(tls_device)) return Set(cudaErrorInvalidDevice);
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return Set(cudaErrorInvalidValue);  // not modelled
  if (!SetSmemLimit(func, tls_device, value)) return Set(cudaErrorInvalidValue);
  tls_last = cudaSuccess;
  return cudaSuccess;
}

// A kernel's handle is its host function: there is one module, on every device.
cudaError_t cudaGetKernel(cudaKernel_t* kernel, const void* func) {
  if (kernel == nullptr || func == nullptr) return Set(cudaErrorInvalidValue);
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(func));
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  Touch();
  *p = nullptr;
  if (!DeviceOk(tls_device)) return Set(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(M().mu);
  Device& d = M().devices[static_cast<size_t>(tls_device)];
  if (bytes > M().device_bytes - d.allocated) return Set(cudaErrorMemoryAllocation);
  void* mem = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{256});
  std::memset(mem, 0xFF, bytes);
  M().allocations[reinterpret_cast<uintptr_t>(mem)] = Allocation{bytes, tls_device};
  d.allocated += bytes;
  *p = mem;
  return cudaSuccess;
}

// Stream-ordered allocation: the memory exists at once (the stream's earlier work cannot touch
// it), and goes back when the stream reaches the free.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t /*stream*/) {
  return cudaMalloc(p, bytes);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(M().mu);
    if (M().allocations.count(reinterpret_cast<uintptr_t>(p)) == 0) return Set(cudaErrorInvalidValue);
  }
  Enqueue(Resolve(stream), [p] { Release(p); });
  return cudaSuccess;
}

// Like the GPU's, waits for the device's work first (the memory may still be in use).
cudaError_t cudaFree(void* p) {
  Touch();
  if (p == nullptr) return cudaSuccess;
  std::vector<CUstream_st*> streams;
  {
    std::lock_guard<std::mutex> lock(M().mu);
    auto it = M().allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == M().allocations.end()) return Set(cudaErrorInvalidValue);
    streams = M().devices[static_cast<size_t>(it->second.device)].streams;
  }
  for (CUstream_st* s : streams) Drain(s);
  Release(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  Touch();
  std::lock_guard<std::mutex> lock(M().mu);
  *total = M().device_bytes;
  *free_bytes = M().device_bytes - M().devices[static_cast<size_t>(tls_device)].allocated;
  return cudaSuccess;
}

// Page-locked host memory: host memory the model only remembers, so that the pointer's attributes
// say what it is.
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  Touch();
  void* mem = ::operator new (std::max<size_t>(bytes, 1), std::align_val_t{256});
  std::lock_guard<std::mutex> lock(M().mu);
  M().pinned[reinterpret_cast<uintptr_t>(mem)] = bytes;
  *p = mem;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  Touch();
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(M().mu);
    if (M().pinned.erase(reinterpret_cast<uintptr_t>(p)) == 0) return Set(cudaErrorInvalidValue);
  }
  ::operator delete (p, std::align_val_t{256});
  return cudaSuccess;
}

static bool IsPinned(const void* p) {
  std::lock_guard<std::mutex> lock(M().mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = M().pinned.upper_bound(a);
  if (it == M().pinned.begin()) return false;
  --it;
  return a < it->first + std::max<size_t>(it->second, 1);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* p) {
  std::memset(attr, 0, sizeof(*attr));
  Allocation al;
  bool bad = false;
  if (p != nullptr && Find(p, 1, &al, &bad)) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = al.device;
    attr->devicePointer = const_cast<void*>(p);
  } else if (p != nullptr && IsPinned(p)) {
    attr->type = cudaMemoryTypeHost;
    attr->device = tls_device;
    attr->hostPointer = const_cast<void*>(p);
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

// Peer access: every pair of distinct model devices may enable it, once (a second time is the
// runtime's cudaErrorPeerAccessAlreadyEnabled). Copies between devices work either way, as
// cudaMemcpyDefault's do on GPUs.
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (!DeviceOk(device) || !DeviceOk(peer)) return Set(cudaErrorInvalidDevice);
  *can = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  Touch();
  if (!DeviceOk(peer) || peer == tls_device) return Set(cudaErrorInvalidDevice);
  if (flags != 0) return Set(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(M().mu);
  if (!M().peer_access.insert({tls_device, peer}).second) return Set(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int /*flags*/) {
  Touch();
  // Only non-blocking streams are modelled faithfully: a blocking one would also order itself
  // against the legacy default stream, which nothing here relies on.
  std::lock_guard<std::mutex> lock(M().mu);
  *s = NewStream(tls_device);
  return cudaSuccess;
}

// Priorities order nothing here (every stream of the model is a thread of its own); they are
// recorded for the launch counts by priority. The range is an H200's.
constexpr int kLeastPriority = 0, kGreatestPriority = -5;
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = kLeastPriority;
  *greatest = kGreatestPriority;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  Touch();
  const cudaError_t e = cudaStreamCreateWithFlags(s, flags);
  if (e == cudaSuccess) {
    const int clamped = std::max(kGreatestPriority, std::min(kLeastPriority, priority));
    (*s)->priority_class = clamped == kLeastPriority ? -1 : clamped == kGreatestPriority ? 1 : 0;
  }
  return e;
}

// Returns at once, as the runtime does: the stream's worker runs what is queued, then ends (work
// that never ends, such as a kernel of a dead peer's communication, keeps only that thread).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s == nullptr) return Set(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stopping = true;
  }
  s->cv.notify_all();
  if (s->worker.joinable()) s->worker.detach();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = Resolve(stream);
  s->host_waits.fetch_add(1);
  Drain(s);
  return Set(Sticky(s->device));
}

// Like the runtime, not-ready is also left as the thread's last error (callers clear it).
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = Resolve(stream);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->done < s->queued) return Set(cudaErrorNotReady);
  }
  return Set(Sticky(s->device));
}

// `fn` runs on the stream's thread in stream order, and holds the stream until it returns (what
// the model of NCCL uses as its communication kernels).
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return Set(cudaErrorInvalidValue);
  Enqueue(Resolve(stream), [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

// Capture, as far as a caller that refuses it needs: the stream's state, and a graph to destroy.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode /*mode*/) {
  if (stream == nullptr) return Set(cudaErrorStreamCaptureUnsupported);  // as the legacy stream
  if (stream->capturing.exchange(true)) return Set(cudaErrorIllegalState);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (stream == nullptr || !stream->capturing.exchange(false)) return Set(cudaErrorIllegalState);
  *graph = new CUgraph_st;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  *status = Resolve(stream)->capturing.load() ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  Touch();
  std::vector<CUstream_st*> streams;
  {
    std::lock_guard<std::mutex> lock(M().mu);
    streams = M().devices[static_cast<size_t>(tls_device)].streams;
  }
  for (CUstream_st* s : streams) {
    s->host_waits.fetch_add(1);
    Drain(s);
  }
  return Set(Sticky(tls_device));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int /*flags*/) {
  Touch();
  *e = new CUevent_st();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, 0);
}

// Freed at once, as the runtime allows even with a record pending (a stream never refers to an
// event: a record or a wait copies what it needs), so that a late use is a use after free.
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return Set(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

// A destroyed stream's handle dangles in the runtime (its use is undefined, and the address may
// name a new stream later); the model refuses it, so that a library that keeps using a stream
// its caller has destroyed fails a test rather than working by luck.
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (e == nullptr) return Set(cudaErrorInvalidResourceHandle);
  CUstream_st* s = Resolve(stream);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->stopping) return Set(cudaErrorInvalidResourceHandle);
  }
  // A work item of its own stamps the time the stream reaches the record; the event completes
  // with it, so with everything queued before it.
  auto stamp = std::make_shared<std::atomic<int64_t>>(-1);
  const uint64_t ticket = Enqueue(s, [stamp] {
    stamp->store(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  });
  std::lock_guard<std::mutex> elock(e->mu);
  e->stream = s;
  e->ticket = ticket;
  e->stamp = std::move(stamp);
  return cudaSuccess;
}

// Between two completed records, in milliseconds, as the runtime measures it; cudaErrorNotReady
// while either is pending, an invalid handle for one never recorded.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return Set(cudaErrorInvalidValue);
  int64_t t[2];
  cudaEvent_t events[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    std::shared_ptr<std::atomic<int64_t>> stamp;
    {
      std::lock_guard<std::mutex> lock(events[i]->mu);
      stamp = events[i]->stamp;
    }
    if (stamp == nullptr) return Set(cudaErrorInvalidResourceHandle);
    t[i] = stamp->load();
    if (t[i] < 0) return Set(cudaErrorNotReady);
  }
  *ms = static_cast<float>(static_cast<double>(t[1] - t[0]) * 1e-6);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return Set(cudaErrorInvalidResourceHandle);
  uint64_t ticket;
  CUstream_st* s = LastRecord(e, &ticket);
  if (s == nullptr) return cudaSuccess;  // never recorded
  std::lock_guard<std::mutex> lock(s->mu);
  return s->done >= ticket ? cudaSuccess : Set(cudaErrorNotReady);
}

// Blocks the host until the work queued before the event's record has run (at once when it was
// never recorded), as the runtime does.
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return Set(cudaErrorInvalidResourceHandle);
  uint64_t ticket;
  CUstream_st* s = LastRecord(e, &ticket);
  if (s == nullptr) return cudaSuccess;  // never recorded
  s->host_waits.fetch_add(1);
  WaitFor(s, ticket);
  return Set(Sticky(s->device));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int /*flags*/) {
  if (e == nullptr) return Set(cudaErrorInvalidResourceHandle);
  CUstream_st* waiter = Resolve(stream);
  {
    std::lock_guard<std::mutex> lock(waiter->mu);
    if (waiter->stopping) return Set(cudaErrorInvalidResourceHandle);  // destroyed (cudaEventRecord)
  }
  CUstream_st* target;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->stream;
    ticket = e->ticket;
  }
  if (target == nullptr || target == waiter) return cudaSuccess;  // never recorded, or in order anyway
  Enqueue(waiter, [target, ticket] { WaitFor(target, ticket); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const cudaError_t e = CheckRange(p, bytes, true);
  if (e != cudaSuccess) return Set(e);
  Enqueue(Resolve(stream), [=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > pitch) return Set(cudaErrorInvalidValue);
  const cudaError_t e = CheckRange(p, pitch * (height - 1) + width, true);
  if (e != cudaSuccess) return Set(e);
  Enqueue(Resolve(stream), [=] {
    for (size_t r = 0; r < height; ++r) std::memset(static_cast<char*>(p) + r * pitch, value, width);
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const cudaError_t e = CheckKind(dst, src, bytes, kind);
  if (e != cudaSuccess) return Set(e);
  if (IsCopyBetween(src, dst, bytes)) stria::cuda::emu::g_copies_to_host.fetch_add(1);
  if (IsCopyBetween(dst, src, bytes)) stria::cuda::emu::g_copies_to_device.fetch_add(1);
  CUstream_st* s = Resolve(stream);
  if ((IsCopyBetween(src, dst, bytes) && !IsPinned(dst)) || (IsCopyBetween(dst, src, bytes) && !IsPinned(src)))
    s->host_waits.fetch_add(1);
  Enqueue(s, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

// The synchronous forms: queued on the legacy default stream, then waited for.
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  Touch();
  const cudaError_t e = cudaMemsetAsync(p, value, bytes, nullptr);
  return e != cudaSuccess ? e : cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  Touch();
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  return e != cudaSuccess ? e : cudaStreamSynchronize(nullptr);
}

}  // extern "C"

// XLA FFI handlers that run stria's attention inside a JAX program (stria.jax): XLA hands the
// handler its buffers (dense, row-major) and, on a GPU, its stream; the handler wraps them as
// DLTensors and calls the C ABI. So a jitted JAX function computes ring attention on XLA's own
// buffers and stream, without a copy and without a host round trip.
//
// Contexts are named by a key, not by their address: a compiled JAX executable keeps its
// attributes for as long as JAX caches it, which can outlive the context. stria.jax binds a
// context to a key when it first uses it and unbinds it when the context closes; a call through a
// stale key fails with a message instead of touching a destroyed context.
#include <dlpack/dlpack.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "stria/stria.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One bound context. `calls` serialises this handler's calls on it: XLA may run two independent
// custom calls of one program at once, and a stria context takes one call at a time (a second
// would be refused as busy).
struct Bound {
  stria_context_t ctx;
  std::shared_ptr<std::mutex> calls;
};

std::mutex g_registry_mutex;
std::unordered_map<int64_t, Bound>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, Bound>();  // outlives every handler call
  return *registry;
}
int64_t g_next_key = 1;  // keys are never reused, so a stale one stays stale

ffi::ErrorCode CodeOf(stria_status_t s) {
  switch (s) {
    case STRIA_ERROR_INVALID_ARGUMENT:
      return ffi::ErrorCode::kInvalidArgument;
    case STRIA_ERROR_UNSUPPORTED:
      return ffi::ErrorCode::kUnimplemented;
    case STRIA_ERROR_OUT_OF_MEMORY:
      return ffi::ErrorCode::kResourceExhausted;
    case STRIA_ERROR_TRANSPORT:
      return ffi::ErrorCode::kUnavailable;
    case STRIA_ERROR_TIMEOUT:
      return ffi::ErrorCode::kDeadlineExceeded;
    case STRIA_ERROR_ABORTED:
      return ffi::ErrorCode::kAborted;
    default:
      return ffi::ErrorCode::kInternal;
  }
}

// The failed call's status and message, as JAX will raise them ("<CODE>: stria ...").
ffi::Error Failure(const char* call, stria_status_t s) {
  return ffi::Error(CodeOf(s),
                    std::string("stria ") + call + ": " + stria_status_string(s) + ": " + stria_get_last_error());
}

// A DLTensor over an XLA buffer: compact row-major (strides NULL), on `device`. The DLPack dtype
// of an element type stria does not take is left invalid (code 255), for stria to reject with its
// own message naming the supported dtypes.
struct View {
  DLTensor t{};
  explicit View(const ffi::AnyBuffer& b, DLDevice device) {
    t.data = b.untyped_data();
    t.device = device;
    const auto dims = b.dimensions();
    t.ndim = static_cast<int32_t>(dims.size());
    t.shape = const_cast<int64_t*>(dims.begin());
    switch (b.element_type()) {
      case ffi::DataType::F32:
        t.dtype = DLDataType{kDLFloat, 32, 1};
        break;
      case ffi::DataType::F16:
        t.dtype = DLDataType{kDLFloat, 16, 1};
        break;
      case ffi::DataType::BF16:
        t.dtype = DLDataType{kDLBfloat, 16, 1};
        break;
      default:
        t.dtype = DLDataType{255, static_cast<uint8_t>(8 * ffi::ByteWidth(b.element_type())), 1};
    }
  }
};

bool Lookup(int64_t key, Bound* out) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  const auto it = Registry().find(key);
  if (it == Registry().end()) return false;
  *out = it->second;
  return true;
}

ffi::Error Closed(int64_t key) {
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    "stria: the context this computation was compiled for (key " + std::to_string(key) +
                        ") is closed; call the function again with an open context");
}

stria_attention_params_t Params(int32_t layout, bool causal, float softmax_scale) {
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = static_cast<stria_layout_t>(layout);
  params.causal = causal ? 1 : 0;
  params.softmax_scale = softmax_scale;
  return params;
}

ffi::Error Forward(void* stream, DLDevice device, int64_t key, int32_t layout, bool causal, float softmax_scale,
                   ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> lse) {
  Bound bound;
  if (!Lookup(key, &bound)) return Closed(key);
  View vq(q, device), vk(k, device), vv(v, device), vo(*out, device), vl(*lse, device);
  const stria_attention_params_t params = Params(layout, causal, softmax_scale);
  std::lock_guard<std::mutex> serial(*bound.calls);
  const stria_status_t s = stria_attention_forward(bound.ctx, &params, &vq.t, &vk.t, &vv.t, &vo.t, &vl.t, stream);
  return s == STRIA_SUCCESS ? ffi::Error::Success() : Failure("attention_forward", s);
}

ffi::Error Backward(void* stream, DLDevice device, int64_t key, int32_t layout, bool causal, float softmax_scale,
                    ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                    ffi::AnyBuffer dout, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                    ffi::Result<ffi::AnyBuffer> dv) {
  Bound bound;
  if (!Lookup(key, &bound)) return Closed(key);
  View vq(q, device), vk(k, device), vv(v, device), vo(out, device), vl(lse, device), vdo(dout, device);
  View vdq(*dq, device), vdk(*dk, device), vdv(*dv, device);
  const stria_attention_params_t params = Params(layout, causal, softmax_scale);
  std::lock_guard<std::mutex> serial(*bound.calls);
  const stria_status_t s = stria_attention_backward(bound.ctx, &params, &vq.t, &vk.t, &vv.t, &vo.t, &vl.t, &vdo.t,
                                                    &vdq.t, &vdk.t, &vdv.t, stream);
  return s == STRIA_SUCCESS ? ffi::Error::Success() : Failure("attention_backward", s);
}

ffi::Error ForwardCpu(int64_t key, int32_t layout, bool causal, float scale, ffi::AnyBuffer q, ffi::AnyBuffer k,
                      ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse) {
  return Forward(nullptr, DLDevice{kDLCPU, 0}, key, layout, causal, scale, q, k, v, out, lse);
}

ffi::Error ForwardCuda(void* stream, int64_t key, int32_t device_id, int32_t layout, bool causal, float scale,
                       ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> lse) {
  return Forward(stream, DLDevice{kDLCUDA, device_id}, key, layout, causal, scale, q, k, v, out, lse);
}

ffi::Error BackwardCpu(int64_t key, int32_t layout, bool causal, float scale, ffi::AnyBuffer q, ffi::AnyBuffer k,
                       ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                       ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv) {
  return Backward(nullptr, DLDevice{kDLCPU, 0}, key, layout, causal, scale, q, k, v, out, lse, dout, dq, dk, dv);
}

ffi::Error BackwardCuda(void* stream, int64_t key, int32_t device_id, int32_t layout, bool causal, float scale,
                        ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                        ffi::AnyBuffer dout, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                        ffi::Result<ffi::AnyBuffer> dv) {
  return Backward(stream, DLDevice{kDLCUDA, device_id}, key, layout, causal, scale, q, k, v, out, lse, dout, dq, dk,
                  dv);
}

// The attributes every handler takes, in the order stria.jax passes them.
template <typename Binding>
auto CallAttrs(Binding binding) {
  return std::move(binding).template Attr<int32_t>("layout").template Attr<bool>("causal").template Attr<float>(
      "softmax_scale");
}

}  // namespace

// Everything else in this module is hidden (CMake's visibility preset): these are what stria.jax
// looks up.
#pragma GCC visibility push(default)
extern "C" {

// Binds a context (a stria_context_t) to a new key; 0 for a null context.
int64_t stria_jax_bind(void* ctx) {
  if (ctx == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  const int64_t key = g_next_key++;
  Registry().emplace(key, Bound{static_cast<stria_context_t>(ctx), std::make_shared<std::mutex>()});
  return key;
}

// Unbinds a key, after any call running on it has returned (so the caller may then destroy the
// context). Unknown keys are ignored.
void stria_jax_unbind(int64_t key) {
  Bound bound;
  if (!Lookup(key, &bound)) return;
  std::lock_guard<std::mutex> serial(*bound.calls);
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  Registry().erase(key);
}

}  // extern "C"

// The handlers, by platform: the CPU ones take no stream, the CUDA ones XLA's stream and the
// context's device ordinal (the DLTensors name it; stria checks the buffers are on it).
XLA_FFI_DEFINE_HANDLER_SYMBOL(stria_jax_forward_cpu, ForwardCpu,
                              CallAttrs(ffi::Ffi::Bind().Attr<int64_t>("context"))
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(stria_jax_backward_cpu, BackwardCpu,
                              CallAttrs(ffi::Ffi::Bind().Attr<int64_t>("context"))
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    stria_jax_forward_cuda, ForwardCuda,
    CallAttrs(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Attr<int64_t>("context").Attr<int32_t>("device_id"))
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    stria_jax_backward_cuda, BackwardCuda,
    CallAttrs(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Attr<int64_t>("context").Attr<int32_t>("device_id"))
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>()
        .Ret<ffi::AnyBuffer>());
#pragma GCC visibility pop

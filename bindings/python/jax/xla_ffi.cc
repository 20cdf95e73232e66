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
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stria/stria.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace stria_jax {

// What stria.jax passes every call (its custom call's attributes): the binding's key, the
// attention parameters, and the call's tag (stria_context_set_call_tag) and site ("model.py:12
// (attend)", empty if none), which errors name.
struct CallAttributes {
  int64_t context;
  int32_t layout;
  bool causal;
  float softmax_scale;
  uint64_t tag;
  std::string_view site;
  int64_t window_left;  // the sliding window (stria_attention_forward_window); -1, -1: none
  int64_t window_right;
  // A document plan (stria_plan_create) made here from the call's boundaries operand with this
  // config, the same plan the caller sharded its data by: plan_tile 0 is none. The plan is
  // rebuilt only when the boundaries change.
  int64_t plan_tile;
  int64_t plan_local_len;
  bool plan_causal;
  int64_t plan_window_left;
  int64_t plan_window_right;
  // Which optional operands follow q, k, v (and out, lse, dout): the document boundaries, then the
  // sinks ([Hq] float32, whose gradient the backward returns after dq, dk, dv).
  bool has_documents;
  bool has_sinks;
  float softcap;  // logit softcapping; 0: none
  // FP8 inputs' descales (a forward's, float32 [1] or [H]) after the sinks: bit 0 q's, 1 k's, 2 v's.
  int32_t descales;
};

}  // namespace stria_jax

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    stria_jax::CallAttributes, xla::ffi::StructMember<int64_t>("context"), xla::ffi::StructMember<int32_t>("layout"),
    xla::ffi::StructMember<bool>("causal"), xla::ffi::StructMember<float>("softmax_scale"),
    xla::ffi::StructMember<uint64_t>("tag"), xla::ffi::StructMember<std::string_view>("site"),
    xla::ffi::StructMember<int64_t>("window_left"), xla::ffi::StructMember<int64_t>("window_right"),
    xla::ffi::StructMember<int64_t>("plan_tile"), xla::ffi::StructMember<int64_t>("plan_local_len"),
    xla::ffi::StructMember<bool>("plan_causal"), xla::ffi::StructMember<int64_t>("plan_window_left"),
    xla::ffi::StructMember<int64_t>("plan_window_right"), xla::ffi::StructMember<bool>("has_documents"),
    xla::ffi::StructMember<bool>("has_sinks"), xla::ffi::StructMember<float>("softcap"),
    xla::ffi::StructMember<int32_t>("descales"));

namespace {

using stria_jax::CallAttributes;

// A context's calls through this module: `mutex` serialises them (XLA may run two independent
// custom calls of one program at once, and a stria context takes one call at a time: a second
// would be refused as busy), and `bound` turns false under it when the context is unbound, so a
// call that found the context just before cannot start on it after.
struct Calls {
  std::mutex mutex;
  bool bound = true;
  int32_t xla_device = -1;  // a lone context of a world > 1: the XLA device it serves, once known
  // The last plan made for this context's calls (under `mutex`), and what it was made from: the
  // config attributes, then the boundaries.
  stria_plan_t plan = nullptr;
  std::vector<int64_t> plan_key;
  ~Calls() {
    if (plan != nullptr) stria_plan_destroy(plan);
  }
};
// One context of a binding: the XLA device whose programs it serves (-1: any), and the DLPack
// device its tensors are on.
struct Member {
  int32_t xla_device;
  DLDevice device;
  stria_context_t ctx;
  std::shared_ptr<Calls> calls;
};
// A binding: one context (for every device), or the ranks of a local group, rank r serving the
// XLA device that runs rank r's shard of a shard_map.
using Binding = std::vector<Member>;

std::mutex g_registry_mutex;
std::unordered_map<int64_t, Binding>& Registry() {
  static auto* registry = new std::unordered_map<int64_t, Binding>();  // outlives every handler call
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

// What every error message ends with: the call site, if stria.jax found one.
std::string At(std::string_view site) {
  return site.empty() ? "" : " [called at " + std::string(site) + "]";
}

// The failed call's status and message, as JAX will raise them ("<CODE>: stria ...", then the
// call site).
ffi::Error Failure(const char* call, stria_status_t s, std::string_view site) {
  return ffi::Error(CodeOf(s), std::string("stria ") + call + ": " + stria_status_string(s) + ": " +
                                   stria_get_last_error() + At(site));
}

// A DLTensor over an XLA buffer: compact row-major (strides NULL), on `device`. Element types
// stria does not take still get their DLPack type where there is one (integers, float64), so
// that stria's refusal names them; the rest are left invalid (code 255).
//
// Under jax.vmap XLA hands the handler every mapped element at once, with the mapped axes in
// front (stria.jax asks for that: vmap_method "broadcast_all"). Attention is independent across
// the batch, so those axes fold into B: a buffer of more than `rank` dimensions (4, or 3 for
// lse) is viewed with its leading ones merged, which its compact layout allows without a copy.
struct View {
  DLTensor t{};
  int64_t merged[4] = {};
  View(const ffi::AnyBuffer& b, DLDevice device, size_t rank = 4) {
    t.data = b.untyped_data();
    t.device = device;
    const auto dims = b.dimensions();
    t.ndim = static_cast<int32_t>(dims.size());
    t.shape = const_cast<int64_t*>(dims.begin());
    if (dims.size() > rank && rank <= 4) {
      const size_t lead = dims.size() - rank + 1;  // the mapped axes and B
      merged[0] = 1;
      for (size_t i = 0; i < lead; ++i) merged[0] *= dims[i];
      for (size_t i = 1; i < rank; ++i) merged[i] = dims[lead + i - 1];
      t.ndim = static_cast<int32_t>(rank);
      t.shape = merged;
    }
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
      case ffi::DataType::F64:
        t.dtype = DLDataType{kDLFloat, 64, 1};
        break;
      case ffi::DataType::F8E4M3FN:
        t.dtype = DLDataType{STRIA_DL_FLOAT8_E4M3FN, 8, 1};
        break;
      case ffi::DataType::S8:
      case ffi::DataType::S16:
      case ffi::DataType::S32:
      case ffi::DataType::S64:
        t.dtype = DLDataType{kDLInt, static_cast<uint8_t>(8 * ffi::ByteWidth(b.element_type())), 1};
        break;
      case ffi::DataType::U8:
      case ffi::DataType::U16:
      case ffi::DataType::U32:
      case ffi::DataType::U64:
        t.dtype = DLDataType{kDLUInt, static_cast<uint8_t>(8 * ffi::ByteWidth(b.element_type())), 1};
        break;
      default:
        t.dtype = DLDataType{255, static_cast<uint8_t>(8 * ffi::ByteWidth(b.element_type())), 1};
    }
  }
};

ffi::Error Closed(int64_t key) {
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    "stria: the context this computation was compiled for (key " + std::to_string(key) +
                        ") is closed; call the function again with an open context");
}

// The member of binding `key` that serves XLA device `xla_device`, or an error saying why none.
ffi::Error Find(int64_t key, int32_t xla_device, Member* out) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  const auto it = Registry().find(key);
  if (it == Registry().end()) return Closed(key);
  for (const Member& m : it->second) {
    if (m.xla_device == -1 || m.xla_device == xla_device) {
      *out = m;
      return ffi::Error::Success();
    }
  }
  std::string devices;
  for (const Member& m : it->second) devices += (devices.empty() ? "" : ", ") + std::to_string(m.xla_device);
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "stria: no rank of the local group serves XLA device " +
                                                          std::to_string(xla_device) + " (its ranks serve devices " +
                                                          devices + ", rank r the r-th)");
}

stria_attention_params_t Params(const CallAttributes& a) {
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = static_cast<stria_layout_t>(a.layout);
  params.causal = a.causal ? 1 : 0;
  params.softmax_scale = a.softmax_scale;
  params.window_left = a.window_left;
  params.window_right = a.window_right;
  params.softcap = a.softcap;
  return params;
}

// Whether a lone context (bound for every device) may serve a call from `xla_device`; calls->mutex
// held. On a GPU it serves its own GPU only: a buffer of another would reach stria labelled as on
// the context's. A context of a world of more than one serves one device: programs that call it
// from two (a shard_map or pmap over several devices of this process) would make its calls in
// whatever order XLA runs the devices' shards, and pair them with the peers' calls for other
// shards: wrong numbers, no error. The first device to call claims it. A world of one has no
// peers to pair with: any device of its platform.
ffi::Error CheckDevice(const Member& m, int32_t xla_device, std::string_view site) {
  const std::string where = At(site);
  if (m.device.device_type == kDLCUDA && xla_device != m.device.device_id)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "stria: this program runs on XLA device " + std::to_string(xla_device) +
                          " but its stria context is on cuda:" + std::to_string(m.device.device_id) +
                          ": use a context on that GPU, or a stria.LocalGroup with one rank per device" + where);
  int world = 1;
  if (stria_context_get_world_size(m.ctx, &world) != STRIA_SUCCESS || world == 1) return ffi::Error::Success();
  if (m.calls->xla_device < 0) m.calls->xla_device = xla_device;
  if (m.calls->xla_device == xla_device) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    "stria: a Context of a world of " + std::to_string(world) +
                        " serves one XLA device, and it was first called from device " +
                        std::to_string(m.calls->xla_device) + ", now from device " + std::to_string(xla_device) +
                        " (several devices of this process under shard_map or pmap?): their calls would pair with "
                        "the other ranks' in any order; give each device its own rank (a stria.LocalGroup under "
                        "shard_map, or one device per process)" +
                        where);
}

// Whether the context's device is of the platform XLA runs the call on. Otherwise the library
// would see XLA's buffers labelled as the context's device and refuse them in its own terms (a CPU
// context's "stream must be NULL", a CUDA context's "host memory"), which do not say what to change
// in the JAX program.
ffi::Error CheckPlatform(const Member& m, bool cuda, int32_t xla_device, std::string_view site) {
  if (cuda == (m.device.device_type == kDLCUDA)) return ffi::Error::Success();
  const std::string where = At(site);
  if (cuda)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "stria: this program runs on XLA's CUDA device " + std::to_string(xla_device) +
                          " but its stria context is a CPU context: create it with device=\"cuda:" +
                          std::to_string(xla_device) + "\", or run the program on the CPU (its arrays placed with " +
                          "jax.device_put(x, jax.devices(\"cpu\")[0]))" + where);
  return ffi::Error(
      ffi::ErrorCode::kInvalidArgument,
      "stria: this program runs on XLA's CPU but its stria context is on cuda:" + std::to_string(m.device.device_id) +
          ": place its arrays on that GPU (jax.device_put), or use a CPU context" + where);
}

// Under the binding's lock (the tag names the call that follows it on this thread): tags the call,
// then makes it.
template <typename Call>
ffi::Error Run(const Member& m, int32_t xla_device, const CallAttributes& a, const char* name, Call call) {
  std::lock_guard<std::mutex> serial(m.calls->mutex);
  if (!m.calls->bound) return Closed(a.context);
  if (m.xla_device == -1) {
    if (ffi::Error e = CheckDevice(m, xla_device, a.site); e.failure()) return e;
  }
  stria_status_t s = stria_context_set_call_tag(m.ctx, a.tag);
  if (s == STRIA_SUCCESS) s = call();
  return s == STRIA_SUCCESS ? ffi::Error::Success() : Failure(name, s, a.site);
}

// A document mask's boundaries (stria.jax's cu_seqlens operand, after the attention tensors), as
// stria_attention_forward_documents reads them: int64 [..., B, n + 1]; or, where JAX runs without
// 64-bit integers, int32 [..., B, n + 1, 2] holding each int64's two little-endian words (stria.jax
// writes them so), which is the same memory. On a GPU they are XLA's device buffer, which a CUDA
// context reads on the call's stream. Leading (vmapped) axes fold into B, as q's do.
struct Boundaries {
  const int64_t* data = nullptr;  // nullptr: no document mask
  int64_t num_seqs = 0;
};
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "stria.jax's int32 pairs are little-endian int64s");

// A call with plan attributes needs its boundaries where the host reads them: a CPU context's.
ffi::Error CheckPlan(const Member& m, const CallAttributes& a, const Boundaries& docs) {
  if (a.plan_tile <= 0) return ffi::Error::Success();
  if (docs.data == nullptr)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "stria: a call on a plan needs its document boundaries (cu_seqlens)" + At(a.site));
  if (m.device.device_type != kDLCPU)
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "stria: stria.jax makes plans from the boundaries on CPU contexts; on a GPU, call "
                      "stria.attention_forward with a stria.Plan instead" +
                          At(a.site));
  return ffi::Error::Success();
}

// The plan of a call with plan attributes, made from its boundaries (host memory: a CPU context's)
// or found as the last one made from the same; calls->mutex held. STRIA_ERROR_* with the library's
// message on failure.
stria_status_t PlanOf(const Member& m, const CallAttributes& a, const Boundaries& docs, int64_t batch,
                      stria_plan_t* plan) {
  *plan = nullptr;
  if (a.plan_tile <= 0) return STRIA_SUCCESS;
  // On a grid of all-to-all groups of U ranks a plan is made for the ring of groups: world / U.
  int world = 1, ulysses = 1;
  stria_status_t s = stria_context_get_world_size(m.ctx, &world);
  if (s == STRIA_SUCCESS) s = stria_context_get_grid(m.ctx, &ulysses);
  if (s != STRIA_SUCCESS) return s;
  world /= ulysses;
  std::vector<int64_t> key{
      world, a.plan_tile,  a.plan_local_len, a.plan_causal ? 1 : 0, a.plan_window_left, a.plan_window_right,
      batch, docs.num_seqs};
  key.insert(key.end(), docs.data, docs.data + batch * (docs.num_seqs + 1));
  Calls& calls = *m.calls;
  if (calls.plan != nullptr && calls.plan_key == key) {
    *plan = calls.plan;
    return STRIA_SUCCESS;
  }
  stria_plan_config_t config;
  stria_plan_config_init(&config);
  config.world_size = world;
  config.tile = a.plan_tile;
  config.local_len = a.plan_local_len;
  config.causal = a.plan_causal ? 1 : 0;
  config.window_left = a.plan_window_left;
  config.window_right = a.plan_window_right;
  stria_plan_t made = nullptr;
  // The sequence length is every row's last boundary (the library checks that they agree).
  s = stria_plan_create(&config, docs.data, docs.num_seqs, batch, docs.data[docs.num_seqs], &made);
  if (s != STRIA_SUCCESS) return s;
  if (calls.plan != nullptr) stria_plan_destroy(calls.plan);
  calls.plan = made;
  calls.plan_key = std::move(key);
  *plan = made;
  return STRIA_SUCCESS;
}

ffi::Error BoundariesOf(const ffi::AnyBuffer& cu, int64_t batch, std::string_view site, Boundaries* out) {
  const auto dims = cu.dimensions();
  const bool pairs = cu.element_type() == ffi::DataType::S32;
  const size_t row_axes = pairs ? 2 : 1;  // the axes of one row: n + 1 (and the word pair)
  std::string why;
  if (cu.element_type() != ffi::DataType::S64 && !pairs)
    why = "must be int64 (or stria.jax's int32 word pairs)";
  else if (dims.size() < row_axes + 1 || (pairs && dims[dims.size() - 1] != 2) || dims[dims.size() - row_axes] < 2)
    why = pairs ? "must be [B, n + 1, 2] with n >= 1" : "must be [B, n + 1] with n >= 1";
  int64_t rows = 1;
  for (size_t i = 0; why.empty() && i + row_axes < dims.size(); ++i) rows *= dims[i];
  if (why.empty() && rows != batch)
    why = "has " + std::to_string(rows) + " rows but q's batch is " + std::to_string(batch);
  if (!why.empty()) {
    std::string shape;
    for (int64_t d : dims) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "stria: the document boundaries operand [" + shape + "] " + why + At(site));
  }
  out->data = static_cast<const int64_t*>(cu.untyped_data());
  out->num_seqs = dims[dims.size() - row_axes] - 1;
  return ffi::Error::Success();
}

// Sinks reach a handler with more than one dimension only under jax.vmap, which hands it every
// mapped element at once: their gradient would be one vector for the whole call, not one per
// element.
ffi::Error SinksUnderVmap(const CallAttributes& a) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    "stria: attention sinks under jax.vmap are not supported (their gradient is one vector per "
                    "call, not per mapped element): call ring_attention outside vmap, or fold the mapped axis into "
                    "the batch" +
                        At(a.site));
}

// A forward's FP8 descales (q's, k's, v's: those the attributes announce), as views.
struct Descales {
  std::optional<View> views[3];
  const DLTensor* at(int i) const { return views[i] ? &views[i]->t : nullptr; }
};

// The optional operands after the attention tensors, as the attributes announce them: the
// boundaries (into *docs), the sinks (into *sinks, a [Hq] float32 view) and, in a forward, the FP8
// descales (into *descales).
ffi::Error Extras(const ffi::RemainingArgs& rest, const CallAttributes& a, DLDevice device, int64_t batch,
                  Boundaries* docs, View** sinks, std::optional<View>* sinks_view, Descales* descales = nullptr) {
  const size_t want = (a.has_documents ? 1 : 0) + (a.has_sinks ? 1 : 0) +
                      static_cast<size_t>(__builtin_popcount(static_cast<unsigned>(a.descales) & 7u));
  if (rest.size() != want)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "stria: the call has " + std::to_string(rest.size()) + " operands after the attention tensors, " +
                          "its attributes announce " + std::to_string(want) + At(a.site));
  size_t next = 0;
  if (a.has_documents) {
    ffi::ErrorOr<ffi::AnyBuffer> cu = rest.get<ffi::AnyBuffer>(next++);
    if (cu.has_error()) return cu.error();
    if (ffi::Error e = BoundariesOf(*cu, batch, a.site, docs); e.failure()) return e;
  }
  *sinks = nullptr;
  if (a.has_sinks) {
    ffi::ErrorOr<ffi::AnyBuffer> z = rest.get<ffi::AnyBuffer>(next++);
    if (z.has_error()) return z.error();
    if (z->dimensions().size() != 1) return SinksUnderVmap(a);
    sinks_view->emplace(*z, device, 1);
    *sinks = &**sinks_view;
  }
  for (int i = 0; i < 3; ++i) {
    if ((a.descales & (1 << i)) == 0) continue;
    ffi::ErrorOr<ffi::AnyBuffer> ds = rest.get<ffi::AnyBuffer>(next++);
    if (ds.has_error()) return ds.error();
    if (descales == nullptr || ds->dimensions().size() != 1)
      return ffi::Error(ffi::ErrorCode::kUnimplemented,
                        "stria: FP8 descales are taken by the forward outside jax.vmap only" + At(a.site));
    descales->views[i].emplace(*ds, device, 1);
  }
  return ffi::Error::Success();
}

// Every handler: stria_attention_forward with the whole call in params (documents, window, plan,
// softcap, sinks).
ffi::Error Forward(bool cuda, void* stream, int32_t xla_device, const CallAttributes& a, ffi::AnyBuffer q,
                   ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::AnyBuffer> lse) {
  Member m;
  if (ffi::Error e = Find(a.context, xla_device, &m); e.failure()) return e;
  if (ffi::Error e = CheckPlatform(m, cuda, xla_device, a.site); e.failure()) return e;
  View vq(q, m.device), vk(k, m.device), vv(v, m.device), vo(*out, m.device), vl(*lse, m.device, 3);
  Boundaries docs;
  View* sinks = nullptr;
  std::optional<View> sinks_view;
  Descales descales;
  if (ffi::Error e = Extras(rest, a, m.device, vq.t.shape[0], &docs, &sinks, &sinks_view, &descales); e.failure())
    return e;
  if (ffi::Error e = CheckPlan(m, a, docs); e.failure()) return e;
  stria_attention_params_t params = Params(a);
  params.cu_seqlens = docs.data;
  params.num_seqs = docs.num_seqs;
  params.sinks = sinks != nullptr ? &sinks->t : nullptr;
  params.q_descale = descales.at(0);
  params.k_descale = descales.at(1);
  params.v_descale = descales.at(2);
  return Run(m, xla_device, a, "attention_forward", [&] {
    const stria_status_t planned = PlanOf(m, a, docs, vq.t.shape[0], &params.plan);
    if (planned != STRIA_SUCCESS) return planned;
    return stria_attention_forward(m.ctx, &params, &vq.t, &vk.t, &vv.t, &vo.t, &vl.t, stream);
  });
}

// Every backward handler: stria_attention_backward likewise; with sinks, their gradient is the
// result after dq, dk, dv.
ffi::Error Backward(bool cuda, void* stream, int32_t xla_device, const CallAttributes& a, ffi::AnyBuffer q,
                    ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                    ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                    ffi::Result<ffi::AnyBuffer> dv, ffi::RemainingRets more) {
  Member m;
  if (ffi::Error e = Find(a.context, xla_device, &m); e.failure()) return e;
  if (ffi::Error e = CheckPlatform(m, cuda, xla_device, a.site); e.failure()) return e;
  const DLDevice d = m.device;
  View vq(q, d), vk(k, d), vv(v, d), vo(out, d), vl(lse, d, 3), vdo(dout, d), vdq(*dq, d), vdk(*dk, d), vdv(*dv, d);
  Boundaries docs;
  View* sinks = nullptr;
  std::optional<View> sinks_view, dsinks_view;
  if (ffi::Error e = Extras(rest, a, d, vq.t.shape[0], &docs, &sinks, &sinks_view); e.failure()) return e;
  if (more.size() != (a.has_sinks ? 1u : 0u))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "stria: the backward has " + std::to_string(3 + more.size()) +
                                                            " results, its attributes " + "announce " +
                                                            std::to_string(a.has_sinks ? 4 : 3) + At(a.site));
  if (a.has_sinks) {
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> dz = more.get<ffi::AnyBuffer>(0);
    if (dz.has_error()) return dz.error();
    if ((*dz)->dimensions().size() != 1) return SinksUnderVmap(a);
    dsinks_view.emplace(**dz, d, 1);
  }
  if (ffi::Error e = CheckPlan(m, a, docs); e.failure()) return e;
  stria_attention_params_t params = Params(a);
  params.cu_seqlens = docs.data;
  params.num_seqs = docs.num_seqs;
  params.sinks = sinks != nullptr ? &sinks->t : nullptr;
  params.dsinks = dsinks_view ? &dsinks_view->t : nullptr;
  return Run(m, xla_device, a, "attention_backward", [&] {
    const stria_status_t planned = PlanOf(m, a, docs, vq.t.shape[0], &params.plan);
    if (planned != STRIA_SUCCESS) return planned;
    return stria_attention_backward(m.ctx, &params, &vq.t, &vk.t, &vv.t, &vo.t, &vl.t, &vdo.t, &vdq.t, &vdk.t, &vdv.t,
                                    stream);
  });
}

// The handlers' signatures, by platform (the CUDA ones take XLA's stream).
ffi::Error ForwardCuda(void* stream, int32_t xla_device, const CallAttributes& a, ffi::AnyBuffer q, ffi::AnyBuffer k,
                       ffi::AnyBuffer v, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> lse) {
  return Forward(true, stream, xla_device, a, q, k, v, rest, out, lse);
}
ffi::Error ForwardCpu(int32_t xla_device, const CallAttributes& a, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                      ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse) {
  return Forward(false, nullptr, xla_device, a, q, k, v, rest, out, lse);
}
ffi::Error BackwardCuda(void* stream, int32_t xla_device, const CallAttributes& a, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                        ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                        ffi::Result<ffi::AnyBuffer> dv, ffi::RemainingRets more) {
  return Backward(true, stream, xla_device, a, q, k, v, out, lse, dout, rest, dq, dk, dv, more);
}
ffi::Error BackwardCpu(int32_t xla_device, const CallAttributes& a, ffi::AnyBuffer q, ffi::AnyBuffer k,
                       ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                       ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                       ffi::Result<ffi::AnyBuffer> dv, ffi::RemainingRets more) {
  return Backward(false, nullptr, xla_device, a, q, k, v, out, lse, dout, rest, dq, dk, dv, more);
}

// What every handler takes after its context (stream, device ordinal): the call's attributes.
template <typename Binding>
auto CallAttrs(Binding binding) {
  return std::move(binding).template Attrs<CallAttributes>();
}

// Then n buffer arguments (forward: q, k, v; backward: q, k, v, out, lse, dout)...
template <int n, typename Binding>
auto Args(Binding binding) {
  // Only prvalues: a Binding cannot be copied or moved from outside the chain (its constructors
  // are private), so neither this parameter nor a local may be returned as it is.
  if constexpr (n == 1) {
    return std::move(binding).template Arg<ffi::AnyBuffer>();
  } else {
    return Args<n - 1>(std::move(binding).template Arg<ffi::AnyBuffer>());
  }
}

// ... and n results (forward: out, lse; backward: dq, dk, dv).
template <int n, typename Binding>
auto Rets(Binding binding) {
  // Only prvalues, as in Args.
  if constexpr (n == 1) {
    return std::move(binding).template Ret<ffi::AnyBuffer>();
  } else {
    return Rets<n - 1>(std::move(binding).template Ret<ffi::AnyBuffer>());
  }
}

}  // namespace

// Everything else in this module is hidden (CMake's visibility preset): these are what stria.jax
// looks up.
#pragma GCC visibility push(default)
extern "C" {

// Binds n contexts to a new key: context i serves XLA device xla_devices[i] (-1: every device)
// and its tensors are on DLPack device (device_types[i], device_ids[i]). 0 for a bad argument.
int64_t stria_jax_bind(int n, void* const* ctxs, const int32_t* xla_devices, const int32_t* device_types,
                       const int32_t* device_ids) {
  if (n <= 0 || ctxs == nullptr || xla_devices == nullptr || device_types == nullptr || device_ids == nullptr) return 0;
  Binding binding;
  for (int i = 0; i < n; ++i) {
    if (ctxs[i] == nullptr) return 0;
    binding.push_back(Member{xla_devices[i], DLDevice{static_cast<DLDeviceType>(device_types[i]), device_ids[i]},
                             static_cast<stria_context_t>(ctxs[i]), std::make_shared<Calls>()});
  }
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  const int64_t key = g_next_key++;
  Registry().emplace(key, std::move(binding));
  return key;
}

// Unbinds a key, after any call running on one of its contexts has returned (so the caller may
// then destroy them). Unknown keys are ignored.
void stria_jax_unbind(int64_t key) {
  Binding binding;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    const auto it = Registry().find(key);
    if (it == Registry().end()) return;
    binding = std::move(it->second);
    Registry().erase(it);  // no new call finds it
  }
  for (const Member& m : binding) {  // waits for a running call; a call about to start will not
    std::lock_guard<std::mutex> serial(m.calls->mutex);
    m.calls->bound = false;
  }
}

}  // extern "C"

// The handlers, by platform: the CUDA ones take XLA's stream, the CPU ones none; both the ordinal
// of the XLA device running the program (which rank of a local group serves it). After the
// attention tensors come the optional operands the attributes announce (Extras), and after the
// backward's dq, dk, dv the sinks' gradient when there are sinks.
#define STRIA_CPU_BINDING ffi::Ffi::Bind().Ctx<ffi::DeviceOrdinal>()
#define STRIA_CUDA_BINDING ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>()
XLA_FFI_DEFINE_HANDLER_SYMBOL(stria_jax_forward_cpu, ForwardCpu,
                              Rets<2>(Args<3>(CallAttrs(STRIA_CPU_BINDING)).RemainingArgs()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(stria_jax_backward_cpu, BackwardCpu,
                              Rets<3>(Args<6>(CallAttrs(STRIA_CPU_BINDING)).RemainingArgs()).RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(stria_jax_forward_cuda, ForwardCuda,
                              Rets<2>(Args<3>(CallAttrs(STRIA_CUDA_BINDING)).RemainingArgs()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(stria_jax_backward_cuda, BackwardCuda,
                              Rets<3>(Args<6>(CallAttrs(STRIA_CUDA_BINDING)).RemainingArgs()).RemainingRets());
#undef STRIA_CPU_BINDING
#undef STRIA_CUDA_BINDING
#pragma GCC visibility pop

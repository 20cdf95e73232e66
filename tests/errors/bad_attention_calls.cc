// The attention calls under bad input: every malformed argument returns the documented status with
// a message naming what to fix, never crashes, and leaves the context usable. Each bad call runs on
// a world_size-1 context (stria_context_create) and on a local group of 2 where both ranks get the
// same bad input, and is followed by a correct forward checked against the float64 reference:
// validation must not consume state, poison the context, or desynchronise the group. Then the
// descriptors a fuzzer found.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "errors/errors_common.h"

using namespace errors_test;

namespace {

// A bad call: what it does to a rank's good arguments, and what it must return. `needle` is a
// substring the message must contain (the thing a user has to fix), nullptr for "any message".
struct BadCall {
  std::string name;
  stria_status_t want;
  const char* needle;
  std::function<stria_status_t(stria_context_t, RankTensors&)> call;
};

// gtest prints a parameter's bytes unless told otherwise; the name is what identifies a case.
void PrintTo(const BadCall& c, std::ostream* os) {
  *os << c.name;
}

// A 1-D tensor over static storage (a bad call's tensors must outlive the lambda that makes them).
DLTensor Vector(void* data, int64_t* shape, DLDataType dtype = DLDataType{kDLFloat, 32, 1},
                int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = strides;
  return t;
}

std::vector<BadCall> BadCalls() {
  using F = std::function<stria_status_t(stria_context_t, RankTensors&)>;
  std::vector<BadCall> v;
  const stria_status_t kInv = STRIA_ERROR_INVALID_ARGUMENT, kUns = STRIA_ERROR_UNSUPPORTED;
  auto add = [&](const char* name, stria_status_t want, const char* needle, F f) {
    v.push_back(BadCall{name, want, needle, std::move(f)});
  };
  // A forward and a backward variant of one edit of the arguments.
  auto both = [&](const std::string& name, stria_status_t want, const char* needle, std::function<void(Call&)> edit) {
    v.push_back(BadCall{name + "_fwd", want, needle, [edit](stria_context_t c, RankTensors& t) {
                          Call a(t);
                          edit(a);
                          return a.Forward(c);
                        }});
    v.push_back(BadCall{name + "_bwd", want, needle, [edit](stria_context_t c, RankTensors& t) {
                          Call a(t);
                          edit(a);
                          return a.Backward(c);
                        }});
  };
  auto bwd = [&](const std::string& name, stria_status_t want, const char* needle, std::function<void(Call&)> edit) {
    v.push_back(BadCall{name, want, needle, [edit](stria_context_t c, RankTensors& t) {
                          Call a(t);
                          edit(a);
                          return a.Backward(c);
                        }});
  };

  // NULL for every pointer argument.
  both("params_null", kInv, "params", [](Call& a) { a.p = nullptr; });
  both("q_null", kInv, "q is NULL", [](Call& a) { a.qp = nullptr; });
  both("k_null", kInv, "k is NULL", [](Call& a) { a.kp = nullptr; });
  both("v_null", kInv, "v is NULL", [](Call& a) { a.vp = nullptr; });
  both("out_null", kInv, "out is NULL", [](Call& a) { a.outp = nullptr; });
  both("lse_null", kInv, "lse is NULL", [](Call& a) { a.lsep = nullptr; });
  bwd("dout_null_bwd", kInv, "dout is NULL", [](Call& a) { a.doutp = nullptr; });
  bwd("dq_null_bwd", kInv, "dq is NULL", [](Call& a) { a.dqp = nullptr; });
  bwd("dk_null_bwd", kInv, "dk is NULL", [](Call& a) { a.dkp = nullptr; });
  bwd("dv_null_bwd", kInv, "dv is NULL", [](Call& a) { a.dvp = nullptr; });
  both("q_shape_null", kInv, "q", [](Call& a) { a.q.shape = nullptr; });

  // Wrong ndim.
  both("q_ndim3", kInv, "ndim", [](Call& a) {
    static int64_t s[3] = {kB, kL, kHq * kD};
    a.q.ndim = 3;
    a.q.shape = s;
    a.q.strides = nullptr;
  });
  both("lse_ndim2", kInv, "ndim", [](Call& a) {
    static int64_t s[2] = {kB * kHq, kL};
    a.lse.ndim = 2;
    a.lse.shape = s;
    a.lse.strides = nullptr;
  });
  both("k_ndim5", kInv, "ndim", [](Call& a) {
    static int64_t s[5] = {kB, kL, kHkv, kD, 1};
    a.k.ndim = 5;
    a.k.shape = s;
    a.k.strides = nullptr;
  });

  // Shapes and strides whose element count or span overflows int64 (or passes 2^50 bytes): they
  // used to wrap into small workspaces that the backend then overran.
  both("q_count_overflows", kInv, "too large", [](Call& a) {
    static int64_t s[4] = {int64_t{1} << 62, kL, kHq, kD};
    a.q.shape = s;
    a.q.strides = nullptr;
  });
  both("q_B_and_L_2_40", kInv, "too large", [](Call& a) {
    static int64_t s[4] = {int64_t{1} << 40, int64_t{1} << 40, kHq, kD};
    a.q.shape = s;
    a.q.strides = nullptr;
  });
  both("k_heads_2_61", kInv, "too large", [](Call& a) {
    static int64_t s[4] = {kB, kL, int64_t{1} << 61, kD};
    a.k.shape = s;
    a.k.strides = nullptr;
  });
  both("q_stride_wraps", kInv, "too large", [](Call& a) {
    static int64_t s[4] = {2, kL, kHq, kD}, st[4] = {INT64_MAX / 2, kHq * kD, kD, 1};
    a.q.shape = s;
    a.q.strides = st;
  });
  both("out_stride_int64_min", kInv, "too large", [](Call& a) {
    static int64_t s[4] = {2, kL, kHq, kD}, st[4] = {INT64_MIN, kHq * kD, kD, 1};
    a.out.shape = s;
    a.out.strides = st;
  });
  bwd("dq_stride_huge_negative_bwd", kInv, "too large", [](Call& a) {
    static int64_t s[4] = {2, kL, kHq, kD}, st[4] = {-(int64_t{1} << 60), kHq * kD, kD, 1};
    a.dq.shape = s;
    a.dq.strides = st;
  });

  // Outputs that are broadcast views (stride 0 over a dimension of size > 1): rows would collide.
  add("out_broadcast_over_L_fwd", kInv, "must not overlap", [](stria_context_t c, RankTensors& t) {
    static int64_t st[4] = {kL * kHq * kD, 0, kD, 1};
    Call a(t);
    a.out.strides = st;
    return a.Forward(c);
  });
  add("lse_broadcast_over_heads_fwd", kInv, "must not overlap", [](stria_context_t c, RankTensors& t) {
    static int64_t st[3] = {kHq * kL, 0, 1};
    Call a(t);
    a.lse.strides = st;
    return a.Forward(c);
  });
  bwd("dk_broadcast_over_L_bwd", kInv, "must not overlap", [](Call& a) {
    static int64_t st[4] = {kL * kHkv * kD, 0, kD, 1};
    a.dk.strides = st;
  });

  // Mismatched shapes (views of the same storage, smaller than it, so nothing reads past it).
  both("k_L_differs", kInv, "k has shape", [](Call& a) {
    static int64_t s[4] = {kB, kL / 2, kHkv, kD};
    a.k.shape = s;
    a.k.strides = nullptr;
  });
  add("v_heads_differ_fwd", kInv, "v has shape", [](stria_context_t c, RankTensors& t) {
    Tensor v2({kB, kL, 2, kD}, Dt::kF32);
    Call a(t);
    a.vp = &v2.dl;
    return a.Forward(c);
  });
  both("out_shape", kInv, "out has shape", [](Call& a) {
    static int64_t s[4] = {kB, kL, kHq, kD / 2};
    a.out.shape = s;
    a.out.strides = nullptr;
  });
  both("lse_shape", kInv, "lse has shape", [](Call& a) {
    static int64_t s[3] = {kB, kHq, kL / 2};
    a.lse.shape = s;
    a.lse.strides = nullptr;
  });
  bwd("dk_shape_bwd", kInv, "dk has shape", [](Call& a) {
    static int64_t s[4] = {kB, kL, kHkv, kD / 2};
    a.dk.shape = s;
    a.dk.strides = nullptr;
  });
  bwd("dout_shape_bwd", kInv, "dout has shape", [](Call& a) {
    static int64_t s[4] = {kB, kL / 2, kHq, kD};
    a.dout.shape = s;
    a.dout.strides = nullptr;
  });
  add("hq_not_divisible_by_hkv_fwd", kInv, "divide", [](stria_context_t c, RankTensors&) {
    RankTensors t3(kL, Dt::kF32, kD, /*Hq=*/3, /*Hkv=*/2);
    Call a(t3);
    return a.Forward(c);
  });
  both("negative_dim", kInv, "negative", [](Call& a) {
    static int64_t s[4] = {kB, kL, kHkv, -kD};
    a.v.shape = s;
    a.v.strides = nullptr;
  });

  // Dtypes.
  add("k_dtype_differs_fwd", kInv, "dtype", [](stria_context_t c, RankTensors& t) {
    Tensor k16({kB, kL, kHkv, kD}, Dt::kF16);
    Call a(t);
    a.kp = &k16.dl;
    return a.Forward(c);
  });
  add("dq_dtype_differs_bwd", kInv, "dtype", [](stria_context_t c, RankTensors& t) {
    Tensor dq16({kB, kL, kHq, kD}, Dt::kBF16);
    Call a(t);
    a.dqp = &dq16.dl;
    return a.Backward(c);
  });
  both("all_int32", kUns, "int32", [](Call& a) {  // int32 has float32's size: the storage fits
    for (DLTensor* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) t->dtype = Dl(kDLInt, 32);
  });
  add("all_float64_fwd", kUns, "float64", [](stria_context_t c, RankTensors& t) {
    Raw q({kB, kL, kHq, kD}, Dl(kDLFloat, 64)), k({kB, kL, kHkv, kD}, Dl(kDLFloat, 64));
    Raw v({kB, kL, kHkv, kD}, Dl(kDLFloat, 64)), o({kB, kL, kHq, kD}, Dl(kDLFloat, 64));
    Call a(t);
    a.qp = &q.dl;
    a.kp = &k.dl;
    a.vp = &v.dl;
    a.outp = &o.dl;
    return a.Forward(c);
  });
  add("q_lanes2_fwd", kUns, "float32x2", [](stria_context_t c, RankTensors& t) {
    Raw q({kB, kL, kHq, kD}, Dl(kDLFloat, 32, 2));
    Call a(t);
    a.qp = &q.dl;
    return a.Forward(c);
  });
  both("q_lanes0", kUns, "q", [](Call& a) { a.q.dtype = Dl(kDLFloat, 32, 0); });
  both("lse_float16", kInv, "float32", [](Call& a) {
    a.lse.dtype = Dl(kDLFloat, 16);  // half the bytes: fits the float32 storage
  });

  // Devices, strides, data pointers.
  both("q_on_cuda", kInv, "cuda", [](Call& a) { a.q.device = DLDevice{kDLCUDA, 0}; });
  both("out_on_cuda", kInv, "cuda", [](Call& a) { a.out.device = DLDevice{kDLCUDA, 0}; });
  add("q_last_stride_2_fwd", kInv, "stride", [](stria_context_t c, RankTensors& t) {
    Tensor wide({kB, kL, kHq, 2 * kD}, Dt::kF32);
    static int64_t s[4] = {kB, kL, kHq, kD};
    static int64_t st[4] = {kL * kHq * 2 * kD, kHq * 2 * kD, 2 * kD, 2};
    Call a(t);
    a.q = wide.dl;
    a.q.shape = s;
    a.q.strides = st;
    return a.Forward(c);
  });
  add("dv_last_stride_2_bwd", kInv, "stride", [](stria_context_t c, RankTensors& t) {
    Tensor wide({kB, kL, kHkv, 2 * kD}, Dt::kF32);
    static int64_t s[4] = {kB, kL, kHkv, kD};
    static int64_t st[4] = {kL * kHkv * 2 * kD, kHkv * 2 * kD, 2 * kD, 2};
    Call a(t);
    a.dv = wide.dl;
    a.dv.shape = s;
    a.dv.strides = st;
    return a.Backward(c);
  });
  both("v_data_null", kInv, "NULL data", [](Call& a) { a.v.data = nullptr; });
  both("lse_data_null", kInv, "NULL data", [](Call& a) { a.lse.data = nullptr; });
  both("q_byte_offset_1", kInv, "aligned", [](Call& a) { a.q.byte_offset = 1; });
  both("stream_non_null", kInv, "stream", [](Call& a) { a.stream = reinterpret_cast<void*>(0x10); });

  // Params.
  both("params_struct_size_0", kInv, "struct_size", [](Call& a) { a.params.struct_size = 0; });
  both("params_struct_size_4", kInv, "struct_size", [](Call& a) { a.params.struct_size = 4; });
  both("params_struct_size_huge", kInv, "struct_size", [](Call& a) { a.params.struct_size = SIZE_MAX; });
  both("params_struct_size_1M", kInv, "struct_size", [](Call& a) { a.params.struct_size = size_t{1} << 20; });
  // A caller built against a newer header: bytes past the fields this library knows.
  add("params_newer_nonzero_tail_fwd", kUns, "newer", [](stria_context_t c, RankTensors& t) {
    struct {
      stria_attention_params_t p;
      uint64_t tail[4];
    } big;
    std::memset(&big, 0, sizeof big);
    stria_attention_params_init(&big.p);
    big.p.struct_size = sizeof big;
    big.tail[2] = 1;
    Call a(t);
    a.p = &big.p;
    return a.Forward(c);
  });
  add("params_newer_zero_tail_fwd_is_accepted", STRIA_SUCCESS, nullptr, [](stria_context_t c, RankTensors& t) {
    struct {
      stria_attention_params_t p;
      uint64_t tail[4];
    } big;
    std::memset(&big, 0, sizeof big);
    stria_attention_params_init(&big.p);
    big.p.struct_size = sizeof big;
    Call a(t);
    a.p = &big.p;
    return a.Forward(c);
  });
  // Document boundaries (S is kL on one rank, 2·kL on two: these are wrong for both).
  static const int64_t docs_from_1[3] = {1, 4, kL};
  static const int64_t docs_decrease[4] = {0, 5, 3, kL};
  static const int64_t docs_end_short[2] = {0, kL / 2};
  static const int64_t docs_end_long[2] = {0, 4 * kL};
  both("documents_start_at_1", kInv, "starts at 1", [](Call& a) { a.Documents(docs_from_1, 2); });
  both("documents_decrease", kInv, "decreases", [](Call& a) { a.Documents(docs_decrease, 3); });
  both("documents_end_short", kInv, "sequence length", [](Call& a) { a.Documents(docs_end_short, 1); });
  both("documents_end_long", kInv, "sequence length", [](Call& a) { a.Documents(docs_end_long, 1); });
  both("documents_null", kInv, "cu_seqlens is NULL", [](Call& a) { a.Documents(nullptr, 2); });
  both("documents_num_seqs_0", kInv, "num_seqs 0", [](Call& a) { a.Documents(docs_end_short, 0); });
  both("documents_num_seqs_negative", kInv, "num_seqs -1", [](Call& a) { a.Documents(docs_end_short, -1); });
  both("documents_num_seqs_huge", kInv, "num_seqs", [](Call& a) { a.Documents(docs_end_short, INT64_MAX); });
  both("documents_params_null", kInv, "params", [](Call& a) {
    a.Documents(docs_end_short, 1);
    a.p = nullptr;
  });
  both("documents_q_null", kInv, "q is NULL", [](Call& a) {
    a.Documents(docs_end_short, 1);
    a.qp = nullptr;
  });
  both("window_left_below_minus_1", kInv, "window_left -2", [](Call& a) { a.Window(-2, 3); });
  both("window_right_below_minus_1", kInv, "window_right -5", [](Call& a) { a.Window(4, -5); });
  both("window_int64_min", kInv, "must be >= 0", [](Call& a) { a.Window(INT64_MIN, -1); });
  both("window_documents_null", kInv, "cu_seqlens is NULL", [](Call& a) {
    a.Window(4, -1);
    a.num_seqs = 2;
  });
  both("window_documents_without_count", kInv, "num_seqs 0", [](Call& a) {
    a.Window(4, -1);
    a.cu_seqlens = docs_end_short;
  });
  both("window_bad_documents", kInv, "decreases", [](Call& a) {
    a.Window(4, 0);
    a.cu_seqlens = docs_decrease;
    a.num_seqs = 3;
  });
  both("window_q_null", kInv, "q is NULL", [](Call& a) {
    a.Window(4, -1);
    a.qp = nullptr;
  });
  both("scale_nan", kInv, "softmax_scale", [](Call& a) { a.params.softmax_scale = NAN; });
  both("scale_negative", kInv, "softmax_scale", [](Call& a) { a.params.softmax_scale = -0.5f; });
  both("scale_inf", kInv, "softmax_scale", [](Call& a) { a.params.softmax_scale = INFINITY; });
  both("scale_minus_inf", kInv, "softmax_scale", [](Call& a) { a.params.softmax_scale = -INFINITY; });
  both("softcap_nan", kInv, "softcap", [](Call& a) { a.params.softcap = NAN; });
  both("softcap_negative", kInv, "softcap", [](Call& a) { a.params.softcap = -1.f; });
  both("softcap_inf", kInv, "softcap", [](Call& a) { a.params.softcap = INFINITY; });
  // The mask in params goes through the same checks as the _documents and _window arguments.
  both("params_documents_decrease", kInv, "decreases", [](Call& a) {
    a.params.cu_seqlens = docs_decrease;
    a.params.num_seqs = 3;
  });
  both("params_documents_null", kInv, "cu_seqlens is NULL", [](Call& a) { a.params.num_seqs = 2; });
  both("params_window_below_minus_1", kInv, "window_left -2", [](Call& a) { a.params.window_left = -2; });
  // ... and is given one way only.
  both("params_documents_and_documents_call", kInv, "one way", [](Call& a) {
    a.Documents(docs_end_short, 1);
    a.params.cu_seqlens = docs_end_short;
    a.params.num_seqs = 1;
  });
  both("params_window_and_window_call", kInv, "one way", [](Call& a) {
    a.Window(4, -1);
    a.params.window_right = 2;
  });
  // Sinks: float32 [Hq], contiguous; their gradient likewise, and only with them.
  both("sinks_wrong_length", kInv, "params->sinks has shape", [](Call& a) {
    static float z[kHq + 1] = {};
    static int64_t shape[1] = {kHq + 1};
    static DLTensor t = Vector(z, shape);
    a.params.sinks = &t;
  });
  both("sinks_float16", kInv, "params->sinks", [](Call& a) {
    static uint16_t z[kHq] = {};
    static int64_t shape[1] = {kHq};
    static DLTensor t = Vector(z, shape, DLDataType{kDLFloat, 16, 1});
    a.params.sinks = &t;
  });
  both("sinks_strided", kInv, "params->sinks", [](Call& a) {
    static float z[2 * kHq] = {};
    static int64_t shape[1] = {kHq}, strides[1] = {2};
    static DLTensor t = Vector(z, shape, DLDataType{kDLFloat, 32, 1}, strides);
    a.params.sinks = &t;
  });
  both("sinks_data_null", kInv, "params->sinks", [](Call& a) {
    static int64_t shape[1] = {kHq};
    static DLTensor t = Vector(nullptr, shape);
    a.params.sinks = &t;
  });
  bwd("dsinks_without_sinks_bwd", kInv, "params->sinks is NULL", [](Call& a) {
    static float dz[kHq] = {};
    static int64_t shape[1] = {kHq};
    static DLTensor t = Vector(dz, shape);
    a.params.dsinks = &t;
  });
  bwd("dsinks_wrong_length_bwd", kInv, "params->dsinks has shape", [](Call& a) {
    static float z[kHq] = {}, dz[kHq - 1] = {};
    static int64_t shape[1] = {kHq}, dshape[1] = {kHq - 1};
    static DLTensor t = Vector(z, shape), dt = Vector(dz, dshape);
    a.params.sinks = &t;
    a.params.dsinks = &dt;
  });
  bwd("dsinks_broadcast_bwd", kInv, "params->dsinks", [](Call& a) {
    static float z[kHq] = {}, dz[1] = {};
    static int64_t shape[1] = {kHq}, strides[1] = {0};
    static DLTensor t = Vector(z, shape), dt = Vector(dz, shape, DLDataType{kDLFloat, 32, 1}, strides);
    a.params.sinks = &t;
    a.params.dsinks = &dt;
  });
  both("layout_7", kInv, "layout", [](Call& a) { a.params.layout = static_cast<stria_layout_t>(7); });
  both("layout_minus_1", kInv, "layout", [](Call& a) { a.params.layout = static_cast<stria_layout_t>(-1); });
  // Zigzag needs an even number of tokens per rank (S % 2N == 0).
  add("zigzag_odd_L_fwd", kInv, "zigzag", [](stria_context_t c, RankTensors&) {
    RankTensors t7(7);
    Call a(t7);
    a.params.layout = STRIA_LAYOUT_ZIGZAG;
    return a.Forward(c);
  });

  // Head dims the CPU backend does not take: the message names what it does.
  add("head_dim_0_fwd", kUns, "1..512", [](stria_context_t c, RankTensors&) {
    RankTensors t0(kL, Dt::kF32, 0);
    Call a(t0);
    return a.Forward(c);
  });
  add("head_dim_600_fwd", kUns, "1..512", [](stria_context_t c, RankTensors&) {
    RankTensors t600(kL, Dt::kF32, 600);
    Call a(t600);
    return a.Forward(c);
  });
  add("head_dim_600_bwd", kUns, "1..512", [](stria_context_t c, RankTensors&) {
    RankTensors t600(kL, Dt::kF32, 600);
    Call a(t600);
    return a.Backward(c);
  });
  return v;
}

void ExpectOutcome(const BadCall& c, stria_status_t got, const std::string& msg, int rank) {
  EXPECT_EQ(got, c.want) << "rank " << rank << ": got " << stria_status_string(got) << " (" << msg << ")";
  if (c.want == STRIA_SUCCESS) {
    EXPECT_EQ(msg, "") << "rank " << rank << ": a successful call clears the last error";
    return;
  }
  EXPECT_FALSE(msg.empty()) << "rank " << rank;
  if (c.needle) {
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "rank " << rank << ": message: " << msg;
  }
}

class BadArguments : public ::testing::TestWithParam<BadCall> {};

TEST_P(BadArguments, SingleRankContextStaysUsable) {
  const BadCall& c = GetParam();
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  RankTensors t;
  const stria_status_t got = c.call(ctx, t);
  ExpectOutcome(c, got, stria_get_last_error(), 0);
  // The same mistake twice gives the same answer (nothing was consumed by the first).
  EXPECT_EQ(c.call(ctx, t), got);
  ExpectCorrectForward({ctx});
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

TEST_P(BadArguments, GroupOfTwoBothRanksBadStaysUsable) {
  const BadCall& c = GetParam();
  LocalGroup g(2, kGroupTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  std::vector<stria_status_t> st(2);
  std::vector<std::string> msg(2);
  RunRanks(2, [&](int r) {
    RankTensors t;
    st[static_cast<size_t>(r)] = c.call(g.ctx[static_cast<size_t>(r)], t);
    msg[static_cast<size_t>(r)] = stria_get_last_error();
  });
  for (int r = 0; r < 2; ++r) ExpectOutcome(c, st[static_cast<size_t>(r)], msg[static_cast<size_t>(r)], r);
  ExpectCorrectForward(g.ctx);
}

INSTANTIATE_TEST_SUITE_P(Attention, BadArguments, ::testing::ValuesIn(BadCalls()),
                         [](const ::testing::TestParamInfo<BadCall>& i) { return i.param.name; });

}  // namespace

// Descriptors a fuzzer of the C ABI found to reach undefined behaviour or a hang (each was legal
// or should have been refused; the memory each describes exists). Under UBSan any of them fails.
namespace fuzzed {

DLTensor Describe(void* data, int ndim, int64_t* shape, int64_t* strides, uint64_t byte_offset = 0) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = byte_offset;
  return t;
}

TEST(FuzzedArguments, EmptyTensorsWithHugeOtherDimensions) {
  // [INT64_MAX, 2, 0]: empty, so no extent check applies, but its element count must not be
  // computed by multiplying the other dimensions; [2^40, 0] must not loop over 2^40 tokens.
  int64_t huge[3] = {INT64_MAX, 2, 0};
  DLTensor full = Describe(nullptr, 3, huge, nullptr), local = full;
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 1, &full, &local, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 2, &full, &local, nullptr), STRIA_ERROR_INVALID_ARGUMENT)
      << "a sequence of 0 tokens";
  float cell = 0;
  int64_t long_empty[2] = {int64_t{1} << 40, 0};
  full = Describe(&cell, 2, long_empty, nullptr);
  local = full;
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 0, &full, &local, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  EXPECT_EQ(stria_unshard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 0, &local, &full, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  int64_t rows_of_nothing[2] = {2, 0};  // NULL data: no memcpy may see it
  full = Describe(nullptr, 2, rows_of_nothing, nullptr);
  local = full;
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_STRIPED, 1, 0, 0, &full, &local, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
}

TEST(FuzzedArguments, ByteOffsetsThatWrap) {
  // Empty: the offset is never applied (NULL + offset would be undefined).
  int64_t empty[2] = {2, 0};
  DLTensor full = Describe(nullptr, 2, empty, nullptr, ~uint64_t{0} - 63), local = full;
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 0, &full, &local, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  // Not empty: an offset that wraps around the address space is refused.
  float cells[4] = {};
  int64_t four[1] = {4};
  full = Describe(cells, 1, four, nullptr, ~uint64_t{0} - 3);
  DLTensor good = Describe(cells, 1, four, nullptr);
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 0, &full, &good, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("wraps around"), std::string::npos) << stria_get_last_error();
}

TEST(FuzzedArguments, AnyStrideOnADimensionOfSizeOne) {
  // DLPack allows any stride on a dimension of size 1 (it never moves); k and v with a batch
  // stride of INT64_MAX - 1 must give the same result as compact ones.
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  RankTensors t;
  ASSERT_EQ(kB, 1);
  Call compact(t);
  ASSERT_EQ(compact.Forward(ctx), STRIA_SUCCESS) << stria_get_last_error();
  const std::vector<double> want = t.out.ToDouble();
  t.out.Poison();
  Call odd(t);
  int64_t kv_strides[4] = {INT64_MAX - 1, kHkv * kD, kD, 1};
  odd.k.strides = kv_strides;
  odd.v.strides = kv_strides;
  ASSERT_EQ(odd.Forward(ctx), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(t.out.ToDouble(), want);
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

TEST(FuzzedArguments, DeviceTypeOutsideTheEnum) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  const int seventeen = 17;  // no DLDeviceType: read as a raw int, never as the enum
  std::memcpy(&cfg.device.device_type, &seventeen, sizeof seventeen);
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_NE(stria_context_create(&cfg, &ctx), STRIA_SUCCESS);
  EXPECT_STRNE(stria_get_last_error(), "");
  EXPECT_EQ(ctx, nullptr);
  stria_context_t group[2] = {nullptr, nullptr};
  EXPECT_NE(stria_context_create_local_group(&cfg, 2, group), STRIA_SUCCESS);
  EXPECT_STRNE(stria_get_last_error(), "");
  float cells[4] = {};
  int64_t four[1] = {4};
  DLTensor full = Describe(cells, 1, four, nullptr), local = full;
  std::memcpy(&full.device.device_type, &seventeen, sizeof seventeen);
  std::memcpy(&local.device.device_type, &seventeen, sizeof seventeen);
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_CONTIGUOUS, 1, 0, 0, &full, &local, nullptr), STRIA_ERROR_UNSUPPORTED);
  EXPECT_STRNE(stria_get_last_error(), "");
}

}  // namespace fuzzed

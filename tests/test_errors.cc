// The C ABI under bad input: every function returns the documented status with a message, never
// crashes, and a rejected call leaves the context usable. Each bad attention call runs on a
// world_size-1 context (stria_context_create) and on a local group of 2 where both ranks get the
// same bad input, and is followed by a correct forward checked against the float64 reference:
// validation must not consume state, poison the context, or desynchronise the group.
#include <dirent.h>
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "test_util.h"

using namespace stria_test;

namespace {

// Every good call here is this small, so a case costs milliseconds.
constexpr int64_t kB = 1, kL = 8, kHq = 2, kHkv = 1, kD = 16;
// Generous for a 2-rank exchange of a few KiB, small enough that a hang fails the test quickly.
constexpr double kGroupTimeoutS = 2.0;

// One rank's tensors of a forward/backward call, filled with finite values.
struct RankTensors : AttentionTensors {
  explicit RankTensors(int64_t L = kL, Dt dt = Dt::kF32, int64_t D = kD, int64_t Hq = kHq, int64_t Hkv = kHkv)
      : AttentionTensors(kB, L, Hq, Hkv, D, dt, 7) {}
};

// The arguments of one call, defaulting to a rank's good tensors. The DLTensors are copies, so a
// case edits one field (shape, dtype, device, ...) without touching the rank's tensors.
struct Call {
  stria_attention_params_t params;
  const stria_attention_params_t* p = &params;
  DLTensor q, k, v, out, lse, dout, dq, dk, dv;
  const DLTensor *qp = &q, *kp = &k, *vp = &v, *doutp = &dout;
  DLTensor *outp = &out, *lsep = &lse, *dqp = &dq, *dkp = &dk, *dvp = &dv;
  void* stream = nullptr;
  bool documents = false;  // through the _documents entry points, with these boundaries
  const int64_t* cu_seqlens = nullptr;
  int64_t num_seqs = 0;
  bool windowed = false;  // through the _window entry points, with this window (and the documents)
  int64_t window_left = -1, window_right = -1;

  explicit Call(RankTensors& t)
      : q(t.q.dl),
        k(t.k.dl),
        v(t.v.dl),
        out(t.out.dl),
        lse(t.lse.dl),
        dout(t.dout.dl),
        dq(t.dq.dl),
        dk(t.dk.dl),
        dv(t.dv.dl) {
    stria_attention_params_init(&params);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  stria_status_t Forward(stria_context_t c) {
    if (windowed)
      return stria_attention_forward_window(c, p, window_left, window_right, cu_seqlens, num_seqs, qp, kp, vp, outp,
                                            lsep, stream);
    if (documents) return stria_attention_forward_documents(c, p, cu_seqlens, num_seqs, qp, kp, vp, outp, lsep, stream);
    return stria_attention_forward(c, p, qp, kp, vp, outp, lsep, stream);
  }
  stria_status_t Backward(stria_context_t c) {
    if (windowed)
      return stria_attention_backward_window(c, p, window_left, window_right, cu_seqlens, num_seqs, qp, kp, vp, outp,
                                             lsep, doutp, dqp, dkp, dvp, stream);
    if (documents)
      return stria_attention_backward_documents(c, p, cu_seqlens, num_seqs, qp, kp, vp, outp, lsep, doutp, dqp, dkp,
                                                dvp, stream);
    return stria_attention_backward(c, p, qp, kp, vp, outp, lsep, doutp, dqp, dkp, dvp, stream);
  }
  void Documents(const int64_t* cu, int64_t n) {
    documents = true;
    cu_seqlens = cu;
    num_seqs = n;
  }
  void Window(int64_t left, int64_t right) {
    windowed = true;
    window_left = left;
    window_right = right;
  }
};

// Raw host storage for a DLTensor whose dtype the Tensor helper does not model (int32, float64,
// vectors). Validation must reject these before reading, but the storage is real anyway.
struct Raw {
  std::vector<int64_t> shape;
  std::vector<uint64_t> words;
  DLTensor dl{};
  Raw(std::vector<int64_t> s, DLDataType dt) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    words.assign(static_cast<size_t>((n * dt.bits * dt.lanes / 8 + 7) / 8 + 1), 0);
    dl.data = words.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.dtype = dt;
    dl.shape = shape.data();
    dl.strides = nullptr;
  }
};

DLDataType Dl(uint8_t code, uint8_t bits, uint16_t lanes = 1) {
  DLDataType t;
  t.code = code;
  t.bits = bits;
  t.lanes = lanes;
  return t;
}

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
  add("head_dim_0_fwd", kUns, "1..256", [](stria_context_t c, RankTensors&) {
    RankTensors t0(kL, Dt::kF32, 0);
    Call a(t0);
    return a.Forward(c);
  });
  add("head_dim_300_fwd", kUns, "1..256", [](stria_context_t c, RankTensors&) {
    RankTensors t300(kL, Dt::kF32, 300);
    Call a(t300);
    return a.Forward(c);
  });
  add("head_dim_300_bwd", kUns, "1..256", [](stria_context_t c, RankTensors&) {
    RankTensors t300(kL, Dt::kF32, 300);
    Call a(t300);
    return a.Backward(c);
  });
  return v;
}

// A correct forward on every context of `ctxs` (one ring), checked against the float64 dense
// reference: proof that what came before left the contexts fully usable.
void ExpectCorrectForward(const std::vector<stria_context_t>& ctxs, uint64_t seed = 99) {
  const int n = static_cast<int>(ctxs.size());
  const int64_t S = kL * n;
  std::mt19937_64 rng(seed);
  Tensor q({kB, S, kHq, kD}, Dt::kF32), k({kB, S, kHkv, kD}, Dt::kF32), v({kB, S, kHkv, kD}, Dt::kF32);
  q.FillRandom(rng);
  k.FillRandom(rng);
  v.FillRandom(rng);
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), nullptr, kB, S, kHq, kHkv, kD, true,
                                       1.0 / std::sqrt(static_cast<double>(kD)));
  Tensor out_full({kB, S, kHq, kD}, Dt::kF32), lse_full({kB, kHq, S}, Dt::kF32);
  out_full.Poison();
  lse_full.Poison();
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  std::vector<stria_status_t> st(static_cast<size_t>(n));
  std::vector<std::string> err(static_cast<size_t>(n));
  std::mutex mu;
  RunRanks(n, [&](int r) {
    const stria_layout_t lay = params.layout;
    Tensor ql({kB, kL, kHq, kD}, Dt::kF32), kl({kB, kL, kHkv, kD}, Dt::kF32), vl({kB, kL, kHkv, kD}, Dt::kF32);
    stria_shard(lay, n, r, 1, &q.dl, &ql.dl, nullptr);
    stria_shard(lay, n, r, 1, &k.dl, &kl.dl, nullptr);
    stria_shard(lay, n, r, 1, &v.dl, &vl.dl, nullptr);
    Tensor out({kB, kL, kHq, kD}, Dt::kF32), lse({kB, kHq, kL}, Dt::kF32);
    out.Poison();
    lse.Poison();
    st[static_cast<size_t>(r)] = stria_attention_forward(ctxs[static_cast<size_t>(r)], &params, &ql.dl, &kl.dl, &vl.dl,
                                                         &out.dl, &lse.dl, nullptr);
    err[static_cast<size_t>(r)] = stria_get_last_error();
    std::lock_guard<std::mutex> lock(mu);
    stria_unshard(lay, n, r, 1, &out.dl, &out_full.dl, nullptr);
    stria_unshard(lay, n, r, 2, &lse.dl, &lse_full.dl, nullptr);
  });
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << err[static_cast<size_t>(r)];
  EXPECT_LT(RelError(out_full.ToDouble(), ref.out), 1e-5);
  EXPECT_LT(RelError(lse_full.ToDouble(), ref.lse), 1e-5);
}

stria_context_t CreateSingle() {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.timeout_s = kGroupTimeoutS;
  stria_context_t ctx = nullptr;
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  return ctx;
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

// NULL for the output pointers and objects of the non-attention functions.
TEST(NullPointers, EveryOtherFunction) {
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  stria_context_config_t cfg;
  ASSERT_EQ(stria_context_config_init(&cfg), STRIA_SUCCESS);
  auto expect_invalid = [](stria_status_t s, const char* what) {
    EXPECT_EQ(s, STRIA_ERROR_INVALID_ARGUMENT) << what;
    EXPECT_STRNE(stria_get_last_error(), "") << what;
  };
  expect_invalid(stria_context_config_init(nullptr), "config_init(NULL)");
  expect_invalid(stria_attention_params_init(nullptr), "params_init(NULL)");
  expect_invalid(stria_get_unique_id(nullptr), "get_unique_id(NULL)");
  stria_context_t out = reinterpret_cast<stria_context_t>(0x99);
  expect_invalid(stria_context_create(nullptr, &out), "context_create(NULL config)");
  EXPECT_EQ(out, nullptr) << "a failed create leaves *ctx NULL";
  expect_invalid(stria_context_create(&cfg, nullptr), "context_create(NULL ctx)");
  stria_context_t group[2] = {reinterpret_cast<stria_context_t>(0x99), reinterpret_cast<stria_context_t>(0x99)};
  expect_invalid(stria_context_create_local_group(nullptr, 2, group), "create_local_group(NULL config)");
  EXPECT_EQ(group[0], nullptr);
  EXPECT_EQ(group[1], nullptr);
  expect_invalid(stria_context_create_local_group(&cfg, 2, nullptr), "create_local_group(NULL ctxs)");
  const DLDevice cpus[2] = {{kDLCPU, 0}, {kDLCPU, 0}};
  group[0] = group[1] = reinterpret_cast<stria_context_t>(0x99);
  expect_invalid(stria_context_create_local_group_on_devices(&cfg, nullptr, 2, group), "on_devices(NULL devices)");
  EXPECT_EQ(group[0], nullptr);
  EXPECT_EQ(group[1], nullptr);
  expect_invalid(stria_context_create_local_group_on_devices(nullptr, cpus, 2, group), "on_devices(NULL config)");
  expect_invalid(stria_context_create_local_group_on_devices(&cfg, cpus, 2, nullptr), "on_devices(NULL ctxs)");
  expect_invalid(stria_context_get_rank(ctx, nullptr), "get_rank(NULL)");
  expect_invalid(stria_context_get_world_size(ctx, nullptr), "get_world_size(NULL)");
  int n = 0;
  expect_invalid(stria_context_get_rank(nullptr, &n), "get_rank(NULL ctx)");
  expect_invalid(stria_context_get_world_size(nullptr, &n), "get_world_size(NULL ctx)");
  expect_invalid(stria_context_abort(nullptr), "abort(NULL)");
  expect_invalid(stria_context_destroy(nullptr), "destroy(NULL)");
  expect_invalid(stria_layout_positions(STRIA_LAYOUT_STRIPED, 8, 2, 0, nullptr), "positions(NULL)");
  expect_invalid(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 64, 4, 1, nullptr), "analyze_balance(NULL)");
  expect_invalid(stria_analyze_balance_steps(STRIA_LAYOUT_STRIPED, 1, 64, 4, 1, nullptr), "balance_steps(NULL)");
  stria_step_time_t steps[2];
  expect_invalid(stria_context_set_call_tag(nullptr, 1), "set_call_tag(NULL ctx)");
  expect_invalid(stria_context_set_deterministic(nullptr, 1), "set_deterministic(NULL ctx)");
  expect_invalid(stria_context_set_deterministic(ctx, 2), "set_deterministic(2)");
  expect_invalid(stria_context_set_deterministic(ctx, -1), "set_deterministic(-1)");
  expect_invalid(stria_context_get_step_times(ctx, steps, 2, nullptr), "get_step_times(NULL num_steps)");
  expect_invalid(stria_context_get_step_times(ctx, nullptr, 2, &n), "get_step_times(NULL steps)");
  expect_invalid(stria_context_get_step_times(ctx, steps, -1, &n), "get_step_times(capacity -1)");
  Tensor full({16, 4}, Dt::kF32), local({8, 4}, Dt::kF32);
  expect_invalid(stria_shard(STRIA_LAYOUT_STRIPED, 2, 0, 0, nullptr, &local.dl, nullptr), "shard(NULL full)");
  expect_invalid(stria_shard(STRIA_LAYOUT_STRIPED, 2, 0, 0, &full.dl, nullptr, nullptr), "shard(NULL local)");
  expect_invalid(stria_unshard(STRIA_LAYOUT_STRIPED, 2, 0, 0, nullptr, &full.dl, nullptr), "unshard(NULL local)");
  expect_invalid(stria_unshard(STRIA_LAYOUT_STRIPED, 2, 0, 0, &local.dl, nullptr, nullptr), "unshard(NULL full)");
  // Nothing above touched the context.
  ExpectCorrectForward({ctx});
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

TEST(Balance, BadStructSize) {
  stria_balance_t b;
  std::memset(&b, 0, sizeof b);
  for (size_t size : {size_t{0}, size_t{4}, SIZE_MAX}) {
    b.struct_size = size;
    EXPECT_EQ(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 64, 4, 1, &b), STRIA_ERROR_INVALID_ARGUMENT) << size;
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  b.struct_size = sizeof b;
  EXPECT_EQ(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 64, 4, 1, &b), STRIA_SUCCESS) << stria_get_last_error();
}

// A config case: what it does to a default config, and the status create must return.
struct ConfigCase {
  const char* name;
  stria_status_t want;
  const char* needle;
  std::function<void(stria_context_config_t*)> edit;
};

void PrintTo(const ConfigCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<ConfigCase> ConfigCases() {
  const stria_status_t kInv = STRIA_ERROR_INVALID_ARGUMENT;
  return {
      {"struct_size_0", kInv, "struct_size", [](stria_context_config_t* c) { c->struct_size = 0; }},
      {"struct_size_4", kInv, "struct_size", [](stria_context_config_t* c) { c->struct_size = 4; }},
      {"struct_size_huge", kInv, "struct_size", [](stria_context_config_t* c) { c->struct_size = SIZE_MAX; }},
      {"struct_size_1M", kInv, "struct_size", [](stria_context_config_t* c) { c->struct_size = size_t{1} << 20; }},
      {"timeout_negative", kInv, "timeout", [](stria_context_config_t* c) { c->timeout_s = -1; }},
      {"timeout_nan", kInv, "timeout", [](stria_context_config_t* c) { c->timeout_s = NAN; }},
      {"timeout_inf", kInv, "timeout", [](stria_context_config_t* c) { c->timeout_s = INFINITY; }},
      {"num_threads_negative", kInv, "num_threads", [](stria_context_config_t* c) { c->num_threads = -1; }},
      // Each value would start that many threads: an error, not a process out of threads.
      {"num_threads_1025", kInv, "num_threads", [](stria_context_config_t* c) { c->num_threads = 1025; }},
      {"num_threads_100000", kInv, "num_threads", [](stria_context_config_t* c) { c->num_threads = 100000; }},
      {"num_threads_int_max", kInv, "num_threads", [](stria_context_config_t* c) { c->num_threads = INT_MAX; }},
      {"transport_7", kInv, "transport",
       [](stria_context_config_t* c) { c->transport = static_cast<stria_transport_t>(7); }},
      {"transport_minus_1", kInv, "transport",
       [](stria_context_config_t* c) { c->transport = static_cast<stria_transport_t>(-1); }},
      {"cpu_device_id_1", kInv, "CPU",
       [](stria_context_config_t* c) {
         c->device = DLDevice{kDLCPU, 1};
       }},
      {"vulkan_device", STRIA_ERROR_UNSUPPORTED, "vulkan",
       [](stria_context_config_t* c) {
         c->device = DLDevice{kDLVulkan, 0};
       }},
      {"cuda_device", STRIA_ERROR_UNSUPPORTED, "libstria-cuda.so.0",
       [](stria_context_config_t* c) {
         c->device = DLDevice{kDLCUDA, 0};
       }},
  };
}

class BadConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(BadConfig, ContextCreate) {
  const ConfigCase& c = GetParam();
  if (std::string(c.name) == "cuda_device" && CudaContextWorks()) GTEST_SKIP() << "a GPU is here: CUDA works";
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  c.edit(&cfg);
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), c.want) << stria_get_last_error();
  const std::string msg = stria_get_last_error();
  EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  EXPECT_EQ(ctx, nullptr);
  if (ctx) stria_context_destroy(ctx);
}

TEST_P(BadConfig, CreateLocalGroup) {
  const ConfigCase& c = GetParam();
  if (std::string(c.name) == "cuda_device" && CudaContextWorks()) GTEST_SKIP() << "a GPU is here: CUDA works";
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  c.edit(&cfg);
  stria_context_t ctxs[3];
  for (auto& x : ctxs) x = reinterpret_cast<stria_context_t>(0x99);
  // A bad transport value is caught by the config check; a valid non-local one by the group.
  EXPECT_EQ(stria_context_create_local_group(&cfg, 3, ctxs), c.want) << stria_get_last_error();
  const std::string msg = stria_get_last_error();
  EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  for (auto& x : ctxs) {
    EXPECT_EQ(x, nullptr) << "on failure no context is left behind";
    if (x) stria_context_destroy(x);
  }
}

INSTANTIATE_TEST_SUITE_P(Config, BadConfig, ::testing::ValuesIn(ConfigCases()),
                         [](const ::testing::TestParamInfo<ConfigCase>& i) { return std::string(i.param.name); });

TEST(Config, RanksAndWorldSizes) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  struct {
    int rank, world;
  } bad[] = {{0, 0}, {0, -1}, {1, 1}, {-1, 1}, {2, 2}, {5, 3}};
  for (auto b : bad) {
    cfg.rank = b.rank;
    cfg.world_size = b.world;
    stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
    EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT) << b.rank << "/" << b.world;
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(ctx, nullptr);
  }
  // The local transport joins ranks of one process: stria_context_create is for world_size 1.
  cfg.rank = 0;
  cfg.world_size = 2;
  stria_context_t ctx = nullptr;
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("stria_context_create_local_group"), std::string::npos)
      << stria_get_last_error();
  stria_context_config_init(&cfg);
  stria_context_t group[2];
  for (int n : {0, -1, -1000, 1 << 30}) {
    EXPECT_EQ(stria_context_create_local_group(&cfg, n, group), STRIA_ERROR_INVALID_ARGUMENT) << n;
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  // Threads per rank that are fine alone but too many for the group as a whole.
  cfg.num_threads = 1024;
  stria_context_t nine[9];
  EXPECT_EQ(stria_context_create_local_group(&cfg, 9, nine), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("9216 threads"), std::string::npos) << stria_get_last_error();
  cfg.num_threads = 0;
  // create_local_group ignores config->rank/world_size, even nonsense ones.
  cfg.rank = 17;
  cfg.world_size = -3;
  ASSERT_EQ(stria_context_create_local_group(&cfg, 2, group), STRIA_SUCCESS) << stria_get_last_error();
  for (int r = 0; r < 2; ++r) {
    int got = -1, ws = -1;
    EXPECT_EQ(stria_context_get_rank(group[r], &got), STRIA_SUCCESS);
    EXPECT_EQ(stria_context_get_world_size(group[r], &ws), STRIA_SUCCESS);
    EXPECT_EQ(got, r);
    EXPECT_EQ(ws, 2);
    EXPECT_EQ(stria_context_destroy(group[r]), STRIA_SUCCESS);
  }
}

// The config struct is DESIGN.md's, field for field: a caller that declares it from the design
// (ctypes, another language's FFI) gets the same bytes, and stria_context_config_init, which cannot
// know its caller's size, writes exactly those and not one more.
TEST(Config, StructIsTheDesignsAndInitWritesOnlyIt) {
  EXPECT_EQ(offsetof(stria_context_config_t, struct_size), 0u);
  EXPECT_EQ(offsetof(stria_context_config_t, rank), sizeof(size_t));
  EXPECT_EQ(offsetof(stria_context_config_t, world_size), sizeof(size_t) + sizeof(int));
  EXPECT_EQ(offsetof(stria_context_config_t, device), sizeof(size_t) + 2 * sizeof(int));
  EXPECT_EQ(offsetof(stria_context_config_t, transport), offsetof(stria_context_config_t, device) + sizeof(DLDevice));
  EXPECT_EQ(offsetof(stria_context_config_t, unique_id), offsetof(stria_context_config_t, transport) + sizeof(int));
  const size_t after_id = offsetof(stria_context_config_t, unique_id) + sizeof(stria_unique_id_t);
  EXPECT_EQ(offsetof(stria_context_config_t, timeout_s),
            (after_id + alignof(double) - 1) / alignof(double) * alignof(double));
  EXPECT_EQ(offsetof(stria_context_config_t, num_threads),
            offsetof(stria_context_config_t, timeout_s) + sizeof(double));
  const size_t end = offsetof(stria_context_config_t, num_threads) + sizeof(int);
  EXPECT_EQ(sizeof(stria_context_config_t), (end + alignof(stria_context_config_t) - 1) /
                                                alignof(stria_context_config_t) * alignof(stria_context_config_t))
      << "a field was added: callers that declare the design's struct would be written past its end";
  unsigned char buffer[sizeof(stria_context_config_t) + 64];
  std::memset(buffer, 0xAB, sizeof buffer);
  ASSERT_EQ(stria_context_config_init(reinterpret_cast<stria_context_config_t*>(buffer)), STRIA_SUCCESS);
  for (size_t i = sizeof(stria_context_config_t); i < sizeof buffer; ++i)
    ASSERT_EQ(buffer[i], 0xAB) << "byte " << i << " past the struct was written";
  stria_context_config_t cfg;
  std::memcpy(&cfg, buffer, sizeof cfg);
  EXPECT_EQ(cfg.struct_size, sizeof(stria_context_config_t));
  // The same for the attention parameters.
  unsigned char pbuf[sizeof(stria_attention_params_t) + 64];
  std::memset(pbuf, 0xAB, sizeof pbuf);
  ASSERT_EQ(stria_attention_params_init(reinterpret_cast<stria_attention_params_t*>(pbuf)), STRIA_SUCCESS);
  for (size_t i = sizeof(stria_attention_params_t); i < sizeof pbuf; ++i)
    ASSERT_EQ(pbuf[i], 0xAB) << "byte " << i << " past the params struct was written";
}

// A caller's NCCL communicator comes through its own function, and only with the NCCL transport.
TEST(Config, NcclCommunicatorOnlyWithTheNcclTransport) {
  int fake = 0;  // never dereferenced: the checks come first
  for (stria_transport_t t : {STRIA_TRANSPORT_LOCAL, STRIA_TRANSPORT_UCX}) {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.transport = t;
    stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
    EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, &fake, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stria_get_last_error()).find("STRIA_TRANSPORT_NCCL"), std::string::npos)
        << stria_get_last_error();
    EXPECT_EQ(ctx, nullptr);
  }
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.transport = STRIA_TRANSPORT_NCCL;
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, nullptr, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("nccl_comm is NULL"), std::string::npos) << stria_get_last_error();
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(stria_context_create_with_nccl_comm(nullptr, &fake, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, &fake, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_STRNE(stria_get_last_error(), "");
}

TEST(Config, NewerStructSize) {
  struct {
    stria_context_config_t c;
    uint64_t tail[4];
  } big;
  std::memset(&big, 0, sizeof big);
  stria_context_config_init(&big.c);
  big.c.struct_size = sizeof big;
  big.c.num_threads = 1;
  // Zero bytes past the known fields: a newer caller using none of the new fields.
  stria_context_t ctx = nullptr;
  ASSERT_EQ(stria_context_create(&big.c, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  ExpectCorrectForward({ctx});
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
  stria_context_t group[2] = {nullptr, nullptr};
  ASSERT_EQ(stria_context_create_local_group(&big.c, 2, group), STRIA_SUCCESS) << stria_get_last_error();
  ExpectCorrectForward({group[0], group[1]});
  for (auto g : group) EXPECT_EQ(stria_context_destroy(g), STRIA_SUCCESS);
  // A nonzero one: the caller asked for something this library cannot do.
  big.tail[3] = 0xff;
  ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_EQ(stria_context_create(&big.c, &ctx), STRIA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(stria_get_last_error()).find("newer"), std::string::npos) << stria_get_last_error();
  EXPECT_EQ(ctx, nullptr);
  EXPECT_EQ(stria_context_create_local_group(&big.c, 2, group), STRIA_ERROR_UNSUPPORTED);
  EXPECT_STRNE(stria_get_last_error(), "");
}

// No transport or GPU module is built in this tree: each one asked for is UNSUPPORTED, naming
// the file to install.
TEST(Modules, MissingModulesAreUnsupportedAndNamed) {
  struct {
    stria_transport_t transport;
    const char* file;
  } cases[] = {{STRIA_TRANSPORT_UCX, "libstria-ucx.so.0"}, {STRIA_TRANSPORT_NCCL, "libstria-nccl.so.0"}};
  for (auto c : cases) {
#ifdef STRIA_HAVE_UCX_MODULE
    if (c.transport == STRIA_TRANSPORT_UCX) continue;  // built here: see the next test
#endif
#ifdef STRIA_HAVE_NCCL_MODULE
    if (c.transport == STRIA_TRANSPORT_NCCL) continue;  // built here: tests/nccl checks its refusals
#endif
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.transport = c.transport;
    stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
    // Twice: the failed load is not cached as anything but a failure.
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_UNSUPPORTED) << c.file;
      EXPECT_NE(std::string(stria_get_last_error()).find(c.file), std::string::npos) << stria_get_last_error();
      EXPECT_EQ(ctx, nullptr);
    }
    // A local group is, by definition, the local transport.
    stria_context_t group[2];
    EXPECT_EQ(stria_context_create_local_group(&cfg, 2, group), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
  }
#if !defined(STRIA_HAVE_UCX_MODULE) && !defined(STRIA_HAVE_NCCL_MODULE)  // either serves the id
  stria_unique_id_t id;
  EXPECT_EQ(stria_get_unique_id(&id), STRIA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(stria_get_last_error()).find("libstria-ucx.so.0"), std::string::npos) << stria_get_last_error();
#endif
  if (CudaContextWorks()) return;  // a GPU is here; tests/gpu covers CUDA contexts
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.device = DLDevice{kDLCUDA, 0};
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  // Without the module: it is missing. With it but no GPU: no device is usable. Both name the module.
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(stria_get_last_error()).find("libstria-cuda.so.0"), std::string::npos)
      << stria_get_last_error();
  EXPECT_EQ(ctx, nullptr);
  cfg.device = DLDevice{kDLCUDA, -1};
  EXPECT_NE(stria_context_create(&cfg, &ctx), STRIA_SUCCESS);
  EXPECT_STRNE(stria_get_last_error(), "");
}

// STRIA_CPU_ISA must name a kernel build: a misspelt one is refused at context creation instead
// of quietly running the default build; a valid one is used (generic runs everywhere).
TEST(Config, CpuIsaIsChecked) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  setenv("STRIA_CPU_ISA", "avx-512", 1);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  const std::string msg = stria_get_last_error();
  EXPECT_NE(msg.find("STRIA_CPU_ISA=\"avx-512\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("generic, avx2, avx512, avx512bf16 or amx"), std::string::npos) << msg;
  EXPECT_EQ(ctx, nullptr);
  stria_context_t group[2] = {nullptr, nullptr};
  EXPECT_EQ(stria_context_create_local_group(&cfg, 2, group), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(group[0], nullptr);
  setenv("STRIA_CPU_ISA", "generic", 1);
  ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
  unsetenv("STRIA_CPU_ISA");
}

// STRIA_CPU_ISA is read when each context is created, not once per process: a context forced
// onto the generic build after one on the default build runs the generic kernels (its vectors of
// 4 floats sum in another order than AVX2's 8 or AVX-512's 16, so the outputs differ in their
// last bits), and a later default context runs the default build again. The choice used to be
// latched by the first context of the process, and later ones were silently given it.
TEST(Config, CpuIsaIsReadForEachContext) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string flags((std::istreambuf_iterator<char>(cpuinfo)), std::istreambuf_iterator<char>());
  if (flags.find(" avx2") == std::string::npos) GTEST_SKIP() << "no AVX2 here: the default build is generic";
  auto forward = [](const char* isa) {
    if (isa != nullptr)
      setenv("STRIA_CPU_ISA", isa, 1);
    else
      unsetenv("STRIA_CPU_ISA");
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    stria_context_t ctx = nullptr;
    EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
    unsetenv("STRIA_CPU_ISA");
    AttentionTensors t(1, 96, 2, 2, 64, Dt::kF32, 5);
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    EXPECT_EQ(stria_attention_forward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
    EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
    return t.out.ToDouble();
  };
  const std::vector<double> best = forward(nullptr), generic = forward("generic"), again = forward(nullptr);
  EXPECT_NE(best, generic) << "the generic context ran the first context's build";
  EXPECT_EQ(best, again) << "the default build did not come back";
  EXPECT_LT(RelError(generic, best), 1e-5);
}

#ifdef STRIA_HAVE_CUDA_MODULE
// A misspelt STRIA_CUDA_KERNELS is refused when the context is made, GPU or not, rather than
// quietly running (and timing, and testing) the default family; the accepted spellings pass that
// check and then meet the machine as usual.
TEST(Modules, CudaKernelFamilyIsChecked) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.device = DLDevice{kDLCUDA, 0};
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  for (const char* bad : {"wgmm", "tensor-cores", "simt "}) {
    setenv("STRIA_CUDA_KERNELS", bad, 1);
    EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT) << bad;
    const std::string msg = stria_get_last_error();
    EXPECT_NE(msg.find("STRIA_CUDA_KERNELS=\"" + std::string(bad) + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("simt, mma, wgmma or tma"), std::string::npos) << msg;
    EXPECT_EQ(ctx, nullptr);
  }
  unsetenv("STRIA_CUDA_KERNELS");
  const bool gpu = CudaContextWorks();
  for (const char* good : {"mma", "SIMT", "Wgmma", "tma", ""}) {
    setenv("STRIA_CUDA_KERNELS", good, 1);
    const stria_status_t st = stria_context_create(&cfg, &ctx);
    EXPECT_EQ(st, gpu ? STRIA_SUCCESS : STRIA_ERROR_UNSUPPORTED) << good << ": " << stria_get_last_error();
    if (st == STRIA_SUCCESS) {
      EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
    }
  }
  unsetenv("STRIA_CUDA_KERNELS");
}
#endif

// Handles are tokens: destroyed and made-up ones are rejected, never dereferenced.

#ifdef STRIA_HAVE_UCX_MODULE
// With the UCX module built: a config that names no rendezvous is refused with what to do, and a
// made-up id is refused as such, both before anything waits.
TEST(Modules, UcxConfigWithoutRendezvous) {
  unsetenv("STRIA_ROOT");
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.transport = STRIA_TRANSPORT_UCX;
  cfg.world_size = 2;
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("STRIA_ROOT"), std::string::npos) << stria_get_last_error();
  EXPECT_EQ(ctx, nullptr);
  std::memset(cfg.unique_id.internal, 0x41, sizeof cfg.unique_id.internal);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("not a stria id"), std::string::npos) << stria_get_last_error();
  setenv("STRIA_ROOT", "localhost:http", 1);
  std::memset(cfg.unique_id.internal, 0, sizeof cfg.unique_id.internal);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("STRIA_ROOT"), std::string::npos) << stria_get_last_error();
  unsetenv("STRIA_ROOT");
  stria_unique_id_t id;
  ASSERT_EQ(stria_get_unique_id(&id), STRIA_SUCCESS) << stria_get_last_error();
  cfg.device = DLDevice{kDLCUDA, 0};
  cfg.unique_id = id;
  EXPECT_NE(stria_context_create(&cfg, &ctx), STRIA_SUCCESS);
  EXPECT_EQ(ctx, nullptr);
}

int OpenDescriptors() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) ++n;
    closedir(dir);
  }
  return n;
}

// A world of one needs no rendezvous, but an id from stria_get_unique_id is used up by it all the
// same: its listening socket must close, or a job making such a context per step leaks one each.
TEST(Modules, UcxWorldOfOneClosesItsRendezvousListener) {
  unsetenv("STRIA_ROOT");
  auto cycle = [] {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.transport = STRIA_TRANSPORT_UCX;
    cfg.num_threads = 1;
    ASSERT_EQ(stria_get_unique_id(&cfg.unique_id), STRIA_SUCCESS) << stria_get_last_error();
    stria_context_t ctx = nullptr;
    ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
    ExpectCorrectForward({ctx});
    EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS) << stria_get_last_error();
  };
  cycle();  // UCX's own first-use descriptors stay open for the process
  const int before = OpenDescriptors();
  for (int i = 0; i < 4; ++i) cycle();
  EXPECT_EQ(OpenDescriptors(), before);
}
#endif
// stria_context_create_local_group_on_devices: rank r on devices[r]. On the CPU every rank is cpu:0,
// and the group is an ordinary local group; ranks of different kinds, or a device a rank cannot
// have, are refused with the rank's index, and nothing is left behind.
TEST(Config, LocalGroupOnDevices) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.timeout_s = kGroupTimeoutS;
  cfg.device = DLDevice{kDLCUDA, 7};  // not used: the devices array decides
  std::vector<stria_context_t> ctx(3, reinterpret_cast<stria_context_t>(0x99));
  struct Bad {
    std::vector<DLDevice> devices;
    const char* message;
  };
  const Bad bad[] = {
      {{{kDLCPU, 0}, {kDLCUDA, 0}, {kDLCPU, 0}}, "devices[1] is cuda:0 but devices[0] is cpu:0"},
      {{{kDLCPU, 0}, {kDLCPU, 0}, {kDLCPU, 1}}, "devices[2]: CPU device id must be 0"},
      {{{kDLCPU, 0}, {kDLCPU, 0}, {static_cast<DLDeviceType>(999), 0}}, "devices[2] is"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.message);
    EXPECT_EQ(stria_context_create_local_group_on_devices(&cfg, b.devices.data(), 3, ctx.data()),
              STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stria_get_last_error()).find(b.message), std::string::npos) << stria_get_last_error();
    for (stria_context_t c : ctx) EXPECT_EQ(c, nullptr);
  }
  const DLDevice one[1] = {{kDLCPU, 0}};
  EXPECT_EQ(stria_context_create_local_group_on_devices(&cfg, one, 0, ctx.data()), STRIA_ERROR_INVALID_ARGUMENT);
  const DLDevice cpus[3] = {{kDLCPU, 0}, {kDLCPU, 0}, {kDLCPU, 0}};
  ASSERT_EQ(stria_context_create_local_group_on_devices(&cfg, cpus, 3, ctx.data()), STRIA_SUCCESS)
      << stria_get_last_error();
  ExpectCorrectForward(ctx);
  for (stria_context_t c : ctx) EXPECT_EQ(stria_context_destroy(c), STRIA_SUCCESS);
}

TEST(Handles, DestroyedAndForgedHandles) {
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
  const stria_context_t forged[] = {ctx, reinterpret_cast<stria_context_t>(0x1234),
                                    reinterpret_cast<stria_context_t>(~uintptr_t{0}),
                                    reinterpret_cast<stria_context_t>(&ctx)};
  RankTensors t;
  for (stria_context_t h : forged) {
    SCOPED_TRACE(reinterpret_cast<uintptr_t>(h));
    int x = -7;
    EXPECT_EQ(stria_context_get_rank(h, &x), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(x, -7);
    EXPECT_EQ(stria_context_get_world_size(h, &x), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    Call a(t);
    EXPECT_EQ(a.Forward(h), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(a.Backward(h), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    int num = -1;
    EXPECT_EQ(stria_context_get_step_times(h, nullptr, 0, &num), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(stria_context_set_call_tag(h, 1), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(stria_context_set_deterministic(h, 1), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(stria_context_abort(h), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(stria_context_destroy(h), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  // A fresh context is a different token from the destroyed one, and works.
  stria_context_t again = CreateSingle();
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again, ctx);
  ExpectCorrectForward({again});
  EXPECT_EQ(stria_context_destroy(again), STRIA_SUCCESS);
  EXPECT_EQ(stria_context_destroy(again), STRIA_ERROR_INVALID_ARGUMENT);
}

TEST(Handles, DestroyOneRankOfAGroupLeavesTheOthersAddressable) {
  LocalGroup g(3, kGroupTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  ASSERT_EQ(stria_context_destroy(g.ctx[1]), STRIA_SUCCESS);
  int r = -1;
  EXPECT_EQ(stria_context_get_rank(g.ctx[1], &r), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_context_get_rank(g.ctx[2], &r), STRIA_SUCCESS);
  EXPECT_EQ(r, 2);
  g.ctx[1] = nullptr;  // the helper must not destroy it again
}

// A context is driven by one thread at a time. Two threads calling on one context at once would
// race on its ring buffers, its call sequence and its transport's message order: the second is
// refused at once, and the call in progress goes on unharmed.
TEST(Handles, ASecondThreadsCallOnABusyContextIsRefused) {
  LocalGroup g(2, 10.0, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  RankTensors ta, tb, t1;
  Call a(ta), b(tb), r1(t1);
  std::string msg_a, msg_b;
  // Both on rank 0, whose call then waits for rank 1, which has not called yet.
  auto fa = std::async(std::launch::async, [&] {
    const stria_status_t s = a.Forward(g.ctx[0]);
    msg_a = stria_get_last_error();
    return s;
  });
  auto fb = std::async(std::launch::async, [&] {
    const stria_status_t s = b.Forward(g.ctx[0]);
    msg_b = stria_get_last_error();
    return s;
  });
  const auto t0 = std::chrono::steady_clock::now();
  bool a_done = false, b_done = false;
  while (!a_done && !b_done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    a_done = fa.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready;
    b_done = fb.wait_for(std::chrono::milliseconds(5)) == std::future_status::ready;
  }
  ASSERT_TRUE(a_done != b_done) << "exactly one of the two calls must be refused at once";
  auto& refused = a_done ? fa : fb;
  auto& admitted = a_done ? fb : fa;
  EXPECT_EQ(refused.get(), STRIA_ERROR_INVALID_ARGUMENT);
  const std::string& why = a_done ? msg_a : msg_b;
  EXPECT_NE(why.find("in stria_attention_forward on another thread"), std::string::npos) << why;
  // The step times are being written by the running call: not read under it; and a tag set now
  // would name that call or the next one, depending on timing.
  EXPECT_EQ(stria_context_set_call_tag(g.ctx[0], 3), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_context_set_deterministic(g.ctx[0], 1), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("on another thread"), std::string::npos) << stria_get_last_error();
  int num = -1;
  EXPECT_EQ(stria_context_get_step_times(g.ctx[0], nullptr, 0, &num), STRIA_ERROR_INVALID_ARGUMENT);
  // Rank 1 comes, and the admitted call completes.
  EXPECT_EQ(r1.Forward(g.ctx[1]), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(admitted.get(), STRIA_SUCCESS) << (a_done ? msg_b : msg_a);
  EXPECT_EQ(stria_context_get_step_times(g.ctx[0], nullptr, 0, &num), STRIA_SUCCESS);
  EXPECT_EQ(num, 2);
  ExpectCorrectForward(g.ctx);  // nothing the refused call did is left in the group
}

TEST(Status, StringsVersionAndLastError) {
  std::set<std::string> seen;
  for (int s = STRIA_SUCCESS; s <= STRIA_ERROR_INTERNAL; ++s) {
    const char* str = stria_status_string(static_cast<stria_status_t>(s));
    ASSERT_NE(str, nullptr) << s;
    EXPECT_STRNE(str, "") << s;
    EXPECT_STRNE(str, "unknown status") << s;
    EXPECT_TRUE(seen.insert(str).second) << "duplicate name " << str;
  }
  for (int s : {9, 100, -1, INT32_MAX, INT32_MIN}) {
    const char* str = stria_status_string(static_cast<stria_status_t>(s));
    ASSERT_NE(str, nullptr) << s;
    EXPECT_STREQ(str, "unknown status") << s;
  }
  EXPECT_EQ(stria_get_version(), STRIA_VERSION);
  EXPECT_EQ(STRIA_VERSION, STRIA_VERSION_MAJOR * 10000 + STRIA_VERSION_MINOR * 100 + STRIA_VERSION_PATCH);

  // The last error: set by a failure, kept by calls that are not stria calls, cleared by success.
  stria_context_config_t cfg;
  EXPECT_EQ(stria_context_config_init(&cfg), STRIA_SUCCESS);
  EXPECT_STREQ(stria_get_last_error(), "");
  EXPECT_EQ(stria_context_config_init(nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  const std::string first = stria_get_last_error();
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, stria_get_last_error()) << "reading the error does not clear it";
  // It is per thread: another thread's failure and success leave ours alone.
  std::thread([] {
    EXPECT_STREQ(stria_get_last_error(), "");
    int64_t pos[4];
    EXPECT_EQ(stria_layout_positions(STRIA_LAYOUT_STRIPED, 7, 2, 0, pos), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_STRNE(stria_get_last_error(), "");
  }).join();
  EXPECT_EQ(first, stria_get_last_error());
  int64_t pos[4];
  EXPECT_EQ(stria_layout_positions(STRIA_LAYOUT_STRIPED, 8, 2, 1, pos), STRIA_SUCCESS);
  EXPECT_STREQ(stria_get_last_error(), "") << "a successful call clears the last error";
  EXPECT_EQ(stria_attention_params_init(nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  stria_attention_params_t params;
  EXPECT_EQ(stria_attention_params_init(&params), STRIA_SUCCESS);
  EXPECT_STREQ(stria_get_last_error(), "");
}

TEST(Positions, BadArguments) {
  int64_t pos[64];
  struct {
    int layout;
    int64_t seq_len;
    int world, rank;
    const char* needle;
  } bad[] = {
      {STRIA_LAYOUT_STRIPED, 7, 2, 0, "divisible"},      // S % N
      {STRIA_LAYOUT_CONTIGUOUS, 10, 4, 0, "divisible"},  // S % N
      {STRIA_LAYOUT_ZIGZAG, 6, 2, 0, "divisible"},       // S % 2N (S % N == 0)
      {STRIA_LAYOUT_STRIPED, 8, 2, 2, "rank"},           // rank = world_size
      {STRIA_LAYOUT_STRIPED, 8, 2, -1, "rank"},
      {STRIA_LAYOUT_STRIPED, 8, 0, 0, "world_size"},
      {STRIA_LAYOUT_STRIPED, 8, -2, 0, "world_size"},
      {STRIA_LAYOUT_STRIPED, 0, 2, 0, "seq_len"},
      {STRIA_LAYOUT_STRIPED, -8, 2, 0, "seq_len"},
      {7, 8, 2, 0, "layout"},
      {-1, 8, 2, 0, "layout"},
  };
  for (auto b : bad) {
    SCOPED_TRACE(::testing::Message() << "layout " << b.layout << " S " << b.seq_len << " N " << b.world << " r "
                                      << b.rank);
    for (auto& p : pos) p = -42;
    EXPECT_EQ(stria_layout_positions(static_cast<stria_layout_t>(b.layout), b.seq_len, b.world, b.rank, pos),
              STRIA_ERROR_INVALID_ARGUMENT);
    const std::string msg = stria_get_last_error();
    EXPECT_NE(msg.find(b.needle), std::string::npos) << msg;
    for (auto p : pos) EXPECT_EQ(p, -42) << "a rejected call writes nothing";
  }
}

// NaN in the inputs must come out as NaN (or an error), never as finite numbers: a training run
// must see its blow-up. The NaN sits in one element of token t of q, k or v.
enum class Where { kQ, kK, kV };

void CheckNaNPropagates(Where where, int world, stria_layout_t layout, bool causal, Dt dt = Dt::kF32) {
  SCOPED_TRACE(::testing::Message() << "NaN in "
                                    << (where == Where::kQ   ? "q"
                                        : where == Where::kK ? "k"
                                                             : "v")
                                    << ", world " << world << ", layout " << layout << (causal ? ", causal" : "")
                                    << ", " << DtName(dt));
  const int64_t S = kL * world, t = 5;
  std::mt19937_64 rng(3);
  Tensor q({kB, S, kHq, kD}, dt), k({kB, S, kHkv, kD}, dt), v({kB, S, kHkv, kD}, dt);
  q.FillRandom(rng);
  k.FillRandom(rng);
  v.FillRandom(rng);
  Tensor& bad = where == Where::kQ ? q : where == Where::kK ? k : v;
  bad.Set(((0 * S + t) * bad.shape[2] + 0) * kD + 3, NAN);  // token t, head 0, element 3
  Tensor out_full({kB, S, kHq, kD}, dt), lse_full({kB, kHq, S}, Dt::kF32);
  std::vector<stria_status_t> st(static_cast<size_t>(world));
  std::vector<std::string> err(static_cast<size_t>(world));
  std::mutex mu;
  LocalGroup g(world, kGroupTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = layout;
  params.causal = causal;
  RunRanks(world, [&](int r) {
    Tensor ql({kB, kL, kHq, kD}, dt), kl({kB, kL, kHkv, kD}, dt), vl({kB, kL, kHkv, kD}, dt);
    stria_shard(layout, world, r, 1, &q.dl, &ql.dl, nullptr);
    stria_shard(layout, world, r, 1, &k.dl, &kl.dl, nullptr);
    stria_shard(layout, world, r, 1, &v.dl, &vl.dl, nullptr);
    Tensor out({kB, kL, kHq, kD}, dt), lse({kB, kHq, kL}, Dt::kF32);
    st[static_cast<size_t>(r)] = stria_attention_forward(g.ctx[static_cast<size_t>(r)], &params, &ql.dl, &kl.dl, &vl.dl,
                                                         &out.dl, &lse.dl, nullptr);
    err[static_cast<size_t>(r)] = stria_get_last_error();
    std::lock_guard<std::mutex> lock(mu);
    stria_unshard(layout, world, r, 1, &out.dl, &out_full.dl, nullptr);
    stria_unshard(layout, world, r, 2, &lse.dl, &lse_full.dl, nullptr);
  });
  bool any_error = false;
  for (int r = 0; r < world; ++r) {
    if (st[static_cast<size_t>(r)] != STRIA_SUCCESS) {
      any_error = true;
      EXPECT_FALSE(err[static_cast<size_t>(r)].empty());
    }
  }
  if (any_error) return;  // reporting the NaN as an error is as good as propagating it
  // The (query, head) rows whose result depends on the NaN element; one summary, not one line per row.
  int finite_rows = 0, affected_rows = 0;
  std::string first;
  for (int64_t i = 0; i < S; ++i)
    for (int64_t h = 0; h < kHq; ++h) {
      bool affected = false;
      if (where == Where::kQ) {
        affected = i == t && h == 0;
      } else {
        affected = !causal || i >= t;  // kHkv = 1: every query head reads kv head 0
      }
      if (!affected) continue;
      ++affected_rows;
      bool has_nan = std::isnan(lse_full.Get((0 * kHq + h) * S + i));
      for (int64_t d = 0; d < kD; ++d) has_nan = has_nan || std::isnan(out_full.Get(((0 * S + i) * kHq + h) * kD + d));
      if (has_nan) continue;
      if (finite_rows++ == 0)
        first = ::testing::PrintToString(out_full.Get(((0 * S + i) * kHq + h) * kD)) + ", lse " +
                ::testing::PrintToString(lse_full.Get((0 * kHq + h) * S + i)) + " at query " + std::to_string(i) +
                " head " + std::to_string(h);
    }
  EXPECT_EQ(finite_rows, 0) << finite_rows << " of " << affected_rows
                            << " output rows that read the NaN came out finite, e.g. out[..., 0] = " << first;
}

TEST(NaNInputs, InQPropagates) {
  CheckNaNPropagates(Where::kQ, 1, STRIA_LAYOUT_STRIPED, true);
  CheckNaNPropagates(Where::kQ, 2, STRIA_LAYOUT_ZIGZAG, false);
}
TEST(NaNInputs, InKPropagates) {
  CheckNaNPropagates(Where::kK, 1, STRIA_LAYOUT_STRIPED, true);
  CheckNaNPropagates(Where::kK, 2, STRIA_LAYOUT_CONTIGUOUS, true);
}
TEST(NaNInputs, InVPropagates) {
  CheckNaNPropagates(Where::kV, 1, STRIA_LAYOUT_STRIPED, true);
  CheckNaNPropagates(Where::kV, 2, STRIA_LAYOUT_STRIPED, false);
}
// The 16-bit paths: their own packing and conversions (and on AMX machines the tile kernels).
TEST(NaNInputs, InHalfPrecisionPropagates) {
  for (Dt dt : {Dt::kBF16, Dt::kF16}) {
    CheckNaNPropagates(Where::kQ, 1, STRIA_LAYOUT_STRIPED, true, dt);
    CheckNaNPropagates(Where::kK, 2, STRIA_LAYOUT_ZIGZAG, true, dt);
    CheckNaNPropagates(Where::kV, 2, STRIA_LAYOUT_CONTIGUOUS, false, dt);
  }
}

// The backward: a NaN in dO of query t reaches dQ of that query and dV of every key it sees.
TEST(NaNInputs, InDoutPropagatesThroughBackward) {
  const int64_t t = 5;
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  RankTensors a;
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  ASSERT_EQ(stria_attention_forward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, nullptr),
            STRIA_SUCCESS)
      << stria_get_last_error();
  a.dout.Set(((0 * kL + t) * kHq + 0) * kD + 3, NAN);
  const stria_status_t st = stria_attention_backward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl,
                                                     &a.dout.dl, &a.dq.dl, &a.dk.dl, &a.dv.dl, nullptr);
  if (st == STRIA_SUCCESS) {
    bool dq_nan = false;
    for (int64_t d = 0; d < kD; ++d) dq_nan = dq_nan || std::isnan(a.dq.Get(((0 * kL + t) * kHq + 0) * kD + d));
    EXPECT_TRUE(dq_nan) << "dq of query " << t << " is finite";
    for (int64_t j = 0; j <= t; ++j) {  // causal: query t sees keys 0..t
      bool dv_nan = false;
      for (int64_t d = 0; d < kD; ++d) dv_nan = dv_nan || std::isnan(a.dv.Get((0 * kL + j) * kHkv * kD + d));
      EXPECT_TRUE(dv_nan) << "dv of key " << j << " is finite";
    }
  } else {
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

// A NaN in key t reaches dK and dV of that key through the backward (whatever the forward did).
TEST(NaNInputs, InKPropagatesThroughBackward) {
  const int64_t t = 5;
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  RankTensors a;
  a.k.Set(((0 * kL + t) * kHkv + 0) * kD + 3, NAN);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  stria_status_t st = stria_attention_forward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, nullptr);
  if (st == STRIA_SUCCESS)
    st = stria_attention_backward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, &a.dout.dl, &a.dq.dl,
                                  &a.dk.dl, &a.dv.dl, nullptr);
  if (st == STRIA_SUCCESS) {
    bool dk_nan = false;
    for (int64_t d = 0; d < kD; ++d) dk_nan = dk_nan || std::isnan(a.dk.Get(((0 * kL + t) * kHkv + 0) * kD + d));
    EXPECT_TRUE(dk_nan) << "dk of the NaN key is finite: dk[..., 0] = " << a.dk.Get(((0 * kL + t) * kHkv) * kD);
  } else {
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

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

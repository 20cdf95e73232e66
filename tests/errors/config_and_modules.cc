// Context configurations under bad input, the struct's size rules, and the modules: a missing
// module or system library is STRIA_ERROR_UNSUPPORTED naming it, a misspelt kernel family or CPU
// instruction set is refused, a UCX world of one leaves no descriptor open.
#include <gtest/gtest.h>

#include <dirent.h>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "errors/errors_common.h"

using namespace errors_test;

namespace {

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

// STRIA_RING_ORDER (how a ring keeps its compute and transfers apart: device or host) is checked
// like the other switches: a misspelt value is refused, naming the variable, by stria_context_create
// and the local groups, rather than quietly taken for the default; either value, in any case, is
// taken.
TEST(Config, RingOrderIsChecked) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  setenv("STRIA_RING_ORDER", "hots", 1);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  const std::string msg = stria_get_last_error();
  EXPECT_NE(msg.find("STRIA_RING_ORDER=\"hots\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("device, host"), std::string::npos) << msg;
  EXPECT_EQ(ctx, nullptr);
  stria_context_t group[2] = {nullptr, nullptr};
  EXPECT_EQ(stria_context_create_local_group(&cfg, 2, group), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(group[0], nullptr);
  for (const char* good : {"host", "HOST", "device", ""}) {
    setenv("STRIA_RING_ORDER", good, 1);
    ASSERT_EQ(stria_context_create_local_group(&cfg, 2, group), STRIA_SUCCESS)
        << good << ": " << stria_get_last_error();
    for (stria_context_t c : group) EXPECT_EQ(stria_context_destroy(c), STRIA_SUCCESS);
  }
  unsetenv("STRIA_RING_ORDER");
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

}  // namespace

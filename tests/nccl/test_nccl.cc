// The NCCL transport where no GPU is needed: the module loads and exports its table; it refuses
// what it cannot do (a CPU device, a machine without a usable GPU) at once and with a message,
// before any rank waits on the network; the checks of a caller's communicator; and the
// rendezvous listener that one module hands to another (stria_get_unique_id is served by the UCX
// module where it is built, the NCCL module's rank 0 takes its listener over).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stria/stria.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include "gpu/gpu_util.h"
#include "transport/module_abi.h"
#include "transport/rendezvous/rendezvous.h"

namespace stria {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The module's table, loaded straight from the build tree.
const TransportModule* Module() {
  static void* handle = dlopen(STRIA_NCCL_MODULE, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return nullptr;
  return static_cast<const TransportModule*>(dlsym(handle, "stria_nccl_module_v4"));
}

stria_context_config_t NcclConfig(int rank, int world) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = STRIA_TRANSPORT_NCCL;
  cfg.device = DLDevice{kDLCUDA, 0};
  cfg.timeout_s = 30;
  return cfg;
}

TEST(NcclModule, LoadsAndExportsItsTable) {
  const TransportModule* m = Module();
  ASSERT_NE(m, nullptr) << dlerror();
  EXPECT_EQ(m->abi_version, kTransportModuleAbiVersion);
  EXPECT_STREQ(m->name, "nccl");
  // Only the table: nothing of stria's internals (or of the rendezvous linked into it) leaks.
  void* handle = dlopen(STRIA_NCCL_MODULE, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  EXPECT_EQ(dlsym(handle, "_ZN5stria5ErrorE14stria_status_tPKcz"), nullptr);
  dlclose(handle);
}

TEST(NcclConfig, CpuDeviceIsRefused) {
  stria_context_config_t cfg = NcclConfig(0, 1);
  cfg.device = DLDevice{kDLCPU, 0};
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_UNSUPPORTED);
  const std::string msg = stria_get_last_error();
  EXPECT_NE(msg.find("CUDA device memory"), std::string::npos) << msg;
  EXPECT_NE(msg.find("STRIA_TRANSPORT_UCX"), std::string::npos) << msg;
  EXPECT_EQ(ctx, nullptr);
}

// Without a GPU the module says so at once, whatever the rank: a rank that joined the
// rendezvous first would make rank 0 wait out its timeout.
TEST(NcclNoGpu, CreateFailsAtOnceWithAMessage) {
  if (::stria_test::NoGpuReason().empty()) GTEST_SKIP() << "a GPU is here: tests/nccl/test_nccl_gpu.cc covers it";
  const TransportModule* m = Module();
  ASSERT_NE(m, nullptr);
  stria_unique_id_t id;
  ASSERT_TRUE(m->get_unique_id(&id).ok()) << "the rendezvous needs no GPU";
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      stria_context_config_t cfg = NcclConfig(rank, world);
      cfg.unique_id = id;
      Transport* t = nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      Status s = m->create(cfg, nullptr, 30, &t);
      EXPECT_LT(SecondsSince(t0), 5) << "rank " << rank << " of " << world << " waited";
      EXPECT_EQ(s.code(), STRIA_ERROR_UNSUPPORTED) << s.message();
      EXPECT_NE(s.message().find("needs a CUDA GPU"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find("cudaGetDeviceCount"), std::string::npos) << s.message();
      EXPECT_EQ(t, nullptr);
    }
  }
  // The caller's-communicator path refuses the same way, before touching the (here fake) pointer.
  int fake = 0;
  stria_context_config_t cfg = NcclConfig(0, 1);
  Transport* t = nullptr;
  EXPECT_EQ(m->create(cfg, &fake, 30, &t).code(), STRIA_ERROR_UNSUPPORTED);
  stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
  EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, &fake, &ctx), STRIA_ERROR_UNSUPPORTED);
  EXPECT_STRNE(stria_get_last_error(), "");
  EXPECT_EQ(ctx, nullptr);
}

// Through the C API: the CUDA backend comes first and refuses (no module or no GPU); either way a
// clean error with a message, at once.
TEST(NcclNoGpu, ContextCreateIsACleanError) {
  if (::stria_test::NoGpuReason().empty()) GTEST_SKIP() << "a GPU is here: tests/nccl/test_nccl_gpu.cc covers it";
  stria_unique_id_t id;
  ASSERT_EQ(stria_get_unique_id(&id), STRIA_SUCCESS) << stria_get_last_error();
  for (int rank = 0; rank < 2; ++rank) {
    stria_context_config_t cfg = NcclConfig(rank, 2);
    cfg.unique_id = id;
    stria_context_t ctx = reinterpret_cast<stria_context_t>(0x99);
    const auto t0 = std::chrono::steady_clock::now();
    const stria_status_t s = stria_context_create(&cfg, &ctx);
    EXPECT_LT(SecondsSince(t0), 5);
    EXPECT_TRUE(s == STRIA_ERROR_UNSUPPORTED || s == STRIA_ERROR_CUDA) << stria_status_string(s);
    EXPECT_STRNE(stria_get_last_error(), "");
    EXPECT_EQ(ctx, nullptr);
  }
}

// A stria id names the listener it was issued with; rank 0 of another module finds it among the
// process's sockets, serves the rendezvous on it and stops it afterwards.
TEST(NcclRendezvous, IdCarriesItsListener) {
  unsetenv("STRIA_ROOT");
  RendezvousId id;
  ASSERT_TRUE(OpenRendezvous(&id).ok());
  EXPECT_NE(id.listener, 0u);
  stria_unique_id_t raw;
  EncodeId(id, &raw);
  RendezvousId back;
  ASSERT_TRUE(DecodeId(raw, &back).ok());
  EXPECT_EQ(back.listener, id.listener);
  EXPECT_EQ(back.port, id.port);
  // The NCCL module issues the same kind of id (it serves stria_get_unique_id without UCX).
  const TransportModule* m = Module();
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->get_unique_id(&raw).ok());
  ASSERT_TRUE(DecodeId(raw, &back).ok());
  EXPECT_NE(back.listener, 0u);
  EXPECT_NE(back.port, 0);
}

TEST(NcclRendezvous, RankZeroAdoptsAListenerAnotherModuleOpened) {
  // "Another module's" listener: opened here, kept out of this module's table.
  Fd theirs;
  uint16_t port = 0;
  ASSERT_TRUE(Listen("127.0.0.1", 0, &theirs, &port).ok());
  struct stat st {};
  ASSERT_EQ(fstat(theirs.get(), &st), 0);
  RendezvousId id;
  id.host = "127.0.0.1";
  id.port = port;
  id.listener = static_cast<uint64_t>(st.st_ino);
  for (size_t i = 0; i < kSecretBytes; ++i) id.secret[i] = static_cast<uint8_t>(3 * i + 1);
  auto server = std::async(std::launch::async, [&] {
    std::vector<Bytes> table;
    Status s = ServeRendezvous(id, 3, Bytes{'r', '0'}, 20, nullptr, &table);
    return std::make_pair(s, table);
  });
  std::vector<Bytes> t1, t2;
  Status s1, s2;
  std::thread j1([&] { s1 = JoinRendezvous(id, 1, 3, Bytes{'r', '1'}, 20, nullptr, &t1); });
  std::thread j2([&] { s2 = JoinRendezvous(id, 2, 3, Bytes{'r', '2'}, 20, nullptr, &t2); });
  j1.join();
  j2.join();
  auto [s, table] = server.get();
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(s1.ok()) << s1.message();
  ASSERT_TRUE(s2.ok()) << s2.message();
  EXPECT_EQ(t1, table);
  EXPECT_EQ(table[2], (Bytes{'r', '2'}));
  // Used up: the socket the other module still holds no longer listens.
  int listening = 1;
  socklen_t len = sizeof listening;
  ASSERT_EQ(getsockopt(theirs.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len), 0);
  EXPECT_EQ(listening, 0);
}

TEST(NcclRendezvous, AnotherSocketOnThePortIsNotTaken) {
  // A listener of the application itself on that port (say torchrun's store, when STRIA_ROOT names
  // its port by mistake) is never adopted: without the id's inode rank 0 tries to listen itself
  // and fails with a message.
  Fd app;
  uint16_t port = 0;
  ASSERT_TRUE(Listen("127.0.0.1", 0, &app, &port).ok());
  RendezvousId id;
  id.host = "127.0.0.1";
  id.port = port;
  id.listener = 0;
  std::vector<Bytes> table;
  Status s = ServeRendezvous(id, 2, Bytes{1}, 2, nullptr, &table);
  EXPECT_EQ(s.code(), STRIA_ERROR_TRANSPORT) << s.message();
  EXPECT_NE(s.message().find("cannot listen"), std::string::npos) << s.message();
  int listening = 0;
  socklen_t len = sizeof listening;
  ASSERT_EQ(getsockopt(app.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len), 0);
  EXPECT_EQ(listening, 1) << "the application's listener was touched";
  // An id whose inode names a socket that is not a listener is not adopted either.
  Fd plain(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct stat st {};
  ASSERT_EQ(fstat(plain.get(), &st), 0);
  id.listener = static_cast<uint64_t>(st.st_ino);
  s = ServeRendezvous(id, 2, Bytes{1}, 2, nullptr, &table);
  EXPECT_NE(s.message().find("cannot listen"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace stria

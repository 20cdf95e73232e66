// The C ABI's functions other than the attention calls under bad input (NULL pointers, bad struct
// sizes, positions of impossible layouts), the status strings, the version, and the per-thread
// last error.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "errors/errors_common.h"

using namespace errors_test;

namespace {

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
  stria_traffic_t traffic{};
  expect_invalid(stria_context_get_traffic(nullptr, &traffic), "get_traffic(NULL ctx)");
  expect_invalid(stria_context_get_traffic(ctx, nullptr), "get_traffic(NULL out)");
  for (size_t size : {size_t{0}, sizeof(size_t), sizeof traffic - 1, size_t{1} << 20}) {
    traffic.struct_size = size;
    expect_invalid(stria_context_get_traffic(ctx, &traffic), "get_traffic(struct_size)");
  }
  traffic.struct_size = sizeof traffic;
  EXPECT_EQ(stria_context_get_traffic(ctx, &traffic), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(traffic.messages, 0u);  // no call yet
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

}  // namespace

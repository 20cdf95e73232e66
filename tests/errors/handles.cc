// Context handles: destroyed, doubly destroyed and forged handles are refused, not followed; one
// rank's destruction leaves the others addressable; a second thread's call on a busy context is
// refused at once, naming the call in progress.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "errors/errors_common.h"

using namespace errors_test;

namespace {

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

}  // namespace

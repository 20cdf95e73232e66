// The call signature's agreement on its own (src/ring/signature.cc, compiled into this test): what
// a peer sends is read as untrusted bytes. A failure reason that fills its field without a NUL is
// printed within the field (under ASan a read past it fails this test), fields outside their
// enums make the signature malformed, and the tag messages name untagged calls as such.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ring/signature.h"

namespace stria {
namespace {

std::vector<CallSignature> Ranks(int n, uint64_t tag = 0) {
  std::vector<CallSignature> all(static_cast<size_t>(n));
  for (auto& s : all) {
    InitSignature(RingOp::kForward, 3, tag, &s);
    s.layout = STRIA_LAYOUT_STRIPED;
    s.causal = 1;
    s.scale = 0.125f;
    s.B = 1, s.L = 64, s.Hq = 4, s.Hkv = 2, s.D = 32;
  }
  return all;
}

TEST(Signature, AgreeingRanksPass) {
  const auto all = Ranks(3, 0x5);
  EXPECT_TRUE(CheckAgreement(all.data(), 3, 0).ok());
}

TEST(Signature, AReasonWithoutItsNulIsPrintedWithinItsField) {
  auto all = Ranks(2);
  all[1].status = STRIA_ERROR_INVALID_ARGUMENT;
  std::memset(all[1].reason, 'x', sizeof(all[1].reason));
  const Status s = CheckAgreement(all.data(), 2, 0);
  EXPECT_EQ(s.code(), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find(std::string(sizeof(all[1].reason), 'x')), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find(std::string(sizeof(all[1].reason) + 1, 'x')), std::string::npos) << s.message();
}

TEST(Signature, FieldsOutsideTheirEnumsAreMalformed) {
  const struct {
    const char* field;
    void (*spoil)(CallSignature*);
  } cases[] = {
      {"op", [](CallSignature* s) { s->op = 7; }},
      {"status", [](CallSignature* s) { s->status = 99; }},
      {"negative status", [](CallSignature* s) { s->status = -1; }},
      {"layout", [](CallSignature* s) { s->layout = 3; }},
      {"dtype", [](CallSignature* s) { s->dtype = 5; }},
      {"kv_wire", [](CallSignature* s) { s->kv_wire = 9; }},
      {"magic", [](CallSignature* s) { s->magic ^= 1; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    auto all = Ranks(3);
    c.spoil(&all[2]);
    const Status s = CheckAgreement(all.data(), 3, 0);
    EXPECT_EQ(s.code(), STRIA_ERROR_TRANSPORT);
    EXPECT_NE(s.message().find("rank 2 sent a malformed call signature"), std::string::npos) << s.message();
  }
}

// Ranks whose grids chunk the heads differently (STRIA_GRID_CHUNKS set apart) would exchange
// messages of different sizes: the agreement names the rank instead.
TEST(Signature, GridHeadChunksMustAgree) {
  auto all = Ranks(3);
  for (auto& s : all) {
    s.grid = 3;
    s.grid_chunks = 2;
  }
  all[1].grid_chunks = 1;
  const Status s = CheckAgreement(all.data(), 3, 0);
  EXPECT_EQ(s.code(), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("of all-to-all groups of 3, 1 head chunks"), std::string::npos) << s.message();
}

TEST(Signature, TagMessagesNameUntaggedCallsAndCountTheMajority) {
  auto all = Ranks(3, 0xa);
  all[2].tag = 0xb;
  Status s = CheckAgreement(all.data(), 3, 0);
  EXPECT_EQ(s.code(), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("tagged 0xb on rank 2 but tagged 0xa on rank 0 (2 of the 3 ranks made that one)"),
            std::string::npos)
      << s.message();
  all = Ranks(2);
  all[0].tag = 0xa1;
  s = CheckAgreement(all.data(), 2, 1);
  EXPECT_NE(s.message().find("is untagged on rank 1 but tagged 0xa1 on rank 0"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace stria

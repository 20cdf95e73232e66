// The rendezvous on its own: the id format, SipHash against its published test vector, the wire
// codecs, and a live rank 0 that must refuse junk, wrong secrets, duplicate and out-of-range
// ranks with a clear message while the real ranks still form the ring.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include "transport/rendezvous/rendezvous.h"
#include "transport/rendezvous/siphash.h"

namespace stria {
namespace {

TEST(SipHash, PublishedVector) {
  // Aumasson and Bernstein's test vector: key 00..0f, message 00..0e.
  uint8_t key[16], msg[15];
  for (int i = 0; i < 16; ++i) key[i] = static_cast<uint8_t>(i);
  for (int i = 0; i < 15; ++i) msg[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(SipHash24(key, msg, 15), 0xa129ca6149be45e5ULL);
  EXPECT_EQ(SipHash24(key, msg, 0), 0x726fdb47dd0e0e31ULL);
}

TEST(UniqueId, RoundTripAndRefusals) {
  RendezvousId id;
  id.host = "10.1.2.3";
  id.port = 29500;
  for (size_t i = 0; i < kSecretBytes; ++i) id.secret[i] = static_cast<uint8_t>(i * 7);
  stria_unique_id_t raw;
  EncodeId(id, &raw);
  RendezvousId back;
  ASSERT_TRUE(DecodeId(raw, &back).ok());
  EXPECT_EQ(back.host, id.host);
  EXPECT_EQ(back.port, id.port);
  EXPECT_EQ(std::memcmp(back.secret, id.secret, kSecretBytes), 0);

  stria_unique_id_t junk;
  std::memset(junk.internal, 'x', sizeof junk.internal);
  Status s = DecodeId(junk, &back);
  EXPECT_EQ(s.code(), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("not a stria id"), std::string::npos) << s.message();
  stria_unique_id_t other_version = raw;
  other_version.internal[4] = 9;
  EXPECT_NE(DecodeId(other_version, &back).message().find("version"), std::string::npos);
  stria_unique_id_t zero{};
  EXPECT_TRUE(IsZeroId(zero));
  EXPECT_FALSE(IsZeroId(raw));
}

TEST(UniqueId, HostPortParsing) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(ParseHostPort("node7:29500", &host, &port).ok());
  EXPECT_EQ(host, "node7");
  EXPECT_EQ(port, 29500);
  ASSERT_TRUE(ParseHostPort("[::1]:80", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  for (const char* bad : {"", "node", "node:", ":80", "node:0", "node:65536", "node:8x", "a:b:c", "[::1]80", "no de:1"})
    EXPECT_FALSE(ParseHostPort(bad, &host, &port).ok()) << bad;
}

TEST(UniqueId, FromEnvironment) {
  setenv("STRIA_ROOT", "127.0.0.1:4000", 1);
  unsetenv("STRIA_SECRET");
  RendezvousId a, b, c;
  ASSERT_TRUE(IdFromEnvironment(4, &a).ok());
  ASSERT_TRUE(IdFromEnvironment(4, &b).ok());
  ASSERT_TRUE(IdFromEnvironment(5, &c).ok());
  EXPECT_EQ(std::memcmp(a.secret, b.secret, kSecretBytes), 0) << "every rank derives the same secret";
  EXPECT_NE(std::memcmp(a.secret, c.secret, kSecretBytes), 0) << "another world size is another job";
  setenv("STRIA_SECRET", "00112233445566778899aabbccddeeff", 1);
  ASSERT_TRUE(IdFromEnvironment(4, &a).ok());
  EXPECT_EQ(a.secret[15], 0xff);
  setenv("STRIA_SECRET", "0011", 1);
  EXPECT_EQ(IdFromEnvironment(4, &a).code(), STRIA_ERROR_INVALID_ARGUMENT);
  setenv("STRIA_SECRET", "zz112233445566778899aabbccddeeff", 1);
  EXPECT_EQ(IdFromEnvironment(4, &a).code(), STRIA_ERROR_INVALID_ARGUMENT);
  unsetenv("STRIA_SECRET");
  unsetenv("STRIA_ROOT");
  Status s = IdFromEnvironment(4, &a);
  EXPECT_EQ(s.code(), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("STRIA_ROOT"), std::string::npos);
}

TEST(Wire, RoundTrips) {
  uint8_t secret[kSecretBytes] = {1, 2, 3};
  Nonce server{}, client{};
  server[0] = 9;
  client[3] = 4;
  JoinMsg m;
  m.rank = 3;
  m.world = 8;
  m.client_nonce = client;
  m.blob = {1, 2, 3, 4, 5};
  m.mac = JoinMac(secret, server, m);
  Bytes frame = EncodeJoin(m);
  FrameHeader h{};
  ASSERT_TRUE(ParseFrameHeader(frame.data(), frame.size(), kMaxJoinBytes, &h).ok());
  EXPECT_EQ(h.type, MsgType::kJoin);
  JoinMsg back;
  ASSERT_TRUE(DecodeJoin(frame.data() + kFrameHeaderBytes, h.length, &back).ok());
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.blob, m.blob);
  EXPECT_EQ(JoinMac(secret, server, back), m.mac);
  secret[0] ^= 1;
  EXPECT_NE(JoinMac(secret, server, back), m.mac) << "another secret gives another mac";
  secret[0] ^= 1;

  std::vector<Bytes> blobs{{1}, {}, {2, 3}};
  Bytes t = EncodeTable(secret, client, blobs);
  ASSERT_TRUE(ParseFrameHeader(t.data(), t.size(), kMaxTableBytes, &h).ok());
  std::vector<Bytes> got;
  ASSERT_TRUE(DecodeTable(t.data() + kFrameHeaderBytes, h.length, secret, client, 3, &got).ok());
  EXPECT_EQ(got, blobs);
  EXPECT_FALSE(DecodeTable(t.data() + kFrameHeaderBytes, h.length, secret, client, 4, &got).ok());
  Nonce other = client;
  other[0] ^= 1;
  EXPECT_FALSE(DecodeTable(t.data() + kFrameHeaderBytes, h.length, secret, other, 3, &got).ok()) << "replayed table";
  t.back() ^= 1;
  EXPECT_FALSE(DecodeTable(t.data() + kFrameHeaderBytes, h.length, secret, client, 3, &got).ok()) << "tampered";
}

TEST(Wire, HeaderRefusals) {
  FrameHeader h{};
  const uint8_t http[] = "GET / HTTP/1.1\r\n";
  Status s = ParseFrameHeader(http, 12, kMaxJoinBytes, &h);
  EXPECT_NE(s.message().find("does not speak"), std::string::npos) << s.message();
  Bytes big = EncodeError("x");
  big[8] = 0x7f;  // a length of ~2 GiB
  s = ParseFrameHeader(big.data(), big.size(), kMaxJoinBytes, &h);
  EXPECT_NE(s.message().find("exceeds the limit"), std::string::npos) << s.message();
  Bytes wrong_type = EncodeError("x");
  wrong_type[7] = 77;
  EXPECT_FALSE(ParseFrameHeader(wrong_type.data(), wrong_type.size(), kMaxJoinBytes, &h).ok());
}

// A live rendezvous on loopback.
class LiveRendezvous : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("STRIA_ROOT");  // an ephemeral port: tests may run side by side
    ASSERT_TRUE(OpenRendezvous(&id_).ok());
    id_.host = "127.0.0.1";  // the listener is on every interface; loopback is enough here
  }

  // rank 0 serving `world` in the background.
  std::future<std::pair<Status, std::vector<Bytes>>> Serve(int world, double timeout) {
    return std::async(std::launch::async, [this, world, timeout] {
      std::vector<Bytes> table;
      Status s = ServeRendezvous(id_, world, Bytes{'r', '0'}, timeout, nullptr, &table);
      return std::make_pair(s, table);
    });
  }
  Status Join(const RendezvousId& id, int rank, int world, std::vector<Bytes>* table, double timeout = 10) {
    return JoinRendezvous(id, rank, world, Bytes{'r', static_cast<uint8_t>('0' + rank)}, timeout, nullptr, table);
  }

  // A raw TCP connection to rank 0: returns what rank 0 answered after `bytes`.
  std::string RawExchange(const Bytes& bytes, bool read_challenge_first = true) {
    Fd fd;
    EXPECT_TRUE(Connect(id_.host, id_.port, DeadlineAfter(5), nullptr, &fd).ok());
    FrameHeader h{};
    Bytes payload;
    if (read_challenge_first) {
      Status s = RecvFrame(fd.get(), 64, DeadlineAfter(5), nullptr, "rank 0", &h, &payload);
      EXPECT_TRUE(s.ok()) << s.message();
      EXPECT_EQ(h.type, MsgType::kChallenge);
    }
    if (!bytes.empty()) (void)SendAll(fd.get(), bytes, DeadlineAfter(5), nullptr, "rank 0");
    Status s = RecvFrame(fd.get(), kMaxErrorBytes, DeadlineAfter(15), nullptr, "rank 0", &h, &payload);
    if (!s.ok()) return "no answer: " + s.message();
    std::string text;
    (void)DecodeError(payload.data(), payload.size(), &text);
    return std::string(MsgTypeName(static_cast<uint16_t>(h.type))) + ": " + text;
  }

  // A JOIN that is well formed but for `rank`/`world` and signed with `secret`.
  Bytes JoinFrame(const RendezvousId& id, int rank, int world, const Nonce& server_nonce) {
    JoinMsg m;
    m.rank = rank;
    m.world = world;
    m.blob = {'x'};
    m.mac = JoinMac(id.secret, server_nonce, m);
    return EncodeJoin(m);
  }

  // Connects, reads the challenge and answers with a JOIN built for it.
  std::string JoinAs(const RendezvousId& id, int rank, int world) {
    Fd fd;
    EXPECT_TRUE(Connect(id_.host, id_.port, DeadlineAfter(5), nullptr, &fd).ok());
    FrameHeader h{};
    Bytes payload;
    EXPECT_TRUE(RecvFrame(fd.get(), 64, DeadlineAfter(5), nullptr, "rank 0", &h, &payload).ok());
    Nonce n{};
    EXPECT_TRUE(DecodeChallenge(payload.data(), payload.size(), &n).ok());
    (void)SendAll(fd.get(), JoinFrame(id, rank, world, n), DeadlineAfter(5), nullptr, "rank 0");
    Status s = RecvFrame(fd.get(), kMaxTableBytes, DeadlineAfter(15), nullptr, "rank 0", &h, &payload);
    if (!s.ok()) return "no answer: " + s.message();
    std::string text;
    if (h.type == MsgType::kError) (void)DecodeError(payload.data(), payload.size(), &text);
    return std::string(MsgTypeName(static_cast<uint16_t>(h.type))) + ": " + text;
  }

  RendezvousId id_;
};

TEST_F(LiveRendezvous, FormsTheTable) {
  auto server = Serve(4, 20);
  std::vector<std::thread> ranks;
  std::vector<std::vector<Bytes>> tables(4);
  std::vector<Status> st(4);
  for (int r = 1; r < 4; ++r) ranks.emplace_back([&, r] { st[r] = Join(id_, r, 4, &tables[r]); });
  for (auto& t : ranks) t.join();
  auto [s, table] = server.get();
  ASSERT_TRUE(s.ok()) << s.message();
  for (int r = 1; r < 4; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].message();
    EXPECT_EQ(tables[r], table);
  }
  EXPECT_EQ(table[2], (Bytes{'r', '2'}));
}

TEST_F(LiveRendezvous, RefusesJunkAndImpostorsThenFormsTheRing) {
  auto server = Serve(3, 30);
  RendezvousId wrong = id_;
  wrong.secret[0] ^= 0x5a;
  // Not our protocol at all.
  const std::string http_text = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_NE(RawExchange(Bytes(http_text.begin(), http_text.end())).find("does not speak the stria rendezvous"),
            std::string::npos);
  // A frame claiming 2 GiB.
  Bytes huge = EncodeError("");
  huge[6] = 0;
  huge[7] = 2;
  huge[8] = 0x7f;
  EXPECT_NE(RawExchange(huge).find("exceeds the limit"), std::string::npos);
  // A TABLE where a JOIN is due.
  EXPECT_NE(RawExchange(EncodeTable(id_.secret, Nonce{}, {})).find("expected a JOIN"), std::string::npos);
  // Well-formed joins that must be refused.
  EXPECT_NE(JoinAs(wrong, 1, 3).find("wrong secret"), std::string::npos);
  EXPECT_NE(JoinAs(id_, 7, 3).find("out of range"), std::string::npos);
  EXPECT_NE(JoinAs(id_, 0, 3).find("out of range"), std::string::npos);
  EXPECT_NE(JoinAs(id_, 1, 5).find("world of 5"), std::string::npos);
  // A real rank 1, then an impostor claiming rank 1 with the right secret: refused as a duplicate.
  std::vector<Bytes> t1, t2;
  Status s1, s2;
  std::thread r1([&] { s1 = Join(id_, 1, 3, &t1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_NE(JoinAs(id_, 1, 3).find("already joined"), std::string::npos);
  // Our own client with the wrong secret hears why it was refused.
  std::vector<Bytes> tw;
  Status sw = Join(wrong, 2, 3, &tw, 5);
  EXPECT_EQ(sw.code(), STRIA_ERROR_TRANSPORT);
  EXPECT_NE(sw.message().find("wrong secret"), std::string::npos) << sw.message();
  std::thread r2([&] { s2 = Join(id_, 2, 3, &t2); });
  r1.join();
  r2.join();
  auto [s, table] = server.get();
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(s1.ok()) << s1.message();
  ASSERT_TRUE(s2.ok()) << s2.message();
  EXPECT_EQ(t1, table);
}

TEST_F(LiveRendezvous, SilentConnectionDoesNotBlockOthers) {
  auto server = Serve(2, 20);
  Fd idle;
  ASSERT_TRUE(Connect(id_.host, id_.port, DeadlineAfter(5), nullptr, &idle).ok());  // says nothing
  std::vector<Bytes> t;
  Status s1 = Join(id_, 1, 2, &t);
  EXPECT_TRUE(s1.ok()) << s1.message();
  EXPECT_TRUE(server.get().first.ok());
}

TEST_F(LiveRendezvous, MissingRankTimesOutWithItsNumber) {
  auto server = Serve(3, 1.5);
  std::vector<Bytes> t;
  Status s1 = Join(id_, 1, 3, &t, 1.5);
  auto [s, table] = server.get();
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT);
  EXPECT_NE(s.message().find("rank(s) 2 "), std::string::npos) << s.message();
  // The joined rank hears rank 0's reason rather than timing out on its own.
  EXPECT_EQ(s1.code(), STRIA_ERROR_TRANSPORT) << s1.message();
  EXPECT_NE(s1.message().find("rank(s) 2 "), std::string::npos) << s1.message();
}

// Rank 0's last look: it runs once everyone has joined (never on a failed rendezvous), sees every
// blob, completes rank 0's own before the table goes out, and its refusal reaches every rank.
TEST_F(LiveRendezvous, RankZeroCompletesItsEntryOnlyOnceEveryRankJoined) {
  std::atomic<int> calls{0};  // the server's thread runs it
  auto complete = [&](std::vector<Bytes>* table) {
    ++calls;
    EXPECT_EQ(table->size(), 3u);
    if ((*table)[2] == Bytes{'b', 'a', 'd'}) return Error(STRIA_ERROR_UNSUPPORTED, "rank 2 brought a bad entry");
    (*table)[0].push_back('z');
    return Status::Ok();
  };
  for (const bool bad : {false, true}) {
    SCOPED_TRACE(bad ? "refused" : "completed");
    if (bad) {
      unsetenv("STRIA_ROOT");
      ASSERT_TRUE(OpenRendezvous(&id_).ok());
      id_.host = "127.0.0.1";
    }
    calls = 0;
    auto server = std::async(std::launch::async, [&] {
      std::vector<Bytes> table;
      Status s = ServeRendezvous(id_, 3, Bytes{'r', '0'}, complete, 20, nullptr, &table);
      return std::make_pair(s, table);
    });
    std::vector<Bytes> t1, t2;
    Status s1, s2;
    std::thread r1([&] { s1 = Join(id_, 1, 3, &t1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(calls, 0) << "ran before rank 2 joined";
    s2 = JoinRendezvous(id_, 2, 3, bad ? Bytes{'b', 'a', 'd'} : Bytes{'r', '2'}, 10, nullptr, &t2);
    r1.join();
    auto [s, table] = server.get();
    EXPECT_EQ(calls, 1);
    if (!bad) {
      ASSERT_TRUE(s.ok()) << s.message();
      EXPECT_EQ(table[0], (Bytes{'r', '0', 'z'}));
      EXPECT_EQ(t1, table);
      EXPECT_EQ(t2, table);
      continue;
    }
    EXPECT_EQ(s.code(), STRIA_ERROR_UNSUPPORTED) << s.message();
    for (const Status* other : {&s1, &s2})
      EXPECT_NE(other->message().find("rank 2 brought a bad entry"), std::string::npos) << other->message();
  }
  // A rendezvous that fails never gets there.
  unsetenv("STRIA_ROOT");
  ASSERT_TRUE(OpenRendezvous(&id_).ok());
  calls = 0;
  std::vector<Bytes> table;
  EXPECT_EQ(ServeRendezvous(id_, 2, Bytes{'r', '0'}, complete, 0.3, nullptr, &table).code(), STRIA_ERROR_TIMEOUT);
  EXPECT_EQ(calls, 0);
}

TEST(Rendezvous, NoRankZero) {
  RendezvousId id;
  id.host = "127.0.0.1";
  Fd probe;
  uint16_t port = 0;
  ASSERT_TRUE(Listen("127.0.0.1", 0, &probe, &port).ok());
  probe.reset();  // nothing listens there now
  id.port = port;
  std::vector<Bytes> t;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = JoinRendezvous(id, 1, 2, Bytes{1}, 0.5, nullptr, &t);
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT);
  EXPECT_NE(s.message().find("is rank 0 running"), std::string::npos) << s.message();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
}

}  // namespace
}  // namespace stria

// The pull transports against real peers in one process: a decode-side Transport reads a
// prefill-side Exposure over UCX (two workers, RMA get) and over gRPC (PrefillNode.ReadRegions
// on a loopback server). The fault-injecting transport drops, delays, corrupts and truncates,
// and a read that fails or times out leaves nothing written after it returns.
#include "baton/transfer/transport.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "baton/transfer/exposure.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "testing/eventually.h"

namespace baton::transfer {
namespace {

using ::baton::testing::EventuallyThat;
using ::testing::HasSubstr;

constexpr char kPoison = static_cast<char>(0xA5);

// Writes one chunk, then finishes OK: a peer that lies about where its bytes go.
class OneChunk final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit OneChunk(const v1::RegionChunk& chunk) {
    bool own = false;
    (void)grpc::SerializationTraits<v1::RegionChunk>::Serialize(chunk, &buffer_, &own);
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer buffer_;
};

// A PrefillNode that only serves reads of its exposures (what baton-prefill does in
// ReadRegions), optionally holding each read back first, or answering each read with the one
// chunk `lie` makes of its request instead. `answered` counts the reads it has answered (handed
// its answer to gRPC, after the hold).
class ReadRegionsServer final
    : public v1::PrefillNode::WithRawCallbackMethod_ReadRegions<v1::PrefillNode::Service> {
 public:
  explicit ReadRegionsServer(const ExposureTable& table) : table_(table) {}
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadRegions(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override {
    if (hold_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms.load()));
    grpc::ServerWriteReactor<grpc::ByteBuffer>* answer;
    if (lie) {
      v1::ReadRegionsRequest read;
      grpc::ByteBuffer copy(*request);
      (void)grpc::SerializationTraits<v1::ReadRegionsRequest>::Deserialize(&copy, &read);
      answer = new OneChunk(lie(read));
    } else {
      answer = table_.Stream("", *request);
    }
    ++answered;
    return answer;
  }
  std::atomic<int> hold_ms{0};
  std::atomic<int> answered{0};
  std::function<v1::RegionChunk(const v1::ReadRegionsRequest&)> lie;

 private:
  const ExposureTable& table_;
};

// Destination memory shaped like a decode reservation: pages scattered (every other page slot
// of a larger buffer), all filled with a poison pattern.
struct Destination {
  explicit Destination(const RegionSizes& sizes)
      : rings(sizes.producer_swa + sizes.consumer_swa, kPoison),
        page_memory(2 * sizes.pages * sizes.page, kPoison) {
    spans.sizes = sizes;
    spans.producer_swa = rings.data();
    spans.consumer_swa = rings.data() + sizes.producer_swa;
    // Pages 0 and 1 adjacent (one get), then gaps.
    for (uint64_t p = 0; p < sizes.pages; ++p) {
      spans.pages.push_back(page_memory.data() + (p < 2 ? p : 2 * p) * sizes.page);
    }
  }
  // The bytes of `region` as they are in this destination.
  std::string Bytes(v1::Region region) const {
    std::string out;
    ForEachPiece(spans, region, 0, spans.sizes.bytes(region),
                 [&](char* local, uint64_t n, uint64_t) { out.append(local, n); });
    return out;
  }
  bool Untouched() const {
    for (char c : rings) {
      if (c != kPoison) return false;
    }
    for (char c : page_memory) {
      if (c != kPoison) return false;
    }
    return true;
  }
  std::string rings, page_memory;
  RegionSpans spans;
};

class TransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sizes_ = {.producer_swa = 3000, .consumer_swa = 5000, .page = 4096, .pages = 5};
    sizes_.block_kv = sizes_.pages * sizes_.page - 1000;  // the last page partial
    auto worker = UcxWorker::Create();
    ASSERT_TRUE(worker.ok()) << worker.status();
    exposer_ = *std::move(worker);
    progress_ = std::thread([this] {
      while (!stop_) {
        if (exposer_->Progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    pool_ = std::make_unique<StagingPool>(exposer_.get(), 64 << 20);
    auto exposure = Exposure::Create(*pool_, sizes_, "", "reader");
    ASSERT_TRUE(exposure.ok()) << exposure.status();
    exposure_ = *exposure;
    // Recognisable bytes: each region its own pattern.
    auto fill = [](float* at, uint64_t bytes, int seed) {
      char* p = reinterpret_cast<char*>(at);
      for (uint64_t i = 0; i < bytes; ++i) p[i] = static_cast<char>((i * 7 + seed) % 251);
    };
    fill(exposure_->producer_swa(), sizes_.producer_swa, 1);
    fill(exposure_->consumer_swa(), sizes_.consumer_swa, 2);
    fill(exposure_->block_kv(), sizes_.block_kv, 3);
    table_.Add(exposure_);

    server_impl_ = std::make_unique<ReadRegionsServer>(table_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(server_impl_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    stop_ = true;
    if (progress_.joinable()) progress_.join();
  }

  std::string Source(v1::Region region) const {
    const char* base = reinterpret_cast<const char*>(
        region == v1::REGION_PRODUCER_SWA   ? exposure_->producer_swa()
        : region == v1::REGION_CONSUMER_SWA ? exposure_->consumer_swa()
                                            : exposure_->block_kv());
    return std::string(base, sizes_.bytes(region));
  }
  void ExpectSame(const Destination& into) const {
    for (v1::Region region :
         {v1::REGION_PRODUCER_SWA, v1::REGION_CONSUMER_SWA, v1::REGION_BLOCK_KV}) {
      EXPECT_EQ(into.Bytes(region), Source(region)) << v1::Region_Name(region);
    }
  }
  Clock::time_point In(int ms) const { return Clock::now() + std::chrono::milliseconds(ms); }

  RegionSizes sizes_;
  std::unique_ptr<UcxWorker> exposer_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  std::unique_ptr<StagingPool> pool_;
  std::shared_ptr<Exposure> exposure_;
  ExposureTable table_;
  std::unique_ptr<ReadRegionsServer> server_impl_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(TransportTest, UcxGetReadsEveryRegionIntoScatteredPages) {
  auto reader = UcxWorker::Create();
  ASSERT_TRUE(reader.ok());
  std::unique_ptr<Transport> ucx = MakeUcxTransport(**reader);
  Destination into(sizes_);
  const v1::RegionSource source = exposure_->Source(v1::TRANSPORT_UCX);
  EXPECT_FALSE(source.rkey().empty());
  ASSERT_TRUE(ucx->Read(source, "", into.spans, In(10000)).ok());
  ExpectSame(into);
  // The page slots between the scattered pages stay as they were.
  EXPECT_EQ(into.page_memory[2 * sizes_.page], kPoison);
}

TEST_F(TransportTest, UcxReadsOfAReusedStagingBufferSeeItsNewContents) {
  auto reader = UcxWorker::Create();
  ASSERT_TRUE(reader.ok());
  std::unique_ptr<Transport> ucx = MakeUcxTransport(**reader);
  Destination first(sizes_);
  ASSERT_TRUE(ucx->Read(exposure_->Source(v1::TRANSPORT_UCX), "", first.spans, In(10000)).ok());
  // The next request to the same reader gets the same buffer and key, zeroed, with new state;
  // the reader's cached key reads the new bytes.
  const v1::RegionSource old_source = exposure_->Source(v1::TRANSPORT_UCX);
  table_.Remove(exposure_->id());
  exposure_.reset();
  auto next = Exposure::Create(*pool_, sizes_, "", "reader");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ((*next)->Source(v1::TRANSPORT_UCX).rkey(), old_source.rkey());
  EXPECT_EQ(reinterpret_cast<const char*>((*next)->block_kv())[5], 0);
  std::memset((*next)->block_kv(), 9, sizes_.block_kv);
  Destination second(sizes_);
  ASSERT_TRUE(ucx->Read((*next)->Source(v1::TRANSPORT_UCX), "", second.spans, In(10000)).ok());
  EXPECT_EQ(second.Bytes(v1::REGION_BLOCK_KV), std::string(sizes_.block_kv, 9));
}

TEST(StagingPoolTest, ABufferServesOnlyItsReaderAndIdleBuffersAreBounded) {
  StagingPool pool(nullptr, 2 << 20);
  auto a = pool.Acquire("decode-a", 100);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->capacity, 1u << 20);  // at least 1 MiB, a power of two
  char* a_base = (*a)->base;
  std::memset(a_base, 'a', 100);
  pool.Release(*std::move(a));
  EXPECT_EQ(pool.idle_bytes(), 1u << 20);
  // Another reader never gets decode-a's buffer; decode-a gets it back, zeroed.
  auto b = pool.Acquire("decode-b", 100);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)->base, a_base);
  auto again = pool.Acquire("decode-a", 100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->base, a_base);
  EXPECT_EQ(a_base[0], 0);
  // Past cache_bytes the least recently released idle buffers go.
  auto big = pool.Acquire("decode-a", (2 << 20) + 1);  // a 4 MiB buffer: never kept
  ASSERT_TRUE(big.ok());
  pool.Release(*std::move(big));
  EXPECT_EQ(pool.idle_bytes(), 0u);
  pool.Release(*std::move(b));
  pool.Release(*std::move(again));
  EXPECT_EQ(pool.idle_bytes(), 2u << 20);
  auto c = pool.Acquire("decode-c", 1 << 20);
  ASSERT_TRUE(c.ok());
  pool.Release(*std::move(c));
  EXPECT_EQ(pool.idle_bytes(), 2u << 20);  // decode-b's, the oldest, went
  auto b_again = pool.Acquire("decode-b", 100);
  ASSERT_TRUE(b_again.ok());
  EXPECT_EQ(pool.idle_bytes(), 2u << 20);  // a new one: nothing idle was decode-b's
  // With cache_bytes 0 every buffer is for one request.
  StagingPool strict(nullptr, 0);
  auto once = strict.Acquire("decode-a", 100);
  ASSERT_TRUE(once.ok());
  strict.Release(*std::move(once));
  EXPECT_EQ(strict.idle_bytes(), 0u);
}

TEST_F(TransportTest, UcxSourceFieldsOutsideTheirBoundsAreRefused) {
  auto reader = UcxWorker::Create();
  ASSERT_TRUE(reader.ok());
  std::unique_ptr<Transport> ucx = MakeUcxTransport(**reader);
  Destination into(sizes_);
  v1::RegionSource source = exposure_->Source(v1::TRANSPORT_UCX);
  source.set_address(~uint64_t{0} - 100);
  absl::Status status = ucx->Read(source, "", into.spans, In(1000));
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("wraps 64 bits"));
  source = exposure_->Source(v1::TRANSPORT_UCX);
  source.set_rkey(std::string(kMaxRkeyBytes + 1, 'k'));
  status = ucx->Read(source, "", into.spans, In(1000));
  EXPECT_THAT(status.message(), HasSubstr("source.rkey"));
  EXPECT_TRUE(into.Untouched());
}

// The reproducer of issue 48's UCX item: a Commit naming staging memory outside what its key
// covers is refused by name before any get (under shared memory a get is a plain copy from the
// attached segment, which UCX does not check against the key, so it would read this process's
// own memory or crash it): past the exposure's end, across it, before its start, more than it
// holds, an exposure that wraps 64 bits, an address whose end wraps, and no exposure named.
// This process, the reader, stays up with its destination untouched, and reads the real
// exposure afterwards.
TEST_F(TransportTest, UcxReadsOutsideWhatTheKeyCoversAreRefusedByName) {
  auto reader = UcxWorker::Create();
  ASSERT_TRUE(reader.ok());
  std::unique_ptr<Transport> ucx = MakeUcxTransport(**reader);
  const v1::RegionSource good = exposure_->Source(v1::TRANSPORT_UCX);
  const uint64_t begin = good.exposed_address(), bytes = good.exposed_bytes();
  const uint64_t total = StagingBytes(sizes_);
  ASSERT_EQ(good.address(), begin);
  ASSERT_GE(bytes, total);
  const uint64_t top = ~uint64_t{0};
  struct Case {
    const char* name;
    std::function<void(v1::RegionSource&)> forge;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"past the end", [&](auto& s) { s.set_address(begin + bytes); }, "source.address"},
      {"across the end", [&](auto& s) { s.set_address(begin + bytes - total + 1); },
       "source.address"},
      {"before the start", [&](auto& s) { s.set_address(begin - 4096); }, "source.address"},
      {"more than it holds", [&](auto& s) { s.set_exposed_bytes(total - 1); }, "source.address"},
      {"an exposure that wraps",
       [&](auto& s) {
         s.set_exposed_address(top - 100);
         s.set_address(top - 50);
       },
       "source.exposed_bytes"},
      {"an end that wraps", [&](auto& s) { s.set_address(top - 100); }, "wraps 64 bits"},
      {"no exposure named", [&](auto& s) { s.clear_exposed_bytes(); }, "source.exposed_bytes"},
  };
  Destination into(sizes_);
  for (const Case& c : cases) {
    v1::RegionSource source = good;
    c.forge(source);
    const absl::Status status = ucx->Read(source, "", into.spans, In(1000));
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << c.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.field)) << c.name;
    EXPECT_TRUE(into.Untouched()) << c.name;
  }
  ASSERT_TRUE(ucx->Read(good, "", into.spans, In(10000)).ok());
  ExpectSame(into);
}

// The same Commit from a peer that lies consistently: its exposure names far more than the key
// covers, so CheckUcxSource passes, and the address lies outside the staging segment (past its
// end, before its start, and in this process's own heap). The reader bounds the read by the
// segment that unpacking the key attached and refuses each by name; it stays up with its
// destination untouched, and reads the real exposure afterwards.
TEST_F(TransportTest, UcxReadsOutsideWhatTheKeyAttachedAreRefusedWhateverTheExposureSays) {
  auto reader = UcxWorker::Create();
  ASSERT_TRUE(reader.ok());
  std::unique_ptr<Transport> ucx = MakeUcxTransport(**reader);
  const v1::RegionSource good = exposure_->Source(v1::TRANSPORT_UCX);
  const uint64_t begin = good.exposed_address(), bytes = good.exposed_bytes();
  const auto secret = std::make_unique<std::string>(4096, 's');
  const uint64_t heap = reinterpret_cast<uint64_t>(secret->data());
  struct Case {
    const char* name;
    uint64_t address;
  };
  const std::vector<Case> cases = {
      {"past the segment's end", begin + bytes + 4096},
      {"before the segment's start", begin - (uint64_t{1} << 24)},
      {"this process's heap", heap},
  };
  Destination into(sizes_);
  for (const Case& c : cases) {
    v1::RegionSource source = good;
    source.set_address(c.address);
    source.set_exposed_address(std::min(c.address, begin));
    source.set_exposed_bytes(uint64_t{1} << 40);
    ASSERT_TRUE(CheckUcxSource(source, sizes_).ok()) << c.name;  // the lie passes the first check
    const absl::Status status = ucx->Read(source, "", into.spans, In(1000));
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << c.name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("outside the memory the key attached")) << c.name;
    EXPECT_TRUE(into.Untouched()) << c.name;
  }
  ASSERT_TRUE(ucx->Read(good, "", into.spans, In(10000)).ok());
  ExpectSame(into);
}

// Over TCP a get needs the prefill worker's progress; without it the read stalls. A read past
// its deadline, or abandoned, force-closes its endpoint and waits for the cancelled gets:
// when the prefill worker resumes, nothing of the late answer reaches the destination.
TEST(UcxStallTest, StalledGetPastItsDeadlineOrAbandonedWritesNothingAfterwards) {
  setenv("UCX_TLS", "tcp,self", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  // TCP only where the operator says the network is trusted (UcxTransports).
  auto exposer = UcxWorker::Create({.allow_unprotected_tcp = true});
  auto reader = UcxWorker::Create({.peer_error_handling = true, .allow_unprotected_tcp = true});
  unsetenv("UCX_TLS");
  unsetenv("UCX_NET_DEVICES");
  ASSERT_TRUE(exposer.ok() && reader.ok());
  RegionSizes sizes{.producer_swa = 4096, .consumer_swa = 4096, .page = 65536, .pages = 4};
  sizes.block_kv = 4 * 65536;
  StagingPool pool(exposer->get(), 0);
  auto exposure = Exposure::Create(pool, sizes, "", "reader");
  ASSERT_TRUE(exposure.ok());
  std::memset((*exposure)->producer_swa(), 1, StagingBytes(sizes));
  std::unique_ptr<Transport> ucx = MakeUcxTransport(**reader);
  for (const bool abandon : {false, true}) {
    Destination into(sizes);
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(abandon ? 60000 : 300);
    const Clock::time_point stop_at = Clock::now() + std::chrono::milliseconds(300);
    const absl::Status status =
        ucx->Read((*exposure)->Source(v1::TRANSPORT_UCX), "", into.spans, deadline,
                  [&] { return abandon && Clock::now() > stop_at; });
    EXPECT_EQ(status.code(),
              abandon ? absl::StatusCode::kCancelled : absl::StatusCode::kDeadlineExceeded)
        << status;
    // The prefill worker resumes: whatever it answers now lands nowhere.
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < until) (*exposer)->Progress();
    (*reader)->Progress();
    EXPECT_TRUE(into.Untouched()) << (abandon ? "abandoned" : "timed out");
  }
}

TEST_F(TransportTest, GrpcReadRegionsReadsEveryRegionInChunks) {
  std::unique_ptr<Transport> grpc = MakeGrpcTransport();
  Destination into(sizes_);
  ASSERT_TRUE(
      grpc->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(10000))
          .ok());
  ExpectSame(into);
}

// Regions larger than one stream (kGrpcReadBytes) are read by several streams at once, each in
// chunks, into pages scattered over the destination.
TEST(GrpcTransportTest, LargeRegionsArriveWholeOverSeveralStreams) {
  RegionSizes sizes{.producer_swa = 3 * kGrpcRegionChunkBytes + 17, .consumer_swa = 12345,
                    .page = 1 << 20, .pages = 2 * kGrpcReadBytes / (1 << 20) + 3};
  sizes.block_kv = sizes.pages * sizes.page - 999;
  StagingPool pool(nullptr, 0);
  auto exposure = Exposure::Create(pool, sizes, "", "reader");
  ASSERT_TRUE(exposure.ok());
  char* staged = reinterpret_cast<char*>((*exposure)->producer_swa());
  for (uint64_t i = 0; i < StagingBytes(sizes); ++i) staged[i] = static_cast<char>((i * 131) >> 7);
  ExposureTable table;
  table.Add(*exposure);
  ReadRegionsServer service(table);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  Destination into(sizes);
  const absl::Status status = MakeGrpcTransport()->Read(
      (*exposure)->Source(v1::TRANSPORT_GRPC), "127.0.0.1:" + std::to_string(port), into.spans,
      Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(status.ok()) << status;
  for (v1::Region region : {v1::REGION_PRODUCER_SWA, v1::REGION_CONSUMER_SWA, v1::REGION_BLOCK_KV}) {
    const std::string got = into.Bytes(region);
    ASSERT_EQ(got.size(), sizes.bytes(region));
    EXPECT_EQ(0, std::memcmp(got.data(), staged + StagingOffset(sizes, region), got.size()))
        << v1::Region_Name(region);
  }
  server->Shutdown();
}

// The reader checks every chunk before it writes: one that names another place is refused and
// nothing of it lands. Every stream of the read is lied to (the reader runs several at once, in
// no fixed order), each lie wrong for the stream that receives it: one byte past where the
// stream is, another region at the same place, or an offset whose end wraps 64 bits.
TEST_F(TransportTest, AChunkOutsideWhatWasAskedIsRefusedAndWritesNothing) {
  std::unique_ptr<Transport> grpc = MakeGrpcTransport();
  using Lie = std::function<void(const v1::ReadRegionsRequest&, v1::RegionChunk&)>;
  const std::vector<std::pair<std::string, Lie>> lies = {
      {"past", [](const v1::ReadRegionsRequest& read, v1::RegionChunk& chunk) {
         chunk.set_region(read.region());
         chunk.set_offset(read.offset() + 1);
       }},
      {"other region", [](const v1::ReadRegionsRequest& read, v1::RegionChunk& chunk) {
         chunk.set_region(read.region() == v1::REGION_CONSUMER_SWA ? v1::REGION_PRODUCER_SWA
                                                                   : v1::REGION_CONSUMER_SWA);
         chunk.set_offset(read.offset());
       }},
      {"wrapping", [](const v1::ReadRegionsRequest& read, v1::RegionChunk& chunk) {
         chunk.set_region(read.region());
         chunk.set_offset(~uint64_t{0} - 2);
       }},
  };
  for (const auto& [name, lie] : lies) {
    server_impl_->lie = [&lie = lie](const v1::ReadRegionsRequest& read) {
      v1::RegionChunk chunk;
      lie(read, chunk);
      chunk.set_data(std::string(64, 'L'));
      return chunk;
    };
    Destination into(sizes_);
    const absl::Status status =
        grpc->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(5000));
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("lies outside region")) << name;
    EXPECT_TRUE(into.Untouched()) << name;
  }
  server_impl_->lie = nullptr;
}

TEST_F(TransportTest, ReadsOfAClosedOrUnknownExposureAreNotFoundAndWriteNothing) {
  std::unique_ptr<Transport> grpc = MakeGrpcTransport();
  Destination into(sizes_);
  v1::RegionSource source = exposure_->Source(v1::TRANSPORT_GRPC);
  table_.Remove(exposure_->id());
  absl::Status status = grpc->Read(source, address_, into.spans, In(5000));
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_TRUE(into.Untouched());
}

TEST_F(TransportTest, ReadRangesNearTwoToTheSixtyFourAreRefused) {
  auto stub = v1::PrefillNode::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  v1::ReadRegionsRequest request;
  request.set_exposure_id(exposure_->id());
  request.set_region(v1::REGION_PRODUCER_SWA);
  // offset + length wraps to 16: a naive end check passes and reads 8 KiB below the region.
  request.set_offset(~uint64_t{0} - 8192 + 1);
  request.set_length(8208);
  grpc::ClientContext context;
  auto reader = stub->ReadRegions(&context, request);
  v1::RegionChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("lies outside region REGION_PRODUCER_SWA"));
}

TEST_F(TransportTest, FaultSpecParsesAndNamesWhatIsWrong) {
  auto spec = ParseFaultSpec("drop=0.25,corrupt=1,truncate=0,delay_ms=30,seed=9");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->drop, 0.25);
  EXPECT_EQ(spec->corrupt, 1);
  EXPECT_EQ(spec->delay_ms, 30);
  EXPECT_EQ(spec->seed, 9u);
  EXPECT_THAT(ParseFaultSpec("drop=2").status().message(), HasSubstr("drop must be a probability"));
  EXPECT_THAT(ParseFaultSpec("jitter=1").status().message(), HasSubstr("unknown key 'jitter'"));
  EXPECT_THAT(ParseFaultSpec("delay_ms=-1").status().message(), HasSubstr("delay_ms"));
}

TEST_F(TransportTest, DroppedTransferTimesOutAndWritesNothing) {
  std::unique_ptr<Transport> faulty =
      MakeFaultInjectingTransport(MakeGrpcTransport(), {.drop = 1});
  Destination into(sizes_);
  const absl::Status status =
      faulty->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_TRUE(into.Untouched());
}

TEST_F(TransportTest, TransferDelayedPastItsDeadlineWritesNothing) {
  std::unique_ptr<Transport> faulty =
      MakeFaultInjectingTransport(MakeGrpcTransport(), {.delay_ms = 400});
  Destination into(sizes_);
  absl::Status status =
      faulty->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_TRUE(into.Untouched());
  // Within its deadline the same delay only delays.
  status =
      faulty->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(5000));
  EXPECT_TRUE(status.ok()) << status;
  ExpectSame(into);
}

// The peer answers each read 500 ms late, long after the reader gave up at 100 ms: once the peer
// has answered all of them, nothing of the answers has reached the destination.
TEST_F(TransportTest, SlowPeerPastTheDeadlineIsCancelledAndWritesNothingAfterwards) {
  server_impl_->hold_ms = 500;
  std::unique_ptr<Transport> grpc = MakeGrpcTransport();
  Destination into(sizes_);
  const absl::Status status =
      grpc->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  constexpr int kReads = 3;  // one stream per region, each below kGrpcReadBytes
  ASSERT_TRUE(EventuallyThat([&] { return server_impl_->answered.load(); }, kReads));
  EXPECT_TRUE(into.Untouched());
}

TEST_F(TransportTest, CorruptedTransferDiffersInOneByte) {
  std::unique_ptr<Transport> faulty =
      MakeFaultInjectingTransport(MakeGrpcTransport(), {.corrupt = 1});
  Destination into(sizes_);
  ASSERT_TRUE(
      faulty->Read(exposure_->Source(v1::TRANSPORT_GRPC), address_, into.spans, In(5000))
          .ok());
  const std::string got = into.Bytes(v1::REGION_PRODUCER_SWA);
  const std::string want = Source(v1::REGION_PRODUCER_SWA);
  int differing = 0;
  for (size_t i = 0; i < got.size(); ++i) differing += got[i] != want[i];
  EXPECT_EQ(differing, 1);
  EXPECT_EQ(into.Bytes(v1::REGION_BLOCK_KV), Source(v1::REGION_BLOCK_KV));
}

TEST_F(TransportTest, TruncatedTransferLeavesTheTailUnwritten) {
  auto reader = UcxWorker::Create();
  ASSERT_TRUE(reader.ok());
  std::unique_ptr<Transport> faulty =
      MakeFaultInjectingTransport(MakeUcxTransport(**reader), {.truncate = 1});
  Destination into(sizes_);
  ASSERT_TRUE(
      faulty->Read(exposure_->Source(v1::TRANSPORT_UCX), "", into.spans, In(5000))
          .ok());
  const std::string got = into.Bytes(v1::REGION_BLOCK_KV);
  const std::string want = Source(v1::REGION_BLOCK_KV);
  const size_t half = sizes_.block_kv / 2;
  EXPECT_EQ(got.substr(0, half), want.substr(0, half));
  EXPECT_EQ(got.substr(half), std::string(got.size() - half, kPoison));
}

}  // namespace
}  // namespace baton::transfer

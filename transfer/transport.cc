#include "baton/transfer/transport.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "baton/common/checked_math.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/v1/node.grpc.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/generic/generic_stub.h"

namespace baton::transfer {

RegionSpans SpansOf(model::SequenceState& state, uint64_t prompt_len) {
  return SpansOf(state, RegionSizesFor(state.layout(), prompt_len), {});
}

RegionSpans SpansOf(model::SequenceState& state, const RegionSizes& sizes,
                    std::span<float* const> boundary_pages) {
  RegionSpans spans;
  spans.sizes = sizes;
  spans.producer_swa = reinterpret_cast<char*>(state.producer_swa());
  spans.consumer_swa = reinterpret_cast<char*>(state.consumer_swa());
  for (uint64_t p = 0; p < spans.sizes.pages; ++p) {
    spans.pages.push_back(reinterpret_cast<char*>(state.pages()[p]));
  }
  for (float* page : boundary_pages) spans.boundary_pages.push_back(reinterpret_cast<char*>(page));
  return spans;
}

void ForEachPiece(const RegionSpans& spans, v1::Region region, uint64_t offset, uint64_t length,
                  const std::function<void(char*, uint64_t, uint64_t)>& fn) {
  if (region != v1::REGION_BLOCK_KV && region != v1::REGION_BOUNDARY_ROWS) {
    char* base = region == v1::REGION_PRODUCER_SWA ? spans.producer_swa : spans.consumer_swa;
    if (length > 0) fn(base + offset, length, offset);
    return;
  }
  const std::vector<char*>& pages =
      region == v1::REGION_BLOCK_KV ? spans.pages : spans.boundary_pages;
  const uint64_t page = spans.sizes.page;
  while (length > 0) {
    const uint64_t in_page = offset % page;
    const uint64_t n = std::min(length, page - in_page);
    fn(pages[offset / page] + in_page, n, offset);
    offset += n;
    length -= n;
  }
}

uint64_t StagingOffset(const RegionSizes& sizes, v1::Region region) {
  switch (region) {
    case v1::REGION_PRODUCER_SWA:
      return 0;
    case v1::REGION_CONSUMER_SWA:
      return sizes.producer_swa;
    case v1::REGION_BOUNDARY_ROWS:
      return sizes.producer_swa + sizes.consumer_swa;
    default:
      return sizes.producer_swa + sizes.consumer_swa + sizes.boundary_rows;
  }
}

const char* TransportLabel(v1::Transport transport) {
  return transport == v1::TRANSPORT_GRPC ? "grpc" : "ucx";
}

uint64_t StagingBytes(const RegionSizes& sizes) {
  return sizes.producer_swa + sizes.consumer_swa + sizes.boundary_rows + sizes.block_kv;
}

absl::Status CheckUcxSource(const v1::RegionSource& source, const RegionSizes& sizes) {
  if (source.ucx_worker_address().empty() ||
      source.ucx_worker_address().size() > kMaxUcxWorkerAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("source.ucx_worker_address: must be 1 to ",
                                                   kMaxUcxWorkerAddressBytes, " bytes"));
  }
  if (source.rkey().empty() || source.rkey().size() > kMaxRkeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("source.rkey: must be 1 to ", kMaxRkeyBytes, " bytes"));
  }
  const uint64_t total = StagingBytes(sizes);
  const uint64_t begin = source.exposed_address(), bytes = source.exposed_bytes();
  if (bytes == 0 || !CheckedAdd<uint64_t>(begin, bytes).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "source.exposed_bytes: ", bytes, " at exposed_address ", begin,
        " must name the memory the key covers, 1 byte or more without wrapping 64 bits (a "
        "prefill node older than this decode node names none: upgrade prefill nodes first)"));
  }
  if (!CheckedAdd<uint64_t>(source.address(), total).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("source.address: ", source.address(), " + ", total, " bytes wraps 64 bits"));
  }
  // Inside [begin, begin + bytes), compared without forming a sum that could wrap.
  const uint64_t address = source.address();
  if (address < begin || address - begin > bytes || total > bytes - (address - begin)) {
    return absl::InvalidArgumentError(
        absl::StrCat("source.address: ", total, " bytes of staging memory at ", address,
                     " lie outside the memory the key covers, [", begin, ", ", begin + bytes, ")"));
  }
  return absl::OkStatus();
}

namespace {

constexpr v1::Region kRegions[] = {v1::REGION_PRODUCER_SWA, v1::REGION_CONSUMER_SWA,
                                   v1::REGION_BOUNDARY_ROWS, v1::REGION_BLOCK_KV};

// Unpacking a key attaches the peer's memory (a shared-memory transport maps it; every page
// of a fresh mapping faults on first touch), which costs more than the get itself, so each
// endpoint keeps the keys it unpacked: the prefill node reuses a staging buffer, and so its
// key, only for reads by the same decode node (transfer/exposure.h). Keys unused for
// kKeyIdle, or past kMaxKeys per endpoint, are let go.
constexpr size_t kMaxKeys = 32;
constexpr auto kKeyIdle = std::chrono::seconds(30);
constexpr auto kPeerIdle = std::chrono::minutes(5);

// Every region of `into` copied from a staging area at `staging` (the source's layout).
void CopyFromStaging(const char* staging, const RegionSpans& into) {
  for (v1::Region region : kRegions) {
    const char* from = staging + StagingOffset(into.sizes, region);
    ForEachPiece(into, region, 0, into.sizes.bytes(region),
                 [&](char* to, uint64_t n, uint64_t offset) { std::memcpy(to, from + offset, n); });
  }
}

// The gets that read every region of `into` from the staging area at `address` on `endpoint`
// (pages adjacent in the pool become one get; the source is contiguous), each request added to
// `pending`; the first error stops issuing more.
absl::Status StartGets(UcxEndpoint& endpoint, uint64_t address, const RegionSpans& into,
                       UcxRemoteKey& rkey, std::vector<void*>& pending) {
  absl::Status status;
  for (v1::Region region : kRegions) {
    const uint64_t remote = address + StagingOffset(into.sizes, region);
    char* run = nullptr;
    uint64_t run_bytes = 0, run_offset = 0;
    auto flush = [&] {
      if (run_bytes > 0 && status.ok()) {
        status = endpoint.Get(run, run_bytes, remote + run_offset, rkey, pending);
      }
      run_bytes = 0;
    };
    ForEachPiece(into, region, 0, into.sizes.bytes(region),
                 [&](char* local, uint64_t n, uint64_t offset) {
                   if (run_bytes > 0 && run + run_bytes == local) {
                     run_bytes += n;
                     return;
                   }
                   flush();
                   run = local;
                   run_bytes = n;
                   run_offset = offset;
                 });
    flush();
  }
  return status;
}

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(UcxWorker& worker) : worker_(worker) {}

  absl::Status Read(const v1::RegionSource& source, const std::string& prefill_address,
                    const RegionSpans& into, Clock::time_point deadline,
                    const std::function<bool()>& stop) override {
    if (absl::Status s = CheckUcxSource(source, into.sizes); !s.ok()) return s;
    auto peer = Peer(source.ucx_worker_address());
    if (!peer.ok()) return peer.status();
    auto rkey = Key(**peer, source.rkey());
    if (!rkey.ok()) return rkey.status();
    // Under shared memory the key's segment is attached here, and a get would be a copy from
    // it that UCX does not bound: copy from what the key attached, checked, instead.
    absl::StatusOr<const char*> local = (*rkey)->Local(source.address(), StagingBytes(into.sizes));
    if (!local.ok()) return local.status();
    if (*local != nullptr) {
      CopyFromStaging(*local, into);
      return absl::OkStatus();
    }
    UcxEndpoint& endpoint = *(*peer)->endpoint;
    std::vector<void*> pending;
    const absl::Status status = StartGets(endpoint, source.address(), into, **rkey, pending);
    absl::Status waited = worker_.WaitAll(pending, deadline, stop);
    if (absl::IsDeadlineExceeded(waited) || absl::IsCancelled(waited)) {
      // The gets still running must end before the destination may be freed: close the
      // endpoint (which cancels them) and wait for every one. Its keys are released after
      // the close; UCX 1.13 releases a key through its transport component alone.
      endpoint.Close();
      Forget(source.ucx_worker_address(), *peer);
      (void)worker_.WaitAll(pending, Clock::time_point::max());
    }
    if (!status.ok() || !waited.ok()) {
      // A key that failed may be stale (the peer freed its buffer): unpack afresh next time.
      std::lock_guard<std::mutex> lock((*peer)->mutex);
      (*peer)->keys.erase(source.rkey());
    }
    return status.ok() ? waited : status;
  }

 private:
  struct CachedKey {
    std::shared_ptr<UcxRemoteKey> key;
    Clock::time_point used;
  };
  struct PeerState {
    std::unique_ptr<UcxEndpoint> endpoint;
    Clock::time_point used;  // guarded by UcxTransport::mutex_
    std::mutex mutex;
    std::map<std::string, CachedKey> keys;  // by packed key
    ~PeerState() {
      keys.clear();  // keys go before their endpoint
    }
  };

  absl::StatusOr<std::shared_ptr<PeerState>> Peer(const std::string& address) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Endpoints (and the keys, and so the memory, they hold) of prefill nodes not read from
    // for a while go: a node that restarted or left is not read from again.
    const Clock::time_point now = Clock::now();
    for (auto it = peers_.begin(); it != peers_.end();) {
      const bool idle = it->second.use_count() == 1 && now - it->second->used > kPeerIdle;
      it = idle ? peers_.erase(it) : std::next(it);
    }
    auto& peer = peers_[address];
    if (peer == nullptr) {
      auto connected = worker_.Connect(address);
      if (!connected.ok()) {
        peers_.erase(address);
        return connected.status();
      }
      peer = std::make_shared<PeerState>();
      peer->endpoint = *std::move(connected);
    }
    peer->used = now;
    return peer;
  }
  absl::StatusOr<std::shared_ptr<UcxRemoteKey>> Key(PeerState& peer, const std::string& packed) {
    std::lock_guard<std::mutex> lock(peer.mutex);
    const Clock::time_point now = Clock::now();
    for (auto it = peer.keys.begin(); it != peer.keys.end();) {
      it = now - it->second.used > kKeyIdle ? peer.keys.erase(it) : std::next(it);
    }
    auto found = peer.keys.find(packed);
    if (found != peer.keys.end()) {
      found->second.used = now;
      return found->second.key;
    }
    auto unpacked = peer.endpoint->Unpack(packed);
    if (!unpacked.ok()) return unpacked.status();
    if (peer.keys.size() >= kMaxKeys) {
      auto oldest = std::min_element(peer.keys.begin(), peer.keys.end(), [](auto& a, auto& b) {
        return a.second.used < b.second.used;
      });
      peer.keys.erase(oldest);
    }
    std::shared_ptr<UcxRemoteKey> key = *std::move(unpacked);
    peer.keys[packed] = {key, now};
    return key;
  }
  void Forget(const std::string& address, const std::shared_ptr<PeerState>& peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = peers_.find(address);
    if (it != peers_.end() && it->second == peer) peers_.erase(it);
  }

  UcxWorker& worker_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<PeerState>> peers_;
};

// Where a RegionChunk's payload starts in its wire bytes, with the fields before it; false for
// bytes that are not a RegionChunk whose data comes last (what every writer of one produces).
struct ChunkHeader {
  uint64_t region = 0, offset = 0, data_bytes = 0;
  size_t header_bytes = 0;
};
bool ParseChunkHeader(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>& slices,
                      ChunkHeader* header) {
  if (!buffer.Dump(&slices).ok()) return false;
  // The fields before the payload fit in 33 bytes: copy at most that much to parse them.
  uint8_t head[3 * 11];
  size_t have = 0;
  for (const grpc::Slice& slice : slices) {
    const size_t n = std::min(slice.size(), sizeof(head) - have);
    std::memcpy(head + have, slice.begin(), n);
    have += n;
    if (have == sizeof(head)) break;
  }
  const size_t total = buffer.Length();
  google::protobuf::io::CodedInputStream in(head, static_cast<int>(have));
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) {  // the end of a chunk without data (or of the bytes we copied)
      if (static_cast<size_t>(in.CurrentPosition()) != total) return false;
      header->header_bytes = total;
      header->data_bytes = 0;
      return true;
    }
    uint64_t value = 0;
    if (!in.ReadVarint64(&value)) return false;
    switch (tag) {
      case (2 << 3) | 0:
        header->region = value;
        break;
      case (3 << 3) | 0:
        header->offset = value;
        break;
      case (4 << 3) | 2:
        header->header_bytes = static_cast<size_t>(in.CurrentPosition());
        header->data_bytes = value;
        return value == total - header->header_bytes;
      default:
        return false;
    }
  }
}

// PrefillNode.ReadRegions over mutual TLS, read raw: each chunk's payload is copied from the
// received slices straight into the reservation (no protobuf copy), and up to kGrpcReadsInFlight
// streams, each of at most kGrpcReadBytes of one region, run at once on one connection.
class GrpcTransport final : public Transport {
 public:
  absl::Status Read(const v1::RegionSource& source, const std::string& prefill_address,
                    const RegionSpans& into, Clock::time_point deadline,
                    const std::function<bool()>& stop) override {
    if (prefill_address.empty()) {
      return absl::FailedPreconditionError("prefill_address: the reservation names none");
    }
    grpc::GenericStub stub(Channel(prefill_address));
    std::vector<std::unique_ptr<Stream>> pending = PlanStreams(into);
    const auto system_deadline =
        std::chrono::system_clock::now() +
        std::min<Clock::duration>(deadline - Clock::now(), std::chrono::hours(1));
    grpc::CompletionQueue queue;
    std::vector<std::unique_ptr<Stream>> running;
    absl::Status failed;
    auto start = [&] {
      std::unique_ptr<Stream> stream = std::move(pending.back());
      pending.pop_back();
      StartStream(*stream, source.exposure_id(), system_deadline, stub, queue);
      running.push_back(std::move(stream));
    };
    auto fail = [&](absl::Status status) {
      if (failed.ok()) failed = std::move(status);
      for (auto& stream : running) stream->context.TryCancel();
      pending.clear();
    };
    while (!pending.empty() && running.size() < kGrpcReadsInFlight) start();
    while (!running.empty()) {
      void* tag = nullptr;
      bool ok = false;
      const auto wake = std::chrono::system_clock::now() + std::chrono::milliseconds(10);
      const grpc::CompletionQueue::NextStatus next = queue.AsyncNext(&tag, &ok, wake);
      if (next == grpc::CompletionQueue::SHUTDOWN) break;
      if (next == grpc::CompletionQueue::TIMEOUT) {
        if (failed.ok() && stop && stop()) {
          fail(absl::CancelledError("gRPC read: the transfer was abandoned"));
        } else if (failed.ok() && Clock::now() >= deadline) {
          fail(absl::DeadlineExceededError("gRPC read: not complete by the transfer deadline"));
        }
        continue;
      }
      auto* stream = static_cast<Stream*>(tag);
      switch (stream->step) {
        case Step::kStarting:
          if (!ok) {
            stream->step = Step::kFinishing;
            stream->call->Finish(&stream->status, stream);
            break;
          }
          stream->step = Step::kWriting;
          stream->call->WriteLast(stream->request, grpc::WriteOptions(), stream);
          break;
        case Step::kWriting:
        case Step::kReading:
          if (stream->step == Step::kReading && ok && failed.ok()) {
            if (absl::Status s = Accept(*stream, into); !s.ok()) fail(std::move(s));
          }
          if (!ok || !failed.ok()) {
            stream->step = Step::kFinishing;
            stream->call->Finish(&stream->status, stream);
            break;
          }
          stream->step = Step::kReading;
          stream->chunk.Clear();
          stream->call->Read(&stream->chunk, stream);
          break;
        case Step::kFinishing: {
          if (absl::Status status = Finished(*stream); !status.ok()) fail(std::move(status));
          auto it = std::find_if(running.begin(), running.end(),
                                 [&](const auto& s) { return s.get() == stream; });
          running.erase(it);
          if (failed.ok() && !pending.empty()) start();
          break;
        }
      }
    }
    queue.Shutdown();
    DrainQueue(queue);
    return failed;
  }

 private:
  enum class Step { kStarting, kWriting, kReading, kFinishing };
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call;
    grpc::ByteBuffer request, chunk;
    grpc::Status status;
    Step step = Step::kStarting;
    v1::Region region = v1::REGION_UNSPECIFIED;
    uint64_t begin = 0, end = 0, next = 0;  // bytes of the region this stream reads
  };

  // The streams that read `into`, each of at most kGrpcReadBytes of one region, in reverse
  // order (taken from the back).
  static std::vector<std::unique_ptr<Stream>> PlanStreams(const RegionSpans& into) {
    std::vector<std::unique_ptr<Stream>> streams;
    for (v1::Region region : kRegions) {
      const uint64_t size = into.sizes.bytes(region);
      for (uint64_t begin = 0; begin < size; begin += kGrpcReadBytes) {
        auto stream = std::make_unique<Stream>();
        stream->region = region;
        stream->begin = stream->next = begin;
        stream->end = begin + std::min(kGrpcReadBytes, size - begin);
        streams.push_back(std::move(stream));
      }
    }
    std::reverse(streams.begin(), streams.end());
    return streams;
  }

  // Starts `stream`'s ReadRegions call on `queue` (its range of exposure `exposure_id`).
  static void StartStream(Stream& stream, const std::string& exposure_id,
                          std::chrono::system_clock::time_point deadline, grpc::GenericStub& stub,
                          grpc::CompletionQueue& queue) {
    stream.context.set_deadline(deadline);
    v1::ReadRegionsRequest request;
    request.set_exposure_id(exposure_id);
    request.set_region(stream.region);
    request.set_offset(stream.begin);
    request.set_length(stream.end - stream.begin);
    bool own = false;
    (void)grpc::SerializationTraits<v1::ReadRegionsRequest>::Serialize(request, &stream.request,
                                                                       &own);
    stream.call = stub.PrepareCall(&stream.context, "/baton.v1.PrefillNode/ReadRegions", &queue);
    stream.step = Step::kStarting;
    stream.call->StartCall(&stream);
  }

  // Takes every event left on a shut-down `queue`.
  static void DrainQueue(grpc::CompletionQueue& queue) {
    void* tag = nullptr;
    bool ok = false;
    while (queue.Next(&tag, &ok)) {
    }
  }

  // A finished stream's outcome: its call's status, and all of its range received.
  static absl::Status Finished(const Stream& stream) {
    absl::Status status = FromGrpcStatus(stream.status);
    if (status.ok() && stream.next != stream.end) {
      status = absl::DataLossError(absl::StrCat(
          "region ", v1::Region_Name(stream.region), ": got ", stream.next - stream.begin, " of ",
          stream.end - stream.begin, " bytes at offset ", stream.begin));
    }
    return status;
  }

  // Copies one received chunk into place after checking that it is the next piece of its
  // stream's range.
  static absl::Status Accept(Stream& stream, const RegionSpans& into) {
    std::vector<grpc::Slice> slices;
    ChunkHeader header;
    if (!ParseChunkHeader(stream.chunk, slices, &header)) {
      return absl::InvalidArgumentError("region chunk: not a RegionChunk message");
    }
    const uint64_t bytes = header.data_bytes;
    // In order and inside the range; offset + bytes may wrap 64 bits, so the check never forms
    // that sum.
    if (header.region != static_cast<uint64_t>(stream.region) || header.offset != stream.next ||
        bytes > stream.end - stream.next) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region chunk of ", bytes, " bytes at offset ", header.offset, " lies outside region ",
          v1::Region_Name(stream.region), " bytes [", stream.begin, ", ", stream.end,
          ") (or out of order; expected offset ", stream.next, ")"));
    }
    size_t slice = 0, at = header.header_bytes;
    while (slice < slices.size() && at >= slices[slice].size()) at -= slices[slice++].size();
    ForEachPiece(into, stream.region, stream.next, bytes, [&](char* local, uint64_t n, uint64_t) {
      while (n > 0) {
        const size_t take = std::min<uint64_t>(n, slices[slice].size() - at);
        std::memcpy(local, slices[slice].begin() + at, take);
        local += take;
        n -= take;
        at += take;
        if (at == slices[slice].size()) {
          ++slice;
          at = 0;
        }
      }
    });
    stream.next += bytes;
    return absl::OkStatus();
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& channel = channels_[address];
    if (channel == nullptr) {
      // A receive window that holds several chunks of every stream in flight, so that the
      // prefill node never waits for a window update between chunks.
      grpc::ChannelArguments args = security::ChannelArguments();
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                  static_cast<int>(4 * kGrpcRegionChunkBytes));
      channel = security::InternalChannel(address, security::Role::kPrefill, args);
    }
    return channel;
  }

  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

class FaultInjectingTransport final : public Transport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> inner, const FaultSpec& spec)
      : inner_(std::move(inner)), spec_(spec), random_(spec.seed) {}

  absl::Status Read(const v1::RegionSource& source, const std::string& prefill_address,
                    const RegionSpans& into, Clock::time_point deadline,
                    const std::function<bool()>& stop) override {
    bool drop, corrupt, truncate;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      drop = Draw(spec_.drop);
      corrupt = Draw(spec_.corrupt);
      truncate = Draw(spec_.truncate);
    }
    // Waits until `until`, or less when the reader stops; false when it stopped.
    auto wait = [&](Clock::time_point until) {
      while (Clock::now() < until) {
        if (stop && stop()) return false;
        std::this_thread::sleep_for(
            std::min<Clock::duration>(until - Clock::now(), std::chrono::milliseconds(10)));
      }
      return true;
    };
    if (spec_.delay_ms > 0) {
      const Clock::time_point until = Clock::now() + std::chrono::milliseconds(spec_.delay_ms);
      if (!wait(std::min(until, deadline))) {
        return absl::CancelledError("transfer abandoned while delayed (injected fault)");
      }
      if (until > deadline) {
        return absl::DeadlineExceededError("transfer delayed past its deadline (injected fault)");
      }
    }
    if (drop) {
      if (!wait(deadline)) return absl::CancelledError("dropped transfer abandoned (injected fault)");
      return absl::DeadlineExceededError("transfer dropped (injected fault)");
    }
    RegionSpans spans = into;
    if (truncate) {
      // Half of the last non-empty region arrives; the read reports success.
      if (spans.sizes.block_kv > 0) {
        spans.sizes.block_kv /= 2;
      } else if (spans.sizes.consumer_swa > 0) {
        spans.sizes.consumer_swa /= 2;
      } else {
        spans.sizes.producer_swa /= 2;
      }
    }
    if (absl::Status s = inner_->Read(source, prefill_address, spans, deadline, stop); !s.ok()) {
      return s;
    }
    if (corrupt) {
      for (v1::Region region : kRegions) {
        if (spans.sizes.bytes(region) == 0) continue;
        ForEachPiece(spans, region, 0, 1, [](char* local, uint64_t, uint64_t) { *local ^= 0x40; });
        break;
      }
    }
    return absl::OkStatus();
  }

 private:
  bool Draw(double probability) {
    return probability > 0 && std::uniform_real_distribution<double>(0, 1)(random_) < probability;
  }

  std::unique_ptr<Transport> inner_;
  FaultSpec spec_;
  std::mutex mutex_;
  std::mt19937_64 random_;
};

}  // namespace

std::unique_ptr<Transport> MakeUcxTransport(UcxWorker& worker) {
  return std::make_unique<UcxTransport>(worker);
}

std::unique_ptr<Transport> MakeGrpcTransport() { return std::make_unique<GrpcTransport>(); }

std::unique_ptr<Transport> MakeFaultInjectingTransport(std::unique_ptr<Transport> inner,
                                                       const FaultSpec& spec) {
  return std::make_unique<FaultInjectingTransport>(std::move(inner), spec);
}

absl::StatusOr<FaultSpec> ParseFaultSpec(const std::string& text) {
  FaultSpec spec;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    const std::string key(kv.first);
    double* probability = key == "drop"       ? &spec.drop
                          : key == "corrupt"  ? &spec.corrupt
                          : key == "truncate" ? &spec.truncate
                                              : nullptr;
    if (probability != nullptr) {
      if (!absl::SimpleAtod(kv.second, probability) || !(*probability >= 0 && *probability <= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("transfer faults: ", key, " must be a probability in [0, 1]"));
      }
    } else if (key == "delay_ms") {
      if (!absl::SimpleAtoi(kv.second, &spec.delay_ms) || spec.delay_ms < 0 ||
          spec.delay_ms > 600000) {
        return absl::InvalidArgumentError(
            "transfer faults: delay_ms must be an integer in [0, 600000]");
      }
    } else if (key == "seed") {
      if (!absl::SimpleAtoi(kv.second, &spec.seed)) {
        return absl::InvalidArgumentError("transfer faults: seed must be an unsigned integer");
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer faults: unknown key '", key,
                       "' (allowed: drop, corrupt, truncate, delay_ms, seed)"));
    }
  }
  return spec;
}

}  // namespace baton::transfer

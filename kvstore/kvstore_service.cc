#include "baton/kvstore/kvstore_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/rpc.h"
#include "baton/common/security.h"
#include "baton/common/trace.h"
#include "baton/common/wire_bounds.h"

namespace baton::kvstore {
namespace {

using security::Role;

absl::StatusOr<Sha256Digest> KeyFrom(const std::string& bytes, const char* field) {
  if (bytes.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": a chain key is 32 bytes, got ", bytes.size()));
  }
  Sha256Digest key;
  std::memcpy(key.data(), bytes.data(), 32);
  return key;
}

absl::StatusOr<Region> RegionFrom(v1::StoreRegion region) {
  switch (region) {
    case v1::STORE_REGION_BLOCK_KV:
      return Region::kBlockKv;
    case v1::STORE_REGION_PRODUCER_SWA:
      return Region::kProducerSwa;
    default:
      return absl::InvalidArgumentError("region: must be BLOCK_KV or PRODUCER_SWA");
  }
}

// A chain longer than the model's longest sequence cannot come from a real prompt; refusing it
// bounds the work of one call.
absl::Status CheckKeyCount(int count, uint64_t max_keys) {
  if (static_cast<uint64_t>(count) > max_keys) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keys: ", count, " keys; a chain of this model has at most ", max_keys, " blocks"));
  }
  return absl::OkStatus();
}

}  // namespace

KvStoreService::KvStoreService(PrefixStore& store, uint64_t max_keys)
    : store_(store), max_keys_(max_keys) {
  collector_ = metrics::AddCollector([this] {
    const StoreCounters c = store_.counters();
    auto one = [](double value) {
      return std::vector<std::pair<std::map<std::string, std::string>, double>>{{{}, value}};
    };
    return std::vector<prometheus::MetricFamily>{
        metrics::CounterFamily("baton_store_lookups_total",
                               "Lookups served: whole chains (Lookup), and a fleet's per-key "
                               "probes of the keys this node owns (Probe)",
                               one(lookups_.load())),
        metrics::CounterFamily("baton_store_lookup_blocks_total",
                               "Leading blocks with block KV found by lookups",
                               one(lookup_blocks_.load())),
        metrics::CounterFamily("baton_store_probe_keys_total", "Keys asked by probes, by result",
                               {{{{"result", "held"}}, static_cast<double>(probe_found_.load())},
                                {{{"result", "absent"}},
                                 static_cast<double>(probe_keys_.load() - probe_found_.load())}}),
        metrics::CounterFamily("baton_store_reads_total", "Block reads, by result",
                               {{{{"result", "hit"}}, static_cast<double>(c.hits)},
                                {{{"result", "miss"}}, static_cast<double>(c.misses)}}),
        metrics::CounterFamily("baton_store_read_bytes_total", "Payload bytes read",
                               one(c.bytes_read)),
        metrics::CounterFamily("baton_store_written_bytes_total", "Payload bytes written",
                               one(c.bytes_written)),
        metrics::CounterFamily("baton_store_evictions_total", "Values evicted for the budget",
                               one(c.evictions)),
        metrics::CounterFamily("baton_store_corrupt_values_total",
                               "Values that failed their checks and were dropped",
                               one(c.corrupt_values)),
        metrics::CounterFamily("baton_store_failed_deletes_total",
                               "RocksDB deletes that failed (the value stays on disk until the "
                               "next open)",
                               one(c.failed_deletes)),
        metrics::GaugeFamily("baton_store_bytes", "Bytes of every value held", one(c.stored_bytes)),
        metrics::GaugeFamily("baton_store_budget_bytes", "The byte budget (0: unlimited)",
                             one(store_.budget_bytes())),
        metrics::GaugeFamily(
            "baton_store_values", "Values held, by region",
            {{{{"region", "block_kv"}}, static_cast<double>(c.block_kv_values)},
             {{{"region", "producer_swa"}}, static_cast<double>(c.producer_swa_values)}})};
  });
}

namespace {

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Logs one call made for a request: at info when its trace is sampled, at debug otherwise
// (common/trace.h). A failed call is named so, with its code, message and milliseconds.
void LogCall(const trace::Span& span, absl::string_view event, const absl::Status& status,
             double ms, log::Fields fields) {
  const bool info = span.context.sampled;
  if (status.ok()) {
    info ? log::Info(span.Ids(), event, fields) : log::Debug(span.Ids(), event, fields);
    return;
  }
  const std::string failed = absl::StrCat(event, " failed");
  const log::Fields why = {{"code", metrics::OutcomeLabel(static_cast<int>(status.code()))},
                           {"error", std::string(status.message())},
                           {"ms", ms}};
  info ? log::Info(span.Ids(), failed, why) : log::Debug(span.Ids(), failed, why);
}

}  // namespace

grpc::Status KvStoreService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                    v1::LookupResponse* reply) {
  const auto start = std::chrono::steady_clock::now();
  const trace::Span span = trace::StartServerSpan(*context);
  const absl::Status status = LookupChain(*context, *request, *reply);
  const double ms = MillisSince(start);
  LogCall(span, "prefix lookup", status, ms,
          {{"keys", request->keys_size()},
           {"block_kv_blocks", reply->block_kv_blocks()},
           {"ms", ms}});
  return ToGrpcStatus(status);
}

grpc::Status KvStoreService::Probe(grpc::ServerContext* context, const v1::ProbeRequest* request,
                                   v1::ProbeResponse* reply) {
  const auto start = std::chrono::steady_clock::now();
  const trace::Span span = trace::StartServerSpan(*context);
  const absl::Status status = ProbeKeys(*context, *request, *reply);
  const double ms = MillisSince(start);
  // The fleet's lookup: logged as the whole-chain one is (the event name is the log contract).
  const int64_t held = std::count(reply->block_kv().begin(), reply->block_kv().end(), true);
  LogCall(span, "prefix lookup", status, ms,
          {{"keys", request->keys_size()}, {"held", held}, {"ms", ms}});
  return ToGrpcStatus(status);
}

grpc::Status KvStoreService::ReadBlocks(grpc::ServerContext* context,
                                        const v1::ReadBlocksRequest* request,
                                        grpc::ServerWriter<v1::StoredBlock>* writer) {
  const auto start = std::chrono::steady_clock::now();
  const trace::Span span = trace::StartServerSpan(*context);
  const absl::Status status = SendBlocks(*context, *request, *writer);
  const double ms = MillisSince(start);
  LogCall(span, "blocks read", status, ms, {{"keys", request->keys_size()}, {"ms", ms}});
  return ToGrpcStatus(status);
}

grpc::Status KvStoreService::WriteBlocks(grpc::ServerContext* context,
                                         grpc::ServerReader<v1::BlockWrite>* reader,
                                         v1::WriteBlocksResponse* reply) {
  const auto start = std::chrono::steady_clock::now();
  const trace::Span span = trace::StartServerSpan(*context);
  const absl::Status status = TakeBlocks(*context, *reader, *reply);
  const double ms = MillisSince(start);
  LogCall(span, "blocks written", status, ms, {{"written", reply->written()}, {"ms", ms}});
  return ToGrpcStatus(status);
}

absl::Status KvStoreService::LookupChain(const grpc::ServerContext& context,
                                         const v1::LookupRequest& request,
                                         v1::LookupResponse& reply) {
  if (absl::Status s =
          security::Authorize(context, {Role::kRouter, Role::kPrefill}, "KvStore/Lookup");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckKeyCount(request.keys_size(), max_keys_); !s.ok()) return s;
  std::vector<Sha256Digest> chain;
  for (const std::string& bytes : request.keys()) {
    absl::StatusOr<Sha256Digest> key = KeyFrom(bytes, "keys");
    if (!key.ok()) return key.status();
    chain.push_back(*key);
  }
  const ChainLookup lookup = store_.Lookup(chain);
  ++lookups_;
  lookup_blocks_ += lookup.block_kv_blocks;
  reply.set_block_kv_blocks(static_cast<uint32_t>(lookup.block_kv_blocks));
  for (bool present : lookup.swa_present) reply.add_swa_present(present);
  return absl::OkStatus();
}

absl::Status KvStoreService::ProbeKeys(const grpc::ServerContext& context,
                                       const v1::ProbeRequest& request, v1::ProbeResponse& reply) {
  if (absl::Status s =
          security::Authorize(context, {Role::kRouter, Role::kPrefill}, "KvStore/Probe");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckKeyCount(request.keys_size(), max_keys_); !s.ok()) return s;
  std::vector<Sha256Digest> keys;
  keys.reserve(request.keys_size());
  for (const std::string& bytes : request.keys()) {
    absl::StatusOr<Sha256Digest> key = KeyFrom(bytes, "keys");
    if (!key.ok()) return key.status();
    keys.push_back(*key);
  }
  uint64_t found = 0;
  for (const PrefixStore::Presence& held : store_.Probe(keys)) {
    reply.add_block_kv(held.block_kv);
    reply.add_producer_swa(held.producer_swa);
    found += held.block_kv ? 1 : 0;
  }
  ++lookups_;
  probe_keys_ += keys.size();
  probe_found_ += found;
  return absl::OkStatus();
}

absl::Status KvStoreService::SendBlocks(const grpc::ServerContext& context,
                                        const v1::ReadBlocksRequest& request,
                                        grpc::ServerWriter<v1::StoredBlock>& writer) {
  if (absl::Status s = security::Authorize(context, {Role::kPrefill}, "KvStore/ReadBlocks");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Region> region = RegionFrom(request.region());
  if (!region.ok()) return region.status();
  if (absl::Status s = CheckKeyCount(request.keys_size(), max_keys_); !s.ok()) return s;
  if (absl::Status s =
          CheckBytes("model_fingerprint", request.model_fingerprint(), kMaxFingerprintBytes);
      !s.ok()) {
    return s;
  }
  for (const std::string& bytes : request.keys()) {
    absl::StatusOr<Sha256Digest> key = KeyFrom(bytes, "keys");
    if (!key.ok()) return key.status();
    v1::StoredBlock block;
    block.set_key(bytes);
    absl::StatusOr<std::string> payload = store_.Read(*key, *region, request.model_fingerprint());
    block.set_found(payload.ok());
    if (payload.ok()) *block.mutable_payload() = *std::move(payload);
    if (!writer.Write(block)) return absl::CancelledError("reader gone");
  }
  return absl::OkStatus();
}

absl::Status KvStoreService::TakeBlocks(const grpc::ServerContext& context,
                                        grpc::ServerReader<v1::BlockWrite>& reader,
                                        v1::WriteBlocksResponse& reply) {
  if (absl::Status s = security::Authorize(context, {Role::kPrefill}, "KvStore/WriteBlocks");
      !s.ok()) {
    return s;
  }
  v1::BlockWrite write;
  uint32_t written = 0;
  while (reader.Read(&write)) {
    if (absl::Status s = Write(write); !s.ok()) return s;
    ++written;
  }
  reply.set_written(written);
  return absl::OkStatus();
}

absl::Status KvStoreService::Write(const v1::BlockWrite& write) {
  absl::StatusOr<Sha256Digest> key = KeyFrom(write.key(), "key");
  if (!key.ok()) return key.status();
  std::optional<Sha256Digest> parent;
  if (!write.parent().empty()) {
    absl::StatusOr<Sha256Digest> p = KeyFrom(write.parent(), "parent");
    if (!p.ok()) return p.status();
    parent = *p;
  }
  absl::StatusOr<Region> region = RegionFrom(write.region());
  if (!region.ok()) return region.status();
  if (absl::Status s =
          CheckBytes("model_fingerprint", write.model_fingerprint(), kMaxFingerprintBytes);
      !s.ok()) {
    return s;
  }
  return store_.Write(*key, parent, *region, write.payload(), write.model_fingerprint());
}

grpc::Status KvStoreService::Stats(grpc::ServerContext* context,
                                   const v1::KvStoreStatsRequest* request,
                                   v1::KvStoreStats* reply) {
  // Stats has one refusal and nothing else that fails: the conversion is this one.
  if (absl::Status s =
          security::Authorize(*context, {Role::kRouter, Role::kPrefill}, "KvStore/Stats");
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  const StoreCounters c = store_.counters();
  reply->set_hits(c.hits);
  reply->set_misses(c.misses);
  reply->set_bytes_read(c.bytes_read);
  reply->set_bytes_written(c.bytes_written);
  reply->set_evictions(c.evictions);
  reply->set_corrupt_values(c.corrupt_values);
  reply->set_stored_bytes(c.stored_bytes);
  reply->set_budget_bytes(store_.budget_bytes());
  reply->set_block_kv_values(c.block_kv_values);
  reply->set_producer_swa_values(c.producer_swa_values);
  return grpc::Status::OK;
}

}  // namespace baton::kvstore

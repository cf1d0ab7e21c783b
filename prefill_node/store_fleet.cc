#include "store_fleet.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <thread>

#include "baton/common/security.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/placement.h"

namespace baton::prefill_node {
namespace {

// Runs fn(i) for i in [0, n) at once: i = 0 on this thread, the others on their own.
void ForEachAtOnce(size_t n, const std::function<void(size_t)>& fn) {
  std::vector<std::thread> others;
  for (size_t i = 1; i < n; ++i) others.emplace_back(fn, i);
  if (n > 0) fn(0);
  for (std::thread& t : others) t.join();
}

// A failure that says something of the store node (not of the caller going away).
bool CountsAgainstNode(const grpc::Status& status) {
  return status.error_code() != grpc::StatusCode::CANCELLED;
}

// One ReadBlocks call to a store node for `request` (the blocks `mine`, indexes into `got`),
// under the caller's cancellation and at most until `call_deadline`: each answer that is the
// block asked at its place, with a payload of `payload_bytes`, goes into `got`. More answers
// than blocks asked cut the call, as the node's fault (DATA_LOSS).
grpc::Status ReadFromNode(v1::KvStore::StubInterface& stub, grpc::ServerContext& caller,
                          const trace::Span& span,
                          std::chrono::system_clock::time_point call_deadline,
                          const v1::ReadBlocksRequest& request, const std::vector<size_t>& mine,
                          uint64_t payload_bytes, std::vector<std::optional<std::string>>& got) {
  auto context = grpc::ClientContext::FromServerContext(caller);
  if (caller.deadline() > call_deadline) context->set_deadline(call_deadline);
  trace::Inject(span, *context);
  auto reader = stub.ReadBlocks(context.get(), request);
  v1::StoredBlock block;
  size_t n = 0;
  while (reader->Read(&block)) {
    if (n >= mine.size()) {  // more answers than blocks asked: the call is cut
      context->TryCancel();
      reader->Finish();
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "more blocks than asked");
    }
    if (block.found() && block.payload().size() == payload_bytes &&
        block.key() == request.keys(static_cast<int>(n))) {
      got[mine[n]] = std::move(*block.mutable_payload());
    }
    ++n;
  }
  return reader->Finish();
}

}  // namespace

StoreFleetClient::StoreFleetClient(std::string fixed_address)
    : fixed_address_(std::move(fixed_address)) {
  // The node's own store is connected to now, not on the first hit's read, whose deadline is
  // the hit's compute time (tens of ms on a small model): a connection and its TLS handshake
  // made inside it on a busy machine turned the node's first hit into a miss.
  if (!fixed_address_.empty()) Stub(fixed_address_);
}

std::shared_ptr<v1::KvStore::StubInterface> StoreFleetClient::Stub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second;
  // Store nodes come and go: past a bound, the channels are made afresh as they are needed.
  if (stubs_.size() >= kvstore::kMaxStoreNodes * 2) stubs_.clear();
  // The channel checks that the peer's certificate is a store's, whatever address it is given.
  std::shared_ptr<grpc::Channel> channel =
      security::InternalChannel(address, security::Role::kKvstore);
  channel->GetState(/*try_to_connect=*/true);  // connecting starts now, in the background
  auto stub = std::shared_ptr<v1::KvStore::StubInterface>(v1::KvStore::NewStub(channel));
  stubs_.emplace(address, stub);
  return stub;
}

StoreFleetClient::Route StoreFleetClient::RouteFor(const v1::StoreFleet& fleet) {
  Route route;
  if (fleet.nodes_size() == 0) {
    if (fixed_address_.empty()) return route;
    route.ids = {fixed_address_};
    route.stubs = {Stub(fixed_address_)};
    route.replication = 1;
    return route;
  }
  for (const v1::StoreNode& node : fleet.nodes()) {
    route.ids.push_back(node.node_id());
    route.stubs.push_back(Stub(node.address()));
  }
  route.replication = static_cast<int>(fleet.replication());
  return route;
}

bool StoreFleetClient::Read(const Route& route, grpc::ServerContext& caller,
                            const trace::Span& span, std::span<const Sha256Digest> keys,
                            std::span<const int64_t> blocks, kvstore::Region region,
                            const std::string& model_fingerprint, uint64_t payload_bytes,
                            std::chrono::system_clock::time_point deadline,
                            const std::function<void(int64_t, const std::string&)>& use) {
  if (route.empty()) return blocks.empty();
  uint64_t turn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    turn = turn_++;
  }
  // Each block's owners in the order this request tries them, and the next one to try.
  std::vector<std::vector<size_t>> order(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    order[i] = kvstore::ReadOrder(keys[blocks[i]], route.ids, route.replication, turn);
  }
  std::vector<size_t> next(blocks.size(), 0);
  std::vector<size_t> pending(blocks.size());
  std::iota(pending.begin(), pending.end(), size_t{0});
  std::vector<std::optional<std::string>> got(blocks.size());
  while (!pending.empty()) {
    // This round: each pending block to its next owner that a call may go to.
    std::map<size_t, bool> allowed;  // node -> its breaker let a call through (asked once)
    std::map<size_t, std::vector<size_t>> asked;  // node -> blocks (indexes into `blocks`)
    bool unreadable = false;                      // a block has no owner left to ask
    for (size_t i : pending) {
      for (; next[i] < order[i].size(); ++next[i]) {
        const size_t node = order[i][next[i]];
        auto [it, fresh] = allowed.try_emplace(node, false);
        if (fresh) it->second = breaker_.Allow(route.ids[node]);
        if (it->second) break;
      }
      if (next[i] >= order[i].size()) {
        unreadable = true;
        break;
      }
      asked[order[i][next[i]]].push_back(i);
    }
    for (auto& [node, allowed_call] : allowed) {
      // A call the breaker let through that is not made keeps no half-open trial.
      if (allowed_call && (unreadable || !asked.contains(node))) breaker_.Cancel(route.ids[node]);
    }
    if (unreadable) return false;  // no owner left: the hit is computed instead
    std::vector<std::pair<size_t, std::vector<size_t>>> calls(asked.begin(), asked.end());
    std::vector<grpc::Status> statuses(calls.size());
    // A call whose blocks all have an owner left after this one ends at half the time left
    // (a hedge): an owner that stops answering mid-read, which the router's lookup could not
    // foresee, then costs the load half its budget before the other owners are asked.
    const auto now = std::chrono::system_clock::now();
    const auto hedge = now + (deadline - now) / 2;
    ForEachAtOnce(calls.size(), [&](size_t c) {
      const auto& [node, mine] = calls[c];
      const bool others_left = std::all_of(mine.begin(), mine.end(),
                                           [&](size_t i) { return next[i] + 1 < order[i].size(); });
      const auto call_deadline = others_left ? std::min(hedge, deadline) : deadline;
      v1::ReadBlocksRequest request;
      for (size_t i : mine) request.add_keys(kvstore::KeyBytes(keys[blocks[i]]));
      request.set_region(region == kvstore::Region::kBlockKv ? v1::STORE_REGION_BLOCK_KV
                                                             : v1::STORE_REGION_PRODUCER_SWA);
      request.set_model_fingerprint(model_fingerprint);
      statuses[c] = ReadFromNode(*route.stubs[node], caller, span, call_deadline, request, mine,
                                 payload_bytes, got);
    });
    pending.clear();
    for (size_t c = 0; c < calls.size(); ++c) {
      const auto& [node, mine] = calls[c];
      if (CountsAgainstNode(statuses[c])) breaker_.Record(route.ids[node], statuses[c].ok());
      if (statuses[c].error_code() == grpc::StatusCode::CANCELLED) return false;
      for (size_t i : mine) {
        if (got[i].has_value()) continue;
        ++next[i];  // absent there, failed its checks there, or the call failed
        pending.push_back(i);
      }
    }
    if (!pending.empty() && std::chrono::system_clock::now() >= deadline) return false;
  }
  for (size_t i = 0; i < blocks.size(); ++i) use(blocks[i], *got[i]);
  return true;
}

std::vector<std::string> StoreFleetClient::Write(const Route& route,
                                                 const std::vector<v1::BlockWrite>& writes,
                                                 const trace::Span& span) {
  // Each owner's writes, deepest block first.
  std::map<size_t, std::vector<const v1::BlockWrite*>> owned;
  for (auto it = writes.rbegin(); it != writes.rend(); ++it) {
    Sha256Digest key{};
    if (it->key().size() != key.size()) continue;
    std::memcpy(key.data(), it->key().data(), key.size());
    for (size_t node : kvstore::Owners(key, route.ids, route.replication)) {
      owned[node].push_back(&*it);
    }
  }
  std::vector<std::pair<size_t, std::vector<const v1::BlockWrite*>>> calls;
  std::vector<std::string> failed;
  for (auto& [node, mine] : owned) {
    if (breaker_.Allow(route.ids[node])) {
      calls.emplace_back(node, std::move(mine));
    } else {
      failed.push_back(route.ids[node]);
    }
  }
  std::vector<grpc::Status> statuses(calls.size());
  ForEachAtOnce(calls.size(), [&](size_t c) {
    const auto& [node, mine] = calls[c];
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    trace::Inject(span, context);
    v1::WriteBlocksResponse written;
    auto writer = route.stubs[node]->WriteBlocks(&context, &written);
    for (const v1::BlockWrite* w : mine) {
      if (!writer->Write(*w)) break;
    }
    writer->WritesDone();
    statuses[c] = writer->Finish();
  });
  for (size_t c = 0; c < calls.size(); ++c) {
    const std::string& id = route.ids[calls[c].first];
    breaker_.Record(id, statuses[c].ok());
    if (!statuses[c].ok()) failed.push_back(id);
  }
  return failed;
}

}  // namespace baton::prefill_node

#include "baton/router/admission.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "baton/router/tenant_share.h"

namespace baton::router {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting request looks at its client's call: gRPC's synchronous API says nothing
// when a client cancels, so a cancel is seen within this. Everything that can admit a request
// (a freed slot or stream, a registration, the queue moving) wakes the one whose turn it is.
constexpr std::chrono::milliseconds kCancelCheck{100};

// A pool without a known bound (no API keys, or no decode node has reported its slots yet).
constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 2;

kvstore::PrefillRates RatesFor(const NodeRegistry::PrefillCandidate& candidate) {
  kvstore::PrefillRates rates = candidate.rates;
  rates.replay_ms_per_gflop = candidate.replay_ms_per_gflop;
  return rates;
}

}  // namespace

class Admission::Waiting {
 public:
  Waiting(Admission& admission, size_t model, bool retry)
      : admission_(admission), model_(model), retry_(retry) {
    if (retry_) admission_.retries_[model_].insert(&waiter_);
  }
  ~Waiting() {
    if (retry_) admission_.retries_[model_].erase(&waiter_);
    Leave(/*admitted=*/false);
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

  void Queue(const std::string& tenant) {
    ticket_ = admission_.queues_[model_].Push(tenant);
    admission_.waiters_[model_].emplace(*ticket_, &waiter_);
    // A new active tenant shrinks the others' shares, which may pass the turn on.
    admission_.WakeTurn(model_);
  }
  // Out of the queue, admitted or not; the next in turn is woken.
  void Leave(bool admitted) {
    if (!ticket_.has_value()) return;
    admission_.queues_[model_].Remove(*ticket_, admitted);
    admission_.waiters_[model_].erase(*ticket_);
    ticket_.reset();
    admission_.WakeTurn(model_);
  }
  const std::optional<uint64_t>& ticket() const { return ticket_; }
  Waiter& waiter() { return waiter_; }

 private:
  Admission& admission_;
  const size_t model_;
  const bool retry_;
  Waiter waiter_;
  std::optional<uint64_t> ticket_;
};

PrefillSlot& PrefillSlot::operator=(PrefillSlot&& other) noexcept {
  if (this != &other) {
    Done();
    admission_ = other.admission_;
    node_ = std::move(other.node_);
    start_ = other.start_;
    predicted_ms_ = other.predicted_ms_;
    other.node_ = nullptr;
  }
  return *this;
}

void PrefillSlot::Done() {
  if (node_ != nullptr && admission_ != nullptr)
    admission_->SlotDone(*node_, Clock::now() - start_, predicted_ms_);
  node_ = nullptr;
}

Admission::Admission(NodeRegistry& registry, const std::vector<ServedModel>& models,
                     const Options& options)
    : registry_(registry),
      models_(models),
      options_(options),
      queues_(models.size()),
      waiters_(models.size()),
      retries_(models.size()),
      streams_(models.size()) {}

void Admission::Notify() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t model = 0; model < queues_.size(); ++model) WakeTurn(model);
}

void Admission::WakeTurn(size_t model) {
  auto wake = [](Waiter* waiter) {
    waiter->woken = true;
    waiter->wake.notify_one();
  };
  for (Waiter* retry : retries_[model]) wake(retry);
  const FairQueue& queue = queues_[model];
  if (queue.empty()) return;
  const std::optional<uint64_t> head = queue.Head(StreamsFull(model, ActiveTenants(model)));
  if (!head.has_value()) return;
  if (auto it = waiters_[model].find(*head); it != waiters_[model].end()) wake(it->second);
}

void Admission::SlotDone(RegisteredNode& node, Clock::duration took, double predicted_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    prefill_ms_average_ =
        0.8 * prefill_ms_average_ + 0.2 * std::chrono::duration<double, std::milli>(took).count();
  }
  registry_.PrefillDone(node, predicted_ms);  // notifies through the registry's OnChange
}

int64_t Admission::Weight(const std::string& tenant) const {
  return options_.tenant_weight ? options_.tenant_weight(tenant) : 1;
}

std::set<std::string> Admission::ActiveTenants(size_t model) const {
  std::set<std::string> tenants;
  for (const auto& [tenant, n] : streams_[model]) tenants.insert(tenant);
  queues_[model].ForEachTenant([&](const std::string& tenant) { tenants.insert(tenant); });
  return tenants;
}

std::set<std::string> Admission::StreamsFull(size_t model,
                                             const std::set<std::string>& tenants) const {
  // Without keys every request is the one tenant "": no share but the operator's ceiling.
  const int64_t slots = options_.api_keys ? registry_.DecodeSlots(model) : 0;
  ShareInput input{.pool = slots > 0 ? slots : kUnbounded,
                   .reserve = slots > 0 ? NewcomerReserve(slots) : 0,
                   .active_weight = 0,
                   .cap = options_.max_streams_per_tenant};
  for (const std::string& tenant : tenants) input.active_weight += Weight(tenant);
  const std::map<std::string, int64_t>& streams = streams_[model];
  int64_t in_use = 0;
  for (const auto& [tenant, n] : streams) in_use += n;
  std::set<std::string> full;
  for (const std::string& tenant : tenants) {
    input.weight = Weight(tenant);
    const auto held = streams.find(tenant);
    if (!MayTake(input, held == streams.end() ? 0 : held->second, in_use)) full.insert(tenant);
  }
  return full;
}

absl::Status Admission::MakeQueueRoom(size_t model, const std::string& tenant, int64_t live,
                                      int64_t* retry_after_ms) {
  FairQueue& queue = queues_[model];
  // Roughly when the queue ahead will have drained to where this request would start.
  auto hint = [&](int64_t ahead) {
    return static_cast<int64_t>(
        prefill_ms_average_ * static_cast<double>(ahead) /
        static_cast<double>(std::max<int64_t>(1, live * options_.prefill_slots)));
  };
  std::set<std::string> tenants = ActiveTenants(model);
  tenants.insert(tenant);
  // No reserve: a place in the queue holds nothing yet, so a tenant over its share gives one
  // up to a tenant under it instead (tenant_share.h).
  ShareInput input{
      .pool = options_.max_queued, .active_weight = 0, .cap = options_.max_queued_per_tenant};
  for (const std::string& t : tenants) input.active_weight += Weight(t);
  auto share_of = [&](const std::string& t) {
    input.weight = Weight(t);
    return TenantShare(input);
  };
  const int64_t waiting = queue.waiting(tenant), share = share_of(tenant);
  if (share > 0 && waiting >= share) {
    // A flood from one tenant is refused while the others' requests wait.
    *retry_after_ms = hint(waiting);
    return absl::ResourceExhaustedError(
        absl::StrCat("this tenant holds its share of the router's admission queue (", share, " of ",
                     options_.max_queued, " requests waiting, shared by ", tenants.size(),
                     " active tenants); retry after ", *retry_after_ms, " ms"));
  }
  if (static_cast<int64_t>(queue.size()) < options_.max_queued) return absl::OkStatus();
  // Full: the tenant furthest over its share gives up its newest request's place.
  std::string over;
  int64_t most = 0;
  for (const std::string& t : tenants) {
    if (const int64_t excess = queue.waiting(t) - share_of(t); excess > most) {
      most = excess;
      over = t;
    }
  }
  if (most > 0) {
    const uint64_t newest = *queue.Newest(over);
    Waiter* victim = waiters_[model].at(newest);
    victim->retry_after_ms = hint(queue.waiting(over));
    victim->refused = absl::ResourceExhaustedError(absl::StrCat(
        "this tenant holds more than its share of the router's admission queue (", share_of(over),
        " of ", options_.max_queued, " requests waiting, shared by ", tenants.size(),
        " active tenants): another tenant's request took this one's place; retry after ",
        victim->retry_after_ms, " ms"));
    victim->woken = true;
    victim->wake.notify_one();
    queue.Remove(newest, /*admitted=*/false);
    waiters_[model].erase(newest);
    return absl::OkStatus();
  }
  *retry_after_ms = hint(static_cast<int64_t>(queue.size()));
  return absl::ResourceExhaustedError(
      absl::StrCat("the router's admission queue is full (", options_.max_queued,
                   " requests waiting for a prefill node); retry after ", *retry_after_ms, " ms"));
}

absl::Status Admission::Sleep(const grpc::ServerContextBase& context,
                              std::unique_lock<std::mutex>& lock, Waiter& waiter,
                              Clock::time_point recheck) {
  while (!waiter.woken && Clock::now() < recheck) {
    if (context.IsCancelled()) {
      return absl::CancelledError("cancelled while waiting for a prefill node");
    }
    if (context.deadline() < std::chrono::system_clock::now()) {
      return absl::DeadlineExceededError(
          "the request's deadline passed while it waited for a prefill node");
    }
    waiter.wake.wait_until(lock, std::min(recheck, Clock::now() + kCancelCheck));
  }
  waiter.woken = false;
  return absl::OkStatus();
}

Admission::Admitted Admission::TakeSlot(const NodeRegistry::PrefillChoice& choice, const Ask& ask) {
  // Kept from call to call on this thread: a placement over a thousand nodes allocates nothing.
  thread_local std::vector<kvstore::PrefillNodeView> views;
  views.clear();
  for (const NodeRegistry::PrefillCandidate& candidate : choice.open) {
    views.push_back({.prefilling = candidate.prefilling,
                     .reported_queued = candidate.reported_queued,
                     .queue_ms = candidate.pending_ms,
                     .rates = RatesFor(candidate),
                     .tiers = ask.tiers ? ask.tiers(*candidate.node) : kvstore::TierLookups{}});
  }
  const kvstore::Placement placement = kvstore::PlacePrefill(views, ask.placement);
  const NodeRegistry::PrefillCandidate& chosen = choice.open[placement.chosen];
  // The node's own part: a replay on the decode node is no work queued here.
  const double service_ms = placement.plan.cost.node_ms();
  Admitted admitted{registry_.TakePrefillSlot(chosen.node, service_ms),
                    PrefillSlot(this, chosen.node, service_ms), chosen, std::nullopt, placement};
  if (placement.runner_up >= 0) admitted.runner_up = choice.open[placement.runner_up];
  return admitted;
}

absl::StatusOr<Admission::Admitted> Admission::Admit(const grpc::ServerContextBase& context,
                                                     const Ask& ask, StreamHold& hold,
                                                     int64_t* retry_after_ms) {
  const size_t model = hold.model;
  std::unique_lock<std::mutex> lock(mutex_);
  // Each model waits in its own queue: one without a free prefill slot holds up no other.
  FairQueue& queue = queues_[model];
  const auto entered = Clock::now();
  const auto ttl = std::chrono::milliseconds(options_.node_ttl_ms);
  Waiting waiting(*this, model, ask.retry);
  while (true) {
    const NodeRegistry::PrefillChoice choice = registry_.ChoosePrefill(
        model, ask.fingerprint, ask.exclude, ask.lost_decode, options_.prefill_slots);
    // A node marked down after one failed call is back at its next heartbeat: wait that long
    // before telling the queue there is none.
    if (choice.live == 0 && Clock::now() - entered > ttl) {
      return absl::UnavailableError(
          models_[model].name.empty()
              ? std::string("no prefill node is available")
              : absl::StrCat("no prefill node is available for model '", models_[model].name,
                             "' (with a decode node of the same weights)"));
    }
    // A request takes a slot only when it is its turn (fair_queue.h), and while its tenant may
    // take a decode stream (tenant_share.h); the turn of a tenant at its share passes to the
    // next.
    std::set<std::string> tenants = ActiveTenants(model);
    tenants.insert(hold.tenant);
    const std::set<std::string> full = StreamsFull(model, tenants);
    const bool at_share = !hold.held && full.contains(hold.tenant);
    const std::optional<uint64_t> head = queue.Head(full);
    const bool turn = !at_share && (ask.retry || !head.has_value() || head == waiting.ticket());
    if (!choice.open.empty() && turn) {
      if (!hold.held) {
        ++streams_[model][hold.tenant];
        hold.held = true;
      }
      waiting.Leave(/*admitted=*/true);
      return TakeSlot(choice, ask);
    }
    if (!waiting.ticket().has_value() && !ask.retry) {
      if (absl::Status room = MakeQueueRoom(model, hold.tenant, choice.live, retry_after_ms);
          !room.ok()) {
        return room;
      }
      waiting.Queue(hold.tenant);
    }
    // With no live node, look again when the node TTL has passed.
    const auto recheck =
        choice.live == 0 ? entered + ttl + std::chrono::milliseconds(1) : Clock::time_point::max();
    if (absl::Status s = Sleep(context, lock, waiting.waiter(), recheck); !s.ok()) return s;
    if (!waiting.waiter().refused.ok()) {  // another tenant's request took its place
      *retry_after_ms = waiting.waiter().retry_after_ms;
      return waiting.waiter().refused;
    }
  }
}

void Admission::ReleaseStream(StreamHold& hold) {
  if (!hold.held) return;
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, int64_t>& streams = streams_[hold.model];
  if (--streams[hold.tenant] <= 0) streams.erase(hold.tenant);
  hold.held = false;
  WakeTurn(hold.model);
}

double Admission::Queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  double queued = 0;
  for (const FairQueue& queue : queues_) queued += static_cast<double>(queue.size());
  return queued;
}

std::map<std::string, double> Admission::StreamsByTenant() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, double> streams;
  for (const auto& model : streams_) {
    for (const auto& [tenant, n] : model) streams[tenant] += static_cast<double>(n);
  }
  return streams;
}

}  // namespace baton::router

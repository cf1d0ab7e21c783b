#include "baton/router/admission.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"

namespace baton::router {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting request looks at its client's call: gRPC's synchronous API says nothing
// when a client cancels, so a cancel is seen within this. Everything else that can admit a
// request (a freed slot, a registration, the queue moving) notifies.
constexpr std::chrono::milliseconds kCancelCheck{20};

}  // namespace

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
      streams_(models.size()) {}

void Admission::Notify() {
  std::lock_guard<std::mutex> lock(mutex_);
  changed_.notify_all();
}

void Admission::SlotDone(RegisteredNode& node, Clock::duration took, double predicted_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    prefill_ms_average_ =
        0.8 * prefill_ms_average_ + 0.2 * std::chrono::duration<double, std::milli>(took).count();
  }
  registry_.PrefillDone(node, predicted_ms);  // notifies through the registry's OnChange
}

int64_t Admission::StreamShare(size_t model) const {
  if (options_.max_streams_per_tenant > 0) return options_.max_streams_per_tenant;
  if (!options_.api_keys) return std::numeric_limits<int64_t>::max();
  const int64_t slots = registry_.DecodeSlots(model);
  // No decode node has said how many slots it has: the share is unknown, so unbounded.
  return slots == 0 ? std::numeric_limits<int64_t>::max() : std::max<int64_t>(1, slots / 2);
}

absl::Status Admission::CheckQueueRoom(const FairQueue& queue, const std::string& tenant,
                                       int64_t live, int64_t* retry_after_ms) const {
  // Roughly when the queue ahead will have drained to where this request would start.
  auto hint = [&](int64_t ahead) {
    return static_cast<int64_t>(
        prefill_ms_average_ * static_cast<double>(ahead) /
        static_cast<double>(std::max<int64_t>(1, live * options_.prefill_slots)));
  };
  if (static_cast<int64_t>(queue.size()) >= options_.max_queued) {
    *retry_after_ms = hint(static_cast<int64_t>(queue.size()));
    return absl::ResourceExhaustedError(absl::StrCat(
        "the router's admission queue is full (", options_.max_queued,
        " requests waiting for a prefill node); retry after ", *retry_after_ms, " ms"));
  }
  // A tenant's share: a flood from one tenant is refused while the others' requests wait.
  const int64_t share = options_.max_queued_per_tenant > 0 ? options_.max_queued_per_tenant
                        : options_.api_keys ? std::max<int64_t>(1, options_.max_queued / 2)
                                            : options_.max_queued;
  if (queue.waiting(tenant) >= share) {
    *retry_after_ms = hint(queue.waiting(tenant));
    return absl::ResourceExhaustedError(absl::StrCat(
        "this tenant holds its share of the router's admission queue (", share, " of ",
        options_.max_queued, " requests waiting); retry after ", *retry_after_ms, " ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Admission::Admitted> Admission::Admit(const grpc::ServerContextBase& context,
                                                     const Ask& ask, StreamHold& hold,
                                                     int64_t* retry_after_ms) {
  const size_t model = hold.model;
  std::unique_lock<std::mutex> lock(mutex_);
  std::map<std::string, int64_t>& streams = streams_[model];
  // Each model waits in its own queue: one without a free prefill slot holds up no other.
  FairQueue& queue = queues_[model];
  const auto entered = Clock::now();
  std::optional<uint64_t> ticket;
  auto leave = [&](absl::Status why) -> absl::Status {
    if (ticket.has_value()) {
      queue.Remove(*ticket, /*admitted=*/false);
      changed_.notify_all();
    }
    return why;
  };
  while (true) {
    const NodeRegistry::PrefillChoice choice = registry_.ChoosePrefill(
        model, ask.fingerprint, ask.exclude, ask.lost_decode, options_.prefill_slots);
    // A node marked down after one failed call is back at its next heartbeat: wait that long
    // before telling the queue there is none.
    if (choice.live == 0 &&
        Clock::now() - entered > std::chrono::milliseconds(options_.node_ttl_ms)) {
      return leave(absl::UnavailableError(
          models_[model].name.empty()
              ? std::string("no prefill node is available")
              : absl::StrCat("no prefill node is available for model '", models_[model].name,
                             "' (with a decode node of the same weights)")));
    }
    // A request takes a slot only when it is its turn (fair_queue.h), and while its tenant
    // holds less than its share of the decode slots; the turn of a tenant at its share passes
    // to the next.
    const int64_t share = StreamShare(model);
    std::set<std::string> full;
    for (const auto& [tenant, n] : streams) {
      if (n >= share) full.insert(tenant);
    }
    const bool at_share = !hold.held && full.contains(hold.tenant);
    const std::optional<uint64_t> head = queue.Head(full);
    const bool turn = !at_share && (ask.retry || !head.has_value() || head == ticket);
    if (choice.best != nullptr && turn) {
      if (ticket.has_value()) {
        queue.Remove(*ticket, /*admitted=*/true);
        changed_.notify_all();
      }
      if (!hold.held) {
        ++streams[hold.tenant];
        hold.held = true;
      }
      // The policy's first among the nodes with a free slot (the least loaded first on ties).
      size_t first = 0, second = choice.open.size();
      std::vector<PrefillScore> scores;
      if (ask.score) {
        for (const NodeRegistry::PrefillCandidate& candidate : choice.open) {
          scores.push_back(ask.score(candidate));
        }
        for (size_t i = 1; i < scores.size(); ++i) {
          if (scores[i].rank < scores[first].rank) first = i;
        }
      }
      for (size_t i = 0; i < choice.open.size(); ++i) {
        if (i != first && (second == choice.open.size() ||
                           (!scores.empty() && scores[i].rank < scores[second].rank))) {
          second = i;
        }
      }
      const double service_ms = scores.empty() ? 0 : scores[first].service_ms;
      Admitted admitted{registry_.TakePrefillSlot(choice.open[first].node, service_ms),
                        PrefillSlot(this, choice.open[first].node, service_ms), choice.open[first],
                        std::nullopt, first == 0};
      if (second < choice.open.size()) admitted.runner_up = choice.open[second];
      return admitted;
    }
    if (!ticket.has_value() && !ask.retry) {
      if (absl::Status room = CheckQueueRoom(queue, hold.tenant, choice.live, retry_after_ms);
          !room.ok()) {
        return room;
      }
      ticket = queue.Push(hold.tenant);
    }
    if (context.IsCancelled()) {
      return leave(absl::CancelledError("cancelled while waiting for a prefill node"));
    }
    if (context.deadline() < std::chrono::system_clock::now()) {
      return leave(absl::DeadlineExceededError(
          "the request's deadline passed while it waited for a prefill node"));
    }
    changed_.wait_for(lock, kCancelCheck);
  }
}

void Admission::ReleaseStream(StreamHold& hold) {
  if (!hold.held) return;
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, int64_t>& streams = streams_[hold.model];
  if (--streams[hold.tenant] <= 0) streams.erase(hold.tenant);
  hold.held = false;
  changed_.notify_all();
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

// The decode node's shadow verification (fidelity_shadow.h): what a request asks for at its
// reservation, the served rows kept as its tokens are sampled, the shadow handed its capture,
// and the outcome into the metrics and the request's last output.
#include <algorithm>
#include <map>
#include <string>

#include "baton/common/log.h"
#include "baton/decode_node/decode_service.h"
#include "baton/model/truncation.h"
#include "decode_metrics.h"
#include "request.h"

namespace baton::decode_node {
namespace {

const char* ModeLabel(v1::TruncationMode mode) {
  switch (mode) {
    case v1::TRUNCATION_MODE_COMPACT:
      return "compact";
    case v1::TRUNCATION_MODE_MASK:
      return "mask";
    default:
      return "off";
  }
}

}  // namespace

void DecodeService::StartFidelity(const v1::ReserveRequest& request, Request& r) {
  // A re-prefill after a lost decode node is not shadowed: its first tokens were served elsewhere.
  if (request.fidelity_tokens() == 0 || request.completed_tokens() > 0) return;
  FidelityCapture& f = r.fidelity;
  f.want = std::min<int64_t>(request.fidelity_tokens(), r.generation.max_tokens);
  f.reply = request.fidelity_reply();
  f.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
}

void DecodeService::FidelityAtCommit(const v1::StateHeader& h, Request& r) {
  FidelityCapture& f = r.fidelity;
  if (f.want == 0) return;
  const bool truncated = h.mode() != v1::TRUNCATION_MODE_OFF && h.keep() < h.prompt_len();
  const int64_t V = model_.config().vocab_size;
  // The served rows held at once are bounded: besides the shadows waiting and the one running,
  // at most --fidelity-queue requests keep theirs (each want x vocab_size floats).
  int64_t capturing = 0;
  for (const auto& [id, other] : requests_) {
    capturing += other->fidelity.want > 0 && !other->fidelity.submitted;
  }
  const bool full = capturing > options_.fidelity_queue;  // this request counts itself
  if (!truncated || shadows_ == nullptr || full ||
      (h.split() == v1::SPLIT_PREFILL_ALL && h.first_logits_size() != V)) {
    // Exact (nothing to compare), no shadow on this backend, too many rows held already, or
    // position 0's served row missing: answered at once.
    f.want = 0;
    f.result.set_not_truncated(!truncated);
    f.result.set_dropped(truncated);
    if (truncated) CountDropped();
    return;
  }
  f.mode = ModeLabel(h.mode());
  f.keep = KeepBucket(h.keep());
  f.hit = h.s_valid() > 0 ? "true" : "false";
  if (h.split() == v1::SPLIT_PREFILL_ALL) {
    f.Keep(h.first_token(), {h.first_logits().data(), static_cast<size_t>(V)});
  }
}

void DecodeService::MaybeShadow(const std::shared_ptr<Request>& r) {
  FidelityCapture& f = r->fidelity;
  if (f.want == 0 || f.submitted) return;
  if (static_cast<int64_t>(f.tokens.size()) < f.want && r->phase != Phase::kFinished) return;
  f.submitted = true;
  std::vector<std::string> labels = {f.mode, f.keep, f.hit, model_.fingerprint().substr(0, 16)};
  ShadowJob job{.prompt = f.prompt, .tokens = std::move(f.tokens), .served = std::move(f.served)};
  job.done = [this, request = std::weak_ptr<Request>(r), labels](const ShadowOutcome& outcome) {
    ShadowDone(request, outcome, labels);
  };
  if (!job.tokens.empty() && shadows_->Submit(job)) {
    f.pending = f.reply;
    return;
  }
  CountDropped();
  f.result.set_dropped(true);
}

void DecodeService::InjectRingFault(Request& r) {
  if (!options_.inject_consumer_ring_fault) return;
  model::SequenceState& state = r.reservation.computed();
  std::fill_n(state.consumer_swa(), state.layout().consumer_swa_floats(), 0.0f);
}

void DecodeService::CountDropped() {
  metrics_->fidelity_shadows.Add({{"outcome", "dropped"}}).Increment();
  fidelity_report_.set_shadows_dropped(fidelity_report_.shadows_dropped() + 1);
}

void DecodeService::Tally(const std::vector<std::string>& labels, const model::FidelitySummary& s) {
  v1::FidelityTally* tally = nullptr;
  for (v1::FidelityTally& t : *fidelity_report_.mutable_tallies()) {
    if (t.mode() == labels[0] && std::to_string(t.keep()) == labels[1] &&
        t.hit() == (labels[2] == "true")) {
      tally = &t;
    }
  }
  if (tally == nullptr) {
    if (fidelity_report_.tallies_size() >= kMaxFidelityTallies) return;  // the metrics have it
    tally = fidelity_report_.add_tallies();
    tally->set_mode(labels[0]);
    tally->set_keep(static_cast<uint32_t>(std::stoul(labels[1])));
    tally->set_hit(labels[2] == "true");
  }
  tally->set_positions(tally->positions() + static_cast<uint64_t>(s.positions));
  tally->set_top1_disagreements(tally->top1_disagreements() +
                                static_cast<uint64_t>(s.positions - s.top1_agreements));
  tally->set_kl_sum(tally->kl_sum() + s.kl_sum);
  tally->set_max_logit_diff(std::max(tally->max_logit_diff(), s.max_logit_diff));
}

void DecodeService::ShadowDone(const std::weak_ptr<Request>& request, const ShadowOutcome& outcome,
                               const std::vector<std::string>& labels) {
  const char* result = outcome.dropped ? "dropped" : outcome.status.ok() ? "run" : "failed";
  metrics_->fidelity_shadows.Add({{"outcome", result}}).Increment();
  metrics_->fidelity_cpu_seconds.Increment(outcome.cpu_seconds);
  const model::FidelitySummary& s = outcome.summary;
  if (!outcome.dropped && outcome.status.ok()) {
    const std::map<std::string, std::string> by = {
        {"mode", labels[0]}, {"keep", labels[1]}, {"hit", labels[2]}, {"model", labels[3]}};
    auto& kl = metrics_->fidelity_kl.Add(
        by, prometheus::Histogram::BucketBoundaries{1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1});
    auto& diff = metrics_->fidelity_max_logit_diff.Add(
        by, prometheus::Histogram::BucketBoundaries{1e-4, 1e-3, 1e-2, 0.1, 0.5, 1, 2, 5});
    for (const model::LogitsError& e : s.per_position) {
      kl.Observe(e.kl);
      diff.Observe(e.max_abs);
    }
    metrics_->fidelity_positions.Add(by).Increment(static_cast<double>(s.positions));
    metrics_->fidelity_top1_disagreements.Add(by).Increment(
        static_cast<double>(s.positions - s.top1_agreements));
  } else if (!outcome.status.ok()) {
    log::Warn("shadow verification failed", {{"error", std::string(outcome.status.message())}});
  }
  absl::MutexLock lock(&mutex_);
  v1::FidelityReport& report = fidelity_report_;
  report.set_cpu_seconds(report.cpu_seconds() + outcome.cpu_seconds);
  if (outcome.dropped) {
    report.set_shadows_dropped(report.shadows_dropped() + 1);
  } else if (!outcome.status.ok()) {
    report.set_shadows_failed(report.shadows_failed() + 1);
  } else {
    report.set_shadows_run(report.shadows_run() + 1);
    Tally(labels, s);
  }
  const std::shared_ptr<Request> r = request.lock();
  if (r == nullptr || !r->fidelity.pending) return;  // gone, or nobody waits for it
  v1::Fidelity& f = r->fidelity.result;
  f.set_dropped(outcome.dropped || !outcome.status.ok());
  if (!f.dropped()) {
    f.set_positions(static_cast<uint32_t>(s.positions));
    f.set_top1_agreements(static_cast<uint32_t>(s.top1_agreements));
    f.set_mean_kl(s.mean_kl());
    f.set_max_kl(s.max_kl);
    f.set_max_logit_diff(s.max_logit_diff);
    f.set_first_disagreement(static_cast<int32_t>(s.first_disagreement));
  }
  r->fidelity.pending = false;
  r->progress.SignalAll();
}

}  // namespace baton::decode_node

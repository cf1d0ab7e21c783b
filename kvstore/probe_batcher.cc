#include "baton/kvstore/probe_batcher.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <unordered_map>

namespace baton::kvstore {

// One Probe() call: its answers, and how many nodes have yet to give theirs.
struct ProbeBatcher::Lookup {
  std::vector<Answer> answers;
  size_t remaining = 0;
  Clock::time_point deadline;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::condition_variable answered;
};

// One node's part of a lookup, queued on that node's sender.
struct ProbeBatcher::Waiter {
  std::shared_ptr<Lookup> lookup;
  size_t index = 0;  // its Answer in lookup->answers
  std::shared_ptr<v1::KvStore::StubInterface> stub;
  std::vector<std::string> keys;
  bool settled = false;  // its Answer is final (given, or the lookup's deadline passed)
};

struct ProbeBatcher::Sender {
  std::deque<std::shared_ptr<Waiter>> queue;
  std::condition_variable wake;
};

ProbeBatcher::ProbeBatcher(Options options) : options_(options) {}

ProbeBatcher::~ProbeBatcher() {
  std::unique_lock<std::mutex> lock(mutex_);
  stop_ = true;
  // What is queued ends now; the calls out end at their answer or their deadline.
  for (auto& [id, sender] : senders_) {
    for (const std::shared_ptr<Waiter>& waiter : sender->queue) {
      Cancel(*waiter, grpc::Status(grpc::StatusCode::CANCELLED, "the router is stopping"));
    }
    sender->queue.clear();
    sender->wake.notify_all();
  }
  threads_ended_.wait(lock, [&] { return threads_ == 0 && probing_ == 0; });
}

std::vector<ProbeBatcher::Answer> ProbeBatcher::Probe(
    std::vector<Ask> asks, Clock::time_point deadline,
    std::vector<std::pair<std::string, std::string>> metadata) {
  auto lookup = std::make_shared<Lookup>();
  lookup->answers.resize(asks.size());
  lookup->deadline = deadline;
  lookup->metadata = std::move(metadata);
  std::vector<std::shared_ptr<Waiter>> waiters;
  std::unique_lock<std::mutex> lock(mutex_);
  ++probing_;
  for (size_t i = 0; i < asks.size(); ++i) {
    auto waiter = std::make_shared<Waiter>();
    waiter->lookup = lookup;
    waiter->index = i;
    waiter->stub = std::move(asks[i].stub);
    waiter->keys = std::move(asks[i].keys);
    waiters.push_back(waiter);
    if (stop_) {
      lookup->answers[i].status =
          grpc::Status(grpc::StatusCode::CANCELLED, "the router is stopping");
      waiter->settled = true;
      continue;
    }
    ++lookup->remaining;
    std::shared_ptr<Sender>& sender = senders_[asks[i].node_id];
    if (sender == nullptr) {
      sender = std::make_shared<Sender>();
      ++threads_;
      std::thread(&ProbeBatcher::Send, this, asks[i].node_id, sender).detach();
    }
    sender->queue.push_back(std::move(waiter));
    sender->wake.notify_one();
  }
  lookup->answered.wait_until(lock, deadline, [&] { return lookup->remaining == 0; });
  // What has not answered by now has missed this lookup's deadline, queued or out: its sender
  // skips it, or drops the answer when it comes.
  for (const std::shared_ptr<Waiter>& waiter : waiters) {
    if (waiter->settled) continue;
    waiter->settled = true;
    lookup->answers[waiter->index].status =
        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                     "the store node did not answer by the lookup's deadline");
  }
  if (--probing_ == 0) threads_ended_.notify_all();
  return std::move(lookup->answers);
}

std::vector<std::shared_ptr<ProbeBatcher::Waiter>> ProbeBatcher::TakeBatch(Sender& sender) {
  std::vector<std::shared_ptr<Waiter>> batch;
  size_t keys = 0;
  while (!sender.queue.empty() && batch.size() < options_.max_lookups_per_call) {
    const std::shared_ptr<Waiter>& next = sender.queue.front();
    if (next->settled) {
      sender.queue.pop_front();
      continue;
    }
    // Keys counted with repeats: a bound that the call's distinct keys then keep too.
    if (!batch.empty() && keys + next->keys.size() > options_.max_keys_per_call) break;
    keys += next->keys.size();
    batch.push_back(next);
    sender.queue.pop_front();
  }
  return batch;
}

void ProbeBatcher::Send(const std::string& node_id, const std::shared_ptr<Sender>& sender) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    const bool woken = sender->wake.wait_for(lock, options_.idle_exit,
                                             [&] { return stop_ || !sender->queue.empty(); });
    if (stop_ || !woken) break;
    std::vector<std::shared_ptr<Waiter>> batch = TakeBatch(*sender);
    if (batch.empty()) continue;
    // One call for the batch: each key once, each waiter's keys placed in it.
    v1::ProbeRequest request;
    std::unordered_map<std::string, size_t> place;
    std::vector<std::vector<size_t>> places(batch.size());
    Clock::time_point deadline = Clock::time_point::max();
    for (size_t w = 0; w < batch.size(); ++w) {
      for (const std::string& key : batch[w]->keys) {
        auto [it, added] = place.try_emplace(key, place.size());
        if (added) request.add_keys(key);
        places[w].push_back(it->second);
      }
      deadline = std::min(deadline, batch[w]->lookup->deadline);
    }
    grpc::ClientContext context;
    context.set_deadline(deadline);
    for (const auto& [key, value] : batch.front()->lookup->metadata) {
      context.AddMetadata(key, value);
    }
    const std::shared_ptr<v1::KvStore::StubInterface> stub = batch.back()->stub;
    ++calls_;
    lookups_ += batch.size();
    lock.unlock();
    v1::ProbeResponse response;
    const grpc::Status status = stub->Probe(&context, request, &response);
    lock.lock();
    Settle(batch, places, status, response, static_cast<size_t>(request.keys_size()));
  }
  // Out of work for a while, or stopping: what is still queued is cancelled, and the next
  // lookup for this node starts a new sender.
  for (const std::shared_ptr<Waiter>& waiter : sender->queue) {
    Cancel(*waiter, grpc::Status(grpc::StatusCode::CANCELLED, "the router is stopping"));
  }
  if (auto it = senders_.find(node_id); it != senders_.end() && it->second == sender) {
    senders_.erase(it);
  }
  if (--threads_ == 0) threads_ended_.notify_all();
}

void ProbeBatcher::Cancel(Waiter& waiter, const grpc::Status& status) {
  if (waiter.settled) return;
  waiter.settled = true;
  waiter.lookup->answers[waiter.index].status = status;
  if (--waiter.lookup->remaining == 0) waiter.lookup->answered.notify_all();
}

void ProbeBatcher::Settle(const std::vector<std::shared_ptr<Waiter>>& batch,
                          const std::vector<std::vector<size_t>>& places,
                          const grpc::Status& status, const v1::ProbeResponse& response,
                          size_t sent_keys) {
  const bool whole = status.ok() && static_cast<size_t>(response.block_kv_size()) == sent_keys &&
                     static_cast<size_t>(response.producer_swa_size()) == sent_keys;
  for (size_t w = 0; w < batch.size(); ++w) {
    Waiter& waiter = *batch[w];
    if (waiter.settled) continue;  // its lookup's deadline passed first
    waiter.settled = true;
    Answer& answer = waiter.lookup->answers[waiter.index];
    answer.status = status;
    if (whole) {
      for (size_t k : places[w]) {
        answer.response.add_block_kv(response.block_kv(static_cast<int>(k)));
        answer.response.add_producer_swa(response.producer_swa(static_cast<int>(k)));
      }
    }
    if (--waiter.lookup->remaining == 0) waiter.lookup->answered.notify_all();
  }
}

uint64_t ProbeBatcher::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

size_t ProbeBatcher::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t waiting = 0;
  for (const auto& [id, sender] : senders_) {
    for (const std::shared_ptr<Waiter>& waiter : sender->queue) waiting += waiter->settled ? 0 : 1;
  }
  return waiting;
}

uint64_t ProbeBatcher::lookups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return lookups_;
}

}  // namespace baton::kvstore

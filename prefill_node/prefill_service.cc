#include "baton/prefill_node/prefill_service.h"

#include <chrono>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "baton/common/rpc.h"
#include "baton/model/sampling.h"
#include "baton/transfer/checksum.h"
#include "baton/transfer/grpc_regions.h"

namespace baton::prefill_node {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kStateFormatVersion = 1;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

absl::StatusOr<model::TruncationMode> ModeFromProto(v1::TruncationMode mode) {
  switch (mode) {
    case v1::TRUNCATION_MODE_OFF:
      return model::TruncationMode::kOff;
    case v1::TRUNCATION_MODE_MASK:
      return model::TruncationMode::kMask;
    case v1::TRUNCATION_MODE_COMPACT:
      return model::TruncationMode::kCompact;
    default:
      return absl::InvalidArgumentError("mode: must be OFF, MASK or COMPACT");
  }
}

}  // namespace

PrefillService::PrefillService(const model::CedModel& model, const PrefillOptions& options)
    : model_(model), options_(options) {
  if (options.use_ucx) {
    auto worker = transfer::UcxWorker::Create();
    if (worker.ok()) {
      ucx_ = *std::move(worker);
    } else {
      std::cerr << "baton-prefill: UCX unavailable (" << worker.status().message()
                << "); only the gRPC transport will work\n";
    }
  }
}

v1::LoadReport PrefillService::Load() const {
  std::lock_guard<std::mutex> lock(mutex_);
  v1::LoadReport load;
  load.set_active_requests(static_cast<uint32_t>(active_));
  return load;
}

v1::DecodeNode::Stub& PrefillService::DecodeStub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& stub = decode_stubs_[address];
  if (stub == nullptr) {
    stub =
        v1::DecodeNode::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  return *stub;
}

absl::Status PrefillService::SendUcx(const v1::Reservation& reservation,
                                     const model::SequenceState& state, uint64_t block_kv_bytes) {
  if (ucx_ == nullptr) return absl::FailedPreconditionError("this prefill node has no UCX");
  if (reservation.ucx_worker_address().empty()) {
    return absl::FailedPreconditionError("the decode node offers no UCX worker address");
  }
  const std::string key = reservation.ucx_worker_address() + reservation.rkey();
  auto& endpoint = endpoints_[key];
  if (endpoint == nullptr) {
    auto connected = ucx_->Connect(reservation.ucx_worker_address(), reservation.rkey());
    if (!connected.ok()) return connected.status();
    endpoint = *std::move(connected);
  }
  absl::Status status = endpoint->Put(state.producer_swa(), reservation.producer_swa_bytes(),
                                      reservation.producer_swa_addr());
  if (status.ok()) {
    status = endpoint->Put(state.consumer_swa(), reservation.consumer_swa_bytes(),
                           reservation.consumer_swa_addr());
  }
  if (status.ok()) {
    const std::vector<const void*> local(state.pages().begin(), state.pages().end());
    const std::vector<uint64_t> remote(reservation.page_addrs().begin(),
                                       reservation.page_addrs().end());
    status = endpoint->PutPages(local, remote, reservation.page_bytes(), block_kv_bytes);
  }
  if (absl::Status flushed = endpoint->Flush(); status.ok()) status = flushed;
  if (!status.ok()) endpoints_.erase(key);  // the peer may be gone; reconnect next time
  return status;
}

absl::Status PrefillService::SendGrpc(grpc::ServerContext* context, v1::DecodeNode::Stub& decode,
                                      const std::string& request_id,
                                      const model::SequenceState& state, uint64_t block_kv_bytes) {
  auto client = grpc::ClientContext::FromServerContext(*context);
  v1::PushRegionsResponse response;
  auto writer = decode.PushRegions(client.get(), &response);
  const model::StateLayout& layout = state.layout();
  const uint64_t page_bytes = sizeof(float) * layout.page_floats();
  auto send = [&](v1::Region region, const void* data, uint64_t bytes, uint64_t offset) {
    return transfer::WriteRegionChunks(*writer, request_id, region, data, bytes, offset);
  };
  bool ok = send(v1::REGION_PRODUCER_SWA, state.producer_swa(),
                 sizeof(float) * layout.producer_swa_floats(), 0) &&
            send(v1::REGION_CONSUMER_SWA, state.consumer_swa(),
                 sizeof(float) * layout.consumer_swa_floats(), 0);
  for (uint64_t p = 0; ok && p * page_bytes < block_kv_bytes; ++p) {
    ok = send(v1::REGION_BLOCK_KV, state.pages()[p],
              std::min(page_bytes, block_kv_bytes - p * page_bytes), p * page_bytes);
  }
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const v1::PrefillRequest* request,
                                     v1::PrefillResponse* reply) {
  const auto start = Clock::now();
  const v1::GenerateRequest& generate = request->request();
  std::vector<int32_t> tokens(generate.prompt_token_ids().begin(),
                              generate.prompt_token_ids().end());
  absl::StatusOr<model::TruncationMode> mode = ModeFromProto(request->mode());
  if (!mode.ok()) return ToGrpcStatus(mode.status());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++active_;
  }
  struct Done {
    PrefillService* self;
    ~Done() {
      std::lock_guard<std::mutex> lock(self->mutex_);
      --self->active_;
    }
  } done{this};

  std::unique_lock<std::mutex> model_lock(model_mutex_);
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  // Block KV in one contiguous buffer, so that UCX moves it in as few puts as possible.
  const model::StateLayout layout = model_.state_layout();
  model::ContiguousPageAllocator page_buffer(
      layout, (static_cast<int64_t>(tokens.size()) + layout.block_size - 1) / layout.block_size);
  model::SequenceState state(layout, &page_buffer);
  model::PrefillOptions options{.mode = *mode,
                                .keep = request->keep(),
                                .s_valid = request->s_valid(),
                                .chunk_size = options_.token_budget};
  absl::StatusOr<model::PrefillResult> result = model_.Prefill(tokens, options, state);
  if (!result.ok()) return ToGrpcStatus(result.status());
  const auto& sampling = generate.sampling();
  const model::SampledToken first =
      model::SampleToken(result->logits,
                         {.temperature = sampling.temperature(),
                          .top_k = static_cast<int32_t>(sampling.top_k()),
                          .top_p = sampling.top_p() > 0 ? sampling.top_p() : 1.0f,
                          .seed = sampling.seed()},
                         request->completed_tokens());
  const double prefill_ms = MillisSince(start);
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");

  // Move the regions, then commit them with their checksums.
  const auto transfer_start = Clock::now();
  const uint64_t page_bytes = sizeof(float) * layout.page_floats();
  const int64_t prompt_pages =
      (static_cast<int64_t>(tokens.size()) + layout.block_size - 1) / layout.block_size;
  const uint64_t block_kv_bytes = page_bytes * prompt_pages;
  const v1::Reservation& reservation = request->reservation();
  if (reservation.page_addrs_size() != prompt_pages ||
      reservation.producer_swa_bytes() != sizeof(float) * layout.producer_swa_floats() ||
      reservation.consumer_swa_bytes() != sizeof(float) * layout.consumer_swa_floats() ||
      reservation.page_bytes() != page_bytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "reservation: its regions do not match this prompt and model");
  }
  v1::DecodeNode::Stub& decode = DecodeStub(request->decode_address());
  absl::Status sent =
      request->transport() == v1::TRANSPORT_GRPC
          ? SendGrpc(context, decode, reservation.request_id(), state, block_kv_bytes)
          : SendUcx(reservation, state, block_kv_bytes);
  if (!sent.ok()) return ToGrpcStatus(sent);
  std::vector<const void*> pages(state.pages().begin(), state.pages().end());
  v1::CommitRequest commit;
  v1::StateHeader& h = *commit.mutable_header();
  h.set_format_version(kStateFormatVersion);
  h.set_model_fingerprint(model_.fingerprint());
  h.set_request_id(reservation.request_id());
  h.set_prompt_len(static_cast<uint32_t>(tokens.size()));
  h.set_s_valid(request->s_valid());
  h.set_mode(request->mode());
  h.set_keep(request->keep());
  h.set_first_token(first.token);
  h.set_first_logprob(first.logprob);
  h.set_replayed_rows(static_cast<uint32_t>(result->consumer_rows));
  h.set_producer_swa_bytes(sizeof(float) * layout.producer_swa_floats());
  h.set_consumer_swa_bytes(sizeof(float) * layout.consumer_swa_floats());
  h.set_block_kv_bytes(block_kv_bytes);
  h.set_producer_swa_checksum(transfer::Checksum(state.producer_swa(), h.producer_swa_bytes()));
  h.set_consumer_swa_checksum(transfer::Checksum(state.consumer_swa(), h.consumer_swa_bytes()));
  h.set_block_kv_checksum(transfer::ChecksumPieces(pages, page_bytes, block_kv_bytes));
  model_lock.unlock();
  auto client = grpc::ClientContext::FromServerContext(*context);
  v1::CommitResponse committed;
  if (grpc::Status s = decode.Commit(client.get(), commit, &committed); !s.ok()) return s;

  reply->set_first_token(first.token);
  reply->set_first_logprob(first.logprob);
  reply->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(tokens.size()));
  reply->mutable_usage()->set_replayed_rows(static_cast<uint32_t>(result->consumer_rows));
  reply->set_prefill_ms(prefill_ms);
  reply->set_transfer_ms(MillisSince(transfer_start));
  return grpc::Status::OK;
}

}  // namespace baton::prefill_node

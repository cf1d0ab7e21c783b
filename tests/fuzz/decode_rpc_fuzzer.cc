// The decode node's request validation: Reserve with any ReserveRequest, then Commit with any
// CommitRequest (the StateHeader and the RegionSource the node would read from) aimed at a
// live reservation (of the replay-on-decode split when the ReserveRequest names it), then
// Release. Whatever the bytes, the node answers with a status and its
// pool ends as it started (no slot or page leaks).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "baton/decode_node/decode_service.h"
#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"

namespace {

baton::model::Engine* model = nullptr;
baton::decode_node::DecodeService* service = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                          "/baton_fuzz_decode_model";
  if (!baton::model::MakeModel(*baton::model::PresetConfig("tiny"), 3, dir).ok()) std::abort();
  model = baton::model::LoadEngine(dir)->release();
  service = new baton::decode_node::DecodeService(
      *model, {.slots = 2, .pages = 64, .max_waiting = 0, .use_ucx = false});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first byte splits the input between the two messages.
  const size_t split = 1 + data[0] % (size - 1);
  baton::v1::ReserveRequest reserve;
  if (!reserve.ParseFromArray(data + 1, static_cast<int>(split - 1))) return 0;
  grpc::ServerContext reserve_context;
  baton::v1::Reservation reservation;
  (void)service->Reserve(&reserve_context, &reserve, &reservation);

  // A valid reservation for the header to aim at.
  baton::v1::ReserveRequest valid;
  valid.set_request_id("fuzz");
  valid.set_prompt_tokens(20);
  valid.set_model_fingerprint(model->fingerprint());
  valid.mutable_sampling()->set_max_tokens(4);
  // Replay-on-decode when the fuzzed reservation asks for it: the header then meets a
  // reservation of its split, with room for every row of the prompt.
  if (reserve.split() == baton::v1::SPLIT_REPLAY_ON_DECODE) {
    valid.set_split(baton::v1::SPLIT_REPLAY_ON_DECODE);
    valid.set_boundary_rows(20);
  }
  grpc::ServerContext valid_context;
  baton::v1::Reservation live;
  baton::v1::CommitRequest commit;
  if (commit.ParseFromArray(data + split, static_cast<int>(size - split)) &&
      service->Reserve(&valid_context, &valid, &live).ok()) {
    commit.mutable_header()->set_reservation_id(live.reservation_id());
    grpc::ServerContext commit_context;
    baton::v1::CommitResponse committed;
    (void)service->Commit(&commit_context, &commit, &committed);
  }
  for (const std::string& id : {reservation.reservation_id(), live.reservation_id()}) {
    grpc::ServerContext release_context;
    baton::v1::ReleaseRequest release;
    release.set_reservation_id(id);
    baton::v1::ReleaseResponse released;
    (void)service->Release(&release_context, &release, &released);
  }
  // A request that passed its commit frees its memory once the decode step holding it ends.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (true) {
    const baton::v1::LoadReport load = service->Load();
    if (load.free_pages() == load.total_pages() && load.free_slots() == load.total_slots()) break;
    if (std::chrono::steady_clock::now() > until) std::abort();  // leaked pool memory
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return 0;
}

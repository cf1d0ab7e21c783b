// The prefill node's request validation (ValidatePrefillRequest) with any PrefillRequest.
// Whatever the bytes, the answer is a status; a request it passes has every length within its
// bound, so nothing sized from it can exceed what the node accounts for.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "baton/common/wire_bounds.h"
#include "baton/model/model_factory.h"
#include "baton/prefill_node/prefill_service.h"

namespace {

baton::ModelConfig* config = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  config = new baton::ModelConfig(*baton::model::PresetConfig("tiny"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::v1::PrefillRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!baton::prefill_node::ValidatePrefillRequest(request, *config).ok()) return 0;
  const auto& generate = request.request();
  if (generate.request_id().size() > 256 ||
      generate.cache_salt().size() > baton::kMaxCacheSaltBytes ||
      request.tenant().size() > baton::kMaxTenantBytes ||
      request.decode_identity().size() > baton::kMaxIdentityBytes ||
      request.decode_address().size() > baton::kMaxAddressBytes ||
      generate.prompt_token_ids_size() > config->max_position_embeddings ||
      request.s_valid() > static_cast<uint64_t>(generate.prompt_token_ids_size()) ||
      request.s_valid() % static_cast<uint64_t>(config->kv_block_size) != 0 ||
      generate.sampling().stop_token_ids_size() > 64) {
    std::abort();  // passed with a length past its bound
  }
  return 0;
}

// The router's check of a client request: any GenerateRequest is accepted with an effective
// truncation allowed by the contract (off with keep 0, or keep >= C) or refused naming a field.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "baton/model/model_factory.h"
#include "baton/router/router_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const baton::ModelConfig config = *baton::model::PresetConfig("tiny");
  static baton::router::RouterService* router =
      new baton::router::RouterService(config, baton::router::RouterOptions());
  baton::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto effective = router->Validate(request);
  if (effective.ok() && effective->mode != baton::v1::TRUNCATION_MODE_OFF &&
      effective->keep < config.ring_capacity()) {
    std::abort();  // truncation with keep below C must never pass (DESIGN section 3)
  }
  if (!effective.ok() && effective.status().code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }
  return 0;
}

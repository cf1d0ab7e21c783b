// The router's check of a client request: any GenerateRequest is accepted with an effective
// truncation allowed by the contract (off with keep 0, or keep >= C of the model it names) or
// refused naming a field (or the model, when it is not served).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "baton/model/model_factory.h"
#include "baton/router/router_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Two served models of different C, so that a request is checked against the one it names.
  static baton::router::RouterService* router = [] {
    baton::router::RouterOptions options;
    options.model_name = "tiny";
    options.more_models.push_back({"small", *baton::model::PresetConfig("small"), nullptr});
    return new baton::router::RouterService(*baton::model::PresetConfig("tiny"), options);
  }();
  baton::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const auto effective = router->Validate(request);
  if (effective.ok()) {
    const auto model = router->ResolveModel(request.model());
    if (!model.ok()) std::abort();  // accepted for a model not served
    if (effective->mode != baton::v1::TRUNCATION_MODE_OFF &&
        effective->keep < router->Models()[*model].config.ring_capacity()) {
      std::abort();  // truncation with keep below C must never pass (DESIGN section 3)
    }
  }
  // Refused naming a field, or NOT_FOUND for a model not served.
  if (!effective.ok() && effective.status().code() != absl::StatusCode::kInvalidArgument &&
      effective.status().code() != absl::StatusCode::kNotFound) {
    std::abort();
  }
  return 0;
}

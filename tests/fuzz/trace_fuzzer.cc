// Trace JSONL (batonctl replay and simulate): any text is parsed or refused with a message.
#include <cstddef>
#include <cstdint>

#include "trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)baton::tools::ParseTrace(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

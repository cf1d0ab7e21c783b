// Chat templates come from model directories, which are not trusted: any template parses or
// is refused naming what it cannot take (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED past the
// nesting bound), and renders within its bounds (output and steps) or fails with an error,
// never a crash or a hang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "baton/text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::json variables = {
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", "Hello"}},
        {{"role", "assistant"}, {"content", "Hi!"}}}},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<baton::text::ChatTemplate> parsed = baton::text::ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument &&
        parsed.status().code() != absl::StatusCode::kResourceExhausted) {
      std::abort();
    }
    return 0;
  }
  absl::StatusOr<std::string> rendered = parsed->Render(variables, 1 << 16);
  if (rendered.ok() && rendered->size() > (1 << 16)) std::abort();  // the output bound holds
  return 0;
}

// Hugging Face chat templates without Python: the `chat_template` of a model's
// tokenizer_config.json (a Jinja2 template) turned into prompt text.
//
// Implements the subset of Jinja2 that the published chat templates use (Llama 2 and 3,
// Mistral, Zephyr, Gemma, ChatML, Qwen, Phi-3), with the environment transformers'
// apply_chat_template builds: trim_blocks and lstrip_blocks on, keep_trailing_newline off,
// the loopcontrols extension (break, continue), the `{% generation %}` block, the
// `raise_exception` global and its Python-style `tojson` filter. A construct outside the subset
// is refused by Parse, naming it and its offset, so a model whose template cannot be rendered
// fails when it is loaded rather than at its first request.
//
// Supported:
//   Tags: text, {{ expr }}, {% stmt %}, {# comment #}; whitespace control `-` and `+` on either
//     side of a tag.
//   Statements: for (one or more targets, `if` filter, `else`, loop.index, index0, revindex,
//     revindex0, first, last, length), if/elif/else, set name = expr, set ns.attr = expr,
//     break, continue, generation.
//   Expressions: string (with Python escapes), integer, float, boolean and none literals; list,
//     tuple and dict literals; variables, a.b, a[k], slices a[i:j:k]; + - * / // % ~; == != < >
//     <= >= (chainable); and, or, not; in, not in; a if c else b; filters; `is [not]` tests.
//   Filters: trim, length, count, upper, lower, title, capitalize, tojson(indent), string, first,
//     last, default/d(value, boolean), join(sep), list, items.
//   Tests: defined, undefined, none, string, mapping, iterable, sequence, number, integer, float,
//     boolean, true, false.
//   Methods: strip, lstrip, rstrip, upper, lower, title, capitalize, startswith, endswith, split,
//     replace (strings); items, keys, values, get (objects).
//   Functions: raise_exception(msg), namespace(k=v, ...), range(...).
// Refused: macros, call/filter/raw/with blocks, block set, extends/include/import, `**`,
// recursive loops, loop.cycle/previtem/nextitem, other filters, tests, methods and functions
// (strftime_now among them).
//
// Values follow Python and Jinja: undefined variables (and attributes or items of undefined
// values) are Jinja's default Undefined, which renders as "" and is false, but is an error
// where a value is needed (arithmetic, a method call, tojson); empty strings, lists and objects,
// 0, false and none are false; none renders as "None", booleans as "True"/"False", lists and
// objects as Python's repr. Tuples, items() pairs and range() are lists, so they print as [...]
// where Python prints (...) or range(...). Case mapping (upper, lower, title, capitalize) is
// ASCII-only; strip and trim know Python's Unicode whitespace; lengths, indices and slices of
// strings count code points. Objects iterate, render and serialise in nlohmann::json's key
// order (sorted), where Python would keep insertion order.
//
// A ChatTemplate is immutable once parsed: copies share the parsed program, and Render is
// const and safe to call from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace baton::text {

// The template used when a model's tokenizer_config.json has no chat_template: ChatML.
inline constexpr std::string_view kDefaultChatTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

class ChatTemplate {
 public:
  // Parses a template; an unsupported construct is an InvalidArgument error naming it and its
  // offset ("chat_template: unsupported filter 'tojson' at offset 123"). Offsets count bytes
  // of `source`.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders with `variables` (a JSON object: messages = array of {role, content},
  // add_generation_prompt, bos_token, eos_token, and whatever else). raise_exception('msg') in
  // the template gives InvalidArgument "chat template: msg"; other errors while rendering
  // (adding a string to a number, using an undefined value) are InvalidArgument naming the
  // offset. Bounded, since templates come from model directories and are not trusted: output
  // larger than max_output bytes (or a string built on the way that is), or more than
  // 1,000,000 evaluation steps, is ResourceExhausted. Copying big strings and lists costs steps
  // in proportion to their size, so the bound caps time and memory, not just node visits.
  // String operations (in, split, replace, strip) are charged the bytes they compare, so the
  // step bound is a bound on time too. `steps` (when given) receives the steps the render took.
  absl::StatusOr<std::string> Render(const nlohmann::json& variables,
                                     size_t max_output = 1 << 20,
                                     uint64_t* steps = nullptr) const;

 private:
  struct Program;  // the parsed statements; defined in chat_template.cc

  explicit ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}

  std::shared_ptr<const Program> program_;
};

}  // namespace baton::text

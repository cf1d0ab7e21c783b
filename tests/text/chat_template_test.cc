// The chat template engine: the published templates of common models rendered to the exact
// prompt text transformers' apply_chat_template gives, Jinja's whitespace rules, the
// expression subset, refusals at parse time and the bounds on rendering.
#include "baton/text/chat_template.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::text {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// A conversation: (role, content) pairs as the `messages` array.
Json Messages(std::vector<std::pair<std::string, std::string>> turns) {
  Json messages = Json::array();
  for (auto& [role, content] : turns) messages.push_back({{"role", role}, {"content", content}});
  return messages;
}

absl::StatusOr<std::string> Render(std::string_view source, const Json& variables,
                                   size_t max_output = 1 << 20) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) return parsed.status();
  return parsed->Render(variables, max_output);
}

// The rendered text, or the error's message so that a failing EXPECT_EQ shows it.
std::string Text(std::string_view source, const Json& variables = Json::object()) {
  absl::StatusOr<std::string> text = Render(source, variables);
  return text.ok() ? *text : "ERROR: " + text.status().ToString();
}

TEST(ChatTemplateTest, DefaultTemplateIsChatMl) {
  Json vars = {{"messages", Messages({{"system", "You are terse."}, {"user", "Hi"}})}};
  EXPECT_EQ(Text(kDefaultChatTemplate, vars),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  vars["add_generation_prompt"] = true;
  EXPECT_EQ(Text(kDefaultChatTemplate, vars),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// meta-llama/Llama-2-7b-chat-hf: the system message is folded into the first user turn.
constexpr std::string_view kLlama2 =
    R"jinja({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})jinja";

TEST(ChatTemplateTest, Llama2) {
  Json vars = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  vars["messages"] = Messages({{"system", "Be brief."},
                               {"user", " What is 2+2? "},
                               {"assistant", "4"},
                               {"user", "And 3+3?"}});
  // strip() applies to the whole folded content, so the user's leading space stays.
  EXPECT_EQ(Text(kLlama2, vars),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n What is 2+2? [/INST] 4 </s>"
            "<s>[INST] And 3+3? [/INST]");
  vars["messages"] = Messages({{"user", "Hi"}});
  EXPECT_EQ(Text(kLlama2, vars), "<s>[INST] Hi [/INST]");

  vars["messages"] = Messages({{"user", "Hi"}, {"user", "Again"}});
  absl::StatusOr<std::string> text = Render(kLlama2, vars);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(),
            "chat template: Conversation roles must alternate user/assistant/user/assistant/...");
}

// HuggingFaceH4/zephyr-7b-beta: one tag per line, so trim_blocks decides the newlines.
constexpr std::string_view kZephyr = R"jinja({% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %})jinja";

TEST(ChatTemplateTest, Zephyr) {
  Json vars = {{"eos_token", "</s>"}, {"add_generation_prompt", true}};
  vars["messages"] = Messages({{"system", "Be kind."}, {"user", "Hello"}});
  EXPECT_EQ(Text(kZephyr, vars), "<|system|>\nBe kind.</s>\n<|user|>\nHello</s>\n<|assistant|>\n");
}

// google/gemma-7b-it: no system role; the assistant is "model".
constexpr std::string_view kGemma =
    R"jinja({{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %})jinja";

TEST(ChatTemplateTest, Gemma) {
  Json vars = {{"bos_token", "<bos>"}, {"add_generation_prompt", true}};
  vars["messages"] = Messages({{"user", "Hi \n"}, {"assistant", "Hello"}, {"user", "Bye"}});
  EXPECT_EQ(Text(kGemma, vars),
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");

  vars["messages"] = Messages({{"system", "Be kind."}, {"user", "Hi"}});
  absl::StatusOr<std::string> text = Render(kGemma, vars);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().message(), "chat template: System role not supported");
}

// meta-llama/Meta-Llama-3-8B-Instruct.
constexpr std::string_view kLlama3 =
    R"jinja({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})jinja";

TEST(ChatTemplateTest, Llama3) {
  Json vars = {{"bos_token", "<|begin_of_text|>"}, {"add_generation_prompt", true}};
  vars["messages"] = Messages({{"system", "Be kind."}, {"user", " Hi "}});
  EXPECT_EQ(Text(kLlama3, vars),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// mistralai/Mistral-7B-Instruct-v0.1.
constexpr std::string_view kMistral =
    R"jinja({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})jinja";

TEST(ChatTemplateTest, MistralInstruct) {
  Json vars = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  vars["messages"] = Messages({{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}});
  EXPECT_EQ(Text(kMistral, vars), "<s>[INST] Hi [/INST]Hello</s>[INST] Bye [/INST]");
}

// The later Mistral style: one tag per indented line, all whitespace removed by `-`.
TEST(ChatTemplateTest, IndentedTemplateWithWhitespaceControl) {
  constexpr std::string_view kTemplate = R"jinja({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- endif %}
{%- endfor %}
)jinja";
  Json vars = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  vars["messages"] =
      Messages({{"system", "Sys"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}});
  EXPECT_EQ(Text(kTemplate, vars), "<s> [INST] Sys\n\nU1 [/INST] A1</s> [INST] U2 [/INST]");
}

TEST(ChatTemplateTest, WhitespaceRules) {
  // lstrip_blocks takes the indent before a block tag alone on its line, trim_blocks the
  // newline after it; `+` keeps the indent; `-` strips all whitespace on its side.
  constexpr std::string_view kTemplate = R"jinja(<ul>
  {% for x in items %}
  <li>{{ x }}</li>
  {% endfor %}
</ul>
  {%+ if true %}kept{% endif %}
a  {{- 'b' -}}  c
{#- comment -#}
d)jinja";
  EXPECT_EQ(Text(kTemplate, {{"items", {1, 2}}}),
            "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>\n  keptabcd");
  EXPECT_EQ(Text("{% if true +%}\nx{% endif %}"), "\nx");           // `+%}` keeps the newline
  EXPECT_EQ(Text("{{ 'a' }}\n{{ 'b' }}"), "a\nb");                  // not after {{ }}
  EXPECT_EQ(Text("{{ 'a' }}  {% if true %}b{% endif %}"), "a  b");  // not mid-line
  EXPECT_EQ(Text("  {# note #}\nx\n"), "x");  // comments too; one final newline goes
  EXPECT_EQ(Text("a\r\n{% if true %}\r\nb\rc{% endif %}\r\n"),
            "a\nb\nc");  // \r\n and \r read as \n
}

TEST(ChatTemplateTest, RaiseExceptionNamesItsMessage) {
  absl::StatusOr<std::string> text =
      Render("{% if true %}{{ raise_exception('bad ' ~ role) }}{% endif %}", {{"role", "tool"}});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "chat template: bad tool");
}

TEST(ChatTemplateTest, ParseRefusesUnsupportedConstructs) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {"{% macro m() %}x{% endmacro %}", "chat_template: unsupported tag 'macro' at offset 0"},
      {"{{ x | wordcount }}", "chat_template: unsupported filter 'wordcount' at offset 7"},
      {"ab{{ strftime_now('%Y') }}",
       "chat_template: unsupported function 'strftime_now' at "
       "offset 5"},
      {"{{ x is divisibleby(3) }}", "chat_template: unsupported test 'divisibleby' at offset 8"},
      {"{{ 'a'.format(1) }}", "chat_template: unsupported method 'format' at offset 7"},
      {"{{ 2 ** 3 }}", "chat_template: unsupported operator '**' at offset 5"},
      {"{% for x in y %}{{ loop.cycle }}{% endfor %}",
       "chat_template: unsupported loop attribute 'cycle' at offset 24"},
      {"{% raw %}{{ }}{% endraw %}", "chat_template: unsupported tag 'raw' at offset 3"},
      {"{% set x %}y{% endset %}", "chat_template: unsupported tag 'set ... endset' at offset 0"},
      {"{% for x in y %}", "chat_template: unclosed 'for' at offset 0"},
      {"{% break %}", "chat_template: 'break' outside a loop at offset 0"},
      {"{{ 'abc }}", "chat_template: unclosed string at offset 3"},
      {"{{ x + }}", "chat_template: expected an expression, found end of tag at offset 7"},
      // Offsets count bytes of the source as given, before \r\n is read as \n.
      {"a\r\n{{ x + }}", "chat_template: expected an expression, found end of tag at offset 10"},
  };
  for (const auto& [source, message] : cases) {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
    ASSERT_FALSE(parsed.ok()) << source;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << source;
    EXPECT_EQ(std::string(parsed.status().message()), message) << source;
  }
}

TEST(ChatTemplateTest, RenderErrorsNameTheOffset) {
  absl::StatusOr<std::string> text = Render("{{ 'a' + 1 }}", Json::object());
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(),
            "chat_template: unsupported operand types for +: string and integer at offset 7");
  EXPECT_EQ(Render("{{ missing + 1 }}", Json::object()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Render("x", Json::array()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, OutputBound) {
  EXPECT_EQ(Render("{{ 'x' * 100 }}", Json::object(), 50).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{% for i in range(100) %}abc{% endfor %}", Json::object(), 50).status().code(),
            absl::StatusCode::kResourceExhausted);
  std::string fifty;
  for (int i = 0; i < 10; ++i) fifty += "abcde";
  EXPECT_EQ(*Render("{% for i in range(10) %}abcde{% endfor %}", Json::object(), 50), fifty);
  // A string that doubles in a loop is refused before it is rendered.
  EXPECT_EQ(Render("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                   "{% set ns.s = ns.s + ns.s %}{% endfor %}",
                   Json::object())
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ChatTemplateTest, StepBound) {
  absl::StatusOr<std::string> text =
      Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
             Json::object());
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{% for i in range(10 ** 1) %}{% endfor %}", Json::object()).status().code(),
            absl::StatusCode::kInvalidArgument);  // `**` is refused by Parse
  EXPECT_EQ(Render("{{ range(9223372036854775807) | length }}", Json::object()).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Deep nesting is refused by Parse rather than overflowing the stack.
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(ChatTemplate::Parse(deep).status().code(), absl::StatusCode::kResourceExhausted);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_EQ(ChatTemplate::Parse(chain + " }}").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ChatTemplateTest, UndefinedValues) {
  const Json vars = {{"messages", Messages({{"user", "Hi"}})}};
  EXPECT_EQ(Text("[{{ nothing }}][{{ nothing.attr }}][{{ messages[5].role }}]", vars), "[][][]");
  EXPECT_EQ(Text("{% if nothing is defined %}yes{% else %}no{% endif %}"
                 "{% if messages is defined and nothing is undefined %}Y{% endif %}"
                 "{% if messages[0].tool_calls is not defined %}N{% endif %}",
                 vars),
            "noYN");
  EXPECT_EQ(Text("{{ nothing | default('dflt') }} {{ '' | default('empty', true) }} "
                 "{{ nothing | length }} {% for x in nothing %}x{% endfor %}",
                 vars),
            "dflt empty 0 ");
  EXPECT_EQ(Render("{{ nothing | tojson }}", vars).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, NamespaceSetInLoopIsVisibleAfterIt) {
  const Json vars = {{"messages", Messages({{"user", "a"}, {"assistant", "b"}, {"user", "c"}})}};
  EXPECT_EQ(Text("{% set ns = namespace(found=false, n=0) %}{% set plain = 'outer' %}"
                 "{% for m in messages %}{% set plain = 'inner' %}{% if m.role == 'user' %}"
                 "{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}"
                 "{{ ns.found }} {{ ns.n }} {{ plain }}",
                 vars),
            "True 2 outer");
  EXPECT_THAT(Render("{% set x = 1 %}{% set x.a = 2 %}", vars).status().message(),
              HasSubstr("'x' is not a namespace"));
}

TEST(ChatTemplateTest, ToJsonAndRepr) {
  const Json vars = {{"messages", Messages({{"user", "Say \"hi\"\n"}})}};
  EXPECT_EQ(Text("{{ messages[0] | tojson }}", vars),
            R"({"content": "Say \"hi\"\n", "role": "user"})");
  EXPECT_EQ(Text("{{ {'a': [1, 2.5, none, true]} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}");
  EXPECT_EQ(Text("{{ [] | tojson(indent=2) }} {{ 'é<>' | tojson }}"), "[] \"é<>\"");
  EXPECT_EQ(Text("{{ messages[0] }}", vars), R"({'content': 'Say "hi"\n', 'role': 'user'})");
  EXPECT_EQ(Text("{{ none }} {{ true }} {{ 1.5 }} {{ 2.0 }} {{ [\"it's\", 1] }}"),
            "None True 1.5 2.0 [\"it's\", 1]");
  EXPECT_EQ(
      Text("{{ 1e15 }} {{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ [0.1] | tojson }}"),
      "1000000000000000.0 1e+16 0.0001 1e-05 -0.0 [0.1]");
}

TEST(ChatTemplateTest, Expressions) {
  EXPECT_EQ(Text("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 * 3 + 1 }} "
                 "{{ 'ab' ~ 1 }} {{ 'x' * 3 }} {{ [1] + [2] }}"),
            "3 -4 2 3.5 7 ab1 xxx [1, 2]");
  EXPECT_EQ(Text("{{ 1 < 2 < 3 }} {{ 3 < 2 < 4 }} {{ 'b' in 'abc' }} {{ 'x' not in ['x'] }} "
                 "{{ 'k' in {'k': 1} }} {{ not 0 }} {{ 0 or 'y' }} {{ 1 and 'z' }}"),
            "True False True False True True y z");
  EXPECT_EQ(Text("{{ 'yes' if 1 else 'no' }}[{{ 'yes' if 0 }}]"), "yes[]");
  EXPECT_EQ(Text("{{ true + true }} {{ true == 1 }} {{ 'ab' * true }} {{ false < 1 }}"),
            "2 True ab True");  // Python's bool is an int
  EXPECT_EQ(Text("{{ 'héllo'[1:3] }} {{ [1, 2, 3, 4][::-1] }} {{ 'abc'[-1] }} "
                 "{{ [1, 2, 3][1:] }} {{ 'héllo' | length }} {{ (1, 2)[0] }}"),
            "él [4, 3, 2, 1] c [2, 3] 5 1");
  // Unary minus binds tighter than a filter, as in Jinja: -x|length is (-x)|length.
  EXPECT_EQ(Render("{{ -x|length }}", {{"x", {1, 2}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Text("{{ -x|string }}", {{"x", 2}}), "-2");
  EXPECT_EQ(Text(R"({{ 'tab\there\x41\u00e9' }})"),
            "tab\there"
            "A\xc3\xa9");
}

TEST(ChatTemplateTest, Loops) {
  EXPECT_EQ(Text("{% for x in [1, 2, 3] if x != 2 %}{{ loop.index }}/{{ loop.length }}:{{ x }}"
                 "{% if not loop.last %},{% endif %}{% endfor %}"),
            "1/2:1,2/2:3");
  EXPECT_EQ(Text("{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}"
                 "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "023");
  EXPECT_EQ(Text("{% for k, v in {'b': 2, 'a': 1}.items() %}{{ k }}={{ v }};{% endfor %}"
                 "{% for x in [] %}x{% else %}empty{% endfor %}"
                 "{% for i in range(5, 0, -2) %}{{ loop.revindex0 }}{{ i }}{% endfor %}"),
            "a=1;b=2;empty251301");
  // Each iteration starts afresh: what one sets is gone in the next.
  EXPECT_EQ(Text("{% set y = 0 %}{% for m in [1, 2] %}[{{ y }}]{% set y = m %}{% endfor %}{{ y }}"),
            "[0][0]0");
}

TEST(ChatTemplateTest, FiltersTestsAndMethods) {
  EXPECT_EQ(Text("{{ 'Hello wORLD'.title() }}|{{ 'hello-world foo' | title }}|{{ 'aBc' | upper }}"
                 "|{{ 'ABC'.lower() }}|{{ 'hELLO' | capitalize }}|{{ ' x ' | trim }}"),
            "Hello World|Hello-World Foo|ABC|abc|Hello|x");
  EXPECT_EQ(Text("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} "
                 "{{ ' a  b  c '.split(none, 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a', 'b  c ']");
  EXPECT_EQ(
      Text("{{ '\u3000x\n'.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  hi'.lstrip() }}|"
           "{{ 'hi  '.rstrip() }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'ab'.replace('', '.') }}"),
      "x|hi|hi|hi|a-b-|.a.b.");
  EXPECT_EQ(Text("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'bc')) }} "
                 "{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 2) }} "
                 "{{ {'a': 1, 'b': 2}.keys() | list }} {{ {'a': 1}.values() }}"),
            "True True 1 None 2 ['a', 'b'] [1]");
  EXPECT_EQ(Text("{{ ['a', 'b'] | join(', ') }} {{ [3, 4] | first }} {{ 'xyz' | last }} "
                 "{{ {'b': 1} | items }} {{ 5 | string }} {{ 'ab' | list }} {{ [1, 2] | count }}"),
            "a, b 3 z [['b', 1]] 5 ['a', 'b'] 2");
  EXPECT_EQ(Text("{{ 1 is integer }} {{ 1.0 is float }} {{ 'x' is string }} {{ none is none }} "
                 "{{ {} is mapping }} {{ [] is sequence }} {{ 1 is not number }} "
                 "{{ true is boolean }} {{ false is false }} {{ 'x' is iterable }}"),
            "True True True True True True False True True True");
}

TEST(ChatTemplateTest, CopiesShareTheProgram) {
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(kDefaultChatTemplate);
  ASSERT_TRUE(parsed.ok());
  const ChatTemplate copy = *parsed;
  const Json vars = {{"messages", Messages({{"user", "Hi"}})}};
  EXPECT_EQ(*copy.Render(vars), *parsed->Render(vars));
}


// String operations are charged the bytes they compare, so the step bound (1,000,000) bounds
// their time: each of these either renders, charged at least the linear cost of reading its
// strings, or stops when the steps run out, having been charged every step of the work it did
// (in, split and replace with a needle that nearly matches at every position: about 600,000
// positions of 400,000 bytes each, which the engine once charged as one step).
TEST(ChatTemplateTest, QuadraticStringOperationsAreChargedTheWorkTheyDo) {
  constexpr uint64_t kBudget = 1'000'000;
  struct Case {
    std::string source;
    bool exhausts;
  };
  const std::vector<Case> cases = {
      {"{{ ('a' * 100000).strip('b' * 100000 + 'a') | length }}", false},
      {"{{ ('a' * 100000).lstrip('b' * 100000 + 'a') | length }}", false},
      {"{{ ('a' * 399999 + 'b') in ('a' * 1000000) }}", true},
      {"{{ ('a' * 1000000).split('a' * 399999 + 'b') | length }}", true},
      {"{{ ('a' * 1000000).replace('a' * 399999 + 'b', 'x') | length }}", true},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(c.source);
    ASSERT_TRUE(parsed.ok()) << c.source << ": " << parsed.status();
    uint64_t steps = 0;
    const absl::StatusOr<std::string> out = parsed->Render(Json::object(), 1 << 21, &steps);
    if (c.exhausts) {
      EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << c.source;
      EXPECT_THAT(out.status().message(), HasSubstr("evaluation steps")) << c.source;
      EXPECT_GT(steps, kBudget / 2) << c.source;
    } else {
      ASSERT_TRUE(out.ok()) << c.source << ": " << out.status();
      EXPECT_EQ(*out, "0");
      // Reading both strings once: 200,000 bytes at 64 a step.
      EXPECT_GE(steps, 200000 / 64) << c.source;
      EXPECT_LT(steps, kBudget / 10) << c.source;
    }
  }
  // The same operations on ordinary sizes stay cheap.
  absl::StatusOr<ChatTemplate> small =
      ChatTemplate::Parse("{{ ('<|im_end|>' in 'a message<|im_end|>') }} "
                          "{{ 'a b c'.split(' ') | length }} {{ 'x-y'.replace('-', '+') }}");
  ASSERT_TRUE(small.ok());
  uint64_t steps = 0;
  EXPECT_EQ(*small->Render(Json::object(), 1 << 20, &steps), "True 3 x+y");
  EXPECT_LT(steps, 100u);
}

// Every template baton ships (ChatML, used by the shipped models, which carry none of their
// own), the published templates above and a set of Jinja constructs, rendered by baton and by
// Python's Jinja2 in the environment transformers' apply_chat_template builds (trim_blocks,
// lstrip_blocks, loopcontrols, raise_exception, a json.dumps tojson): the texts are the same.
TEST(ChatTemplateTest, RendersWhatJinja2Renders) {
  const std::vector<Json> conversations = {
      Messages({{"user", "Hi"}}),
      Messages({{"system", "Be brief."}, {"user", "  What is 2+2?  "},
                {"assistant", "4"}, {"user", "And 3+3?\n"}}),
      Messages({{"user", "Ünïcödé ✓ and <|im_end|> \"quotes\""}, {"assistant", "ok"}}),
  };
  const std::vector<std::string> templates = {
      std::string(kDefaultChatTemplate), std::string(kLlama2), std::string(kZephyr),
      std::string(kLlama3), std::string(kMistral),
      // Constructs: loops and their variables, set and namespace, break and continue,
      // whitespace control, filters, string methods, slices, arithmetic, tests, tojson.
      "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{% if loop.first %}F{% endif %}"
      "{% if loop.last %}L{% endif %}:{{ m.role | upper }}={{ m.content | trim | length }} "
      "{% endfor %}",
      "{% set ns = namespace(n=0, seen='') %}{% for m in messages %}{% if m.role == 'assistant' "
      "%}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{% set ns.seen = ns.seen ~ m.role[:1] "
      "%}{% if ns.n > 2 %}{% break %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.seen }}",
      "{%- for m in messages -%}\n  {{- m['content'].strip().split(' ') | join('_') -}}\n"
      "{%- endfor %}|{{ messages | length }}|{{ (messages | first).role }}|"
      "{{ (messages | last)['content'] | lower }}",
      "{{ 'a-b-c'.replace('-', '+', 1) }} {{ 'Hello'[1:4] }} {{ 'Hello'[::-1] }} "
      "{{ [1, 2, 3][-1] }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 * 3 + 1 }} {{ 'x' * 3 }} "
      "{{ 10 / 4 }} {{ 'ab' ~ 1 }} {{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 'z' not in ['a'] }}",
      "{{ undefined_thing | default('dflt') }} {{ '' | default('empty', true) }} "
      "{{ none is none }} {{ messages is sequence }} {{ 'x' is string }} {{ 3 is integer }} "
      "{{ 'title case words' | title }} {{ 'capital' | capitalize }} "
      "{{ '  pad  '.lstrip() }}|{{ '  pad  '.rstrip() }}|{{ 'xxyxx'.strip('x') }}",
      "{{ messages[0] | tojson }} {{ ['a', 1, none, true] | tojson }} "
      "{{ {'k': [1, 2]} | tojson(indent=2) }}",
      "{% for m in messages if m.role != 'system' %}{{ m.role }}{% else %}none{% endfor %} "
      "{{ 'yes' if messages | length > 1 else 'no' }} "
      "{% if messages[0].role == 'system' %}S{% elif messages[0].role == 'user' %}U{% else %}?"
      "{% endif %} {{ range(3) | list }} {{ range(1, 7, 2) | list }}",
      "{{ bos_token }}{% for message in messages %}\n    {% if message['role'] == 'user' %}\n"
      "        {{ '[U] ' + message['content'] }}\n    {% else %}\n        {{ '[A] ' + "
      "message['content'] + eos_token }}\n    {% endif %}\n{% endfor %}\n"
      "{%+ if add_generation_prompt %}  [A]{% endif %}",
  };
  Json cases = Json::array();
  std::vector<std::string> ours;
  for (const std::string& source : templates) {
    absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
    ASSERT_TRUE(parsed.ok()) << source << ": " << parsed.status();
    for (const Json& messages : conversations) {
      for (const bool generation : {false, true}) {
        const Json vars = {{"messages", messages},
                           {"add_generation_prompt", generation},
                           {"bos_token", "<s>"},
                           {"eos_token", "</s>"}};
        absl::StatusOr<std::string> text = parsed->Render(vars);
        // A template that refuses a conversation (raise_exception) must refuse it in both.
        ours.push_back(text.ok() ? *text : "ERROR: " + std::string(text.status().message()));
        cases.push_back({{"template", source}, {"vars", vars}});
      }
    }
  }
  const std::string dir = ::testing::TempDir() + "/jinja2_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/cases.json") << cases.dump();
  std::ofstream(dir + "/render.py") << R"py(
import json, sys
import jinja2, jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
out = []
for case in json.load(open(sys.argv[1])):
    try:
        out.append(env.from_string(case["template"]).render(**case["vars"]))
    except jinja2.exceptions.TemplateError as e:
        out.append("ERROR: chat template: " + str(e))
json.dump(out, open(sys.argv[2], "w"))
)py";
  const std::string command = "/usr/bin/python3 " + dir + "/render.py " + dir + "/cases.json " +
                              dir + "/out.json 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string python_output;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) python_output.append(buffer, n);
  ASSERT_EQ(pclose(pipe), 0) << "Jinja2 (Debian's python3-jinja2, which scripts/setup.sh "
                                "installs) failed:\n"
                             << python_output;
  std::ifstream in(dir + "/out.json");
  const Json theirs = Json::parse(in);
  ASSERT_EQ(theirs.size(), ours.size());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i], theirs[i].get<std::string>())
        << "template:\n"
        << cases[i]["template"].get<std::string>() << "\nvariables: " << cases[i]["vars"].dump();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace baton::text

// The chat template engine in three parts: a lexer that applies Jinja's whitespace rules
// (trim_blocks, lstrip_blocks, `-` and `+`) while it cuts the source into text and tag tokens;
// a recursive-descent parser that builds statement and expression trees and refuses anything
// outside the subset chat_template.h lists; and a tree-walking renderer over nlohmann::json
// values held by shared_ptr, so that a variable lookup or `message['content']` copies nothing.
//
// Failures inside Parse and Render travel as a `Failure` exception carrying the final status;
// both entry points catch it, so no exception leaves this file.
#include "baton/text/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace baton::text {
namespace {

using Json = nlohmann::json;
using JsonPtr = std::shared_ptr<const Json>;

constexpr uint64_t kMaxSteps = 1'000'000;
// Nesting of tags and expressions in a template, and of JSON values when printed: deeper
// structures would overflow the stack of the recursive parser, renderer and printers.
constexpr int kMaxDepth = 200;
// Copying this many bytes of a string costs one evaluation step.
constexpr size_t kBytesPerStep = 64;

struct Failure {
  absl::Status status;
};

[[noreturn]] void Fail(size_t offset, const std::string& what) {
  throw Failure{absl::InvalidArgumentError("chat_template: " + what + " at offset " +
                                           std::to_string(offset))};
}

[[noreturn]] void Unsupported(size_t offset, const std::string& what, const std::string& name) {
  Fail(offset, "unsupported " + what + " '" + name + "'");
}

[[noreturn]] void Exhausted(const std::string& what) {
  throw Failure{absl::ResourceExhaustedError("chat_template: " + what)};
}

// ---------------------------------------------------------------------------------------------
// Lexer.

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kNumber,
  kOp,
  kEnd
};

struct Token {
  Tok type;
  std::string text;  // kText: the text; kName, kOp: the spelling; kString: the decoded value
  size_t offset;
  JsonPtr number;  // kNumber: the value
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}
bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class Lexer {
 public:
  // As Jinja does, reads \r\n and \r as \n everywhere and, keep_trailing_newline being off,
  // drops one newline at the very end.
  explicit Lexer(std::string_view source) {
    for (size_t i = 0; i < source.size(); ++i) {
      origin_.push_back(i);
      src_.push_back(source[i] == '\r' ? '\n' : source[i]);
      if (source[i] == '\r' && i + 1 < source.size() && source[i + 1] == '\n') ++i;
    }
    if (!src_.empty() && src_.back() == '\n') {
      src_.pop_back();
      origin_.pop_back();
    }
    origin_.push_back(source.size());
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    bool line_starting = true;  // the text at `pos` begins a line (Jinja's lstrip rule)
    while (pos < src_.size()) {
      size_t tag = pos;
      while ((tag = src_.find('{', tag)) != std::string_view::npos &&
             (tag + 1 >= src_.size() ||
              std::string_view("{%#").find(src_[tag + 1]) == std::string_view::npos)) {
        ++tag;
      }
      std::string text(src_.substr(pos, tag == std::string_view::npos ? tag : tag - pos));
      if (tag == std::string_view::npos) {
        Emit(Tok::kText, std::move(text), pos);
        break;
      }
      const char kind = src_[tag + 1];
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes the line's indent.
        const size_t line = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((line > 0 || line_starting) &&
            text.find_first_not_of(" \t", line) == std::string::npos) {
          text.resize(line);
        }
      }
      Emit(Tok::kText, std::move(text), pos);
      pos = tag + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        const size_t end = src_.find("#}", pos);
        if (end == std::string_view::npos) LexFail(tag, "unclosed comment");
        const char before = end > pos ? src_[end - 1] : '\0';
        pos = AfterTag(end + 2, before, /*block=*/true);
      } else {
        pos = LexTag(tag, kind == '%', pos);
      }
      line_starting = src_[pos - 1] == '\n';
    }
    Emit(Tok::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  void Emit(Tok type, std::string text, size_t pos, JsonPtr number = nullptr) {
    if (type == Tok::kText && text.empty()) return;
    tokens_.push_back(Token{type, std::move(text), origin_[pos], std::move(number)});
  }
  [[noreturn]] void LexFail(size_t pos, const std::string& what) const { Fail(origin_[pos], what); }

  // Where the text after a tag ending at `pos` starts: `-` eats all whitespace, and a block
  // or comment without `+` eats one newline (trim_blocks).
  size_t AfterTag(size_t pos, char sign, bool block) const {
    if (sign == '-') {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
    } else if (block && sign != '+' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  // Lexes the inside of {{ }} or {% %} from `pos`; returns where the text after it starts.
  size_t LexTag(size_t tag, bool block, size_t pos) {
    Emit(block ? Tok::kBlockBegin : Tok::kVarBegin, "", tag);
    const std::string_view close = block ? "%}" : "}}";
    const size_t first_token = tokens_.size();
    int depth = 0;  // open brackets, inside which `}}` closes a dict rather than the tag
    while (true) {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) LexFail(tag, block ? "unclosed '{%'" : "unclosed '{{'");
      if (depth == 0) {
        const bool signed_close = (src_[pos] == '-' || (block && src_[pos] == '+')) &&
                                  src_.compare(pos + 1, 2, close) == 0;
        if (signed_close || src_.compare(pos, 2, close) == 0) {
          Emit(block ? Tok::kBlockEnd : Tok::kVarEnd, "", pos);
          return AfterTag(pos + (signed_close ? 3 : 2), signed_close ? src_[pos] : '\0', block);
        }
      }
      pos = LexToken(pos, &depth);
      // {% raw %} holds text that is not tokens; refuse it before trying to lex that text.
      if (block && tokens_.size() == first_token + 1 && tokens_.back().type == Tok::kName &&
          tokens_.back().text == "raw") {
        Unsupported(tokens_.back().offset, "tag", "raw");
      }
    }
  }

  size_t LexToken(size_t pos, int* depth) {
    const char c = src_[pos];
    if (IsNameStart(c)) {
      size_t end = pos;
      while (end < src_.size() && (IsNameStart(src_[end]) || IsDigit(src_[end]))) ++end;
      Emit(Tok::kName, std::string(src_.substr(pos, end - pos)), pos);
      return end;
    }
    if (IsDigit(c)) return LexNumber(pos);
    if (c == '\'' || c == '"') return LexString(pos);
    static constexpr std::string_view kTwoChar[] = {"//", "**", "==", "!=", "<=", ">="};
    for (std::string_view op : kTwoChar) {
      if (src_.compare(pos, 2, op) == 0) {
        Emit(Tok::kOp, std::string(op), pos);
        return pos + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
      LexFail(pos, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') ++*depth;
    if ((c == ')' || c == ']' || c == '}') && *depth > 0) --*depth;
    Emit(Tok::kOp, std::string(1, c), pos);
    return pos + 1;
  }

  // Integers and floats as Jinja spells them: digits with `_` separators, an optional
  // fraction (digits on both sides of the point) and exponent.
  size_t LexNumber(size_t start) {
    std::string digits;
    size_t pos = start;
    auto take_digits = [&] {
      while (pos < src_.size() && (IsDigit(src_[pos]) || src_[pos] == '_')) {
        if (src_[pos] != '_') digits.push_back(src_[pos]);
        ++pos;
      }
    };
    take_digits();
    bool is_float = false;
    if (pos + 1 < src_.size() && src_[pos] == '.' && IsDigit(src_[pos + 1])) {
      is_float = true;
      digits.push_back(src_[pos++]);
      take_digits();
    }
    if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t exp = pos + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (exp < src_.size() && IsDigit(src_[exp])) {
        is_float = true;
        digits += std::string(src_.substr(pos, exp - pos));
        pos = exp;
        take_digits();
      }
    }
    errno = 0;
    JsonPtr value = is_float ? std::make_shared<const Json>(std::strtod(digits.c_str(), nullptr))
                             : std::make_shared<const Json>(
                                   static_cast<int64_t>(std::strtoll(digits.c_str(), nullptr, 10)));
    if (errno == ERANGE) LexFail(start, "number out of range");
    Emit(Tok::kNumber, digits, start, std::move(value));
    return pos;
  }

  // A quoted string with Python's escapes (Jinja decodes them with "unicode-escape").
  size_t LexString(size_t start) {
    const char quote = src_[start];
    std::string value;
    size_t pos = start + 1;
    auto hex = [&](size_t at, int n) -> uint32_t {
      uint32_t cp = 0;
      for (int i = 0; i < n; ++i) {
        const char h = at + i < src_.size() ? src_[at + i] : '\0';
        const int d = IsDigit(h)               ? h - '0'
                      : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                               : -1;
        if (d < 0) LexFail(at, "malformed escape in string");
        cp = cp * 16 + d;
      }
      if (cp > 0x10FFFF) LexFail(at, "malformed escape in string");
      return cp;
    };
    while (true) {
      if (pos >= src_.size()) LexFail(start, "unclosed string");
      const char c = src_[pos];
      if (c == quote) break;
      if (c != '\\' || pos + 1 >= src_.size()) {
        value.push_back(c);
        ++pos;
        continue;
      }
      const char e = src_[pos + 1];
      pos += 2;
      static constexpr std::string_view kSimple = "n\nt\tr\ra\ab\bf\fv\v\\\\''\"\"";
      const size_t simple = kSimple.find(e);
      if (simple != std::string_view::npos && simple % 2 == 0) {
        value.push_back(kSimple[simple + 1]);
      } else if (e == 'x' || e == 'u' || e == 'U') {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        AppendUtf8(&value, hex(pos, digits));
        pos += digits;
      } else if (e >= '0' && e <= '7') {  // up to three octal digits
        uint32_t cp = e - '0';
        for (int i = 0; i < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++i) {
          cp = cp * 8 + (src_[pos++] - '0');
        }
        AppendUtf8(&value, cp);
      } else if (e != '\n') {  // Python keeps unknown escapes; backslash-newline continues
        value.push_back('\\');
        value.push_back(e);
      }
    }
    Emit(Tok::kString, std::move(value), start);
    return pos + 1;
  }

  std::string src_;             // the source with newlines normalised
  std::vector<size_t> origin_;  // origin_[i]: the offset in the source of src_[i]
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------------------------------------
// Syntax trees.

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kNot,
    kNeg,
    kBinary,
    kCompare,
    kAnd,
    kOr,
    kIf,
    kFilter,
    kTest,
    kCall,
    kMethod
  };
  Kind kind;
  size_t offset;
  // kName: the variable; kAttr: the attribute; kBinary: the operator; kFilter, kTest, kCall,
  // kMethod: the filter, test, function or method.
  std::string name;
  JsonPtr literal;  // kLiteral
  // The operands. kList: the items; kDict: key, value, key, value...; kAttr, kItem: object
  // (and key); kSlice: object, start, stop, step (each may be null); kIf: value, condition,
  // else value (may be null); kFilter, kTest, kMethod: the subject, then the arguments; kCall:
  // the arguments. Keyword arguments come last, named by `names`.
  std::vector<ExprPtr> args;
  // kCompare: the operator between args[i] and args[i + 1]; calls: keyword argument names.
  std::vector<std::string> names;
  bool negated = false;  // kTest: `is not`
  int depth = 1;         // height of this subtree
};

struct Stmt {
  enum class Kind { kText, kOutput, kFor, kIf, kSet, kSetAttr, kBreak, kContinue };
  Kind kind;
  size_t offset;
  std::string text;  // kText: the text; kSet: the variable; kSetAttr: the namespace variable
  std::string attr;  // kSetAttr: the attribute
  std::vector<std::string> targets;  // kFor: the loop variables
  ExprPtr expr;    // kOutput, kSet, kSetAttr: the value; kFor: the iterable; kIf: the condition
  ExprPtr filter;  // kFor: the `if` filter, or null
  std::vector<Stmt> body, else_body;  // an `elif` is an else_body of one kIf
};

bool OneOf(const std::string& name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// ---------------------------------------------------------------------------------------------
// Parser.

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::vector<Stmt> ParseTemplate() {
    std::string stop;
    return ParseBody({}, &stop, 0);
  }

 private:
  // Bounds recursion: every nested tag, parenthesis, unary operator and call adds one level.
  class Nest {
   public:
    Nest(Parser* parser, size_t offset) : parser_(parser) {
      if (++parser_->depth_ > kMaxDepth) {
        Exhausted("template nested deeper than " + std::to_string(kMaxDepth) + " at offset " +
                  std::to_string(offset));
      }
    }
    ~Nest() { --parser_->depth_; }

   private:
    Parser* parser_;
  };

  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& Next() { return tokens_[std::min(pos_++, tokens_.size() - 1)]; }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name) const {
    return Peek().type == Tok::kName && Peek().text == name;
  }
  bool SkipOp(std::string_view op) { return IsOp(op) && (++pos_, true); }
  bool SkipName(std::string_view name) { return IsName(name) && (++pos_, true); }

  [[noreturn]] void Unexpected(const std::string& expected) const {
    const Token& t = Peek();
    const std::string found = t.type == Tok::kEnd ? "end of template"
                              : t.type == Tok::kVarEnd || t.type == Tok::kBlockEnd
                                  ? "end of tag"
                                  : "'" + t.text + "'";
    Fail(t.offset, "expected " + expected + ", found " + found);
  }
  void ExpectOp(std::string_view op) {
    if (!SkipOp(op)) Unexpected("'" + std::string(op) + "'");
  }
  std::string ExpectName() {
    if (Peek().type != Tok::kName) Unexpected("a name");
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Peek().type != Tok::kBlockEnd) Unexpected("'%}'");
    ++pos_;
  }

  ExprPtr Make(Expr::Kind kind, size_t offset, std::vector<ExprPtr> args = {},
               std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    e->name = std::move(name);
    for (const ExprPtr& arg : args) {
      if (arg) e->depth = std::max(e->depth, arg->depth + 1);
    }
    // Chains such as a + b + c + ... build deep trees without deep parser recursion.
    if (e->depth > kMaxDepth) {
      Exhausted("expression nested deeper than " + std::to_string(kMaxDepth) + " at offset " +
                std::to_string(offset));
    }
    e->args = std::move(args);
    return e;
  }
  ExprPtr Literal(size_t offset, JsonPtr value) {
    ExprPtr e = Make(Expr::Kind::kLiteral, offset);
    e->literal = std::move(value);
    return e;
  }

  // Statements up to a block tag named in `stops`, whose name is consumed and put in `*stop`;
  // `open` is where the enclosing statement began, for the error when the template ends.
  std::vector<Stmt> ParseBody(std::initializer_list<std::string_view> stops, std::string* stop,
                              size_t open) {
    std::vector<Stmt> body;
    while (true) {
      const Token& t = Peek();
      if (t.type == Tok::kEnd) {
        if (stops.size() == 0) return body;
        Fail(open, "unclosed '" + std::string(*stops.begin()).substr(3) + "'");
      }
      ++pos_;
      if (t.type == Tok::kText) {
        body.push_back(Stmt{Stmt::Kind::kText, t.offset, t.text});
      } else if (t.type == Tok::kVarBegin) {
        Stmt s{Stmt::Kind::kOutput, t.offset};
        s.expr = ParseExpr();
        if (Peek().type != Tok::kVarEnd) Unexpected("'}}'");
        ++pos_;
        body.push_back(std::move(s));
      } else {
        const std::string name = ExpectName();
        if (std::find(stops.begin(), stops.end(), name) != stops.end()) {
          *stop = name;
          return body;
        }
        ParseStatement(name, t.offset, &body);
      }
    }
  }

  // The statement of a block tag whose name has been read; appends it to `body`.
  void ParseStatement(const std::string& name, size_t offset, std::vector<Stmt>* body) {
    Nest nest(this, offset);
    std::string stop;
    if (name == "for") {
      Stmt s{Stmt::Kind::kFor, offset};
      do {
        s.targets.push_back(ExpectName());
      } while (SkipOp(","));
      if (!SkipName("in")) Unexpected("'in'");
      s.expr = ParseExpr(/*with_condition=*/false);
      if (SkipName("if")) s.filter = ParseExpr();
      if (IsName("recursive")) Unsupported(Peek().offset, "loop", "recursive");
      ExpectBlockEnd();
      ++loops_;
      s.body = ParseBody({"endfor", "else"}, &stop, offset);
      --loops_;
      if (stop == "else") {
        ExpectBlockEnd();
        s.else_body = ParseBody({"endfor"}, &stop, offset);
      }
      ExpectBlockEnd();
      body->push_back(std::move(s));
    } else if (name == "if" || name == "elif") {
      // An elif is parsed as an if nested in the else branch; the whole chain ends at endif.
      Stmt s{Stmt::Kind::kIf, offset};
      s.expr = ParseExpr();
      ExpectBlockEnd();
      s.body = ParseBody({"endif", "elif", "else"}, &stop, offset);
      if (stop == "elif") {
        ParseStatement("elif", tokens_[pos_ - 2].offset, &s.else_body);
      } else {
        ExpectBlockEnd();
        if (stop == "else") {
          s.else_body = ParseBody({"endif"}, &stop, offset);
          ExpectBlockEnd();
        }
      }
      body->push_back(std::move(s));
    } else if (name == "set") {
      Stmt s{Stmt::Kind::kSet, offset, ExpectName()};
      if (SkipOp(".")) {
        s.kind = Stmt::Kind::kSetAttr;
        s.attr = ExpectName();
      }
      if (Peek().type == Tok::kBlockEnd) Unsupported(offset, "tag", "set ... endset");
      ExpectOp("=");
      s.expr = ParseExpr();
      ExpectBlockEnd();
      body->push_back(std::move(s));
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) Fail(offset, "'" + name + "' outside a loop");
      ExpectBlockEnd();
      body->push_back(Stmt{name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, offset});
    } else if (name == "generation") {
      // transformers marks the assistant's tokens with it; as text it is just its body.
      ExpectBlockEnd();
      for (Stmt& s : ParseBody({"endgeneration"}, &stop, offset)) body->push_back(std::move(s));
      ExpectBlockEnd();
    } else if (OneOf(name, {"endfor", "endif", "elif", "else", "endgeneration"})) {
      Fail(offset, "unexpected '" + name + "'");
    } else {
      Unsupported(offset, "tag", name);
    }
  }

  // Jinja's grammar, loosest first: a if c else b; or; and; not; comparisons; + -; ~;
  // * / // %; unary - +; then a primary with its postfixes, filters and tests.
  ExprPtr ParseExpr(bool with_condition = true) {
    Nest nest(this, Peek().offset);
    ExprPtr e = ParseBinary(0);
    while (with_condition && IsName("if")) {
      const size_t offset = Next().offset;
      ExprPtr condition = ParseBinary(0);
      ExprPtr otherwise = SkipName("else") ? ParseExpr() : nullptr;
      std::vector<ExprPtr> args;
      args.push_back(std::move(e));
      args.push_back(std::move(condition));
      args.push_back(std::move(otherwise));
      e = Make(Expr::Kind::kIf, offset, std::move(args));
    }
    return e;
  }

  // Levels 0 (or) to 6 (* / // %) of the precedence table; `not` and comparisons are special.
  ExprPtr ParseBinary(int level) {
    if (level == 2 && IsName("not")) {
      Nest nest(this, Peek().offset);
      const size_t offset = Next().offset;
      std::vector<ExprPtr> args;
      args.push_back(ParseBinary(2));
      return Make(Expr::Kind::kNot, offset, std::move(args));
    }
    if (level == 3) return ParseCompare();
    if (level == 7) return ParseUnary();
    ExprPtr e = ParseBinary(level + 1);
    while (true) {
      const Token& t = Peek();
      std::string op;
      if (level == 0 && IsName("or")) op = "or";
      if (level == 1 && IsName("and")) op = "and";
      if (t.type == Tok::kOp) {
        if ((level == 4 && (t.text == "+" || t.text == "-")) || (level == 5 && t.text == "~") ||
            (level == 6 && OneOf(t.text, {"*", "/", "//", "%"}))) {
          op = t.text;
        }
        if (t.text == "**") Unsupported(t.offset, "operator", "**");
      }
      if (op.empty()) return e;
      ++pos_;
      std::vector<ExprPtr> args;
      args.push_back(std::move(e));
      args.push_back(ParseBinary(level + 1));
      const Expr::Kind kind = op == "or"    ? Expr::Kind::kOr
                              : op == "and" ? Expr::Kind::kAnd
                                            : Expr::Kind::kBinary;
      e = Make(kind, t.offset, std::move(args), op);
    }
  }

  ExprPtr ParseCompare() {
    ExprPtr first = ParseBinary(4);
    if (!IsCompareOp()) return first;
    const size_t offset = Peek().offset;
    std::vector<ExprPtr> args;
    std::vector<std::string> ops;
    args.push_back(std::move(first));
    while (IsCompareOp()) {
      std::string op = Next().text;
      if (op == "not") {
        ++pos_;
        op = "not in";
      }
      ops.push_back(std::move(op));
      args.push_back(ParseBinary(4));
    }
    ExprPtr e = Make(Expr::Kind::kCompare, offset, std::move(args));
    e->names = std::move(ops);
    return e;
  }
  bool IsCompareOp() const {
    const Token& t = Peek();
    if (t.type == Tok::kOp) return OneOf(t.text, {"==", "!=", "<", ">", "<=", ">="});
    return t.type == Tok::kName &&
           (t.text == "in" ||
            (t.text == "not" && Peek(1).type == Tok::kName && Peek(1).text == "in"));
  }

  // As in Jinja, filters apply to the whole unary expression: -x|f is f(-x).
  ExprPtr ParseUnary(bool with_filters = true) {
    Nest nest(this, Peek().offset);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const Token& t = Next();
      std::vector<ExprPtr> args;
      args.push_back(ParseUnary(/*with_filters=*/false));
      e = t.text == "-" ? Make(Expr::Kind::kNeg, t.offset, std::move(args)) : std::move(args[0]);
    } else {
      e = ParsePostfix(ParsePrimary());
    }
    return with_filters ? ParseFiltersAndTests(std::move(e)) : std::move(e);
  }

  ExprPtr ParsePrimary() {
    const Token& t = Next();
    switch (t.type) {
      case Tok::kName:
        if (OneOf(t.text, {"true", "True"})) return Literal(t.offset, std::make_shared<Json>(true));
        if (OneOf(t.text, {"false", "False"})) {
          return Literal(t.offset, std::make_shared<Json>(false));
        }
        if (OneOf(t.text, {"none", "None"})) return Literal(t.offset, std::make_shared<Json>());
        return Make(Expr::Kind::kName, t.offset, {}, t.text);
      case Tok::kString: {
        std::string value = t.text;  // adjacent literals concatenate, as in Python
        while (Peek().type == Tok::kString) value += Next().text;
        return Literal(t.offset, std::make_shared<Json>(std::move(value)));
      }
      case Tok::kNumber:
        return Literal(t.offset, t.number);
      case Tok::kOp:
        if (t.text == "(") {
          if (SkipOp(")")) return Make(Expr::Kind::kList, t.offset);
          ExprPtr e = ParseExpr();
          if (!IsOp(",")) {
            ExpectOp(")");
            return e;
          }
          std::vector<ExprPtr> items;
          items.push_back(std::move(e));
          while (SkipOp(",") && !IsOp(")")) items.push_back(ParseExpr());
          ExpectOp(")");
          return Make(Expr::Kind::kList, t.offset, std::move(items));
        }
        if (t.text == "[" || t.text == "{") {
          const bool dict = t.text == "{";
          const std::string close = dict ? "}" : "]";
          std::vector<ExprPtr> items;
          while (!SkipOp(close)) {
            if (!items.empty()) ExpectOp(",");
            if (SkipOp(close)) break;  // a trailing comma
            items.push_back(ParseExpr());
            if (dict) {
              ExpectOp(":");
              items.push_back(ParseExpr());
            }
          }
          return Make(dict ? Expr::Kind::kDict : Expr::Kind::kList, t.offset, std::move(items));
        }
        break;
      default:
        break;
    }
    --pos_;
    Unexpected("an expression");
  }

  // .attr, .method(...), [key], [start:stop:step] and function calls.
  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      const size_t offset = Peek().offset;
      if (SkipOp(".")) {
        const std::string attr = ExpectName();
        if (IsOp("(")) {
          if (!OneOf(attr, {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize",
                            "startswith", "endswith", "split", "replace", "items", "keys", "values",
                            "get"})) {
            Unsupported(offset + 1, "method", attr);
          }
          std::vector<ExprPtr> args;
          args.push_back(std::move(e));
          e = Make(Expr::Kind::kMethod, offset, std::move(args), attr);
          ParseArguments(e.get());
          continue;
        }
        if (e->kind == Expr::Kind::kName && e->name == "loop" &&
            !OneOf(attr, {"index", "index0", "revindex", "revindex0", "first", "last", "length"})) {
          Unsupported(offset + 1, "loop attribute", attr);
        }
        std::vector<ExprPtr> args;
        args.push_back(std::move(e));
        e = Make(Expr::Kind::kAttr, offset, std::move(args), attr);
      } else if (SkipOp("[")) {
        std::vector<ExprPtr> args;
        args.push_back(std::move(e));
        bool slice = false;
        for (int part = 0; part < 3; ++part) {
          args.push_back(IsOp(":") || IsOp("]") ? nullptr : ParseExpr());
          if (part == 2 || !SkipOp(":")) break;
          slice = true;
        }
        ExpectOp("]");
        args.resize(slice ? 4 : 2);
        if (!slice && !args[1]) Unexpected("an expression");
        e = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, offset, std::move(args));
      } else if (IsOp("(")) {
        if (e->kind != Expr::Kind::kName) Fail(offset, "unsupported call");
        if (!OneOf(e->name, {"raise_exception", "namespace", "range"})) {
          Unsupported(e->offset, "function", e->name);
        }
        e = Make(Expr::Kind::kCall, e->offset, {}, e->name);
        ParseArguments(e.get());
      } else {
        return e;
      }
    }
  }

  // `(a, b, key=c)` after a call, a method or a filter; appends to e->args and e->names.
  void ParseArguments(Expr* e) {
    ExpectOp("(");
    while (!SkipOp(")")) {
      if (e->args.size() > 1 || (e->kind == Expr::Kind::kCall && !e->args.empty())) {
        ExpectOp(",");
        if (SkipOp(")")) break;
      }
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        e->names.push_back(Next().text);
        ++pos_;
      } else if (!e->names.empty()) {
        Fail(Peek().offset, "positional argument after keyword argument");
      }
      ExprPtr arg = ParseExpr();
      e->depth = std::max(e->depth, arg->depth + 1);
      e->args.push_back(std::move(arg));
    }
  }

  // `| filter`, `| filter(args)`, `is [not] test`; they bind tighter than binary operators.
  ExprPtr ParseFiltersAndTests(ExprPtr e) {
    while (true) {
      const size_t offset = Peek().offset;
      if (SkipOp("|")) {
        const size_t name_offset = Peek().offset;
        const std::string name = ExpectName();
        if (!OneOf(name,
                   {"trim", "length", "count", "upper", "lower", "title", "capitalize", "tojson",
                    "string", "first", "last", "default", "d", "join", "list", "items"})) {
          Unsupported(name_offset, "filter", name);
        }
        std::vector<ExprPtr> args;
        args.push_back(std::move(e));
        e = Make(Expr::Kind::kFilter, offset, std::move(args), name);
        if (IsOp("(")) ParseArguments(e.get());
      } else if (SkipName("is")) {
        const bool negated = SkipName("not");
        const size_t name_offset = Peek().offset;
        const std::string name = ExpectName();
        if (!OneOf(name, {"defined", "undefined", "none", "string", "mapping", "iterable",
                          "sequence", "number", "integer", "float", "boolean", "true", "false"})) {
          Unsupported(name_offset, "test", name);
        }
        std::vector<ExprPtr> args;
        args.push_back(std::move(e));
        e = Make(Expr::Kind::kTest, offset, std::move(args), name);
        e->negated = negated;
      } else {
        return e;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;  // current nesting, see Nest
  int loops_ = 0;  // enclosing for loops, where break and continue may appear
};

// ---------------------------------------------------------------------------------------------
// Values.

// A value while rendering: JSON (shared, never changed once made: sub-values alias their
// parent), a namespace (changed in place by `set ns.attr`; the Renderer owns every namespace,
// so one that holds itself is no leak), or, with neither, Jinja's Undefined.
struct Value;
using Namespace = std::map<std::string, Value>;
struct Value {
  JsonPtr json;
  Namespace* ns = nullptr;
  bool undefined() const { return !json && !ns; }
};

Value Own(Json j) {
  return Value{std::make_shared<const Json>(std::move(j))};
}
Value Child(const Value& parent, const Json& child) {
  return Value{JsonPtr(parent.json, &child)};
}
Value Bool(bool b) {
  static const JsonPtr kTrue = std::make_shared<const Json>(true);
  static const JsonPtr kFalse = std::make_shared<const Json>(false);
  return Value{b ? kTrue : kFalse};
}

std::string TypeName(const Value& v) {
  if (v.ns) return "namespace";
  if (!v.json) return "undefined";
  switch (v.json->type()) {
    case Json::value_t::null:
      return "none";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_float:
      return "float";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "list";
    default:
      return "object";
  }
}

const std::string& Str(const Json& j) {
  return j.get_ref<const std::string&>();
}

// Python's bool is an int: True + 1 == 2.
bool IsNumber(const Json& j) {
  return j.is_number() || j.is_boolean();
}
bool IsInteger(const Json& j) {
  return j.is_number_integer() || j.is_boolean();
}
int64_t IntOf(const Json& j) {
  return j.is_boolean() ? j.get<bool>() : j.get<int64_t>();
}
double DoubleOf(const Json& j) {
  return j.is_boolean() ? j.get<bool>() : j.get<double>();
}

bool Truthy(const Value& v) {
  if (v.ns) return true;
  if (!v.json) return false;
  const Json& j = *v.json;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number()) return j.get<double>() != 0;
  if (j.is_string()) return !Str(j).empty();  // Json::empty() is false for every string
  return j.is_structured() && !j.empty();     // false for none
}

bool Equal(const Value& a, const Value& b) {
  if (a.ns || b.ns) return a.ns == b.ns;
  if (!a.json || !b.json) return !a.json && !b.json;
  if (a.json->is_boolean() != b.json->is_boolean() && IsNumber(*a.json) && IsNumber(*b.json)) {
    return DoubleOf(*a.json) == DoubleOf(*b.json);  // True == 1
  }
  return *a.json == *b.json;
}

// ---------------------------------------------------------------------------------------------
// Text helpers. Strings are UTF-8; Python counts and slices them by code point.

// The byte offset of each code point of `s`, then s.size().
std::vector<size_t> CodePoints(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 0 || (s[i] & 0xC0) != 0x80) starts.push_back(i);
  }
  starts.push_back(s.size());
  return starts;
}

// The code point that the bytes of one UTF-8 sequence encode.
uint32_t Decode(std::string_view bytes) {
  const unsigned char lead = bytes[0];
  if (lead < 0x80 || bytes.size() == 1) return lead;
  uint32_t cp = lead & (0xFF >> (bytes.size() + 1));
  for (size_t i = 1; i < bytes.size(); ++i) cp = (cp << 6) | (bytes[i] & 0x3F);
  return cp;
}

// str.isspace() in Python.
bool IsPythonSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Python's strip/lstrip/rstrip: drops whitespace, or the code points of `chars` when it is a
// string, from the chosen ends.
std::string Strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> set;
  const bool custom = chars.json && chars.json->is_string();
  if (custom) {
    const std::string& c = Str(*chars.json);
    const std::vector<size_t> cps = CodePoints(c);
    for (size_t i = 0; i + 1 < cps.size(); ++i) {
      set.push_back(Decode(std::string_view(c).substr(cps[i], cps[i + 1] - cps[i])));
    }
  }
  const std::vector<size_t> cps = CodePoints(s);
  // A sorted set: each code point of `s` is looked up in log time, so the work is linear in the
  // two strings (a linear search made strip(chars) quadratic).
  std::sort(set.begin(), set.end());
  auto drop = [&](size_t i) {
    const uint32_t cp = Decode(std::string_view(s).substr(cps[i], cps[i + 1] - cps[i]));
    return custom ? std::binary_search(set.begin(), set.end(), cp) : IsPythonSpace(cp);
  };
  size_t begin = 0, end = cps.size() - 1;
  while (left && begin < end && drop(begin)) ++begin;
  while (right && end > begin && drop(end - 1)) --end;
  return s.substr(cps[begin], cps[end] - cps[begin]);
}

char Upper(char c) {
  return c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c;
}
char Lower(char c) {
  return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

// Case mapping, ASCII only. "title" is Python's str.title (bytes of non-ASCII characters
// count as letters); "title words" is Jinja's title filter, which starts a word after
// whitespace and -({[<.
std::string MapCase(std::string s, std::string_view how) {
  bool word_start = true;
  for (size_t i = 0; i < s.size(); ++i) {
    char& c = s[i];
    if (how == "upper") {
      c = Upper(c);
    } else if (how == "lower") {
      c = Lower(c);
    } else if (how == "capitalize") {
      c = i == 0 ? Upper(c) : Lower(c);
    } else if (how == "title") {
      const bool letter = Upper(c) != Lower(c);
      c = word_start ? Upper(c) : Lower(c);
      word_start = !letter && static_cast<unsigned char>(c) < 0x80;
    } else {
      const bool separator = IsSpace(c) || std::string_view("-({[<").find(c) != std::string::npos;
      if (!separator) c = word_start ? Upper(c) : Lower(c);
      word_start = separator;
    }
  }
  return s;
}

// Appends `s` as Python's repr() (python) or json.dumps(ensure_ascii=False) quotes it.
void AppendQuoted(std::string* out, const std::string& s, bool python) {
  const char quote =
      python && (s.find('\'') == std::string::npos || s.find('"') != std::string::npos) ? '\''
                                                                                        : '"';
  out->push_back(quote);
  for (const char c : s) {
    const unsigned char u = c;
    if (c == quote || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (u < 0x20 || (python && u == 0x7F)) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), python ? "\\x%02x" : "\\u%04x", u);
      *out += escape;
    } else {
      out->push_back(c);
    }
  }
  out->push_back(quote);
}

// A finite float as Python's repr() (and so json.dumps) writes it: the shortest digits that
// read back to it, in positional notation for exponents from -4 to 15, else as 1.5e+16.
std::string PythonFloat(double d) {
  char buf[64];
  const std::string sci(
      buf, std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific).ptr);
  const std::string sign = d < 0 || std::signbit(d) ? "-" : "";
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  std::string digits = sci.substr(sign.size(), e - sign.size());
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int n = digits.size();
  if (exp < -4 || exp >= 16) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + digits.substr(0, 1) + (n > 1 ? "." + digits.substr(1) : "") + suffix;
  }
  if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
  if (n <= exp + 1) return sign + digits + std::string(exp + 1 - n, '0') + ".0";
  return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
}

// Appends `j` as Python's repr() (python) or as json.dumps(j, ensure_ascii=False,
// indent=indent) does (indent < 0: none). Fails once `out` passes `limit` bytes.
void Print(std::string* out, const Json& j, bool python, int64_t indent, int level, size_t limit) {
  if (level > kMaxDepth) Exhausted("JSON nested deeper than " + std::to_string(kMaxDepth));
  if (out->size() > limit) Exhausted("a string larger than " + std::to_string(limit) + " bytes");
  switch (j.type()) {
    case Json::value_t::null:
      *out += python ? "None" : "null";
      return;
    case Json::value_t::boolean:
      *out += j.get<bool>() ? (python ? "True" : "true") : (python ? "False" : "false");
      return;
    case Json::value_t::string:
      AppendQuoted(out, Str(j), python);
      return;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      if (std::isnan(d)) {
        *out += python ? "nan" : "NaN";
      } else if (std::isinf(d)) {
        *out += std::string(d < 0 ? "-" : "") + (python ? "inf" : "Infinity");
      } else {
        *out += PythonFloat(d);
      }
      return;
    }
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool object = j.is_object();
      out->push_back(object ? '{' : '[');
      auto newline = [&](int depth) {
        if (static_cast<uint64_t>(indent) * depth > limit) Exhausted("indent too large");
        out->push_back('\n');
        out->append(indent * depth, ' ');
      };
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it != j.begin()) *out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        if (object) {
          AppendQuoted(out, it.key(), python);
          *out += ": ";
        }
        Print(out, it.value(), python, indent, level + 1, limit);
      }
      if (indent >= 0 && !j.empty()) newline(level);
      out->push_back(object ? '}' : ']');
      return;
    }
    default:
      *out += j.dump();  // integers
  }
}

// The steps copying `j` costs: one per value and one per kBytesPerStep bytes of string. Stops
// counting once past kMaxSteps, which is already too many.
uint64_t JsonCost(const Json& j, int depth = 0) {
  if (depth > kMaxDepth) Exhausted("JSON nested deeper than " + std::to_string(kMaxDepth));
  if (j.is_string()) return 1 + Str(j).size() / kBytesPerStep;
  uint64_t cost = 1;
  if (j.is_structured()) {
    for (auto it = j.begin(); it != j.end() && cost <= kMaxSteps; ++it) {
      cost += JsonCost(it.value(), depth + 1) + (j.is_object() ? 1 : 0);
    }
  }
  return cost;
}

// Python's slice.indices(): the positions a[start:stop:step] takes from a sequence of `n`.
std::vector<int64_t> SliceIndices(int64_t n, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  auto clamp = [&](std::optional<int64_t> i, int64_t fallback) {
    if (!i) return fallback;
    int64_t v = *i < 0 ? *i + n : *i;
    if (v < 0) return step < 0 ? int64_t{-1} : int64_t{0};
    if (v >= n) return step < 0 ? n - 1 : n;
    return v;
  };
  const int64_t from = clamp(start, step < 0 ? n - 1 : 0);
  const int64_t to = clamp(stop, step < 0 ? -1 : n);
  std::vector<int64_t> indices;
  for (int64_t i = from; step > 0 ? i < to : i > to;) {
    indices.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return indices;
}

// ---------------------------------------------------------------------------------------------
// Renderer.

// Arguments of a call, method or filter.
struct Args {
  std::vector<Value> positional;
  std::map<std::string, Value> named;

  // Argument `index`, or the keyword argument `name`, or Undefined.
  Value Get(size_t index, const std::string& name) const {
    if (index < positional.size()) return positional[index];
    auto it = named.find(name);
    return it == named.end() ? Value{} : it->second;
  }
};

class Renderer {
 public:
  Renderer(const Json& variables, size_t max_output)
      : variables_(JsonPtr(), &variables), max_output_(max_output), scopes_(1) {}

  std::string Run(const std::vector<Stmt>& body) {
    Exec(body);
    return std::move(out_);
  }
  uint64_t steps() const { return steps_; }

 private:
  enum class Flow { kNext, kBreak, kContinue };

  // s.find(needle, from), charging the bytes it compares: a search of a long needle that
  // almost matches everywhere costs its real (quadratic) work, so the step bound cuts it off.
  size_t Find(const std::string& s, const std::string& needle, size_t from) {
    if (needle.empty()) return from <= s.size() ? from : std::string::npos;
    uint64_t compared = 0;
    size_t found = std::string::npos;
    for (size_t i = from; i < s.size() && s.size() - i >= needle.size(); ++i) {
      size_t k = 0;
      while (k < needle.size() && s[i + k] == needle[k]) ++k;
      compared += k + 1;
      if (k == needle.size()) {
        found = i;
        break;
      }
      if (compared >= (uint64_t{1} << 20)) {
        Step(compared / kBytesPerStep);
        compared %= kBytesPerStep;
      }
    }
    Step(compared / kBytesPerStep);
    return found;
  }

  void Step(uint64_t n = 1) {
    if (n > kMaxSteps - steps_) {
      Exhausted("more than " + std::to_string(kMaxSteps) + " evaluation steps");
    }
    steps_ += n;
  }

  // Strings built on the way are bounded like the output, and cost steps as they are copied.
  void CheckSize(uint64_t bytes) const {
    if (bytes > max_output_) {
      Exhausted("a string larger than " + std::to_string(max_output_) + " bytes");
    }
  }
  Value String(std::string s) {
    CheckSize(s.size());
    Step(s.size() / kBytesPerStep);
    return Own(std::move(s));
  }

  // Comparing, searching and scanning walk whole strings and lists; they cost what copying
  // them would.
  void StepOver(const Value& v) {
    if (v.json) Step(JsonCost(*v.json));
  }

  void Append(const std::string& s) {
    if (s.size() > max_output_ - out_.size()) {
      Exhausted("output larger than " + std::to_string(max_output_) + " bytes");
    }
    Step(s.size() / kBytesPerStep);
    out_ += s;
  }

  // The JSON of a value that must be one (not Undefined, not a namespace).
  const Json& JsonOf(const Value& v, size_t offset) {
    if (!v.json) Fail(offset, "expected a value, found " + TypeName(v));
    return *v.json;
  }
  Json Copy(const Value& v, size_t offset) {
    const Json& j = JsonOf(v, offset);
    Step(JsonCost(j));
    return j;
  }
  int64_t Int(const Value& v, size_t offset) {
    if (!v.json || !IsInteger(*v.json)) {
      Fail(offset, "expected an integer, found " + TypeName(v));
    }
    return IntOf(*v.json);
  }
  const std::string& StrOf(const Value& v, size_t offset) {
    if (!v.json || !v.json->is_string()) Fail(offset, "expected a string, found " + TypeName(v));
    return Str(*v.json);
  }

  // How a value renders: Undefined as "", strings as themselves, the rest as Python's str().
  std::string ToString(const Value& v) {
    if (v.ns) return "<Namespace>";
    if (!v.json) return "";
    if (v.json->is_string()) return Str(*v.json);
    std::string out;
    Print(&out, *v.json, /*python=*/true, -1, 0, max_output_);
    return out;
  }

  Value Lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return it->second;
    }
    auto it = variables_->find(name);
    return it == variables_->end() ? Value{} : Child(Value{variables_}, *it);
  }

  // The items a for loop or filter walks: list items, object keys, string characters.
  std::vector<Value> Iterate(const Value& v, size_t offset) {
    std::vector<Value> items;
    if (v.undefined()) return items;
    if (v.json && v.json->is_array()) {
      Step(v.json->size());
      for (const Json& item : *v.json) items.push_back(Child(v, item));
    } else if (v.json && v.json->is_object()) {
      Step(v.json->size());
      for (auto it = v.json->begin(); it != v.json->end(); ++it) items.push_back(Own(it.key()));
    } else if (v.json && v.json->is_string()) {
      const std::string& s = Str(*v.json);
      const std::vector<size_t> cps = CodePoints(s);
      Step(cps.size());
      for (size_t i = 0; i + 1 < cps.size(); ++i) {
        items.push_back(Own(s.substr(cps[i], cps[i + 1] - cps[i])));
      }
    } else {
      Fail(offset, "cannot iterate over " + TypeName(v));
    }
    return items;
  }

  Flow Exec(const std::vector<Stmt>& body) {
    for (const Stmt& s : body) {
      Step();
      Flow flow = Flow::kNext;
      switch (s.kind) {
        case Stmt::Kind::kText:
          Append(s.text);
          break;
        case Stmt::Kind::kOutput:
          Append(ToString(Eval(*s.expr)));
          break;
        case Stmt::Kind::kIf:
          flow = Exec(Truthy(Eval(*s.expr)) ? s.body : s.else_body);
          break;
        case Stmt::Kind::kFor:
          flow = ExecFor(s);
          break;
        case Stmt::Kind::kSet: {
          Value v = Eval(*s.expr);
          scopes_.back()[s.text] = std::move(v);
          break;
        }
        case Stmt::Kind::kSetAttr: {
          Value v = Eval(*s.expr);
          const Value target = Lookup(s.text);
          if (!target.ns) Fail(s.offset, "'" + s.text + "' is not a namespace");
          (*target.ns)[s.attr] = std::move(v);
          break;
        }
        case Stmt::Kind::kBreak:
          return Flow::kBreak;
        case Stmt::Kind::kContinue:
          return Flow::kContinue;
      }
      if (flow != Flow::kNext) return flow;
    }
    return Flow::kNext;
  }

  // Each iteration of a for loop runs in a fresh scope, so what its body sets is gone by the
  // next iteration and after the loop (hence namespace()); break and continue stop at it.
  Flow ExecFor(const Stmt& s) {
    std::vector<Value> items = Iterate(Eval(*s.expr), s.expr->offset);
    scopes_.emplace_back();
    if (s.filter) {
      std::vector<Value> kept;
      for (Value& item : items) {
        scopes_.back().clear();
        Bind(s, item);
        if (Truthy(Eval(*s.filter))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const int64_t n = items.size();
    for (int64_t i = 0; i < n; ++i) {
      scopes_.back().clear();
      Bind(s, items[i]);
      scopes_.back()["loop"] = Own(Json{{"index", i + 1},
                                        {"index0", i},
                                        {"revindex", n - i},
                                        {"revindex0", n - i - 1},
                                        {"first", i == 0},
                                        {"last", i == n - 1},
                                        {"length", n}});
      if (Exec(s.body) == Flow::kBreak) break;
    }
    const Flow flow = n == 0 ? Exec(s.else_body) : Flow::kNext;
    scopes_.pop_back();
    return flow;
  }

  void Bind(const Stmt& s, const Value& item) {
    std::map<std::string, Value>& scope = scopes_.back();
    if (s.targets.size() == 1) {
      scope[s.targets[0]] = item;
      return;
    }
    if (!item.json || !item.json->is_array() || item.json->size() != s.targets.size()) {
      Fail(s.offset, "cannot unpack " + TypeName(item) + " into " +
                         std::to_string(s.targets.size()) + " loop variables");
    }
    for (size_t i = 0; i < s.targets.size(); ++i) {
      scope[s.targets[i]] = Child(item, (*item.json)[i]);
    }
  }

  Args EvalArgs(const Expr& e, size_t first) {
    Args args;
    const size_t first_named = e.args.size() - e.names.size();
    for (size_t i = first; i < e.args.size(); ++i) {
      Value v = Eval(*e.args[i]);
      if (i < first_named) {
        args.positional.push_back(std::move(v));
      } else {
        args.named[e.names[i - first_named]] = std::move(v);
      }
    }
    return args;
  }

  // Refuses arguments beyond the parameters `params` of e's filter, method or function.
  void CheckArgs(const Expr& e, const Args& args, std::initializer_list<std::string_view> params) {
    if (args.positional.size() > params.size()) Fail(e.offset, "too many arguments to " + e.name);
    for (const auto& [name, value] : args.named) {
      if (std::find(params.begin(), params.end(), name) == params.end()) {
        Unsupported(e.offset, "argument", name);
      }
    }
  }

  Value Eval(const Expr& e) {
    Step();
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value{e.literal};
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        Json list = Json::array();
        for (const ExprPtr& item : e.args) list.push_back(Copy(Eval(*item), item->offset));
        return Own(std::move(list));
      }
      case Expr::Kind::kDict: {
        Json dict = Json::object();
        for (size_t i = 0; i < e.args.size(); i += 2) {
          const Value key = Eval(*e.args[i]);
          dict[StrOf(key, e.args[i]->offset)] = Copy(Eval(*e.args[i + 1]), e.args[i + 1]->offset);
        }
        return Own(std::move(dict));
      }
      case Expr::Kind::kAttr:
        return Attr(Eval(*e.args[0]), e.name);
      case Expr::Kind::kItem:
        return Item(Eval(*e.args[0]), Eval(*e.args[1]));
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kNot:
        return Bool(!Truthy(Eval(*e.args[0])));
      case Expr::Kind::kNeg: {
        const Value v = Eval(*e.args[0]);
        if (v.json && v.json->is_number_float()) return Own(-v.json->get<double>());  // -0.0
        return Arith("-", Own(0), v, e.offset);
      }
      case Expr::Kind::kBinary: {
        const Value a = Eval(*e.args[0]);
        return Arith(e.name, a, Eval(*e.args[1]), e.offset);
      }
      case Expr::Kind::kCompare: {
        Value left = Eval(*e.args[0]);
        for (size_t i = 1; i < e.args.size(); ++i) {
          Value right = Eval(*e.args[i]);
          if (!Compare(e.names[i - 1], left, right, e.args[i]->offset)) return Bool(false);
          left = std::move(right);
        }
        return Bool(true);
      }
      case Expr::Kind::kAnd: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? Eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = Eval(*e.args[0]);
        return Truthy(a) ? a : Eval(*e.args[1]);
      }
      case Expr::Kind::kIf:
        if (Truthy(Eval(*e.args[1]))) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : Value{};
      case Expr::Kind::kFilter: {
        const Value subject = Eval(*e.args[0]);
        return Filter(e, subject, EvalArgs(e, 1));
      }
      case Expr::Kind::kTest:
        return Bool(Test(e.name, Eval(*e.args[0])) != e.negated);
      case Expr::Kind::kCall:
        return Call(e, EvalArgs(e, 0));
      case Expr::Kind::kMethod: {
        const Value subject = Eval(*e.args[0]);
        return Method(e, subject, EvalArgs(e, 1));
      }
    }
    return Value{};
  }

  // a.name: an object's key or a namespace's attribute; Undefined otherwise.
  static Value Attr(const Value& v, const std::string& name) {
    if (v.ns) {
      auto it = v.ns->find(name);
      return it == v.ns->end() ? Value{} : it->second;
    }
    if (v.json && v.json->is_object()) {
      auto it = v.json->find(name);
      if (it != v.json->end()) return Child(v, *it);
    }
    return Value{};
  }

  // a[key]: as a.key for a string key; a list item or string character for an integer key
  // (negative counts from the end); Undefined otherwise.
  Value Item(const Value& v, const Value& key) {
    if (key.json && key.json->is_string()) return Attr(v, Str(*key.json));
    if (!v.json || !key.json || !key.json->is_number_integer()) return Value{};
    int64_t i = key.json->get<int64_t>();
    if (v.json->is_array()) {
      const int64_t n = v.json->size();
      if (i < 0) i += n;
      return i < 0 || i >= n ? Value{} : Child(v, (*v.json)[i]);
    }
    if (v.json->is_string()) {
      StepOver(v);
      const std::string& s = Str(*v.json);
      const std::vector<size_t> cps = CodePoints(s);
      const int64_t n = cps.size() - 1;
      if (i < 0) i += n;
      return i < 0 || i >= n ? Value{} : Own(s.substr(cps[i], cps[i + 1] - cps[i]));
    }
    return Value{};
  }

  Value Slice(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    std::optional<int64_t> bounds[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      const Value b = Eval(*e.args[k + 1]);
      if (b.json && !b.json->is_null()) bounds[k] = Int(b, e.args[k + 1]->offset);
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) Fail(e.offset, "slice step cannot be zero");
    if (v.json && v.json->is_array()) {
      Json list = Json::array();
      for (int64_t i : SliceIndices(v.json->size(), bounds[0], bounds[1], step)) {
        list.push_back(Copy(Child(v, (*v.json)[i]), e.offset));
      }
      return Own(std::move(list));
    }
    if (v.json && v.json->is_string()) {
      const std::string& s = Str(*v.json);
      const std::vector<size_t> cps = CodePoints(s);
      std::string out;
      for (int64_t i : SliceIndices(cps.size() - 1, bounds[0], bounds[1], step)) {
        out.append(s, cps[i], cps[i + 1] - cps[i]);
      }
      return String(std::move(out));
    }
    return Value{};
  }

  Value Arith(const std::string& op, const Value& a, const Value& b, size_t offset) {
    if (op == "~") return String(ToString(a) + ToString(b));
    if (a.json && b.json) {
      const Json& x = *a.json;
      const Json& y = *b.json;
      if (IsNumber(x) && IsNumber(y)) return Number(op, x, y, offset);
      if (op == "+" && x.is_string() && y.is_string()) return String(Str(x) + Str(y));
      if (op == "+" && x.is_array() && y.is_array()) {
        Json list = Copy(a, offset);
        for (const Json& item : y) list.push_back(Copy(Child(b, item), offset));
        return Own(std::move(list));
      }
      if (op == "*" && (x.is_string() || x.is_array()) && IsInteger(y)) {
        return Repeat(a, IntOf(y), offset);
      }
      if (op == "*" && IsInteger(x) && (y.is_string() || y.is_array())) {
        return Repeat(b, IntOf(x), offset);
      }
    }
    Fail(offset,
         "unsupported operand types for " + op + ": " + TypeName(a) + " and " + TypeName(b));
  }

  // Python's int and float arithmetic; integers that would overflow 64 bits are an error.
  static Value Number(const std::string& op, const Json& x, const Json& y, size_t offset) {
    if (IsInteger(x) && IsInteger(y) && op != "/") {
      const int64_t a = IntOf(x), b = IntOf(y);
      int64_t r = 0;
      bool overflow = false;
      if (op == "+") {
        overflow = __builtin_add_overflow(a, b, &r);
      } else if (op == "-") {
        overflow = __builtin_sub_overflow(a, b, &r);
      } else if (op == "*") {
        overflow = __builtin_mul_overflow(a, b, &r);
      } else {  // // and %, which floor as Python does
        if (b == 0) Fail(offset, "division by zero");
        overflow = a == INT64_MIN && b == -1;
        int64_t q = overflow ? 0 : a / b, m = overflow ? 0 : a % b;
        if (m != 0 && (m < 0) != (b < 0)) {
          q -= 1;
          m += b;
        }
        r = op == "//" ? q : m;
      }
      if (overflow) Fail(offset, "integer overflow");
      return Own(r);
    }
    const double a = DoubleOf(x), b = DoubleOf(y);
    if ((op == "/" || op == "//" || op == "%") && b == 0) Fail(offset, "division by zero");
    if (op == "+") return Own(a + b);
    if (op == "-") return Own(a - b);
    if (op == "*") return Own(a * b);
    if (op == "/") return Own(a / b);
    if (op == "//") return Own(std::floor(a / b));
    return Own(a - b * std::floor(a / b));
  }

  // 'ab' * 3, [x] * 3.
  Value Repeat(const Value& v, int64_t times, size_t offset) {
    const Json& j = *v.json;
    if (times <= 0 || j.empty() || (j.is_string() && Str(j).empty())) {
      return Own(j.is_string() ? Json("") : Json::array());
    }
    if (j.is_string()) {
      const std::string& s = Str(j);
      if (static_cast<uint64_t>(times) > max_output_ / s.size()) CheckSize(max_output_ + 1);
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += s;
      return String(std::move(out));
    }
    if (static_cast<uint64_t>(times) > kMaxSteps) Exhausted("list too long");
    Json list = Json::array();
    for (int64_t i = 0; i < times; ++i) {
      for (const Json& item : j) list.push_back(Copy(Child(v, item), offset));
    }
    return Own(std::move(list));
  }

  bool Compare(const std::string& op, const Value& a, const Value& b, size_t offset) {
    StepOver(a);
    StepOver(b);
    if (op == "==") return Equal(a, b);
    if (op == "!=") return !Equal(a, b);
    if (op == "in" || op == "not in") return Contains(b, a, offset) == (op == "in");
    int order = 0;
    if (a.json && b.json && IsNumber(*a.json) && IsNumber(*b.json)) {
      const Json& x = *a.json;
      const Json& y = *b.json;
      order = IsInteger(x) && IsInteger(y)
                  ? (IntOf(x) > IntOf(y)) - (IntOf(x) < IntOf(y))
                  : (DoubleOf(x) > DoubleOf(y)) - (DoubleOf(x) < DoubleOf(y));
    } else if (a.json && b.json && a.json->is_string() && b.json->is_string()) {
      order = Str(*a.json).compare(Str(*b.json));
    } else {
      Fail(offset, "cannot compare " + TypeName(a) + " and " + TypeName(b) + " with " + op);
    }
    if (op == "<") return order < 0;
    if (op == ">") return order > 0;
    if (op == "<=") return order <= 0;
    return order >= 0;
  }

  // `item in container`: a substring, a list item or an object key; nothing is in Undefined.
  bool Contains(const Value& container, const Value& item, size_t offset) {
    if (container.undefined()) return false;
    if (container.json && container.json->is_string()) {
      return Find(Str(*container.json), StrOf(item, offset), 0) != std::string::npos;
    }
    if (container.json && container.json->is_array()) {
      return item.json && std::find(container.json->begin(), container.json->end(), *item.json) !=
                              container.json->end();
    }
    if (container.json && container.json->is_object()) {
      return item.json && item.json->is_string() && container.json->contains(Str(*item.json));
    }
    Fail(offset, "'in' needs a string, list or object, found " + TypeName(container));
  }

  static bool Test(const std::string& test, const Value& v) {
    const Json* j = v.json.get();
    if (test == "defined") return !v.undefined();
    if (test == "undefined") return v.undefined();
    if (test == "iterable") return v.undefined() || (j && (j->is_string() || j->is_structured()));
    if (!j) return false;
    if (test == "none") return j->is_null();
    if (test == "string") return j->is_string();
    if (test == "mapping") return j->is_object();
    if (test == "sequence") return j->is_string() || j->is_structured();
    if (test == "number") return j->is_number() || j->is_boolean();
    if (test == "integer") return j->is_number_integer();
    if (test == "float") return j->is_number_float();
    if (test == "boolean") return j->is_boolean();
    return j->is_boolean() && j->get<bool>() == (test == "true");  // true, false
  }

  Value Filter(const Expr& e, const Value& v, const Args& args) {
    if (v.json && v.json->is_string()) StepOver(v);
    const std::string& name = e.name;
    if (name == "default" || name == "d") {
      CheckArgs(e, args, {"default_value", "boolean"});
      const bool replace = Truthy(args.Get(1, "boolean")) ? !Truthy(v) : v.undefined();
      if (!replace) return v;
      const Value fallback = args.Get(0, "default_value");
      return fallback.undefined() ? Own("") : fallback;
    }
    if (name == "tojson") {
      CheckArgs(e, args, {"indent"});
      const Value indent = args.Get(0, "indent");
      std::string out;
      Print(
          &out, JsonOf(v, e.offset), /*python=*/false,
          indent.json && !indent.json->is_null() ? std::max<int64_t>(0, Int(indent, e.offset)) : -1,
          0, max_output_);
      return String(std::move(out));
    }
    if (name == "trim") {
      CheckArgs(e, args, {"chars"});
      return String(Strip(ToString(v), args.Get(0, "chars"), true, true));
    }
    CheckArgs(e, args,
              name == "join" ? std::initializer_list<std::string_view>{"d"}
                             : std::initializer_list<std::string_view>{});
    if (name == "length" || name == "count") {
      if (v.json && v.json->is_string()) return Own(CodePoints(Str(*v.json)).size() - 1);
      if (v.json && v.json->is_structured()) return Own(v.json->size());
      if (v.undefined()) return Own(0);
      Fail(e.offset, TypeName(v) + " has no length");
    }
    if (name == "string") return String(ToString(v));
    if (OneOf(name, {"upper", "lower", "title", "capitalize"})) {
      return String(MapCase(ToString(v), name == "title" ? "title words" : name));
    }
    if (name == "first" || name == "last") {
      std::vector<Value> items = Iterate(v, e.offset);
      if (items.empty()) return Value{};
      return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
      const Value sep = args.Get(0, "d");
      const std::string separator = sep.undefined() ? "" : ToString(sep);
      std::string out;
      bool first = true;
      for (const Value& item : Iterate(v, e.offset)) {
        if (!first) out += separator;
        first = false;
        out += ToString(item);
        CheckSize(out.size());
      }
      return String(std::move(out));
    }
    if (name == "list") {
      Json list = Json::array();
      for (const Value& item : Iterate(v, e.offset)) list.push_back(Copy(item, e.offset));
      return Own(std::move(list));
    }
    // items
    if (v.undefined()) return Own(Json::array());
    if (!v.json || !v.json->is_object()) {
      Fail(e.offset, "items needs an object, found " + TypeName(v));
    }
    return Items(v, e.offset);
  }

  Value Items(const Value& v, size_t offset) {
    Json list = Json::array();
    for (auto it = v.json->begin(); it != v.json->end(); ++it) {
      list.push_back(Json::array({it.key(), Copy(Child(v, it.value()), offset)}));
    }
    return Own(std::move(list));
  }

  Value Method(const Expr& e, const Value& v, const Args& args) {
    if (v.json && v.json->is_string()) StepOver(v);
    const std::string& name = e.name;
    if (v.json && v.json->is_object() && OneOf(name, {"items", "keys", "values", "get"})) {
      CheckArgs(e, args,
                name == "get" ? std::initializer_list<std::string_view>{"key", "default"}
                              : std::initializer_list<std::string_view>{});
      if (name == "items") return Items(v, e.offset);
      if (name == "get") {
        const Value found = Attr(v, StrOf(args.Get(0, "key"), e.offset));
        const Value fallback = args.Get(1, "default");
        return !found.undefined() ? found : fallback.undefined() ? Own(nullptr) : fallback;
      }
      Json list = Json::array();
      for (auto it = v.json->begin(); it != v.json->end(); ++it) {
        list.push_back(name == "keys" ? Json(it.key()) : Copy(Child(v, it.value()), e.offset));
      }
      return Own(std::move(list));
    }
    if (!v.json || !v.json->is_string() || OneOf(name, {"items", "keys", "values", "get"})) {
      Fail(e.offset, TypeName(v) + " has no method " + name);
    }
    const std::string& s = Str(*v.json);
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      CheckArgs(e, args, {"chars"});
      const Value chars = args.Get(0, "chars");
      StepOver(v);  // it decodes every code point of both strings
      StepOver(chars);
      return String(Strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (OneOf(name, {"upper", "lower", "title", "capitalize"})) {
      CheckArgs(e, args, {});
      return String(MapCase(s, name));
    }
    if (name == "startswith" || name == "endswith") {
      CheckArgs(e, args, {"prefix"});
      const Value arg = args.Get(0, "prefix");
      std::vector<Value> affixes{arg};
      if (arg.json && arg.json->is_array()) affixes = Iterate(arg, e.offset);
      for (const Value& affix : affixes) {
        const std::string& a = StrOf(affix, e.offset);
        if (a.size() <= s.size() &&
            s.compare(name == "startswith" ? 0 : s.size() - a.size(), a.size(), a) == 0) {
          return Bool(true);
        }
      }
      return Bool(false);
    }
    if (name == "split") {
      CheckArgs(e, args, {"sep", "maxsplit"});
      const Value sep = args.Get(0, "sep");
      const Value max = args.Get(1, "maxsplit");
      return Split(s, sep.json && !sep.json->is_null() ? &StrOf(sep, e.offset) : nullptr,
                   max.undefined() ? -1 : Int(max, e.offset), e.offset);
    }
    CheckArgs(e, args, {"old", "new", "count"});  // replace
    const Value count = args.Get(2, "count");
    return Replace(s, StrOf(args.Get(0, "old"), e.offset), StrOf(args.Get(1, "new"), e.offset),
                   count.undefined() ? -1 : Int(count, e.offset));
  }

  // str.split(sep, maxsplit); a null sep splits on runs of whitespace.
  Value Split(const std::string& s, const std::string* sep, int64_t maxsplit, size_t offset) {
    Json parts = Json::array();
    auto add = [&](std::string part) {
      Step(1 + part.size() / kBytesPerStep);
      parts.push_back(std::move(part));
    };
    auto done = [&] { return maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit; };
    if (sep != nullptr) {
      if (sep->empty()) Fail(offset, "empty separator");
      size_t start = 0, found;
      while (!done() && (found = Find(s, *sep, start)) != std::string::npos) {
        add(s.substr(start, found - start));
        start = found + sep->size();
      }
      add(s.substr(start));
      return Own(std::move(parts));
    }
    const std::vector<size_t> cps = CodePoints(s);
    const size_t n = cps.size() - 1;
    auto space = [&](size_t i) {
      return IsPythonSpace(Decode(std::string_view(s).substr(cps[i], cps[i + 1] - cps[i])));
    };
    size_t i = 0;
    while (true) {
      while (i < n && space(i)) ++i;
      if (i == n) break;
      if (done()) {
        add(s.substr(cps[i]));
        break;
      }
      size_t j = i;
      while (j < n && !space(j)) ++j;
      add(s.substr(cps[i], cps[j] - cps[i]));
      i = j;
    }
    return Own(std::move(parts));
  }

  // str.replace(old, new, count); an empty `old` matches between every two characters.
  Value Replace(const std::string& s, const std::string& from, const std::string& to,
                int64_t count) {
    std::string out;
    size_t start = 0;
    for (int64_t done = 0; count < 0 || done < count; ++done) {
      size_t found = from.empty() ? start : Find(s, from, start);
      if (from.empty()) {
        found = start;
        if (done > 0 && start < s.size()) {  // step over one whole code point
          do {
            ++found;
          } while (found < s.size() && (s[found] & 0xC0) == 0x80);
        }
        if (done > 0 && start >= s.size()) break;
      }
      if (found == std::string::npos) break;
      out.append(s, start, found - start);
      out += to;
      start = found + from.size();
      CheckSize(out.size());
    }
    out.append(s, std::min(start, s.size()));
    return String(std::move(out));
  }

  Value Call(const Expr& e, const Args& args) {
    if (e.name == "raise_exception") {
      CheckArgs(e, args, {"message"});
      throw Failure{
          absl::InvalidArgumentError("chat template: " + ToString(args.Get(0, "message")))};
    }
    if (e.name == "namespace") {
      if (!args.positional.empty()) Fail(e.offset, "namespace() takes keyword arguments only");
      namespaces_.push_back(std::make_unique<Namespace>(args.named));
      return Value{nullptr, namespaces_.back().get()};
    }
    CheckArgs(e, args, {"start", "stop", "step"});  // range
    if (args.positional.empty()) Fail(e.offset, "range needs an argument");
    const bool one = args.positional.size() == 1;
    const int64_t start = one ? 0 : Int(args.positional[0], e.offset);
    const int64_t stop = Int(args.positional[one ? 0 : 1], e.offset);
    const int64_t step = args.positional.size() == 3 ? Int(args.positional[2], e.offset) : 1;
    if (step == 0) Fail(e.offset, "range step cannot be zero");
    // The length Python would give, in 128 bits since stop - start can overflow 64.
    const __int128 span = step > 0 ? __int128{stop} - start : __int128{start} - stop;
    const __int128 length = span <= 0 ? 0 : (span - 1) / (step > 0 ? step : -__int128{step}) + 1;
    Step(static_cast<uint64_t>(std::min<__int128>(length, kMaxSteps + 1)));
    Json list = Json::array();
    for (int64_t i = 0; i < static_cast<int64_t>(length); ++i) list.push_back(start + i * step);
    return Own(std::move(list));
  }

  JsonPtr variables_;
  size_t max_output_;
  std::vector<std::map<std::string, Value>> scopes_;    // innermost last; [0] holds top-level sets
  std::vector<std::unique_ptr<Namespace>> namespaces_;  // every namespace() made
  std::string out_;
  uint64_t steps_ = 0;
};

}  // namespace

struct ChatTemplate::Program {
  std::vector<Stmt> body;
};

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  try {
    auto program = std::make_shared<Program>();
    program->body = Parser(Lexer(source).Run()).ParseTemplate();
    return ChatTemplate(std::move(program));
  } catch (const Failure& failure) {
    return failure.status;
  }
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& variables,
                                                 size_t max_output, uint64_t* steps) const {
  if (!variables.is_object()) {
    return absl::InvalidArgumentError("chat_template: variables must be a JSON object");
  }
  Renderer renderer(variables, max_output);
  try {
    std::string out = renderer.Run(program_->body);
    if (steps != nullptr) *steps = renderer.steps();
    return out;
  } catch (const Failure& failure) {
    if (steps != nullptr) *steps = renderer.steps();
    return failure.status;
  }
}

}  // namespace baton::text

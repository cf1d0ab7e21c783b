#include "baton/text/tokenizer.h"

#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "sentencepiece_model.h"

namespace baton::text {
namespace {

namespace fs = std::filesystem;

// tokenizer_config.json can list thousands of added tokens; past this it is refused.
constexpr uintmax_t kMaxConfigBytes = uintmax_t{16} << 20;

// The JSON object in `path`; nullopt when the file is absent.
absl::StatusOr<std::optional<nlohmann::json>> ReadJson(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return std::optional<nlohmann::json>();
  const uintmax_t size = fs::file_size(path, error);
  if (error || size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": ", error ? error.message() : "larger than 16 MiB", "; not read"));
  }
  std::ifstream in(path);
  nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": not a JSON object; fix or remove the file"));
  }
  return std::optional<nlohmann::json>(std::move(json));
}

// A token entry of tokenizer_config.json: a string, or an AddedToken object's "content".
std::optional<std::string> TokenString(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir,
                                                           int64_t vocab_size) {
  const fs::path dir(model_dir);
  const fs::path model_path = dir / "tokenizer.model";
  std::error_code error;
  if (!fs::exists(model_path, error)) {
    return absl::NotFoundError(absl::StrCat(model_path.string(), " does not exist"));
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  std::string load_error;
  t->model_ = internal::SentencePieceModel::Create(&load_error);
  if (t->model_ == nullptr) return absl::FailedPreconditionError(load_error);
  if (std::string message = t->model_->Load(model_path.string()); !message.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path.string(), ": not a SentencePiece model (", message, ")"));
  }
  if (t->model_->PieceCount() > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path.string(), ": ", t->model_->PieceCount(),
                     " pieces, more than the model's vocab_size ", vocab_size, " in config.json"));
  }
  t->bos_id_ = t->model_->BosId();
  t->eos_id_ = t->model_->EosId();
  if (t->bos_id_ >= 0) t->bos_token_ = t->model_->Piece(t->bos_id_);
  if (t->eos_id_ >= 0) t->eos_token_ = t->model_->Piece(t->eos_id_);

  if (absl::Status s = t->ReadTokenizerConfig((dir / "tokenizer_config.json").string()); !s.ok()) {
    return s;
  }
  if (absl::Status s = t->ReadGenerationConfig((dir / "generation_config.json").string());
      !s.ok()) {
    return s;
  }
  t->chat_ = ChatTemplate::Parse(t->chat_template_.empty() ? kDefaultChatTemplate
                                                           : std::string_view(t->chat_template_));
  t->CollectSpecials();
  return t;
}

absl::Status Tokenizer::ReadTokenizerConfig(const std::string& path) {
  const fs::path config_path(path);
  absl::StatusOr<std::optional<nlohmann::json>> config = ReadJson(config_path);
  if (!config.ok()) return config.status();
  if (config->has_value()) {
    const nlohmann::json& c = **config;
    auto piece_of = [&, this](const char* key, std::string* token, int32_t* id) -> absl::Status {
      std::optional<std::string> text = TokenString(c, key);
      if (!text.has_value()) return absl::OkStatus();
      const std::optional<int32_t> found = PieceId(*text);
      if (!found.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(config_path.string(), ": ", key, " '", *text,
                                                       "' is not a piece of the model"));
      }
      *token = *text;
      *id = *found;
      return absl::OkStatus();
    };
    if (absl::Status s = piece_of("bos_token", &bos_token_, &bos_id_); !s.ok()) return s;
    if (absl::Status s = piece_of("eos_token", &eos_token_, &eos_id_); !s.ok()) return s;
    if (auto it = c.find("add_bos_token"); it != c.end() && it->is_boolean()) {
      add_bos_ = it->get<bool>();
    }
    if (auto it = c.find("chat_template"); it != c.end()) {
      if (it->is_string()) {
        chat_template_ = it->get<std::string>();
      } else if (it->is_array()) {  // named templates: the one named "default"
        for (const nlohmann::json& named : *it) {
          if (named.is_object() && named.contains("name") && named["name"] == "default" &&
              named.contains("template") && named["template"].is_string()) {
            chat_template_ = named["template"].get<std::string>();
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::ReadGenerationConfig(const std::string& path) {
  absl::StatusOr<std::optional<nlohmann::json>> generation = ReadJson(fs::path(path));
  if (!generation.ok()) return generation.status();
  if (generation->has_value()) {
    const nlohmann::json& g = **generation;
    if (auto it = g.find("temperature"); it != g.end() && it->is_number()) {
      defaults_.temperature = it->get<float>();
    }
    if (auto it = g.find("top_p"); it != g.end() && it->is_number()) {
      defaults_.top_p = it->get<float>();
    }
    if (auto it = g.find("top_k"); it != g.end() && it->is_number_integer()) {
      defaults_.top_k = it->get<int32_t>();
    }
  }
  return absl::OkStatus();
}

void Tokenizer::CollectSpecials() {
  for (int id = 0; id < model_->PieceCount(); ++id) {
    if (model_->IsControl(id) && !model_->Piece(id).empty()) {
      specials_.emplace_back(model_->Piece(id), id);
    }
  }
  std::sort(specials_.begin(), specials_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [piece, id] : specials_) special_texts_.push_back(piece);
  for (int id = 0; id < model_->PieceCount(); ++id) {
    if (model_->IsUserDefined(id) && model_->Piece(id).size() > 1) {
      special_texts_.push_back(model_->Piece(id));
    }
  }
  std::stable_sort(special_texts_.begin(), special_texts_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
}

std::vector<int32_t> Tokenizer::Spell(std::string_view text) const {
  std::vector<int32_t> out;
  for (size_t i = 0; i < text.size();) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(text[i]));
    const int byte = model_->PieceId(name);
    if (model_->IsByte(byte)) {
      out.push_back(byte);
      ++i;
      continue;
    }
    size_t n = 1;
    while (i + n < text.size() && (text[i + n] & 0xC0) == 0x80) ++n;
    for (const int32_t id : Encode(text.substr(i, n), false)) out.push_back(id);
    i += n;
  }
  return out;
}

std::optional<std::string_view> Tokenizer::SpecialText(int32_t id) const {
  if (id < 0 || id >= model_->PieceCount()) return std::nullopt;
  if (!model_->IsControl(id) && !model_->IsUserDefined(id)) return std::nullopt;
  return std::string_view(model_->Piece(id));
}

std::vector<int32_t> Tokenizer::EncodeAsText(std::string_view text) const {
  // Encode never makes a control id from text; a user-defined piece it does match anywhere,
  // so each one is spelled out again.
  std::vector<int32_t> out;
  for (const int32_t id : Encode(text, /*add_bos=*/false)) {
    if (!model_->IsUserDefined(id)) {
      out.push_back(id);
      continue;
    }
    for (const int32_t spelled : Spell(model_->Piece(id))) out.push_back(spelled);
  }
  return out;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  std::vector<int> ids;
  // The library fails only on a model that did not load, which Load rules out.
  (void)model_->Encode(text, &ids);
  std::vector<int32_t> out;
  out.reserve(ids.size() + 1);
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  out.insert(out.end(), ids.begin(), ids.end());
  return out;
}

std::vector<int32_t> Tokenizer::EncodeWithSpecialTokens(std::string_view text) const {
  return EncodeWithSpecialTokens(text, {});
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < model_->PieceCount() && model_->IsControl(id);
}

std::vector<int32_t> Tokenizer::EncodeWithSpecialTokens(std::string_view text,
                                                        const std::set<size_t>& as_text) const {
  std::vector<int32_t> out;
  // Each control piece's next occurrence, searched again only once `at` has passed it, so the
  // text is scanned about once per piece however many pieces it holds.
  std::vector<size_t> next(specials_.size());
  for (size_t i = 0; i < specials_.size(); ++i) next[i] = text.find(specials_[i].first);
  size_t at = 0;
  while (at < text.size()) {
    // The earliest control piece from `at` (the longest where several start there).
    size_t best = std::string_view::npos;
    const std::pair<std::string, int32_t>* found = nullptr;
    for (size_t i = 0; i < specials_.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < at) {
        next[i] = text.find(specials_[i].first, at);
      }
      while (next[i] != std::string_view::npos && as_text.contains(next[i])) {
        next[i] = text.find(specials_[i].first, next[i] + 1);
      }
      if (next[i] < best) {
        best = next[i];
        found = &specials_[i];
      }
    }
    const std::string_view segment =
        text.substr(at, best == std::string_view::npos ? std::string_view::npos : best - at);
    if (!segment.empty()) {
      const std::vector<int32_t> ids = Encode(segment, /*add_bos=*/false);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (found == nullptr) break;
    out.push_back(found->second);
    at = best + found->first.size();
  }
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  // A model's vocabulary may be larger than its tokenizer's (padded for the GEMMs): ids past
  // the pieces have no text. The library would refuse the whole list for one of them.
  std::vector<int> known;
  known.reserve(ids.size());
  const int32_t pieces = model_->PieceCount();
  for (int32_t id : ids) {
    if (id >= 0 && id < pieces) known.push_back(id);
  }
  std::string text;
  if (!model_->Decode(known, &text).empty()) return "";
  return text;
}

std::string Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= model_->PieceCount()) return "";
  const std::string& piece = model_->Piece(id);
  if (model_->IsByte(id)) {  // "<0xE4>"
    return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  }
  if (model_->IsControl(id)) return piece;
  return absl::StrReplaceAll(piece, {{"\xE2\x96\x81", " "}});
}

std::optional<int32_t> Tokenizer::PieceId(std::string_view piece) const {
  const int id = model_->PieceId(piece);
  if (id < 0 || (model_->IsUnknown(id) && piece != model_->Piece(id))) return std::nullopt;
  return id;
}

int64_t Tokenizer::size() const {
  return model_->PieceCount();
}

}  // namespace baton::text

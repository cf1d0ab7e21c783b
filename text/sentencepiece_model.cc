// libbaton_sentencepiece.so: the one file that includes Debian's sentencepiece header (see
// sentencepiece_model.h). No Abseil header may be included here.
#include "sentencepiece_model.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>

namespace baton::text::internal {
namespace {

class Processor final : public SentencePieceModel {
 public:
  std::string Load(const std::string& path) override {
    const sentencepiece::util::Status status = processor_.Load(path);
    if (!status.ok()) return status.ToString();
    user_defined_ = UserDefinedPieces(processor_.serialized_model_proto());
    return "";
  }
  std::string Encode(std::string_view text, std::vector<int>* ids) const override {
    const sentencepiece::util::Status status = processor_.Encode(text, ids);
    return status.ok() ? "" : status.ToString();
  }
  std::string Decode(const std::vector<int>& ids, std::string* text) const override {
    const sentencepiece::util::Status status = processor_.Decode(ids, text);
    return status.ok() ? "" : status.ToString();
  }
  int PieceCount() const override { return processor_.GetPieceSize(); }
  bool IsUserDefined(int id) const override {
    return id >= 0 && static_cast<size_t>(id) < user_defined_.size() && user_defined_[id];
  }
  const std::string& Piece(int id) const override { return processor_.IdToPiece(id); }
  int PieceId(std::string_view piece) const override { return processor_.PieceToId(piece); }
  bool IsControl(int id) const override { return processor_.IsControl(id); }
  bool IsUnknown(int id) const override { return processor_.IsUnknown(id); }
  bool IsByte(int id) const override { return processor_.IsByte(id); }
  int BosId() const override { return processor_.bos_id(); }
  int EosId() const override { return processor_.eos_id(); }

 private:
  // Which pieces are USER_DEFINED (matched anywhere in text, like "<|im_start|>"): the library
  // has no accessor, so this reads the piece types from the model's own bytes (ModelProto
  // field 1, repeated SentencePiece; in each, field 3 is the type, 4 being USER_DEFINED).
  static std::vector<bool> UserDefinedPieces(const std::string& proto) {
    std::vector<bool> out;
    size_t at = 0;
    auto varint = [](const std::string& bytes, size_t& i, uint64_t& value) {
      value = 0;
      for (int shift = 0; i < bytes.size() && shift < 64; shift += 7) {
        const uint8_t b = static_cast<uint8_t>(bytes[i++]);
        value |= static_cast<uint64_t>(b & 0x7F) << shift;
        if ((b & 0x80) == 0) return true;
      }
      return false;
    };
    // Skips one field's value of wire type `type`; false on malformed bytes.
    auto skip = [&](const std::string& bytes, size_t& i, uint64_t type) {
      uint64_t n = 0;
      switch (type) {
        case 0: return varint(bytes, i, n);
        case 1: i += 8; return i <= bytes.size();
        case 5: i += 4; return i <= bytes.size();
        case 2:
          if (!varint(bytes, i, n) || n > bytes.size() - std::min(i, bytes.size())) return false;
          i += n;
          return true;
        default: return false;
      }
    };
    while (at < proto.size()) {
      uint64_t key = 0;
      if (!varint(proto, at, key)) break;
      if (key != ((1 << 3) | 2)) {
        if (!skip(proto, at, key & 7)) break;
        continue;
      }
      uint64_t length = 0;
      if (!varint(proto, at, length) || length > proto.size() - at) break;
      const std::string piece = proto.substr(at, length);
      at += length;
      uint64_t type = 1;  // NORMAL
      for (size_t i = 0; i < piece.size();) {
        uint64_t field = 0;
        if (!varint(piece, i, field)) break;
        if (field == ((3 << 3) | 0)) {
          if (!varint(piece, i, type)) break;
        } else if (!skip(piece, i, field & 7)) {
          break;
        }
      }
      out.push_back(type == 4);
    }
    return out;
  }

  sentencepiece::SentencePieceProcessor processor_;
  std::vector<bool> user_defined_;
};

}  // namespace
}  // namespace baton::text::internal

// The module's entry point (sentencepiece_loader.cc finds it with dlsym).
extern "C" baton::text::internal::SentencePieceModel* BatonNewSentencePieceModel() {
  return new baton::text::internal::Processor();
}

// libbaton_sentencepiece.so: the one file that includes Debian's sentencepiece header (see
// sentencepiece_model.h). No Abseil header may be included here.
#include "sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace baton::text::internal {
namespace {

class Processor final : public SentencePieceModel {
 public:
  std::string Load(const std::string& path) override {
    const sentencepiece::util::Status status = processor_.Load(path);
    return status.ok() ? "" : status.ToString();
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
  const std::string& Piece(int id) const override { return processor_.IdToPiece(id); }
  int PieceId(std::string_view piece) const override { return processor_.PieceToId(piece); }
  bool IsControl(int id) const override { return processor_.IsControl(id); }
  bool IsUnknown(int id) const override { return processor_.IsUnknown(id); }
  bool IsByte(int id) const override { return processor_.IsByte(id); }
  int BosId() const override { return processor_.bos_id(); }
  int EosId() const override { return processor_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace
}  // namespace baton::text::internal

// The module's entry point (sentencepiece_loader.cc finds it with dlsym).
extern "C" baton::text::internal::SentencePieceModel* BatonNewSentencePieceModel() {
  return new baton::text::internal::Processor();
}

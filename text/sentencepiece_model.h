// The SentencePiece processor, loaded as a module of its own (libbaton_sentencepiece.so).
//
// Debian's libsentencepiece carries its own copy of protobuf (3.14, "builtin_pb") and exports
// its symbols, while every baton binary links the system protobuf (3.21) through gRPC: in one
// symbol scope the two collide, and the library's generated code fails its version check. So
// the module that links libsentencepiece is opened with RTLD_DEEPBIND, which resolves its
// references (and the library's) within the module first, keeping the library on its own
// protobuf. The header also clashes with Debian's Abseil (it declares `namespace absl { using
// std::string_view; }`), another reason it is compiled only in the module
// (sentencepiece_model.cc), behind this std-only interface.
//
// Immutable after Load; its const methods are safe to call from many threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace baton::text::internal {

class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;

  // A new, empty processor from the module; null with `error` set when the module cannot be
  // loaded (beside the executable, else where the build wrote it).
  static std::unique_ptr<SentencePieceModel> Create(std::string* error);

  // Loads a serialized model file; "" on success, else the library's message.
  virtual std::string Load(const std::string& path) = 0;
  // Encodes UTF-8 text into piece ids; "" on success, else the library's message.
  virtual std::string Encode(std::string_view text, std::vector<int>* ids) const = 0;
  // Decodes ids (control pieces decode to nothing; an incomplete byte-fallback sequence to
  // U+FFFD); "" on success, else the library's message.
  virtual std::string Decode(const std::vector<int>& ids, std::string* text) const = 0;

  virtual int PieceCount() const = 0;
  // The piece as stored ("▁the", "<0xE4>", "<s>").
  virtual const std::string& Piece(int id) const = 0;
  virtual int PieceId(std::string_view piece) const = 0;  // the unknown id when absent
  virtual bool IsControl(int id) const = 0;
  // A USER_DEFINED piece ("<|im_start|>"): Encode matches its text wherever it occurs.
  virtual bool IsUserDefined(int id) const = 0;
  virtual bool IsUnknown(int id) const = 0;
  virtual bool IsByte(int id) const = 0;
  virtual int BosId() const = 0;  // -1 when the model has none
  virtual int EosId() const = 0;
};

}  // namespace baton::text::internal

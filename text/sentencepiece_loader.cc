// Opens libbaton_sentencepiece.so (see sentencepiece_model.h for why it is a module of its own).
#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "sentencepiece_model.h"

namespace baton::text::internal {
namespace {

// AddressSanitizer refuses RTLD_DEEPBIND; sanitized builds load the module plainly, which
// works in processes that do not also load the system protobuf (the tokenizer's own tests).
#if defined(__SANITIZE_ADDRESS__)
constexpr int kDeepBind = 0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

}  // namespace

std::unique_ptr<SentencePieceModel> SentencePieceModel::Create(std::string* error) {
  static void* handle = nullptr;
  static std::string load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::error_code ignored;
    const std::filesystem::path beside =
        std::filesystem::read_symlink("/proc/self/exe", ignored).parent_path() /
        std::filesystem::path(BATON_SENTENCEPIECE_MODULE).filename();
    for (const std::string& path : {beside.string(), std::string(BATON_SENTENCEPIECE_MODULE)}) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
      if (handle != nullptr) return;
      load_error = dlerror();
    }
  });
  using Entry = SentencePieceModel* (*)();
  Entry entry = handle == nullptr
                    ? nullptr
                    : reinterpret_cast<Entry>(dlsym(handle, "BatonNewSentencePieceModel"));
  if (entry == nullptr) {
    *error = "cannot load the SentencePiece module: " +
             (handle == nullptr ? load_error : std::string("no BatonNewSentencePieceModel"));
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(entry());
}

}  // namespace baton::text::internal

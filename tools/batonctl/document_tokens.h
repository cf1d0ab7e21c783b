// A text file as one token stream, the way `batonctl eval` and `approx-error --text` read it
// and tools/train/train.py writes its held-out text: each non-empty line is a document, encoded
// with bos first, and the documents follow one another.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "baton/text/tokenizer.h"

namespace baton::tools {

inline absl::StatusOr<std::vector<int32_t>> ReadDocumentTokens(const std::string& path,
                                                               const text::Tokenizer& tokenizer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--text: cannot read ", path));
  std::vector<int32_t> stream;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<int32_t> ids = tokenizer.Encode(line, /*add_bos=*/true);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  return stream;
}

}  // namespace baton::tools

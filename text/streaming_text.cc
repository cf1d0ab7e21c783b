#include "baton/text/streaming_text.h"

#include <algorithm>

namespace baton::text {
namespace {

// Prompt ids that seed the window: enough that the first new token's space and any
// multi-piece character at the prompt's end decode as they do in the full text.
constexpr size_t kContextIds = 6;
// The consumed ids before the window are dropped once there are this many.
constexpr size_t kTrimAt = 256;

bool EndsWithReplacement(const std::string& text) {
  return text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer,
                                               std::span<const int32_t> context)
    : tokenizer_(tokenizer) {
  const size_t keep = std::min(context.size(), kContextIds);
  ids_.assign(context.end() - static_cast<std::ptrdiff_t>(keep), context.end());
  read_offset_ = ids_.size();
}

std::string IncrementalDetokenizer::Next(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string before =
      tokenizer_.Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_));
  const std::string after = tokenizer_.Decode(all.subspan(prefix_offset_));
  if (after.size() <= before.size() || EndsWithReplacement(after) ||
      after.compare(0, before.size(), before) != 0) {
    return "";
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (prefix_offset_ >= kTrimAt) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return after.substr(before.size());
}

std::string IncrementalDetokenizer::Flush() {
  if (read_offset_ == ids_.size()) return "";
  const std::span<const int32_t> all(ids_);
  const std::string before =
      tokenizer_.Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_));
  const std::string after = tokenizer_.Decode(all.subspan(prefix_offset_));
  read_offset_ = ids_.size();
  if (after.size() <= before.size() || after.compare(0, before.size(), before) != 0) return "";
  return after.substr(before.size());
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

StopStrings::Step StopStrings::Push(std::string_view text) {
  Step step;
  held_.append(text);
  if (stops_.empty()) {
    step.text = std::move(held_);
    held_.clear();
    return step;
  }
  // The earliest stop string in what is held (held text never contains the start of a match
  // that began in text already shown: that text could not start one).
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at < first) {
      first = at;
      step.matched = stop;
    }
  }
  if (first != std::string::npos) {
    step.text = held_.substr(0, first);
    step.stopped = true;
    held_.clear();
    return step;
  }
  // Hold back the longest tail that is the start of some stop string. Stop strings are whole
  // UTF-8 text, so such a tail starts on a character boundary.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > hold; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  step.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return step;
}

std::string StopStrings::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace baton::text

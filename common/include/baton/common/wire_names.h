// The wire's split and transport by the names the flags take: "prefill-all" or
// "replay-on-decode" (model::SplitName names model::Split alike), "ucx" or "grpc".
#pragma once

#include "absl/strings/string_view.h"
#include "baton/v1/node.pb.h"

namespace baton {

absl::string_view SplitName(v1::Split split);
absl::string_view TransportName(v1::Transport transport);

}  // namespace baton

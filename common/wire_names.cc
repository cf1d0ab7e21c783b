#include "baton/common/wire_names.h"

namespace baton {

absl::string_view SplitName(v1::Split split) {
  return split == v1::SPLIT_REPLAY_ON_DECODE ? "replay-on-decode" : "prefill-all";
}

absl::string_view TransportName(v1::Transport transport) {
  return transport == v1::TRANSPORT_GRPC ? "grpc" : "ucx";
}

}  // namespace baton

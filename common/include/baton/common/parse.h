// Parsing of user-supplied text (command-line lists), with errors that name the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton {

// Parses "1,2,3" into integers. `field` names the input in error messages, e.g. "--chunks".
// Empty items, non-numbers and values out of int64 range are errors.
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, absl::string_view field);

// "host:port", with an IPv6 literal host in brackets ("[::1]:80"), as gRPC, civetweb and
// Kubernetes addresses write it.
std::string JoinHostPort(const std::string& host, int port);

}  // namespace baton

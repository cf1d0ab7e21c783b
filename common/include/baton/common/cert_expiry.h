// When the certificates a process serves with expire, as a metric:
// baton_certificate_expiry_timestamp_seconds{kind} (Unix seconds of the certificate's notAfter),
// read from the file at every scrape, so that a renewal cert-manager or an operator puts in place
// shows at the next scrape, and a renewal that never happens shows as a value approaching
// time() (the BatonCertificateExpiring alert). kind: "internal" (--tls-cert, mutual TLS between
// roles) or "client" (the router's --client-tls-cert: its gRPC client API and HTTPS front). A
// file that cannot be read or parsed is left out, and baton_certificate_unreadable{kind} is 1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/common/metrics.h"

namespace baton {

// The notAfter of the first certificate in the PEM file at `path`, in Unix seconds.
absl::StatusOr<int64_t> CertificateNotAfter(const std::string& path);

// Exports the expiry of each (kind, path) for as long as the returned collector lives.
std::shared_ptr<metrics::Collector> ExportCertificateExpiry(
    std::vector<std::pair<std::string, std::string>> files);

}  // namespace baton

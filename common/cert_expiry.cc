#include "baton/common/cert_expiry.h"

#include <openssl/asn1.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <ctime>

#include "absl/strings/str_cat.h"

namespace baton {

absl::StatusOr<int64_t> CertificateNotAfter(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  X509* cert = PEM_read_X509(file, nullptr, nullptr, nullptr);
  std::fclose(file);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no PEM certificate"));
  }
  std::tm tm{};
  const int parsed = ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm);
  X509_free(cert);
  if (parsed != 1) return absl::InvalidArgumentError(absl::StrCat(path, ": bad notAfter"));
  return static_cast<int64_t>(timegm(&tm));
}

std::shared_ptr<metrics::Collector> ExportCertificateExpiry(
    std::vector<std::pair<std::string, std::string>> files) {
  return metrics::AddCollector([files = std::move(files)] {
    std::vector<std::pair<std::map<std::string, std::string>, double>> expiry, unreadable;
    for (const auto& [kind, path] : files) {
      absl::StatusOr<int64_t> not_after = CertificateNotAfter(path);
      if (not_after.ok()) expiry.push_back({{{"kind", kind}}, static_cast<double>(*not_after)});
      unreadable.push_back({{{"kind", kind}}, not_after.ok() ? 0.0 : 1.0});
    }
    return std::vector<prometheus::MetricFamily>{
        metrics::GaugeFamily("baton_certificate_expiry_timestamp_seconds",
                             "notAfter of the certificate this process serves with (Unix "
                             "seconds), read from its file at each scrape",
                             expiry),
        metrics::GaugeFamily("baton_certificate_unreadable",
                             "1 when the certificate file cannot be read or parsed", unreadable)};
  });
}

}  // namespace baton

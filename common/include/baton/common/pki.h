// A throwaway certificate authority for one machine (`baton up`, tests): a CA and one
// certificate per role, made with OpenSSL. Each role certificate names its role in a URI SAN,
// spiffe://baton/<role> (security.h reads it back from the peer), and also carries
// DNS:localhost and IP:127.0.0.1 so that ordinary TLS clients verify a loopback server.
//
// Files in `dir`: ca.crt, ca.key and <role>.crt + <role>.key; keys are written 0600. In
// Kubernetes the same layout comes from cert-manager instead (docs/deploy.md).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace baton::pki {

// Creates `dir` and a new CA in it, replacing any there.
absl::Status MakeCertificateAuthority(const std::string& dir);

// Issues <role>.crt/.key in `dir`, signed by the CA in `dir`, for `uri` (the URI SAN; the
// role's SPIFFE id unless given). `days` of validity, starting an hour ago.
absl::Status IssueCertificate(const std::string& dir, const std::string& role,
                              const std::string& uri = "", int days = 365);

// The CA and one certificate per role of `roles`, unless `dir` already holds a CA and all of
// them (a restart keeps the certificates its clients were given).
absl::Status EnsureLocalPki(const std::string& dir, const std::vector<std::string>& roles);

// The roles `baton up` issues: router, prefill, decode, kvstore and client.
const std::vector<std::string>& LocalRoles();

}  // namespace baton::pki

// A throwaway certificate authority for one machine (`baton up`, tests): a CA and one
// certificate per role, made with OpenSSL. Each role certificate names its role in a URI SAN,
// spiffe://baton/<role> (security.h reads it back from the peer), and carries only the uses
// its role needs: the client role's is for TLS clients only (clientAuth); the servers' (router,
// prefill, decode, kvstore) for both ends; and only the router's, whose client API ordinary TLS
// clients reach by host name, also names DNS:localhost and IP:127.0.0.1 (the internal peers
// check each other's SPIFFE ids, not host names). So no node's key can pose as the router's
// client endpoint.
//
// One certificate per node (IssueNodeCertificate) names its node too,
// spiffe://baton/<role>/<instance>: the router binds a node_id to it (router/node_registry.h).
//
// Files in `dir`: ca.crt and <role>.crt + <role>.key; the CA's key in `dir`/ca/ca.key (the
// folder 0700), apart from the role keys; node certificates in `dir`/nodes/<instance>.crt +
// .key. Keys are created 0600 (O_CREAT | O_EXCL with the
// mode, then renamed into place). In Kubernetes the same layout comes from cert-manager instead
// (docs/deploy.md).
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

// Issues nodes/<instance>.crt/.key in `dir` for spiffe://baton/<role>/<instance>, signed by
// the CA in `dir`, replacing any there. INVALID_ARGUMENT naming `instance` unless it is 1 to 63
// letters, digits, '.', '_' or '-' (a SPIFFE path segment, and a pod's name).
absl::Status IssueNodeCertificate(const std::string& dir, const std::string& role,
                                  const std::string& instance, int days = 365);
// `dir`/nodes/<instance>: the stem of a node certificate's .crt and .key.
std::string NodeCertificateStem(const std::string& dir, const std::string& instance);

// The CA and one certificate per role of `roles`, unless `dir` already holds a CA and all of
// them (a restart keeps the certificates its clients were given).
absl::Status EnsureLocalPki(const std::string& dir, const std::vector<std::string>& roles);

// The roles `baton up` issues: router, prefill, decode, kvstore and client.
const std::vector<std::string>& LocalRoles();

}  // namespace baton::pki

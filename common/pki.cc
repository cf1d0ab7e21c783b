#include "baton/common/pki.h"

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "baton/common/security.h"

namespace baton::pki {
namespace {

namespace fs = std::filesystem;

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
  void operator()(FILE* p) const { std::fclose(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Free>;
using Cert = std::unique_ptr<X509, Free>;

absl::Status OpenSslError(const std::string& what) {
  return absl::InternalError(absl::StrCat("OpenSSL: cannot ", what));
}

// Writes `path` through a new file created with `mode` from the start (O_CREAT | O_EXCL: never
// another file's, never readable by others for a moment), then renamed over `path`; every step's
// failure is returned.
template <typename WriteFn>
absl::Status WritePem(const fs::path& path, mode_t mode, WriteFn write) {
  const fs::path partial = absl::StrCat(path.string(), ".partial.", security::RandomId());
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", partial.string(), ": ", std::strerror(errno)));
  }
  std::unique_ptr<FILE, Free> file(::fdopen(fd, "w"));
  if (file == nullptr) {
    ::close(fd);
    ::unlink(partial.c_str());
    return absl::UnavailableError(absl::StrCat("cannot write ", partial.string()));
  }
  const bool written = write(file.get()) == 1 && std::fflush(file.get()) == 0 &&
                       ::fsync(::fileno(file.get())) == 0;
  const bool closed = std::fclose(file.release()) == 0;
  if (!written || !closed) {
    ::unlink(partial.c_str());
    return written ? absl::UnavailableError(absl::StrCat("cannot write ", path.string()))
                   : OpenSslError(absl::StrCat("write ", path.string()));
  }
  std::error_code error;
  fs::rename(partial, path, error);
  if (error) {
    ::unlink(partial.c_str());
    return absl::UnavailableError(
        absl::StrCat("cannot write ", path.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteKeyAndCert(const fs::path& key_dir, const fs::path& cert_dir,
                             const std::string& name, EVP_PKEY* key, X509* cert) {
  if (absl::Status s = WritePem(key_dir / (name + ".key"), 0600,
                                [&](FILE* f) {
                                  return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr,
                                                              nullptr);
                                });
      !s.ok()) {
    return s;
  }
  return WritePem(cert_dir / (name + ".crt"), 0644,
                  [&](FILE* f) { return PEM_write_X509(f, cert); });
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("make extension ", value));
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return added == 1 ? absl::OkStatus() : OpenSslError("add an extension");
}

// A new certificate for `key` named `common_name`, valid for `days`; the caller adds
// extensions and signs.
absl::StatusOr<Cert> NewCertificate(EVP_PKEY* key, const std::string& common_name, int days) {
  Cert cert(X509_new());
  std::unique_ptr<BIGNUM, Free> serial(BN_new());
  if (cert == nullptr || serial == nullptr || BN_rand(serial.get(), 120, 0, 0) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr ||
      X509_set_version(cert.get(), 2) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), int64_t{days} * 86400) == nullptr ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("make a certificate");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("baton"), -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1) {
    return OpenSslError("name a certificate");
  }
  return cert;
}

// The CA's key lives apart from the role keys, in <dir>/ca/ (mode 0700); its certificate, which
// every peer and client trusts, in <dir>/ca.crt.
fs::path CaKeyDir(const fs::path& dir) { return dir / "ca"; }

// What a role's certificate may be used for: the roles that serve TLS (router, prefill, decode,
// kvstore) are servers and clients of each other; the client role only calls. Only the router
// serves clients that check host names (its client API), so only its certificate names
// localhost and 127.0.0.1; the internal peers check each other's SPIFFE ids instead.
struct Profile {
  const char* extended_key_usage;
  bool host_names;
};
Profile ProfileOf(const std::string& uri) {
  const std::optional<security::Role> role = security::RoleOfUri(uri);
  if (role == security::Role::kClient) return {"clientAuth", false};
  if (role == security::Role::kRouter) return {"serverAuth,clientAuth", true};
  return {"serverAuth,clientAuth", false};
}

absl::StatusOr<std::pair<Key, Cert>> ReadCa(const fs::path& dir) {
  std::unique_ptr<FILE, Free> key_file(std::fopen((CaKeyDir(dir) / "ca.key").c_str(), "r"));
  std::unique_ptr<FILE, Free> cert_file(std::fopen((dir / "ca.crt").c_str(), "r"));
  if (key_file == nullptr || cert_file == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no CA (ca/ca.key, ca.crt) in ", dir.string()));
  }
  Key key(PEM_read_PrivateKey(key_file.get(), nullptr, nullptr, nullptr));
  Cert cert(PEM_read_X509(cert_file.get(), nullptr, nullptr, nullptr));
  if (key == nullptr || cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unreadable CA in ", dir.string()));
  }
  return std::make_pair(std::move(key), std::move(cert));
}

}  // namespace

absl::Status MakeCertificateAuthority(const std::string& dir) {
  std::error_code error;
  fs::create_directories(CaKeyDir(dir), error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot create ", dir));
  if (::chmod(CaKeyDir(dir).c_str(), 0700) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot make ", CaKeyDir(dir).string(),
                                               " private: ", std::strerror(errno)));
  }
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("make a key");
  absl::StatusOr<Cert> cert = NewCertificate(key.get(), "baton CA", 3650);
  if (!cert.ok()) return cert.status();
  X509_set_issuer_name(cert->get(), X509_get_subject_name(cert->get()));
  for (const auto& [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                                   std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                                   std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(cert->get(), cert->get(), nid, value); !s.ok()) return s;
  }
  if (X509_sign(cert->get(), key.get(), EVP_sha256()) == 0) return OpenSslError("sign the CA");
  return WriteKeyAndCert(CaKeyDir(dir), dir, "ca", key.get(), cert->get());
}

namespace {

// A certificate for `uri` (the role's SPIFFE id unless given) signed by the CA in `dir`,
// written to `out_dir`/<name>.crt and .key.
absl::Status Issue(const fs::path& dir, const fs::path& out_dir, const std::string& name,
                   const std::string& role, const std::string& uri, int days) {
  absl::StatusOr<std::pair<Key, Cert>> ca = ReadCa(dir);
  if (!ca.ok()) return ca.status();
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("make a key");
  absl::StatusOr<Cert> cert = NewCertificate(key.get(), absl::StrCat("baton ", role), days);
  if (!cert.ok()) return cert.status();
  X509_set_issuer_name(cert->get(), X509_get_subject_name(ca->second.get()));
  const std::string id = uri.empty() ? security::RoleUri(role) : uri;
  const Profile profile = ProfileOf(id);
  const std::string san =
      absl::StrCat("URI:", id, profile.host_names ? ",DNS:localhost,IP:127.0.0.1" : "");
  for (const auto& [nid, value] :
       {std::pair<int, std::string>{NID_basic_constraints, "critical,CA:FALSE"},
        {NID_key_usage, "critical,digitalSignature,keyAgreement"},
        {NID_ext_key_usage, profile.extended_key_usage},
        {NID_subject_alt_name, san},
        {NID_authority_key_identifier, "keyid"}}) {
    if (absl::Status s = AddExtension(cert->get(), ca->second.get(), nid, value); !s.ok()) {
      return s;
    }
  }
  if (X509_sign(cert->get(), ca->first.get(), EVP_sha256()) == 0) {
    return OpenSslError(absl::StrCat("sign the ", role, " certificate"));
  }
  return WriteKeyAndCert(out_dir, out_dir, name, key.get(), cert->get());
}

fs::path NodeDir(const fs::path& dir) { return dir / "nodes"; }

}  // namespace

absl::Status IssueCertificate(const std::string& dir, const std::string& role,
                              const std::string& uri, int days) {
  return Issue(dir, dir, role, role, uri, days);
}

absl::Status IssueNodeCertificate(const std::string& dir, const std::string& role,
                                  const std::string& instance, int days) {
  const bool valid =
      !instance.empty() && instance.size() <= 63 &&
      std::all_of(instance.begin(), instance.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
      });
  if (!valid) {
    return absl::InvalidArgumentError(
        absl::StrCat("instance: '", instance,
                     "' must be 1 to 63 letters, digits, '.', '_' or '-' (a node's name)"));
  }
  std::error_code error;
  fs::create_directories(NodeDir(dir), error);
  if (error || ::chmod(NodeDir(dir).c_str(), 0700) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", NodeDir(dir).string()));
  }
  return Issue(dir, NodeDir(dir), instance, role, security::NodeUri(role, instance), days);
}

std::string NodeCertificateStem(const std::string& dir, const std::string& instance) {
  return (NodeDir(dir) / instance).string();
}

absl::Status EnsureLocalPki(const std::string& dir, const std::vector<std::string>& roles) {
  // A CA key left beside the role keys by an earlier baton moves to its own folder.
  if (fs::exists(fs::path(dir) / "ca.key") && !fs::exists(CaKeyDir(dir) / "ca.key")) {
    std::error_code error;
    fs::create_directories(CaKeyDir(dir), error);
    if (error || ::chmod(CaKeyDir(dir).c_str(), 0700) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot create ", CaKeyDir(dir).string()));
    }
    fs::rename(fs::path(dir) / "ca.key", CaKeyDir(dir) / "ca.key", error);
    if (error) {
      return absl::UnavailableError(absl::StrCat("cannot move the CA key into ",
                                                 CaKeyDir(dir).string(), ": ", error.message()));
    }
  }
  bool complete =
      fs::exists(fs::path(dir) / "ca.crt") && fs::exists(CaKeyDir(dir) / "ca.key");
  for (const std::string& role : roles) {
    complete = complete && fs::exists(fs::path(dir) / (role + ".crt")) &&
               fs::exists(fs::path(dir) / (role + ".key"));
  }
  if (complete) return absl::OkStatus();
  if (absl::Status s = MakeCertificateAuthority(dir); !s.ok()) return s;
  for (const std::string& role : roles) {
    if (absl::Status s = IssueCertificate(dir, role); !s.ok()) return s;
  }
  return absl::OkStatus();
}

const std::vector<std::string>& LocalRoles() {
  static const std::vector<std::string> roles = {"router", "prefill", "decode", "kvstore",
                                                 "client"};
  return roles;
}

}  // namespace baton::pki

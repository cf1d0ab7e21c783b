#include "baton/common/pki.h"

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <memory>

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

// Writes through a file created with `mode`, so a key is never readable by others.
template <typename WriteFn>
absl::Status WritePem(const fs::path& path, mode_t mode, WriteFn write) {
  const fs::path partial = path.string() + ".partial";
  std::unique_ptr<FILE, Free> file(std::fopen(partial.c_str(), "w"));
  if (file == nullptr) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  chmod(partial.c_str(), mode);
  if (write(file.get()) != 1) return OpenSslError(absl::StrCat("write ", path.string()));
  file.reset();
  std::error_code error;
  fs::rename(partial, path, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

absl::Status WriteKeyAndCert(const fs::path& dir, const std::string& name, EVP_PKEY* key,
                             X509* cert) {
  if (absl::Status s = WritePem(dir / (name + ".key"), 0600,
                                [&](FILE* f) {
                                  return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr,
                                                              nullptr);
                                });
      !s.ok()) {
    return s;
  }
  return WritePem(dir / (name + ".crt"), 0644, [&](FILE* f) { return PEM_write_X509(f, cert); });
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

absl::StatusOr<std::pair<Key, Cert>> ReadCa(const fs::path& dir) {
  std::unique_ptr<FILE, Free> key_file(std::fopen((dir / "ca.key").c_str(), "r"));
  std::unique_ptr<FILE, Free> cert_file(std::fopen((dir / "ca.crt").c_str(), "r"));
  if (key_file == nullptr || cert_file == nullptr) {
    return absl::NotFoundError(absl::StrCat("no CA (ca.key, ca.crt) in ", dir.string()));
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
  fs::create_directories(dir, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot create ", dir));
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
  return WriteKeyAndCert(dir, "ca", key.get(), cert->get());
}

absl::Status IssueCertificate(const std::string& dir, const std::string& role,
                              const std::string& uri, int days) {
  absl::StatusOr<std::pair<Key, Cert>> ca = ReadCa(dir);
  if (!ca.ok()) return ca.status();
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("make a key");
  absl::StatusOr<Cert> cert = NewCertificate(key.get(), absl::StrCat("baton ", role), days);
  if (!cert.ok()) return cert.status();
  X509_set_issuer_name(cert->get(), X509_get_subject_name(ca->second.get()));
  const std::string san = absl::StrCat("URI:", uri.empty() ? security::RoleUri(role) : uri,
                                       ",DNS:localhost,IP:127.0.0.1");
  for (const auto& [nid, value] :
       {std::pair<int, std::string>{NID_basic_constraints, "critical,CA:FALSE"},
        {NID_key_usage, "critical,digitalSignature,keyAgreement"},
        {NID_ext_key_usage, "serverAuth,clientAuth"},
        {NID_subject_alt_name, san},
        {NID_authority_key_identifier, "keyid"}}) {
    if (absl::Status s = AddExtension(cert->get(), ca->second.get(), nid, value); !s.ok()) {
      return s;
    }
  }
  if (X509_sign(cert->get(), ca->first.get(), EVP_sha256()) == 0) {
    return OpenSslError(absl::StrCat("sign the ", role, " certificate"));
  }
  return WriteKeyAndCert(dir, role, key.get(), cert->get());
}

absl::Status EnsureLocalPki(const std::string& dir, const std::vector<std::string>& roles) {
  bool complete = fs::exists(fs::path(dir) / "ca.crt") && fs::exists(fs::path(dir) / "ca.key");
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

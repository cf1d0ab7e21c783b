// The throwaway PKI (common/pki.h): keys created 0600 from the start and the CA's key apart in
// ca/ (0700); each role's certificate carries only the uses and names its role needs; an old
// layout's CA key moves; a write that cannot happen is an error, not a crash.
#include "baton/common/pki.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::pki {
namespace {

namespace fs = std::filesystem;

mode_t ModeOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

struct CertificateUses {
  bool server = false, client = false;
  std::string names;  // the SANs, "URI:...,IP:...,DNS:..."
};
CertificateUses UsesOf(const fs::path& path) {
  CertificateUses uses;
  FILE* file = std::fopen(path.c_str(), "r");
  EXPECT_NE(file, nullptr) << path;
  if (file == nullptr) return uses;
  X509* cert = PEM_read_X509(file, nullptr, nullptr, nullptr);
  std::fclose(file);
  EXPECT_NE(cert, nullptr) << path;
  if (cert == nullptr) return uses;
  const uint32_t xku = X509_get_extended_key_usage(cert);
  uses.server = (xku & XKU_SSL_SERVER) != 0;
  uses.client = (xku & XKU_SSL_CLIENT) != 0;
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type == GEN_URI) {
      uses.names += "URI:" + std::string(reinterpret_cast<const char*>(
                                             ASN1_STRING_get0_data(name->d.uniformResourceIdentifier)));
    } else if (name->type == GEN_DNS) {
      uses.names += "DNS:" + std::string(reinterpret_cast<const char*>(
                                             ASN1_STRING_get0_data(name->d.dNSName)));
    } else if (name->type == GEN_IPADD) {
      uses.names += "IP";
    }
    uses.names += ",";
  }
  GENERAL_NAMES_free(names);
  X509_free(cert);
  return uses;
}

TEST(PkiTest, KeysArePrivateFromTheStartAndTheCaKeyIsApart) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "pki";
  const mode_t old = umask(0);  // the modes must come from the code, not the umask
  ASSERT_TRUE(EnsureLocalPki(dir.string(), LocalRoles()).ok());
  umask(old);
  EXPECT_FALSE(fs::exists(dir / "ca.key"));
  EXPECT_EQ(ModeOf(dir / "ca"), 0700u);
  EXPECT_EQ(ModeOf(dir / "ca" / "ca.key"), 0600u);
  EXPECT_EQ(ModeOf(dir / "ca.crt"), 0644u);
  for (const std::string& role : LocalRoles()) {
    EXPECT_EQ(ModeOf(dir / (role + ".key")), 0600u) << role;
    EXPECT_EQ(ModeOf(dir / (role + ".crt")), 0644u) << role;
  }
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".partial"), std::string::npos) << entry.path();
  }
}

TEST(PkiTest, EachRoleCertificateCarriesOnlyWhatItsRoleNeeds) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "roles";
  ASSERT_TRUE(EnsureLocalPki(dir.string(), LocalRoles()).ok());
  // Only the router serves clients that check host names (its client API).
  const CertificateUses router = UsesOf(dir / "router.crt");
  EXPECT_TRUE(router.server && router.client);
  EXPECT_EQ(router.names, "URI:spiffe://baton/router,DNS:localhost,IP,");
  for (const char* role : {"prefill", "decode", "kvstore"}) {
    const CertificateUses node = UsesOf(dir / (std::string(role) + ".crt"));
    EXPECT_TRUE(node.server && node.client) << role;
    EXPECT_EQ(node.names, "URI:spiffe://baton/" + std::string(role) + ",") << role;
  }
  // The client role calls; it cannot serve, so it cannot pose as any endpoint.
  const CertificateUses client = UsesOf(dir / "client.crt");
  EXPECT_FALSE(client.server);
  EXPECT_TRUE(client.client);
  EXPECT_EQ(client.names, "URI:spiffe://baton/client,");
  // A per-pod identity gets its role's profile.
  ASSERT_TRUE(IssueCertificate(dir.string(), "prefill-7", "spiffe://baton/prefill/7").ok());
  EXPECT_EQ(UsesOf(dir / "prefill-7.crt").names, "URI:spiffe://baton/prefill/7,");
}

// One certificate per node names it (spiffe://baton/<role>/<instance>) under nodes/, with its
// role's uses and a private key; an instance that is no SPIFFE path segment is refused by name.
TEST(PkiTest, ANodeCertificateNamesItsNode) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "nodes";
  ASSERT_TRUE(EnsureLocalPki(dir.string(), LocalRoles()).ok());
  ASSERT_TRUE(IssueNodeCertificate(dir.string(), "prefill", "prefill-1").ok());
  const std::string stem = NodeCertificateStem(dir.string(), "prefill-1");
  EXPECT_EQ(stem, (dir / "nodes" / "prefill-1").string());
  const CertificateUses node = UsesOf(stem + ".crt");
  EXPECT_TRUE(node.server && node.client);
  EXPECT_EQ(node.names, "URI:spiffe://baton/prefill/prefill-1,");
  EXPECT_EQ(ModeOf(stem + ".key"), 0600u);
  for (const char* bad : {"", "a/b", "pod name", "../ca"}) {
    const absl::Status refused = IssueNodeCertificate(dir.string(), "prefill", bad);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("instance: '")) << bad;
  }
}

TEST(PkiTest, AnEarlierLayoutsCaKeyMovesApartAndTheCaIsKept) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "old";
  ASSERT_TRUE(EnsureLocalPki(dir.string(), {"router"}).ok());
  const std::string ca = [&] {
    std::ifstream in(dir / "ca.crt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  fs::rename(dir / "ca" / "ca.key", dir / "ca.key");  // as an earlier baton left it
  fs::remove(dir / "ca");
  ASSERT_TRUE(EnsureLocalPki(dir.string(), {"router"}).ok());
  EXPECT_FALSE(fs::exists(dir / "ca.key"));
  EXPECT_EQ(ModeOf(dir / "ca" / "ca.key"), 0600u);
  std::ifstream in(dir / "ca.crt");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), ca);  // clients keep trusting
  EXPECT_TRUE(IssueCertificate(dir.string(), "decode").ok());
}

TEST(PkiTest, AWriteThatCannotHappenIsAnError) {
  const fs::path file = fs::path(testing::ProcessTempDir()) / "a-file";
  std::ofstream(file) << "not a folder";
  const absl::Status status = EnsureLocalPki((file / "pki").string(), {"router"});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), ::testing::HasSubstr("cannot create"));
  // Issuing without a CA names what is missing.
  EXPECT_EQ(IssueCertificate((fs::path(testing::ProcessTempDir()) / "empty").string(), "router")
                .code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace baton::pki

#include "client.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "baton/common/security.h"

namespace baton::tools {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

void AddClientFlags(CLI::App& command, ClientOptions& options) {
  command.add_option("--addr", options.addr, "Router address host:port")->required();
  command.add_option("--ca", options.ca, "PEM CA of the router's TLS certificate (enables TLS)");
  command.add_option("--cert", options.cert, "PEM client certificate, when the router asks");
  command.add_option("--key", options.key, "PEM private key of --cert");
  command.add_option("--api-key", options.api_key, "API key (default: $BATON_API_KEY)")
      ->envname("BATON_API_KEY");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ClientChannel(const ClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = ReadPem(options.ca, "--ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (options.cert.empty() != options.key.empty()) {
      return absl::InvalidArgumentError("--cert and --key: give both or neither");
    }
    if (!options.cert.empty()) {
      absl::StatusOr<std::string> cert = ReadPem(options.cert, "--cert");
      absl::StatusOr<std::string> key = ReadPem(options.key, "--key");
      if (!cert.ok()) return cert.status();
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
  } else if (!options.cert.empty() || !options.key.empty()) {
    return absl::InvalidArgumentError("--cert and --key: need --ca (TLS)");
  }
  return grpc::CreateCustomChannel(options.addr, credentials, security::ClientChannelArguments());
}

void Authenticate(const ClientOptions& options, grpc::ClientContext& context) {
  if (!options.api_key.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options.api_key));
  }
}

}  // namespace baton::tools

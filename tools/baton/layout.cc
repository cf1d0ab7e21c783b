#include "baton/launcher/layout.h"

#include <system_error>

#include "absl/strings/str_cat.h"
#include "baton/common/pki.h"

namespace baton::launcher {

namespace fs = std::filesystem;

std::string Layout::RunFile(const std::string& name, const std::string& extension) const {
  return (run() / (name + extension)).string();
}

std::vector<fs::path> Layout::ShippedPlaces(const std::string& what) const {
  return {bin.parent_path() / what, bin.parent_path() / "share" / "baton" / what, bin / what};
}

std::string Layout::Program(const std::string& name) const {
  for (const fs::path& p :
       {bin / name, bin.parent_path() / "router" / name, bin.parent_path() / "prefill_node" / name,
        bin.parent_path() / "decode_node" / name, bin.parent_path() / "kvstore" / name}) {
    if (fs::exists(p)) return p.string();
  }
  return (bin / name).string();
}

absl::StatusOr<Layout> MakeLayout(const std::string& data_dir) {
  std::error_code error;
  fs::create_directories(fs::path(data_dir) / "run", error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", data_dir, ": ", error.message()));
  }
  return Layout{fs::canonical("/proc/self/exe").parent_path(), fs::path(data_dir)};
}

void ClearRunFiles(const Layout& layout) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(layout.run(), error)) {
    const std::string extension = entry.path().extension().string();
    if (extension == ".addr" || extension == ".metrics") fs::remove(entry.path(), error);
  }
}

absl::Status MakeClusterPki(const Layout& layout, const std::vector<NodeName>& nodes) {
  const std::string tls = layout.tls().string();
  absl::Status made = pki::EnsureLocalPki(tls, pki::LocalRoles());
  // Issued at every start: cheap, and always signed by the CA that is there now.
  for (size_t i = 0; made.ok() && i < nodes.size(); ++i) {
    made = pki::IssueNodeCertificate(tls, nodes[i].role, nodes[i].name);
  }
  if (!made.ok()) {
    return absl::AbortedError(
        absl::StrCat("cannot make the certificates in ", tls, ": ", made.message()));
  }
  return absl::OkStatus();
}

}  // namespace baton::launcher

// Where `baton up` finds what ships with it (the other binaries, the trained models, the
// tokenizer) and the files it keeps under --data-dir:
//   run/<name>.addr     a child's address, written by the child once it serves (its ready file)
//   run/<name>.metrics  a child's Prometheus address
//   tls/                the cluster's throwaway CA and role certificates, and in tls/nodes/
//                       one certificate per node (baton/common/pki.h)
//   kvstore/            the prefix store's RocksDB
//   model[-<preset>]/   a generated preset
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::launcher {

struct Layout {
  std::filesystem::path bin;       // the folder of the running `baton` binary
  std::filesystem::path data_dir;  // --data-dir

  std::filesystem::path run() const { return data_dir / "run"; }
  std::filesystem::path tls() const { return data_dir / "tls"; }
  // run/<name><extension>: ReadyFile("decode-1") is run/decode-1.addr.
  std::string RunFile(const std::string& name, const std::string& extension) const;
  std::string ReadyFile(const std::string& name) const { return RunFile(name, ".addr"); }
  std::string MetricsFile(const std::string& name) const { return RunFile(name, ".metrics"); }

  // The folders `what` ("models", "tokenizer") that ships with baton is looked for in, in
  // order: the build tree (build/tools/baton finds build/<what>; build/models links to the
  // source's models/), an installed layout (bin/../share/baton/<what>), beside the binary.
  std::vector<std::filesystem::path> ShippedPlaces(const std::string& what) const;

  // The path of the baton binary `name` ("baton-router"): installed side by side, or in the
  // build tree's folders; bin/<name> when it is in none of them.
  std::string Program(const std::string& name) const;
};

// Creates <data-dir>/run and finds the running binary's folder. INVALID_ARGUMENT when the
// data dir cannot be created.
absl::StatusOr<Layout> MakeLayout(const std::string& data_dir);

// Removes an earlier run's ready and metrics files, so that every wait reads this run's.
void ClearRunFiles(const Layout& layout);

// A node `baton up` starts: its role and its name (the node_id it registers, and its
// certificate's instance: spiffe://baton/<role>/<name>).
struct NodeName {
  std::string role, name;
};

// The cluster's CA and one certificate per role under tls/; an earlier run's are kept when
// complete, so that clients given its CA still trust the router. Then a new certificate for
// each of `nodes` under tls/nodes/, so that no node can speak for another. ABORTED naming the
// folder when they cannot be made.
absl::Status MakeClusterPki(const Layout& layout, const std::vector<NodeName>& nodes);

}  // namespace baton::launcher

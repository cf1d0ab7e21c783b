// The command line of each process `baton up` starts: baton-router, baton-kvstore, and the
// baton-decode and baton-prefill nodes, on loopback. Every child gets, after its own flags:
// mutual TLS inside the cluster with its own certificate (a node's names it,
// spiffe://baton/<role>/<name>; the router's its role) or --insecure-internal, its
// metrics on any free port (the address written to run/<name>.metrics), the log format, its
// ready file run/<name>.addr, --config when given (the flags set here win over the file), and
// last the --set settings of its role.
// The router and every node serve the model under one name (ServedModel::name_flags).
#pragma once

#include <string>
#include <vector>

#include "baton/launcher/launch_options.h"
#include "baton/launcher/layout.h"
#include "baton/launcher/model_source.h"

namespace baton::launcher {

struct ChildCommand {
  std::string name;     // the node id and the stem of its run files ("prefill-1")
  std::string program;  // the binary's path
  std::vector<std::string> args;
  std::string ready_file;  // run/<name>.addr: the child writes its "host:port" there once serving
  // NAME=VALUE: set for this child beside baton up's own environment (over a NAME it has).
  std::vector<std::string> env;
};

// The router's ready files beside router.addr (its client API): its internal API, which the
// nodes and the kvstore register with, and its HTTP API.
inline constexpr char kRouterInternal[] = "router-internal";
inline constexpr char kRouterHttp[] = "router-http";

// The first node of a role keeps the plain name ("prefill", "decode"); the others are
// numbered ("prefill-1", ...).
std::string InstanceName(const std::string& role, int i);

// Holds references: `options`, `layout` and `model` outlive it.
class ChildCommands {
 public:
  ChildCommands(const LaunchOptions& options, const Layout& layout, const ServedModel& model)
      : options_(options), layout_(layout), model_(model) {}

  ChildCommand Router() const;
  // `router_internal`: the router's internal address.
  // Store node `i`: "kvstore", "kvstore-1", ..., under <data-dir>/<its name>.
  ChildCommand Kvstore(int i, const std::string& router_internal) const;
  ChildCommand Decode(int i, const std::string& router_internal) const;
  ChildCommand Prefill(int i, const std::string& router_internal, const std::string& kvstore) const;

 private:
  // What both node roles are told about the model beyond its directory: the CUDA prefill
  // attention kernel when --cuda-prefill-attention was given, and the served name.
  void AppendModelFlags(std::vector<std::string>& args) const;
  // A model node's thread team of --threads-per-node threads, when given.
  void AppendTeamSize(ChildCommand& command) const;
  // Appends the flags every child gets to `args`; `role` names the binary (baton-<role>) and
  // the certificate.
  ChildCommand Make(const std::string& name, const std::string& role,
                    std::vector<std::string> args) const;
  std::vector<std::string> IdentityFlags(const std::string& name, const std::string& role) const;

  const LaunchOptions& options_;
  const Layout& layout_;
  const ServedModel& model_;
};

}  // namespace baton::launcher

// Several hosts on one machine, for fault tests: a private network of Linux network
// namespaces that the test makes and removes itself. Each member ("router", "decode-a", ...)
// gets its own namespace with one interface, eth0, joined by a veth pair to a bridge in a hub
// namespace; addresses are 10.211.0.<n>/24. Nothing is connected to the host's namespace, so
// all traffic stays inside namespaces the test made. Faults act on the hub's end of a
// member's link: cut it (link down), or slow it (tc netem delay, or tbf rate limiting where
// the kernel has no netem).
//
// The test process itself joins the "client" member (Join), so its gRPC channels reach the
// others; binaries start inside their member through `ip netns exec`. Needs root and `ip`;
// Available() says why not otherwise.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "spawn.h"

extern char** environ;

namespace baton::testing {

// The `ip` binary's path ("" when missing).
inline std::string IpPath() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// Runs a command (argv[0] a path or a name on PATH), its output discarded; its exit status.
inline int RunQuiet(const std::vector<std::string>& args) {
  const pid_t pid = Spawn(args);
  if (pid < 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class Netns {
 public:
  // Whether this machine can make the network; `why` says what is missing.
  static bool Available(std::string* why) {
    if (geteuid() != 0) {
      *why = "network namespaces need root";
      return false;
    }
    if (IpPath().empty()) {
      *why = "no `ip` (iproute2)";
      return false;
    }
    return true;
  }

  // Names start with `prefix` (keep it short: interface names are at most 15 bytes).
  explicit Netns(std::string prefix) : prefix_(std::move(prefix)), ip_(IpPath()) {
    ok_ = Ip({"netns", "add", Hub()}) == 0 &&
          Ip({"-n", Hub(), "link", "add", "br0", "type", "bridge"}) == 0 &&
          Ip({"-n", Hub(), "link", "set", "br0", "up"}) == 0;
  }
  ~Netns() {
    for (const auto& [member, n] : members_) Ip({"netns", "del", Ns(member)});
    Ip({"netns", "del", Hub()});
  }
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  bool ok() const { return ok_; }

  // Adds `member` as 10.211.0.<members + 2>; false if a step failed.
  bool Add(const std::string& member) {
    const int n = static_cast<int>(members_.size()) + 2;
    members_[member] = n;
    const std::string ns = Ns(member), link = Link(member);
    const std::string address = "10.211.0." + std::to_string(n);
    const bool ok = ok_ && Ip({"netns", "add", ns}) == 0 &&
                    Ip({"-n", Hub(), "link", "add", link, "type", "veth", "peer", "name", "eth0",
                        "netns", ns}) == 0 &&
                    Ip({"-n", Hub(), "link", "set", link, "master", "br0"}) == 0 &&
                    Ip({"-n", Hub(), "link", "set", link, "up"}) == 0 &&
                    Ip({"-n", ns, "addr", "add", address + "/24", "dev", "eth0"}) == 0 &&
                    Ip({"-n", ns, "link", "set", "eth0", "up"}) == 0 &&
                    Ip({"-n", ns, "link", "set", "lo", "up"}) == 0;
    addresses_[member] = address;
    return ok;
  }
  std::string Ns(const std::string& member) const { return prefix_ + "-" + member; }
  std::string Address(const std::string& member) const { return addresses_.at(member); }

  // Moves the calling thread (and every thread it starts later) into `member`'s namespace.
  // Call before anything starts threads that open sockets (gRPC).
  bool Join(const std::string& member) const {
    const int fd = open(("/run/netns/" + Ns(member)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = setns(fd, CLONE_NEWNET) == 0;
    close(fd);
    return ok;
  }

  // The arguments that run `program` inside `member`'s namespace.
  std::vector<std::string> Exec(const std::string& member) const {
    return {ip_, "netns", "exec", Ns(member)};
  }

  // Cuts `member` off the network (its link goes down at the hub; its process sees no error,
  // as when a cable or a switch port fails), and brings it back.
  bool Cut(const std::string& member) {
    return Ip({"-n", Hub(), "link", "set", Link(member), "down"}) == 0;
  }
  bool Restore(const std::string& member) {
    return Ip({"-n", Hub(), "link", "set", Link(member), "up"}) == 0;
  }

  // Slows traffic to and from `member`: netem delay of `delay_ms` each way where the kernel
  // has netem, else a tbf rate limit of 1 Mbit/s each way. `how` says which.
  bool Slow(const std::string& member, int delay_ms, std::string* how) {
    const std::string delay = std::to_string(delay_ms) + "ms";
    if (Tc(Hub(), Link(member), {"netem", "delay", delay}) &&
        Tc(Ns(member), "eth0", {"netem", "delay", delay})) {
      *how = "netem delay " + delay + " each way";
      return true;
    }
    const std::vector<std::string> tbf = {"tbf", "rate", "1mbit", "burst", "16kb", "latency", "5s"};
    if (Tc(Hub(), Link(member), tbf) && Tc(Ns(member), "eth0", tbf)) {
      *how = "tbf rate 1 Mbit/s each way (this kernel has no netem)";
      return true;
    }
    return false;
  }

 private:
  std::string Hub() const { return prefix_ + "-hub"; }
  // The hub's end of `member`'s veth pair.
  std::string Link(const std::string& member) const {
    return prefix_ + "v" + std::to_string(members_.at(member));
  }
  int Ip(std::vector<std::string> args) const {
    args.insert(args.begin(), ip_);
    return RunQuiet(args);
  }
  bool Tc(const std::string& ns, const std::string& dev, std::vector<std::string> qdisc) const {
    std::vector<std::string> args = {ip_,     "netns",   "exec", ns,  "tc",
                                     "qdisc", "replace", "dev",  dev, "root"};
    args.insert(args.end(), qdisc.begin(), qdisc.end());
    return RunQuiet(args) == 0;
  }

  std::string prefix_;
  std::string ip_;
  bool ok_ = false;
  std::map<std::string, int> members_;
  std::map<std::string, std::string> addresses_;
};

}  // namespace baton::testing

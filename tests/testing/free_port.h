// Ports on 127.0.0.1 for tests: a free one for a server a test starts later, and a listener
// that tells whether anything has connected to it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace baton::testing {

// A free port (bound and released: nothing listens there until then), or -1 when none could
// be bound.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(address.sin_port);
}

// A TCP listener on a free port that accepts nothing: what a client does to it before any call
// shows whether the client connects ahead of its first call.
class Listener {
 public:
  Listener() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0 &&
        listen(fd_, 4) == 0) {
      port_ = ntohs(address.sin_port);
    }
  }
  ~Listener() {
    if (fd_ >= 0) close(fd_);
  }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  bool ok() const { return port_ > 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Whether a connection waits to be accepted within `within`.
  bool Connected(std::chrono::milliseconds within) const {
    pollfd waiting{.fd = fd_, .events = POLLIN, .revents = 0};
    return poll(&waiting, 1, static_cast<int>(within.count())) == 1;
  }

 private:
  int fd_;
  int port_ = 0;
};

}  // namespace baton::testing

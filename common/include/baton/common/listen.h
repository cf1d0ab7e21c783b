// Listening on a host the operator gives, for the servers baton runs on Boost.Asio (the
// router's HTTP front, every binary's /metrics): "::" is every address, IPv6 and IPv4 (one
// socket with IPV6_V6ONLY off), and where the kernel has no IPv6 it is every IPv4 address; an
// IPv6 literal is that address alone.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/socket_base.hpp>
#include <boost/system/error_code.hpp>

namespace baton {

// Opens, binds and listens `acceptor` on `address`:`port`; the error of the last try, closed
// on failure.
inline boost::system::error_code Listen(boost::asio::ip::tcp::acceptor& acceptor,
                                        const boost::asio::ip::address& address,
                                        unsigned short port) {
  namespace net = boost::asio;
  using tcp = net::ip::tcp;
  auto try_bind = [&](const tcp::endpoint& endpoint) {
    boost::system::error_code ec;
    acceptor.open(endpoint.protocol(), ec);
    if (!ec && endpoint.address().is_v6()) {
      acceptor.set_option(net::ip::v6_only(!endpoint.address().to_v6().is_unspecified()), ec);
    }
    if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      boost::system::error_code ignored;
      acceptor.close(ignored);
    }
    return ec;
  };
  boost::system::error_code ec = try_bind(tcp::endpoint(address, port));
  if (ec && address.is_v6() && address.to_v6().is_unspecified()) {
    ec = try_bind(tcp::endpoint(tcp::v4(), port));
  }
  return ec;
}

}  // namespace baton

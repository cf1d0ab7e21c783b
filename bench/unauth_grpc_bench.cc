// The unauthenticated-gRPC figure of bench/run_security_bench.sh: N concurrent Generate calls,
// each on its own connection, whose message carries a cache_salt of BYTES bytes (a valid
// GenerateRequest in shape); odd calls send a wrong API key, even ones none. Prints each call's
// status code and the start of its message, one line per call, for the script to count.
//
//   baton_unauth_grpc_bench ADDRESS N BYTES
#include <future>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace {

// GenerateRequest field 8 (cache_salt), length-delimited, as its wire bytes.
std::string SaltOnlyRequest(size_t bytes) {
  std::string payload = "\x42";
  for (size_t v = bytes;; v >>= 7) {
    if (v < 0x80) {
      payload += static_cast<char>(v);
      break;
    }
    payload += static_cast<char>((v & 0x7f) | 0x80);
  }
  payload.append(bytes, 'x');
  return payload;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: baton_unauth_grpc_bench ADDRESS N BYTES\n";
    return 2;
  }
  const std::string address = argv[1];
  const int n = std::stoi(argv[2]);
  const std::string payload = SaltOnlyRequest(std::stoul(argv[3]));
  grpc::Slice slice(payload);
  const grpc::ByteBuffer request(&slice, 1);
  std::vector<grpc::Status> statuses(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      if (i % 2 == 1) context.AddMetadata("authorization", "Bearer key-nobody-was-given-0000");
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      grpc::ByteBuffer response;
      std::promise<grpc::Status> done;
      stub.UnaryCall(&context, "/baton.v1.Generation/Generate", grpc::StubOptions(), &request,
                     &response, [&](grpc::Status s) { done.set_value(s); });
      statuses[i] = done.get_future().get();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const grpc::Status& s : statuses) {
    std::cout << s.error_code() << " " << s.error_message().substr(0, 60) << "\n";
  }
  return 0;
}

# baton's container image: the binaries the Helm chart (helm/baton) runs, on Debian 12.
#
#   docker build -t baton:0.1.0 .
#
# The build stage runs the repository's own scripts/setup.sh (the Debian -dev packages and the
# CMake + Ninja build a developer machine gets); the runtime stage holds only the binaries and
# the shared libraries they load, and runs as the non-root user 10001 that the chart's
# securityContext names. /usr/local/bin: baton-router, baton-prefill, baton-decode,
# baton-kvstore, batonctl, baton.

FROM debian:bookworm-slim AS build
# Parallel compile jobs (each C++ job takes about 1 GiB of memory).
ARG BATON_JOBS=4
WORKDIR /src
COPY . .
# The image is CPU-only: nvcc is absent, and OFF says so instead of probing for it.
RUN BATON_WITH_CUDA=OFF BATON_JOBS="${BATON_JOBS}" BATON_BUILD_DIR=/src/build \
      bash scripts/setup.sh \
 && install -d /out/bin \
 && install -m 0755 \
      build/router/baton-router \
      build/prefill_node/baton-prefill \
      build/decode_node/baton-decode \
      build/kvstore/baton-kvstore \
      build/tools/batonctl \
      build/tools/baton \
      build/text/libbaton_sentencepiece.so \
      /out/bin/ \
 && install -d /out/share/baton/tokenizer \
 && install -m 0644 build/tokenizer/tokenizer.model build/tokenizer/tokenizer_config.json \
      build/tokenizer/generation_config.json /out/share/baton/tokenizer/ \
 && strip --strip-debug /out/bin/*

FROM debian:bookworm-slim AS runtime
# The runtime halves of the -dev packages scripts/setup.sh installs (header-only ones, CLI11
# and nlohmann-json, need nothing): gRPC (with reflection), protobuf, RocksDB, UCX, Abseil,
# OpenBLAS (OpenMP), OpenSSL, spdlog, prometheus-cpp, xxHash, yaml-cpp, SentencePiece and
# cpp-httplib (the router's tokenizer, whose module libbaton_sentencepiece.so sits beside the
# binaries, and its HTTP front).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 \
      libprotobuf32 \
      librocksdb7.8 \
      libucx0 \
      libabsl20220623 \
      libopenblas0-openmp \
      libssl3 \
      libspdlog1.10 \
      libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 \
      libxxhash0 \
      libyaml-cpp0.7 \
      libsentencepiece0 \
      libcpp-httplib0.11 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 baton \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin baton
COPY --from=build /out/bin/ /usr/local/bin/
# The default tokenizer: `baton up` and `batonctl make-model --tokenizer` give it to the small
# generated model.
COPY --from=build /out/share/ /usr/local/share/
# Fail the build, not the pod, when a binary needs a library the list above lacks.
RUN missing="$(ldd /usr/local/bin/* | grep 'not found' || true)"; \
    if [ -n "$missing" ]; then echo "missing shared libraries:"; echo "$missing"; exit 1; fi
USER 10001:10001
WORKDIR /tmp
# Client API; prefill, decode and store nodes; Prometheus metrics (every binary); the
# router's OpenAI-compatible HTTP API.
EXPOSE 50051 50052 50053 50054 9400 8000
# The chart names each container's command; alone, the image prints batonctl's usage.
CMD ["/usr/local/bin/batonctl", "--help"]

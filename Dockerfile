# baton's container image: the binaries the Helm chart (helm/baton) runs, on Debian 12.
#
#   docker build --target cpu -t baton:0.1.0 .           # CPU only (also the default target)
#   docker build --target cuda -t baton:0.1.0-cuda .     # also --device cuda
#   scripts/build_image.sh                               # the same, offline (docs/deploy.md)
#
# The build stage runs the repository's own scripts/setup.sh (the Debian -dev packages and the
# CMake + Ninja build a developer machine gets); the runtime stage holds only the binaries and
# the shared libraries they load, and runs as the non-root user 10001 that the chart's
# securityContext names. /usr/local/bin: baton-router, baton-prefill, baton-decode,
# baton-kvstore, batonctl, baton (and, with CUDA, libbaton_backend_cuda.so, which the nodes
# load from beside themselves when --device cuda asks for it).
#
# A build context holding prebuilt/ (bin/ and share/ as the build stage lays out /out, made by
# scripts/build_image.sh --from-build from a Debian 12 host's scripts/setup.sh build, whose
# libraries are the same packages) takes those binaries instead of compiling them.
#
# The cuda target is the cpu image plus the CUDA runtime and cuBLAS from NVIDIA's Debian 12 apt
# repository and binaries built with the CUDA toolkit; the kernels are built for sm_90 (H100,
# H200) plus PTX that the driver compiles for newer GPUs. The GPU driver (libcuda) comes from
# the node, through the NVIDIA container toolkit.
#
# BuildKit builds it (Docker's default builder since 23.0; with Debian 12's docker.io 20.10,
# DOCKER_BUILDKIT=1, which scripts/build_image.sh sets): the build stages mount a CA bundle as a
# secret, and BuildKit builds only the stages the target needs. Stage names are lowercase, as
# BuildKit requires; the CPU image's stages come first.

# The CUDA release of NVIDIA's packages (their name suffix): 12-6 is CUDA 12.6.
ARG CUDA_VERSION=12-6
# Which image the default target is: cpu or cuda (as the chart's image.flavor names them).
ARG BATON_FLAVOR=cpu

FROM debian:bookworm-slim AS build
# Parallel compile jobs (each C++ job takes about 1 GiB of memory).
ARG BATON_JOBS=4
WORKDIR /src
COPY . .
# No CUDA here (setup.sh says so instead of probing for nvcc); build-cuda below builds it.
# setup.sh fetches the tokenizer's corpus from the npm registry over HTTPS: a CA bundle passed
# as the build secret "ca" (scripts/build_image.sh passes the host's) is trusted for the build
# and never stored in a layer.
RUN --mount=type=secret,id=ca,required=false \
    if [ -d prebuilt ]; then \
      cp -a prebuilt /out; \
    else \
      if [ -s /run/secrets/ca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca \
        SSL_CERT_FILE=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi; \
      BATON_WITH_CUDA=OFF BATON_JOBS="${BATON_JOBS}" BATON_BUILD_DIR=/src/build \
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
   && install -d /out/share/baton/models \
   && cp -r models/ced-brown-shared models/ced-brown-replay models/ced-brown-plain \
        models/ced-brown-draft /out/share/baton/models/ \
   && strip --strip-debug /out/bin/*; \
    fi

FROM debian:bookworm-slim AS cpu
# The runtime halves of the -dev packages scripts/setup.sh installs (header-only ones, CLI11
# and nlohmann-json, need nothing): gRPC (with reflection), protobuf, RocksDB, UCX, Abseil,
# OpenBLAS (OpenMP), OpenSSL, spdlog, prometheus-cpp, xxHash, yaml-cpp, SentencePiece and
# cpp-httplib (the router's tokenizer, whose module libbaton_sentencepiece.so sits beside the
# binaries, and its HTTP front); libcurl and the CA bundle for `batonctl fetch-model`.
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
      libcurl4 \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 baton \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin baton
COPY --from=build /out/bin/ /usr/local/bin/
# The default tokenizer (`baton up --preset` and `batonctl make-model --tokenizer` give it to a
# generated model) and the trained models, ced-brown-shared being `baton up`'s default (and the
# Helm chart's, model.builtin).
COPY --from=build /out/share/ /usr/local/share/
# Fail the build, not the pod, when a binary needs a library the list above lacks (the GPU
# driver's libcuda.so.1 excepted: the node provides it).
RUN missing="$(ldd /usr/local/bin/* | grep 'not found' | grep -v 'libcuda\.so' || true)"; \
    if [ -n "$missing" ]; then echo "missing shared libraries:"; echo "$missing"; exit 1; fi
USER 10001:10001
WORKDIR /tmp
# Client API; prefill, decode and store nodes; Prometheus metrics (every binary); the
# router's OpenAI-compatible HTTP API.
EXPOSE 50051 50052 50053 50054 9400 8000
# The chart names each container's command; alone, the image prints batonctl's usage.
CMD ["/usr/local/bin/batonctl", "--help"]

# NVIDIA's apt repository for Debian 12, which its keyring package signs: the base of both CUDA
# stages.
FROM debian:bookworm-slim AS cuda-apt
ADD https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb /tmp/cuda-keyring.deb
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
 && rm -rf /var/lib/apt/lists/*

# The CUDA compiler, runtime and cuBLAS headers (/usr/local/cuda/bin/nvcc is where
# CMakeLists.txt looks), and the build with them.
FROM cuda-apt AS build-cuda
ARG CUDA_VERSION
ARG BATON_JOBS=4
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "cuda-nvcc-${CUDA_VERSION}" "cuda-cudart-dev-${CUDA_VERSION}" "libcublas-dev-${CUDA_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && { [ -e /usr/local/cuda ] || ln -s "$(ls -d /usr/local/cuda-*/ | head -n 1)" /usr/local/cuda; } \
 && /usr/local/cuda/bin/nvcc --version
WORKDIR /src
COPY . .
RUN --mount=type=secret,id=ca,required=false \
    if [ -s /run/secrets/ca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca \
      SSL_CERT_FILE=/run/secrets/ca CURL_CA_BUNDLE=/run/secrets/ca; fi; \
    BATON_WITH_CUDA=ON BATON_JOBS="${BATON_JOBS}" BATON_BUILD_DIR=/src/build bash scripts/setup.sh \
 && install -d /out/bin \
 && install -m 0755 build/router/baton-router build/prefill_node/baton-prefill \
      build/decode_node/baton-decode build/kvstore/baton-kvstore build/tools/batonctl \
      build/tools/baton build/text/libbaton_sentencepiece.so \
      build/model/cuda/libbaton_backend_cuda.so /out/bin/ \
 && strip --strip-debug /out/bin/*

# The cpu image with the CUDA runtime and cuBLAS the CUDA backend loads, and the binaries built
# with CUDA over the CPU ones.
FROM cpu AS cuda
ARG CUDA_VERSION
USER 0:0
COPY --from=cuda-apt /etc/apt/ /etc/apt/
COPY --from=cuda-apt /usr/share/keyrings/ /usr/share/keyrings/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "cuda-cudart-${CUDA_VERSION}" "libcublas-${CUDA_VERSION}" \
 && rm -rf /var/lib/apt/lists/* \
 && ls -d /usr/local/cuda-*/targets/x86_64-linux/lib >/etc/ld.so.conf.d/baton-cuda.conf \
 && ldconfig
COPY --from=build-cuda /out/bin/ /usr/local/bin/
RUN missing="$(ldd /usr/local/bin/* | grep 'not found' | grep -v 'libcuda\.so' || true)"; \
    if [ -n "$missing" ]; then echo "missing shared libraries:"; echo "$missing"; exit 1; fi
# What the NVIDIA container toolkit mounts into a GPU container: the compute driver, no more.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001

# The default target: the image BATON_FLAVOR names (BuildKit builds only its stages).
FROM ${BATON_FLAVOR} AS image

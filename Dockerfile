# syntax=docker/dockerfile:1
# Images of the in-cluster parts of IOP, from one build stage:
#   docker build --target edge     -t iop-edge:0.1.0 .
#   docker build --target operator -t iop-operator:0.1.0 .
# No system protoc is needed: the wire compiles with protox (pure Rust). The runtime images
# are distroless (glibc, CA certificates, no shell) and run as the non-root user 65532.

ARG RUST_VERSION=1.95
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and the target directory between builds (BuildKit),
# so both targets share one compilation; the binaries are copied out of the cached target.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p iop-edge -p iop-operator --bin iop-edge --bin iop-operator \
    && mkdir -p /out \
    && cp target/release/iop-edge target/release/iop-operator /out/

FROM ${RUNTIME_IMAGE} AS runtime
LABEL org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="IOP"
USER 65532:65532

FROM runtime AS operator
EXPOSE 9464
LABEL org.opencontainers.image.title="iop-operator" \
      org.opencontainers.image.description="IOP operator: CRDs to Edge config, CA and node certificates, status"
COPY --from=build /out/iop-operator /usr/local/bin/iop-operator
ENTRYPOINT ["/usr/local/bin/iop-operator"]
CMD ["run"]

# Last stage: the default target.
FROM runtime AS edge
LABEL org.opencontainers.image.title="iop-edge" \
      org.opencontainers.image.description="IOP Edge: OpenAI/Anthropic HTTP API, node gRPC over mTLS"
COPY --from=build /out/iop-edge /usr/local/bin/iop-edge
# 8080: HTTP API, health, metrics, admin. 7443: node gRPC (mTLS).
EXPOSE 8080 7443
ENTRYPOINT ["/usr/local/bin/iop-edge"]
CMD ["--config", "/etc/iop/config/edge.yaml"]

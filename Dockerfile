# Multi-stage build: a small, non-root runtime image with the slogate binary.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Without the `demo` feature: the image does not ship the simulator.
RUN cargo build --release --locked --no-default-features --bin slogate && strip target/release/slogate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/slogate /usr/local/bin/slogate
# Listens on every interface (config/slogate.yaml listens on 127.0.0.1, which
# nothing outside the container reaches); mount your own config over it.
COPY --from=build /src/config/container.yaml /etc/slogate/slogate.yaml
USER nonroot:nonroot
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/slogate"]
CMD ["serve", "--config", "/etc/slogate/slogate.yaml"]

# Multi-stage build: a small, non-root runtime image with the slogate binary.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# Without the `demo` feature: the image does not ship the simulator.
# Compiled twice, the second time with a profile of slogate's own request
# path taken from a short load on loopback (scripts/build-release): far less
# CPU per request than a plain build, for two to three times the build time.
RUN scripts/build-release --out /src/slogate --no-default-features && strip /src/slogate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/slogate /usr/local/bin/slogate
# Listens on every interface (config/slogate.yaml listens on 127.0.0.1, which
# nothing outside the container reaches); mount your own config over it.
COPY --from=build /src/config/container.yaml /etc/slogate/slogate.yaml
USER nonroot:nonroot
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/slogate"]
CMD ["serve", "--config", "/etc/slogate/slogate.yaml"]

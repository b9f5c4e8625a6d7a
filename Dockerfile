# One image for every subcommand: `cfp operator`, `cfp worker`, `cfp emulator`, ...
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY src ./src
# The dist profile: release with whole-program LTO (a smaller binary, less resident memory).
RUN cargo build --profile dist --locked --bin cfp

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/dist/cfp /usr/local/bin/cfp
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cfp"]
CMD ["worker"]

# chargeonce container image.
#
#   docker build -t chargeonce .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgres://user:pw@host:5432/chargeonce chargeonce
#
# The binary embeds config/default.toml and the SQL migrations at compile
# time, so both folders must be in the build stage. config/ is also copied
# into the runtime image, where files in it (e.g. config/<CHARGEONCE_ENV>.toml)
# layer over the embedded defaults. tests/deploy_files.rs checks this file
# against the code.

# ---- build ------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS build
WORKDIR /app

# Dependencies first, in their own layer: build a placeholder crate with the
# real manifests, so this layer is reused until Cargo.toml or Cargo.lock change.
# The workspace's other members (dev-only tools) must be present for cargo to
# load the workspace; only their manifests and empty targets are needed.
COPY Cargo.toml Cargo.lock build.rs ./
COPY testkit/Cargo.toml ./testkit/
COPY tools/loadbench/Cargo.toml ./tools/loadbench/
RUN mkdir src testkit/src tools/loadbench/src \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > tools/loadbench/src/main.rs \
    && touch src/lib.rs testkit/src/lib.rs \
    && cargo build --release --locked --bin chargeonce \
    && rm -rf src

# The real sources. touch makes them newer than the placeholder build, so
# cargo rebuilds the crate even if the copied files keep older timestamps.
COPY src ./src
COPY migrations ./migrations
COPY config ./config
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin chargeonce

# ---- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# An unprivileged user with a fixed id (so runAsNonRoot policies can check it).
RUN groupadd --system --gid 10001 chargeonce \
    && useradd --system --uid 10001 --gid chargeonce --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin chargeonce

COPY --from=build /app/target/release/chargeonce /usr/local/bin/chargeonce
COPY config /app/config
WORKDIR /app

# Listen on all interfaces inside the container; the rest comes from
# config/default.toml and CHARGEONCE__SECTION__KEY / DATABASE_URL at run time.
ENV CHARGEONCE__SERVER__HOST=0.0.0.0

USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["chargeonce"]
CMD ["serve"]

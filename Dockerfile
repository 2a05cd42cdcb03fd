# chargeonce container image.
#
#   docker build -t chargeonce .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=postgres://user:pw@host:5432/chargeonce chargeonce
#
# tests/deploy_files.rs checks this file against the code and the workspace;
# `.ci/run` lints it with hadolint (ignored rules, with reasons: .hadolint.yaml).

# ---- build ------------------------------------------------------------------
FROM rust:1.95-slim-bookworm AS build
WORKDIR /app

# jemalloc, the service's allocator, is C built with make, which the slim
# image lacks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*

# The whole build context, minus what .dockerignore leaves out. Cargo loads
# the entire workspace even to build one binary: every member's manifest and
# the files of every declared target (benches included) must be present, and
# the binary embeds config/default.toml and migrations/ at compile time.
# Copying the tree keeps that true as members are added. The price: any
# source change rebuilds the dependencies too; the cache mount at least keeps
# the downloaded crates between builds (BuildKit, the default builder).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --release --locked --bin chargeonce

# ---- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# An unprivileged user with a fixed id (so runAsNonRoot policies can check it).
RUN groupadd --system --gid 10001 chargeonce \
    && useradd --system --uid 10001 --gid chargeonce --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin chargeonce

WORKDIR /app
COPY --from=build /app/target/release/chargeonce /usr/local/bin/chargeonce
# Files in config/ (e.g. config/<CHARGEONCE_ENV>.toml) layer over the defaults
# embedded in the binary; chargeonce reads ./config from the WORKDIR.
COPY config ./config

# Listen on all interfaces inside the container; the rest comes from
# config/default.toml and CHARGEONCE__SECTION__KEY / DATABASE_URL at run time.
ENV CHARGEONCE__SERVER__HOST=0.0.0.0

USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["chargeonce"]
CMD ["serve"]

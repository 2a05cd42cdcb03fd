//! The deployment files (Dockerfile, .dockerignore, docker-compose.yml)
//! checked against the code: their settings load through `Settings`, the
//! ports and commands agree with what the binary reads, and the build
//! context holds what the build needs. No Docker engine and no database.
//!
//! Only what is specific to chargeonce is checked here; generic Dockerfile
//! linting is hadolint's job in `.ci/run`. The Dockerfile is read only as
//! far as these checks need (logical lines, split into stages).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chargeonce::config::{ProcessorKind, Settings};
use chargeonce::processor::simulator::SimulatorOptions;
use clap::Parser;
use secrecy::ExposeSecret;
use yaml_serde::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo().join(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative}: {e}"))
}

/// Settings as the binary loads them from config/ with exactly `vars`; a
/// variable it would silently ignore (`CHARGEONCE_SERVER__PORT`) fails too.
fn load_settings(vars: &HashMap<String, String>, what: &str) -> Settings {
    const OTHERS: &str = "DATABASE_URL CHARGEONCE_ENV CHARGEONCE_CONFIG_DIR RUST_LOG";
    for name in vars.keys() {
        let read = name.starts_with("CHARGEONCE__") || OTHERS.split(' ').any(|o| o == name);
        assert!(read, "{what}: chargeonce does not read `{name}`");
    }
    Settings::load_from(&repo().join("config"), vars)
        .unwrap_or_else(|e| panic!("{what}: the configuration does not load: {e}"))
}

fn default_port() -> u16 {
    load_settings(&HashMap::new(), "defaults").server.port
}

/// The Dockerfile's stages, each a list of (KEYWORD, arguments) starting
/// with its FROM; continuation lines joined, comments dropped.
fn dockerfile() -> Vec<Vec<(String, String)>> {
    let text = read("Dockerfile").replace("\\\n", " ");
    let mut stages: Vec<Vec<(String, String)>> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let instruction = (keyword.to_ascii_uppercase(), args.trim().to_owned());
        if instruction.0 == "FROM" {
            stages.push(Vec::new());
        }
        stages.last_mut().expect("FROM first").push(instruction);
    }
    stages
}

type Stage = [(String, String)];

fn args<'a>(stage: &'a Stage, keyword: &'a str) -> impl Iterator<Item = &'a str> {
    stage
        .iter()
        .filter(move |i| i.0 == keyword)
        .map(|i| i.1.as_str())
}

/// `ENV KEY=VALUE ...` of a stage.
fn env(stage: &Stage) -> HashMap<String, String> {
    args(stage, "ENV")
        .flat_map(str::split_whitespace)
        .map(|pair| {
            let (key, value) = pair.split_once('=').expect("ENV KEY=VALUE");
            (key.to_owned(), value.trim_matches('"').to_owned())
        })
        .collect()
}

/// `.dockerignore`'s verdict on a path of the context, as Docker reads the
/// file: patterns from the context root, a folder covers what it holds,
/// the last matching line wins.
fn ignored(path: &str) -> bool {
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    let parts: Vec<&str> = path.split('/').collect();
    let mut excluded = false;
    for line in read(".dockerignore").lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (exception, pattern) = line.strip_prefix('!').map_or((false, line), |p| (true, p));
        let pattern = glob::Pattern::new(pattern.trim_start_matches('/')).unwrap();
        if (1..=parts.len()).any(|n| pattern.matches_with(&parts[..n].join("/"), options)) {
            excluded = !exception;
        }
    }
    excluded
}

#[test]
fn the_image_runs_chargeonce_serve_on_the_configured_port() {
    let stages = dockerfile();
    let runtime = stages.last().unwrap();
    let mut command: Vec<String> = Vec::new();
    for keyword in ["ENTRYPOINT", "CMD"] {
        let last = args(runtime, keyword).last().unwrap_or("[]");
        command.extend(serde_json::from_str::<Vec<String>>(last).expect("exec form"));
    }
    assert_eq!(command, ["chargeonce", "serve"], "ENTRYPOINT + CMD");
    assert!(
        args(runtime, "COPY")
            .any(|a| a.ends_with("/target/release/chargeonce /usr/local/bin/chargeonce")),
        "the final stage copies the release binary onto PATH, where ENTRYPOINT finds it"
    );
    // The image's ENV is configuration that reaches the container's port.
    let settings = load_settings(&env(runtime), "Dockerfile ENV");
    assert_eq!(settings.server.host, "0.0.0.0", "listen on all interfaces");
    assert_eq!(settings.server.port, default_port());
    let exposed: Vec<String> = args(runtime, "EXPOSE").map(str::to_owned).collect();
    assert_eq!(exposed, [default_port().to_string()], "EXPOSE server.port");
    // config/ lands where the binary reads it: ./config from the WORKDIR.
    let workdir = args(runtime, "WORKDIR").last().unwrap_or("/");
    assert!(
        args(runtime, "COPY")
            .any(|a| a == "config ./config" || a == format!("config {workdir}/config")),
        "the final stage copies config/ into its WORKDIR ({workdir})"
    );
}

/// What cargo reads to build the binary: the lock file, every package's
/// manifest and target sources (it loads the whole workspace even for one
/// binary), and the files the sources embed.
fn files_cargo_needs() -> Vec<String> {
    let output = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version=1", "--no-deps", "--offline"])
        .current_dir(repo())
        .output()
        .expect("cargo metadata");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut needed = vec!["Cargo.toml".to_owned(), "Cargo.lock".to_owned()];
    for package in metadata["packages"].as_array().unwrap() {
        let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap());
        needed.push(relative(&manifest));
        for target in package["targets"].as_array().unwrap() {
            needed.push(relative(Path::new(target["src_path"].as_str().unwrap())));
        }
        let package_root = manifest.parent().unwrap();
        let sources = walk(&package_root.join("src"));
        for source in sources
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        {
            let text = std::fs::read_to_string(source).unwrap();
            for (opening, base) in [
                ("include_str!(\"", source.parent().unwrap()),
                ("include_bytes!(\"", source.parent().unwrap()),
                ("embed_migrations!(\"", package_root),
            ] {
                for (at, _) in text.match_indices(opening) {
                    let rest = &text[at + opening.len()..];
                    let embedded = base.join(&rest[..rest.find('"').unwrap()]);
                    needed.extend(walk(&embedded).iter().map(|file| relative(file)));
                }
            }
        }
    }
    needed
}

/// `path` relative to the repository, the build context; it must be inside.
fn relative(path: &Path) -> String {
    let path = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let root = repo().canonicalize().unwrap();
    let inside = path.strip_prefix(&root).expect("inside the build context");
    inside.to_string_lossy().into_owned()
}

/// `path` itself if it is a file, else every file under it.
fn walk(path: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(path) {
        Ok(entries) => entries.flat_map(|e| walk(&e.unwrap().path())).collect(),
        Err(_) => vec![path.to_owned()],
    }
}

#[test]
fn the_build_context_holds_what_the_build_needs() {
    let stages = dockerfile();
    let build = &stages[0];
    let copied_all = build.iter().position(|(k, a)| k == "COPY" && a == ". .");
    let builds = build.iter().position(|(k, a)| {
        k == "RUN" && a.contains("cargo build --release --locked --bin chargeonce")
    });
    assert!(
        matches!((copied_all, builds), (Some(copy), Some(run)) if copy < run),
        "the build stage copies the whole context (`COPY . .`) before `cargo build --release --locked --bin chargeonce`"
    );
    let mut needed = files_cargo_needs();
    needed.extend(walk(&repo().join("config")).iter().map(|f| relative(f)));
    let excluded: Vec<&String> = needed.iter().filter(|path| ignored(path)).collect();
    assert!(
        excluded.is_empty(),
        ".dockerignore excludes {excluded:?}, which the build needs"
    );
    let kept_out = [
        "target/release/chargeonce",
        ".pgdata/data/PG_VERSION",
        ".git/HEAD",
    ];
    assert!(
        kept_out.iter().all(|path| ignored(path)),
        "build output and local data stay out"
    );
}

fn compose() -> Value {
    yaml_serde::from_str(&read("docker-compose.yml")).expect("docker-compose.yml")
}

/// A scalar of the compose file as text.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("docker-compose.yml: expected a plain value, found {other:?}"),
    }
}

/// A service's `environment` (map form).
fn environment(service: &Value) -> HashMap<String, String> {
    let map = service["environment"].as_mapping().expect("a map");
    map.iter().map(|(k, v)| (text(k), text(v))).collect()
}

/// The container side of each `ports` entry ("8080:8080", "127.0.0.1:80:8080/tcp").
fn container_ports(service: &Value) -> Vec<u16> {
    let ports = service["ports"].as_sequence().cloned().unwrap_or_default();
    let container = |port: &Value| text(port).rsplit(':').next().unwrap().replace("/tcp", "");
    ports
        .iter()
        .map(|p| container(p).parse().unwrap())
        .collect()
}

#[test]
fn compose_environment_is_chargeonce_configuration_reaching_its_postgres() {
    let compose = compose();
    let service = &compose["services"]["chargeonce"];
    let vars = environment(service);
    // Each value valid on its own, and over the image's ENV as the container sees it.
    load_settings(&vars, "compose environment alone");
    let mut effective = env(dockerfile().last().unwrap());
    effective.extend(vars);
    let settings = load_settings(&effective, "compose environment");
    assert_eq!(settings.server.host, "0.0.0.0");
    assert_eq!(
        settings.server.port,
        default_port(),
        "the port the image EXPOSEs"
    );
    assert!(container_ports(service).contains(&settings.server.port));
    assert_eq!(text(&service["build"]), ".", "built from the Dockerfile");
    let after_postgres = &service["depends_on"]["postgres"]["condition"];
    assert_eq!(text(after_postgres), "service_healthy");

    let url: tokio_postgres::Config = settings.database.url.expose_secret().parse().unwrap();
    let postgres = environment(&compose["services"]["postgres"]);
    let var = |name: &str, default: &'static str| postgres.get(name).map_or(default, |v| v);
    let user = var("POSTGRES_USER", "postgres");
    let service_host = tokio_postgres::config::Host::Tcp("postgres".to_owned());
    assert_eq!(url.get_hosts(), &[service_host], "the postgres service");
    assert_eq!(url.get_ports(), &[5432]);
    assert_eq!(url.get_user(), Some(user));
    assert_eq!(
        url.get_password(),
        Some(var("POSTGRES_PASSWORD", "").as_bytes())
    );
    let database = postgres.get("POSTGRES_DB").map_or(user, String::as_str);
    assert_eq!(url.get_dbname(), Some(database));
}

/// `chargeonce psp-sim ...` as the binary reads it.
#[derive(Parser)]
struct PspSimCommand {
    #[command(flatten)]
    options: SimulatorOptions,
}

#[test]
fn compose_points_chargeonce_at_its_psp_sim() {
    let compose = compose();
    let simulator = &compose["services"]["psp-sim"];
    assert_eq!(text(&simulator["build"]), ".", "built from the Dockerfile");
    let command = simulator["command"].as_sequence().expect("command list");
    let command: Vec<String> = command.iter().map(text).collect();
    // After the image's ENTRYPOINT: `chargeonce psp-sim …`.
    assert_eq!(command[0], "psp-sim");
    let options = PspSimCommand::try_parse_from(&command)
        .unwrap_or_else(|e| panic!("`chargeonce {}`: {e}", command.join(" ")))
        .options;
    options.validate().unwrap();
    assert_eq!(options.host, "0.0.0.0");
    assert_eq!(container_ports(simulator), [options.port]);

    let chargeonce = &compose["services"]["chargeonce"];
    let settings = load_settings(&environment(chargeonce), "compose environment");
    assert_eq!(settings.processor.kind, ProcessorKind::Http);
    let psp_sim = format!("http://psp-sim:{}", options.port);
    assert_eq!(settings.processor.url, psp_sim);
    assert!(
        !chargeonce["depends_on"]["psp-sim"].is_null(),
        "depends on psp-sim"
    );
}

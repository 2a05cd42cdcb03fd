//! Static checks of the deployment files (Dockerfile, .dockerignore,
//! docker-compose.yml) against the code, so they fail when the files drift
//! from the configuration keys, the port, the binary or the embedded files.
//! No Docker engine and no database needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use chargeonce::config::Settings;
use serde_yaml::Value;

// ---------------------------------------------------------------------------
// Helpers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    fs::read_to_string(repo().join(relative))
        .unwrap_or_else(|e| panic!("cannot read {relative} at the repository root: {e}"))
}

/// Settings as the binary would load them from the repository's config/
/// folder with exactly these variables.
fn load_settings(vars: &HashMap<String, String>, what: &str) -> Settings {
    Settings::load_from(&repo().join("config"), vars)
        .unwrap_or_else(|e| panic!("{what}: the configuration does not load: {e}"))
}

fn default_settings() -> Settings {
    load_settings(&HashMap::new(), "defaults")
}

/// The name of the binary target, taken from the built binary itself.
fn binary_name() -> String {
    Path::new(env!("CARGO_BIN_EXE_chargeonce"))
        .file_name()
        .and_then(|name| name.to_str())
        .expect("binary file name")
        .trim_end_matches(".exe")
        .to_owned()
}

/// Variables the service reads besides `CHARGEONCE__SECTION__KEY`.
const OTHER_KNOWN_VARS: &[&str] = &[
    "DATABASE_URL",
    "CHARGEONCE_ENV",
    "CHARGEONCE_CONFIG_DIR",
    "RUST_LOG",
];

/// A variable name that the service would silently ignore is a mistake
/// (e.g. `CHARGEONCE_SERVER__PORT` with one underscore after the prefix).
fn assert_known_variables(vars: &HashMap<String, String>, what: &str) {
    for name in vars.keys() {
        assert!(
            name.starts_with("CHARGEONCE__") || OTHER_KNOWN_VARS.contains(&name.as_str()),
            "{what}: variable `{name}` is not read by chargeonce (expected CHARGEONCE__SECTION__KEY or one of {OTHER_KNOWN_VARS:?})"
        );
    }
}

/// `1.95` or `1.85.0` as comparable numbers; missing parts count as 0.
fn parse_version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|part| {
            part.parse()
                .unwrap_or_else(|_| panic!("`{text}` is not a version number like 1.85"))
        })
        .collect();
    parts.resize(3, 0);
    parts
}

/// `rust-version` from the [package] section of Cargo.toml.
fn cargo_rust_version() -> String {
    let manifest = read("Cargo.toml");
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[package]" {
            if let Some((key, value)) = line.split_once('=') {
                if key.trim() == "rust-version" {
                    return value.trim().trim_matches('"').to_owned();
                }
            }
        }
    }
    panic!("Cargo.toml has no package.rust-version");
}

// ---------------------------------------------------------------------------
// A small Dockerfile reader: enough for instructions, stages and arguments.

#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    image: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &str) -> impl Iterator<Item = &'a Instruction> + 'a {
        let keyword = keyword.to_owned();
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
    }

    fn last(&self, keyword: &str) -> Option<&Instruction> {
        self.all(keyword).last()
    }

    fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("stage `{name}` ({})", self.image),
            None => format!("stage {}", self.image),
        }
    }

    /// The effective WORKDIR at the end of the stage (absolute only).
    fn workdir(&self) -> String {
        self.last("WORKDIR")
            .map(|i| i.args.trim().trim_end_matches('/').to_owned())
            .unwrap_or_default()
    }

    /// `ENV` variables of the stage, in the `KEY=VALUE ...` or `KEY VALUE` form.
    fn env(&self) -> HashMap<String, String> {
        let mut vars = HashMap::new();
        for instruction in self.all("ENV") {
            let args = instruction.args.trim();
            let first = args.split_whitespace().next().unwrap_or_default();
            if first.contains('=') {
                for pair in args.split_whitespace() {
                    let (key, value) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("Dockerfile: cannot read `ENV {args}`"));
                    vars.insert(key.to_owned(), unquote(value));
                }
            } else {
                let value = args[first.len()..].trim();
                vars.insert(first.to_owned(), unquote(value));
            }
        }
        vars
    }
}

fn unquote(value: &str) -> String {
    value.trim_matches('"').trim_matches('\'').to_owned()
}

/// A COPY or ADD: its `--flag=value`s, sources and destination.
#[derive(Debug)]
struct Copy {
    from: Option<String>,
    sources: Vec<String>,
    destination: String,
}

impl Copy {
    fn parse(args: &str) -> Self {
        let mut from = None;
        let mut rest = args.trim();
        while rest.starts_with("--") {
            let (flag, tail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            if let Some(stage) = flag.strip_prefix("--from=") {
                from = Some(stage.to_owned());
            }
            rest = tail.trim_start();
        }
        let mut paths: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str(rest)
                .unwrap_or_else(|e| panic!("Dockerfile: bad JSON in `COPY {args}`: {e}"))
        } else {
            rest.split_whitespace().map(str::to_owned).collect()
        };
        assert!(
            paths.len() >= 2,
            "Dockerfile: `COPY {args}` needs a source and a destination"
        );
        let destination = paths.pop().unwrap();
        Self {
            from,
            sources: paths,
            destination,
        }
    }

    /// Where a source lands, given the stage's WORKDIR.
    fn target_of(&self, source: &str, workdir: &str) -> String {
        let destination = if self.destination.starts_with('/') {
            self.destination.clone()
        } else {
            format!("{workdir}/{}", self.destination.trim_start_matches("./"))
        };
        if destination.ends_with('/') || destination.ends_with("/.") {
            let base = Path::new(source)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(source);
            format!(
                "{}/{base}",
                destination.trim_end_matches('.').trim_end_matches('/')
            )
        } else {
            destination
        }
    }
}

/// A source path as written, normalised: `./src/` -> `src`.
fn normalise(source: &str) -> String {
    source
        .trim_start_matches("./")
        .trim_end_matches('/')
        .to_owned()
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    // Join continuation lines; drop comments and blank lines.
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            logical.push(std::mem::take(&mut current));
        }
    }
    assert!(
        current.trim().is_empty(),
        "Dockerfile ends inside a continued line"
    );

    let mut stages: Vec<Stage> = Vec::new();
    for line in logical.iter().filter(|l| !l.trim().is_empty()) {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.trim().to_owned();
        if keyword == "FROM" {
            let words: Vec<&str> = args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let image = words.first().expect("FROM without an image").to_string();
            let name = match words.get(1) {
                Some(word) if word.eq_ignore_ascii_case("as") => {
                    words.get(2).map(|n| n.to_string())
                }
                _ => None,
            };
            stages.push(Stage {
                image,
                name,
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("Dockerfile: `{keyword}` before the first FROM"))
                .instructions
                .push(Instruction { keyword, args });
        }
    }
    stages
}

/// An ENTRYPOINT or CMD in exec form (JSON array).
fn exec_form(stage: &Stage, keyword: &str) -> Vec<String> {
    let Some(instruction) = stage.last(keyword) else {
        return Vec::new();
    };
    assert!(
        instruction.args.starts_with('['),
        "Dockerfile: {keyword} must use the exec form [\"...\"], or /bin/sh runs as PID 1 and SIGTERM never reaches chargeonce (no graceful shutdown)"
    );
    serde_json::from_str(&instruction.args)
        .unwrap_or_else(|e| panic!("Dockerfile: {keyword} is not a JSON array of strings: {e}"))
}

/// The Debian release named in an image reference, if any.
fn debian_release(image: &str) -> Option<&'static str> {
    ["buster", "bullseye", "bookworm", "trixie", "forky"]
        .into_iter()
        .find(|release| image.contains(release))
}

fn dockerignore_patterns() -> Vec<String> {
    read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            line.trim_start_matches('/')
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

/// Files the crate embeds at compile time: include_str!/include_bytes! paths
/// (relative to the source file) and embed_migrations! folders (relative to
/// the crate root), as top-level entries of the repository.
fn embedded_top_level_paths() -> BTreeSet<String> {
    fn visit(dir: &Path, found: &mut BTreeSet<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                visit(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).unwrap();
                for (macro_name, relative_to_file) in [
                    ("include_str!(\"", true),
                    ("include_bytes!(\"", true),
                    ("embed_migrations!(\"", false),
                ] {
                    for (index, _) in text.match_indices(macro_name) {
                        let rest = &text[index + macro_name.len()..];
                        let literal = &rest[..rest.find('"').unwrap()];
                        let full = if relative_to_file {
                            path.parent().unwrap().join(literal)
                        } else {
                            repo().join(literal)
                        };
                        // Resolve `..` without touching the file system.
                        let mut parts: Vec<String> = Vec::new();
                        for part in full.strip_prefix(repo()).unwrap().components() {
                            match part {
                                std::path::Component::ParentDir => {
                                    parts.pop();
                                }
                                std::path::Component::Normal(p) => {
                                    parts.push(p.to_string_lossy().into_owned())
                                }
                                _ => {}
                            }
                        }
                        found.insert(parts.first().cloned().unwrap_or_default());
                    }
                }
            }
        }
    }
    let mut found = BTreeSet::new();
    visit(&repo().join("src"), &mut found);
    found
}

// ---------------------------------------------------------------------------
// (b) Dockerfile

struct Image {
    build: Stage,
    runtime: Stage,
}

/// The runtime stage (the last) and the build stage it copies the binary from.
fn image() -> Image {
    let mut stages = parse_dockerfile(&read("Dockerfile"));
    assert!(
        stages.len() >= 2,
        "Dockerfile: expected a multi-stage build (build + runtime), found {} FROM",
        stages.len()
    );
    let runtime = stages.pop().unwrap();
    let binary = binary_name();
    let copy = runtime
        .all("COPY")
        .map(|i| Copy::parse(&i.args))
        .find(|c| {
            c.from.is_some()
                && c.sources
                    .iter()
                    .any(|s| s.ends_with(&format!("/release/{binary}")))
        })
        .unwrap_or_else(|| {
            panic!(
                "Dockerfile: the final stage copies no target/release/{binary} from a build stage"
            )
        });
    let from = copy.from.unwrap();
    let index = stages
        .iter()
        .position(|s| s.name.as_deref() == Some(from.as_str()))
        .or_else(|| from.parse().ok())
        .unwrap_or_else(|| panic!("Dockerfile: COPY --from={from} names no earlier stage"));
    let build = stages.swap_remove(index);
    Image { build, runtime }
}

#[test]
fn dockerfile_final_stage_is_a_slim_runtime_not_the_rust_image() {
    let Image { build, runtime } = image();
    assert!(
        build.image.starts_with("rust:"),
        "Dockerfile: the build stage should use the official rust image, found {}",
        build.image
    );
    assert!(
        !runtime.image.starts_with("rust"),
        "Dockerfile: the final stage must not be the rust toolchain image, found {}",
        runtime.image
    );
    if let (Some(built_on), Some(runs_on)) =
        (debian_release(&build.image), debian_release(&runtime.image))
    {
        assert_eq!(
            built_on, runs_on,
            "Dockerfile: built on Debian {built_on} but run on Debian {runs_on}: the binary may need a newer glibc than the runtime has"
        );
    }
    let user = runtime
        .last("USER")
        .map(|i| i.args.trim().to_owned())
        .unwrap_or_default();
    let user_name = user.split(':').next().unwrap_or_default();
    assert!(
        !user_name.is_empty() && user_name != "root" && user_name != "0",
        "Dockerfile: the final stage must switch to a non-root USER, found `{user}`"
    );
}

#[test]
fn dockerfile_copies_only_files_that_exist_and_are_not_ignored() {
    let ignored = dockerignore_patterns();
    for stage in parse_dockerfile(&read("Dockerfile")) {
        for instruction in stage
            .instructions
            .iter()
            .filter(|i| i.keyword == "COPY" || i.keyword == "ADD")
        {
            let copy = Copy::parse(&instruction.args);
            if copy.from.is_some() {
                continue;
            }
            for source in &copy.sources {
                let source = normalise(source);
                assert!(
                    repo().join(&source).exists(),
                    "Dockerfile ({}): `{} {}` copies `{source}`, which does not exist in the repository",
                    stage.label(),
                    instruction.keyword,
                    instruction.args
                );
                let top = source.split('/').next().unwrap_or_default();
                assert!(
                    !ignored.iter().any(|pattern| pattern == top || *pattern == source),
                    "Dockerfile: copies `{source}`, but .dockerignore excludes it from the build context"
                );
            }
        }
    }
}

#[test]
fn dockerfile_build_stage_has_everything_the_compiler_embeds() {
    let Image { build, .. } = image();
    let copied: BTreeSet<String> = build
        .all("COPY")
        .map(|i| Copy::parse(&i.args))
        .filter(|c| c.from.is_none())
        .flat_map(|c| c.sources.into_iter().map(|s| normalise(&s)))
        .collect();
    let mut needed: BTreeSet<String> = ["Cargo.toml", "Cargo.lock", "src", "migrations", "config"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    if repo().join("build.rs").exists() {
        needed.insert("build.rs".to_owned());
    }
    // Whatever src/ embeds with include_str!/embed_migrations! must be there too.
    needed.extend(embedded_top_level_paths());
    for path in &needed {
        assert!(
            copied.contains(path),
            "Dockerfile: the build stage ({}) must COPY `{path}` (the build needs it); it copies {copied:?}",
            build.label()
        );
    }
}

#[test]
fn dockerfile_builds_the_release_binary_with_the_locked_dependencies() {
    let Image { build, .. } = image();
    let builds: Vec<&Instruction> = build
        .all("RUN")
        .filter(|i| i.args.contains("cargo build"))
        .collect();
    assert!(
        !builds.is_empty(),
        "Dockerfile: the build stage runs no `cargo build`"
    );
    for run in &builds {
        assert!(
            run.args.contains("--locked"),
            "Dockerfile: `cargo build` must use --locked (the image must build what Cargo.lock pins): `RUN {}`",
            run.args
        );
        assert!(
            run.args.contains("--release"),
            "Dockerfile: `cargo build` must use --release (the final stage copies target/release): `RUN {}`",
            run.args
        );
    }
}

#[test]
fn dockerfile_rust_image_is_new_enough_for_the_crate() {
    let Image { build, .. } = image();
    let tag = build
        .image
        .split_once(':')
        .map(|(_, tag)| tag)
        .unwrap_or_else(|| {
            panic!(
                "Dockerfile: pin the rust image version, found `{}`",
                build.image
            )
        });
    let version = tag.split('-').next().unwrap_or_default();
    assert!(
        version.starts_with(|c: char| c.is_ascii_digit()),
        "Dockerfile: the rust image tag `{tag}` names no version; pin one like 1.95-slim-bookworm"
    );
    let required = cargo_rust_version();
    assert!(
        parse_version(version) >= parse_version(&required),
        "Dockerfile: rust image {version} is older than the crate's rust-version {required} (Cargo.toml)"
    );
}

#[test]
fn dockerfile_runs_chargeonce_serve_on_the_configured_port() {
    let Image { build, runtime } = image();
    let binary = binary_name();

    // ENTRYPOINT + CMD together must be `chargeonce serve`.
    let mut command = exec_form(&runtime, "ENTRYPOINT");
    command.extend(exec_form(&runtime, "CMD"));
    assert_eq!(
        command,
        [binary.clone(), "serve".to_owned()],
        "Dockerfile: ENTRYPOINT + CMD must run `{binary} serve`"
    );

    // ... and `chargeonce` must be where it is looked up.
    let installed: Vec<String> = runtime
        .all("COPY")
        .map(|i| Copy::parse(&i.args))
        .filter(|c| c.from.is_some())
        .flat_map(|c| {
            c.sources
                .iter()
                .map(|s| c.target_of(s, &runtime.workdir()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        installed.contains(&format!("/usr/local/bin/{binary}")),
        "Dockerfile: the binary must be copied to /usr/local/bin/{binary} (on PATH) for ENTRYPOINT [\"{binary}\"]; copied to {installed:?}"
    );
    assert!(
        build.workdir().starts_with('/'),
        "Dockerfile: the build stage needs an absolute WORKDIR"
    );

    // The image's ENV must be valid configuration, and what it gives must be
    // reachable: all interfaces, on the port EXPOSE announces.
    let env = runtime.env();
    assert_known_variables(&env, "Dockerfile ENV");
    let settings = load_settings(&env, "Dockerfile ENV");
    assert_eq!(
        settings.server.host, "0.0.0.0",
        "Dockerfile: the image must set CHARGEONCE__SERVER__HOST=0.0.0.0, or the port is unreachable from outside the container"
    );
    let exposed: Vec<u16> = runtime
        .all("EXPOSE")
        .flat_map(|i| {
            i.args
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .map(|port| {
            port.split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap_or_else(|_| panic!("Dockerfile: EXPOSE {port} is not a port"))
        })
        .collect();
    let default_port = default_settings().server.port;
    assert_eq!(
        settings.server.port, default_port,
        "Dockerfile: the image changes server.port; keep the default {default_port}"
    );
    assert_eq!(
        exposed,
        [default_port],
        "Dockerfile: EXPOSE must announce server.port ({default_port}, config/default.toml)"
    );

    // The config folder must land where the binary looks: ./config from the
    // WORKDIR, or CHARGEONCE_CONFIG_DIR.
    let config_dir = env
        .get("CHARGEONCE_CONFIG_DIR")
        .cloned()
        .unwrap_or_else(|| format!("{}/config", runtime.workdir()));
    let config_copied = runtime
        .all("COPY")
        .map(|i| Copy::parse(&i.args))
        .filter(|c| c.from.is_none())
        .any(|c| {
            c.sources.iter().any(|s| {
                normalise(s) == "config" && c.target_of(s, &runtime.workdir()) == config_dir
            })
        });
    assert!(
        config_copied,
        "Dockerfile: the final stage must COPY config to {config_dir}, where chargeonce reads it (WORKDIR + /config)"
    );
}

// ---------------------------------------------------------------------------
// (c) .dockerignore

#[test]
fn dockerignore_keeps_build_output_and_local_data_out_of_the_context() {
    let patterns = dockerignore_patterns();
    for needed in ["target", ".pgdata", ".git"] {
        assert!(
            patterns.iter().any(|p| p == needed),
            ".dockerignore must exclude `{needed}`; it has {patterns:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// (a) docker-compose.yml

fn compose() -> Value {
    serde_yaml::from_str(&read("docker-compose.yml"))
        .unwrap_or_else(|e| panic!("docker-compose.yml is not valid YAML: {e}"))
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose
        .get("services")
        .and_then(|services| services.get(name))
        .unwrap_or_else(|| panic!("docker-compose.yml: no service `{name}`"))
}

fn scalar(value: &Value, what: &str) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("docker-compose.yml: {what} must be a plain value, found {other:?}"),
    }
}

/// A service's `environment`, in map or `KEY=VALUE` list form.
fn environment(service: &Value, what: &str) -> HashMap<String, String> {
    match service.get("environment") {
        None => HashMap::new(),
        Some(Value::Mapping(map)) => map
            .iter()
            .map(|(key, value)| {
                let key = scalar(key, "an environment name");
                let value = scalar(value, &format!("{what} environment `{key}`"));
                (key, value)
            })
            .collect(),
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|item| {
                let item = scalar(item, "an environment entry");
                let (key, value) = item.split_once('=').unwrap_or_else(|| {
                    panic!("docker-compose.yml: {what} environment entry `{item}` has no =")
                });
                (key.to_owned(), value.to_owned())
            })
            .collect(),
        Some(other) => panic!(
            "docker-compose.yml: {what} environment must be a map or a list, found {other:?}"
        ),
    }
}

/// The container side of a `ports` entry: "8080", "8080:8080",
/// "127.0.0.1:8080:8080/tcp", or the long form with `target`.
fn container_port(entry: &Value) -> u16 {
    let text = match entry.get("target") {
        Some(target) => scalar(target, "ports target"),
        None => {
            let short = scalar(entry, "a ports entry");
            let without_protocol = short.split('/').next().unwrap().to_owned();
            without_protocol.rsplit(':').next().unwrap().to_owned()
        }
    };
    text.parse().unwrap_or_else(|_| {
        panic!("docker-compose.yml: cannot read the container port of {entry:?}")
    })
}

#[test]
fn compose_runs_chargeonce_after_a_healthy_postgres() {
    let compose = compose();
    let postgres = service(&compose, "postgres");
    let chargeonce = service(&compose, "chargeonce");

    let healthcheck = serde_yaml::to_string(&postgres["healthcheck"]["test"]).unwrap();
    assert!(
        healthcheck.contains("pg_isready"),
        "docker-compose.yml: postgres needs a healthcheck running pg_isready, found {healthcheck}"
    );
    assert_eq!(
        chargeonce["depends_on"]["postgres"]["condition"].as_str(),
        Some("service_healthy"),
        "docker-compose.yml: chargeonce must depend on postgres with condition service_healthy"
    );
    let context = match &chargeonce["build"] {
        Value::String(context) => context.clone(),
        build => build["context"].as_str().unwrap_or_default().to_owned(),
    };
    assert_eq!(
        normalise(&context),
        ".",
        "docker-compose.yml: chargeonce must be built from this folder (build: .)"
    );

    // Named volumes must be declared at the top level.
    for volume in postgres["volumes"].as_sequence().into_iter().flatten() {
        let volume = scalar(volume, "a volume");
        let source = volume.split(':').next().unwrap();
        if !(source.starts_with('.') || source.starts_with('/') || source.starts_with('~')) {
            assert!(
                compose["volumes"].get(source).is_some(),
                "docker-compose.yml: named volume `{source}` is not declared under the top-level volumes"
            );
        }
    }
}

#[test]
fn compose_environment_is_valid_chargeonce_configuration() {
    let compose = compose();
    let chargeonce = service(&compose, "chargeonce");
    let vars = environment(chargeonce, "chargeonce");
    assert!(
        !vars.is_empty(),
        "docker-compose.yml: chargeonce has no environment"
    );
    assert_known_variables(&vars, "docker-compose.yml chargeonce environment");

    // What the container sees: the image's ENV, overridden by compose.
    let mut effective = image().runtime.env();
    effective.extend(vars.clone());
    let settings = load_settings(&effective, "docker-compose.yml chargeonce environment");

    // The same keys without the image's ENV must load too (each value valid
    // on its own), so a misspelled key or a bad value fails here.
    load_settings(&vars, "docker-compose.yml chargeonce environment alone");

    assert_eq!(
        settings.server.host, "0.0.0.0",
        "docker-compose.yml: chargeonce must listen on 0.0.0.0 inside its container"
    );

    // The database URL must reach the postgres service with its credentials.
    let url: tokio_postgres::Config = settings
        .database
        .url
        .parse()
        .unwrap_or_else(|e| panic!("docker-compose.yml: the database URL does not parse: {e}"));
    let hosts: Vec<String> = url
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[allow(unreachable_patterns)]
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        hosts,
        ["postgres"],
        "docker-compose.yml: the database URL must point at the `postgres` service"
    );
    assert!(
        url.get_ports().iter().all(|port| *port == 5432),
        "docker-compose.yml: the database URL must use port 5432 of the postgres service, found {:?}",
        url.get_ports()
    );
    let pg = environment(service(&compose, "postgres"), "postgres");
    let pg_user = pg
        .get("POSTGRES_USER")
        .cloned()
        .unwrap_or_else(|| "postgres".to_owned());
    let pg_database = pg
        .get("POSTGRES_DB")
        .cloned()
        .unwrap_or_else(|| pg_user.clone());
    assert_eq!(
        url.get_user(),
        Some(pg_user.as_str()),
        "docker-compose.yml: the database URL's user must be the postgres service's POSTGRES_USER"
    );
    assert_eq!(
        url.get_password(),
        pg.get("POSTGRES_PASSWORD").map(|p| p.as_bytes()),
        "docker-compose.yml: the database URL's password must be the postgres service's POSTGRES_PASSWORD"
    );
    assert_eq!(
        url.get_dbname(),
        Some(pg_database.as_str()),
        "docker-compose.yml: the database URL's database must be the one postgres creates (POSTGRES_DB)"
    );

    // The published port's container side is the port chargeonce listens on.
    let default_port = default_settings().server.port;
    assert_eq!(
        settings.server.port, default_port,
        "docker-compose.yml: keep server.port at its default {default_port} (the image EXPOSEs it)"
    );
    let ports: Vec<u16> = chargeonce["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(container_port)
        .collect();
    assert!(
        ports.contains(&settings.server.port),
        "docker-compose.yml: chargeonce must publish container port {} (server.port), publishes {ports:?}",
        settings.server.port
    );
}

#[test]
fn compose_points_chargeonce_at_its_psp_sim() {
    let compose = compose();
    let simulator = service(&compose, "psp-sim");
    let command: Vec<String> = simulator["command"]
        .as_sequence()
        .expect("docker-compose.yml: psp-sim needs a command list")
        .iter()
        .map(|part| scalar(part, "a psp-sim command word"))
        .collect();
    assert_eq!(
        command.first().map(String::as_str),
        Some("psp-sim"),
        "docker-compose.yml: psp-sim must run `chargeonce psp-sim`, found {command:?}"
    );
    let option = |name: &str| {
        command
            .iter()
            .position(|word| word == name)
            .and_then(|i| command.get(i + 1))
            .cloned()
    };
    assert_eq!(
        option("--host").as_deref(),
        Some("0.0.0.0"),
        "docker-compose.yml: psp-sim must listen on 0.0.0.0"
    );
    let port = option("--port").unwrap_or_else(|| "8090".to_owned());

    let chargeonce = service(&compose, "chargeonce");
    let settings = load_settings(
        &environment(chargeonce, "chargeonce"),
        "docker-compose.yml chargeonce environment",
    );
    assert_eq!(
        settings.processor.kind,
        chargeonce::config::ProcessorKind::Http,
        "docker-compose.yml: chargeonce must use processor.kind = http"
    );
    assert_eq!(
        settings.processor.url,
        format!("http://psp-sim:{port}"),
        "docker-compose.yml: processor.url must reach the psp-sim service"
    );
    assert!(
        chargeonce["depends_on"].get("psp-sim").is_some(),
        "docker-compose.yml: chargeonce must depend on psp-sim"
    );
}

//! Static checks of the deployment files (Dockerfile, .dockerignore,
//! docker-compose.yml) against the code and the workspace, so they fail when
//! the files drift from the configuration keys, the port, the command line,
//! the workspace members or the files the compiler embeds. No Docker engine
//! and no database needed.
//!
//! Only what is specific to chargeonce is checked here. Generic Dockerfile
//! linting (syntax, shell in RUN, apt hygiene, JSON notation, ...) is
//! hadolint's job in `.ci/run`. The Dockerfile is read line by line for the
//! few instructions these checks look at; the compose file through serde.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use chargeonce::config::{ProcessorKind, Settings};
use chargeonce::processor::simulator::SimulatorOptions;
use clap::Parser;
use secrecy::ExposeSecret;
use serde::Deserialize;

// ---------------------------------------------------------------------------
// The code's side: configuration, binary, workspace

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
        .file_stem()
        .and_then(|name| name.to_str())
        .expect("binary file name")
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

/// The workspace as cargo loads it: `[workspace] members` (globs expanded)
/// and the path dependencies, from `cargo metadata`.
#[derive(Deserialize)]
struct Metadata {
    packages: Vec<Package>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    manifest_path: PathBuf,
    rust_version: Option<String>,
    targets: Vec<Target>,
    dependencies: Vec<Dependency>,
}

#[derive(Deserialize)]
struct Target {
    src_path: PathBuf,
}

#[derive(Deserialize)]
struct Dependency {
    path: Option<PathBuf>,
}

fn workspace() -> Metadata {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version=1", "--no-deps", "--offline"])
        .arg("--manifest-path")
        .arg(repo().join("Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo cannot load the workspace: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata output")
}

/// `path` relative to the repository root, with `/` separators; it must be
/// inside the repository (the Docker build context).
fn in_repo(path: &Path, what: &str) -> String {
    let root = repo().canonicalize().unwrap();
    let path = path
        .canonicalize()
        .unwrap_or_else(|e| panic!("{what}: {}: {e}", path.display()));
    let relative = path.strip_prefix(&root).unwrap_or_else(|_| {
        panic!(
            "{what} ({}) is outside the repository, so outside the Docker build context",
            path.display()
        )
    });
    relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// The files the image build needs: the lock file, every package's manifest
/// (cargo loads the whole workspace even for `--bin chargeonce`) and the
/// sources of its targets (cargo refuses a manifest whose declared targets,
/// such as `[[bench]] load`, are missing; this asks for all of them, which
/// copying the source tree gives), the manifests of path dependencies, and
/// whatever the sources embed (config/default.toml, migrations/).
fn files_cargo_needs() -> BTreeSet<String> {
    let mut needed = BTreeSet::from(["Cargo.toml".to_owned(), "Cargo.lock".to_owned()]);
    for package in workspace().packages {
        let what = format!("package `{}`", package.name);
        needed.insert(in_repo(&package.manifest_path, &what));
        for target in &package.targets {
            needed.insert(in_repo(&target.src_path, &what));
        }
        for path in package.dependencies.iter().filter_map(|d| d.path.as_ref()) {
            needed.insert(in_repo(&path.join("Cargo.toml"), &what));
        }
        let root = package.manifest_path.parent().unwrap();
        for file in embedded_files(&root.join("src"), root) {
            needed.insert(in_repo(&file, &what));
        }
    }
    needed
}

/// Files the sources under `dir` embed at compile time: include_str! and
/// include_bytes! paths (relative to the source file) and the files of
/// embed_migrations! folders (relative to the package root).
fn embedded_files(dir: &Path, package_root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(embedded_files(&path, package_root));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        for (opening, base) in [
            ("include_str!(\"", path.parent().unwrap()),
            ("include_bytes!(\"", path.parent().unwrap()),
            ("embed_migrations!(\"", package_root),
        ] {
            for (index, _) in text.match_indices(opening) {
                let rest = &text[index + opening.len()..];
                let literal = &rest[..rest.find('"').unwrap()];
                let target = base.join(literal).canonicalize().unwrap_or_else(|e| {
                    panic!(
                        "{} embeds {literal}, which cannot be read: {e}",
                        path.display()
                    )
                });
                if target.is_dir() {
                    for file in fs::read_dir(&target).unwrap() {
                        found.push(file.unwrap().path());
                    }
                } else {
                    found.push(target);
                }
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------
// .dockerignore and Dockerfile paths

/// `a/./b/../c/` -> `a/c`, `./` -> `.`; a leading `/` is kept.
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    match (path.starts_with('/'), parts.is_empty()) {
        (true, _) => format!("/{}", parts.join("/")),
        (false, true) => ".".to_owned(),
        (false, false) => parts.join("/"),
    }
}

/// `path` from the folder `dir`, as WORKDIR and COPY destinations resolve.
fn join(dir: &str, path: &str) -> String {
    clean(&if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{dir}/{path}")
    })
}

/// Whether .dockerignore leaves `path` (relative to the repository) out of
/// the build context. As Docker reads it: patterns are relative to the
/// context root, `*` stays within a folder, `**` spans folders, a pattern
/// that names a folder covers everything in it, and the last matching line
/// wins (`!` lines put paths back).
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
        let (exception, pattern) = match line.strip_prefix('!') {
            Some(pattern) => (true, pattern),
            None => (false, line),
        };
        let pattern = glob::Pattern::new(&clean(pattern.trim_start_matches('/')))
            .unwrap_or_else(|e| panic!(".dockerignore: bad pattern `{line}`: {e}"));
        if (1..=parts.len()).any(|n| pattern.matches_with(&parts[..n].join("/"), options)) {
            excluded = !exception;
        }
    }
    excluded
}

// ---------------------------------------------------------------------------
// The Dockerfile, line by line: only the instructions the checks need

#[derive(Debug)]
struct Stage {
    image: String,
    name: Option<String>,
    /// (keyword in upper case, arguments), in order.
    instructions: Vec<(String, String)>,
}

impl Stage {
    fn args<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions
            .iter()
            .filter(move |(k, _)| k == keyword)
            .map(|(_, args)| args.as_str())
    }

    /// The COPY instructions with the WORKDIR each runs in.
    fn copies(&self) -> impl Iterator<Item = (Copy, String)> + '_ {
        self.instructions
            .iter()
            .enumerate()
            .filter(|(_, (k, _))| k == "COPY")
            .map(|(i, (_, args))| (Copy::parse(args), self.workdir(i)))
    }

    fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("stage `{name}` ({})", self.image),
            None => format!("stage {}", self.image),
        }
    }

    /// The WORKDIR in effect before instruction `index` (`/` at first).
    fn workdir(&self, index: usize) -> String {
        self.instructions[..index]
            .iter()
            .filter(|(k, _)| k == "WORKDIR")
            .fold("/".to_owned(), |dir, (_, args)| join(&dir, args.trim()))
    }

    fn final_workdir(&self) -> String {
        self.workdir(self.instructions.len())
    }

    /// `ENV KEY=VALUE ...` (the only form read here).
    fn env(&self) -> HashMap<String, String> {
        let mut vars = HashMap::new();
        for args in self.args("ENV") {
            for pair in args.split_whitespace() {
                let (key, value) = pair.split_once('=').unwrap_or_else(|| {
                    panic!("Dockerfile: write `ENV {args}` as ENV KEY=VALUE (no spaces in values)")
                });
                vars.insert(key.to_owned(), value.trim_matches('"').to_owned());
            }
        }
        vars
    }

    /// ENTRYPOINT or CMD (the last one counts), which must be a JSON array.
    fn exec_form(&self, keyword: &str) -> Vec<String> {
        self.args(keyword).last().map_or_else(Vec::new, |args| {
            serde_json::from_str(args).unwrap_or_else(|e| {
                panic!("Dockerfile: {keyword} must be a JSON array (exec form): {e}")
            })
        })
    }
}

/// Logical lines (continuations joined, comments dropped) split into stages.
/// No heredocs and no `# escape=` directive: hadolint reads the real syntax.
fn dockerfile() -> Vec<Stage> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => lines.push(std::mem::take(&mut current) + line),
        }
    }
    assert!(
        current.is_empty(),
        "Dockerfile ends inside a continued line"
    );
    let mut stages: Vec<Stage> = Vec::new();
    for line in &lines {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let (keyword, args) = (keyword.to_ascii_uppercase(), args.trim().to_owned());
        if keyword == "FROM" {
            let words: Vec<&str> = args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            stages.push(Stage {
                image: words.first().expect("FROM without an image").to_string(),
                name: match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                    _ => None,
                },
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("Dockerfile: `{keyword}` before the first FROM"))
                .instructions
                .push((keyword, args));
        }
    }
    stages
}

/// A COPY: `--from` if any, the sources (cleaned) and the destination.
struct Copy {
    from: Option<String>,
    sources: Vec<String>,
    destination: String,
}

impl Copy {
    fn parse(args: &str) -> Self {
        let mut from = None;
        let mut rest = args.trim();
        while let Some(flagged) = rest.strip_prefix("--") {
            let (flag, tail) = flagged
                .split_once(char::is_whitespace)
                .unwrap_or((flagged, ""));
            if let Some(stage) = flag.strip_prefix("from=") {
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
        let destination = paths.pop().unwrap_or_default();
        assert!(
            !paths.is_empty(),
            "Dockerfile: `COPY {args}` needs a source and a destination"
        );
        Self {
            from,
            sources: paths.iter().map(|s| clean(s)).collect(),
            destination,
        }
    }

    /// Where the single source `name` (a file name) lands from `workdir`.
    fn file_target(&self, workdir: &str, name: &str) -> String {
        let destination = join(workdir, &self.destination);
        if self.destination.ends_with('/') {
            join(&destination, name)
        } else {
            destination
        }
    }
}

/// The stages that matter: the final one, and the build stage it copies the
/// binary from (with that COPY and the WORKDIR it runs in).
struct Image {
    build: Stage,
    runtime: Stage,
    binary_copy: (Copy, String),
}

fn image() -> Image {
    let mut stages = dockerfile();
    assert!(
        stages.len() >= 2,
        "Dockerfile: expected a multi-stage build (build + runtime), found {} FROM",
        stages.len()
    );
    let runtime = stages.pop().unwrap();
    let binary = binary_name();
    let binary_copy = runtime
        .copies()
        .find(|(c, _)| {
            c.from.is_some()
                && c.sources
                    .iter()
                    .any(|s| s.ends_with(&format!("/release/{binary}")))
        })
        .unwrap_or_else(|| {
            panic!("Dockerfile: the final stage copies no release/{binary} from a build stage")
        });
    let from = binary_copy.0.from.clone().unwrap();
    let index = stages
        .iter()
        .position(|s| s.name.as_deref() == Some(from.as_str()))
        .or_else(|| from.parse().ok())
        .unwrap_or_else(|| panic!("Dockerfile: COPY --from={from} names no earlier stage"));
    Image {
        build: stages.swap_remove(index),
        runtime,
        binary_copy,
    }
}

/// The Debian release named in an image reference, if any.
fn debian_release(image: &str) -> Option<&'static str> {
    ["buster", "bullseye", "bookworm", "trixie", "forky"]
        .into_iter()
        .find(|release| image.contains(release))
}

// ---------------------------------------------------------------------------
// Dockerfile

#[test]
fn dockerfile_final_stage_is_a_slim_non_root_runtime() {
    let Image { build, runtime, .. } = image();
    assert!(
        build.image.starts_with("rust:"),
        "Dockerfile: the build stage should use the official rust image, found {}",
        build.image
    );
    assert!(
        runtime.image.contains("slim") || runtime.image.contains("distroless"),
        "Dockerfile: the final stage must be a slim runtime image (no toolchain), found {}",
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
    let user = runtime.args("USER").last().unwrap_or_default().trim();
    let user_name = user.split(':').next().unwrap_or_default();
    assert!(
        !user_name.is_empty() && user_name != "root" && user_name != "0",
        "Dockerfile: the final stage must switch to a non-root USER, found `{user}`"
    );
}

#[test]
fn dockerfile_build_stage_has_every_workspace_file_cargo_needs() {
    let Image { build, .. } = image();
    // Every `cargo build` runs on the whole build context, copied into its
    // WORKDIR: cargo loads every workspace member ([workspace] members in
    // Cargo.toml, path dependencies) even to build one binary, and the
    // binary embeds files from config/ and migrations/.
    let mut builds = 0;
    for (index, (keyword, args)) in build.instructions.iter().enumerate() {
        if keyword != "RUN" || !args.contains("cargo build") {
            continue;
        }
        builds += 1;
        let workdir = build.workdir(index);
        let whole_context_copied =
            build.instructions[..index]
                .iter()
                .enumerate()
                .any(|(i, (k, a))| {
                    k == "COPY" && {
                        let copy = Copy::parse(a);
                        copy.from.is_none()
                            && copy.sources == ["."]
                            && join(&build.workdir(i), &copy.destination) == workdir
                    }
                });
        assert!(
            whole_context_copied,
            "Dockerfile ({}): copy the whole build context into {workdir} (`COPY . .`) before `RUN {args}`: cargo needs every workspace member's manifest and targets, and the files the binary embeds",
            build.label()
        );
    }
    assert!(
        builds > 0,
        "Dockerfile: the build stage runs no `cargo build`"
    );
    // ... and .dockerignore must leave all of that in the context.
    for path in files_cargo_needs() {
        assert!(
            !ignored(&path),
            ".dockerignore excludes `{path}`, which cargo needs to build the image"
        );
    }
}

#[test]
fn dockerfile_builds_the_release_binary_with_the_locked_dependencies() {
    let Image {
        build, binary_copy, ..
    } = image();
    let builds: Vec<&str> = build
        .args("RUN")
        .filter(|args| args.contains("cargo build"))
        .collect();
    assert!(
        !builds.is_empty(),
        "Dockerfile: the build stage runs no `cargo build`"
    );
    for run in &builds {
        for flag in ["--locked", "--release"] {
            assert!(
                run.split_whitespace().any(|word| word == flag),
                "Dockerfile: `cargo build` must use {flag} (the image builds what Cargo.lock pins, in release mode): `RUN {run}`"
            );
        }
    }
    // The binary the final stage takes is the one cargo wrote.
    let target_dir = join(
        &build.final_workdir(),
        build
            .env()
            .get("CARGO_TARGET_DIR")
            .map_or("target", String::as_str),
    );
    let expected = format!("{target_dir}/release/{}", binary_name());
    assert!(
        binary_copy.0.sources == [expected.as_str()],
        "Dockerfile: the final stage must copy {expected}, where cargo build writes the binary, copies {:?}",
        binary_copy.0.sources
    );
}

#[test]
fn dockerfile_rust_image_is_new_enough_for_the_workspace() {
    let Image { build, .. } = image();
    let (_, tag) = build.image.split_once(':').unwrap_or_else(|| {
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
    for package in workspace().packages {
        if let Some(required) = package.rust_version {
            assert!(
                parse_version(version) >= parse_version(&required),
                "Dockerfile: rust image {version} is older than rust-version {required} of `{}`",
                package.name
            );
        }
    }
}

#[test]
fn dockerfile_runs_chargeonce_serve_on_the_configured_port() {
    let Image {
        runtime,
        binary_copy: (binary_copy, copy_workdir),
        ..
    } = image();
    let binary = binary_name();

    // ENTRYPOINT + CMD together must be `chargeonce serve`...
    let mut command = runtime.exec_form("ENTRYPOINT");
    command.extend(runtime.exec_form("CMD"));
    assert_eq!(
        command,
        [binary.clone(), "serve".to_owned()],
        "Dockerfile: ENTRYPOINT + CMD must run `{binary} serve`"
    );
    // ... and `chargeonce` must be on PATH, where ENTRYPOINT looks it up.
    assert_eq!(
        binary_copy.file_target(&copy_workdir, &binary),
        format!("/usr/local/bin/{binary}"),
        "Dockerfile: the binary must be copied to /usr/local/bin/{binary} for ENTRYPOINT [\"{binary}\"]"
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
    let default_port = default_settings().server.port;
    assert_eq!(
        settings.server.port, default_port,
        "Dockerfile: the image changes server.port; keep the default {default_port}"
    );
    let exposed: Vec<u16> = runtime
        .args("EXPOSE")
        .flat_map(str::split_whitespace)
        .map(|port| {
            port.split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap_or_else(|_| panic!("Dockerfile: EXPOSE {port} is not a port"))
        })
        .collect();
    assert_eq!(
        exposed,
        [default_port],
        "Dockerfile: EXPOSE must announce server.port ({default_port}, config/default.toml)"
    );

    // The config folder must land where the binary looks: ./config from the
    // final WORKDIR, or CHARGEONCE_CONFIG_DIR.
    let workdir = runtime.final_workdir();
    let config_dir = join(
        &workdir,
        env.get("CHARGEONCE_CONFIG_DIR")
            .map_or("config", String::as_str),
    );
    let copied = runtime.copies().any(|(copy, copy_workdir)| {
        copy.from.is_none()
            && copy.sources == ["config"]
            && join(&copy_workdir, &copy.destination) == config_dir
    });
    assert!(
        copied,
        "Dockerfile: the final stage must COPY config to {config_dir}, where chargeonce reads its config folder"
    );
    for entry in fs::read_dir(repo().join("config")).unwrap() {
        let path = format!("config/{}", entry.unwrap().file_name().to_string_lossy());
        assert!(
            !ignored(&path),
            ".dockerignore excludes `{path}`, which the image needs"
        );
    }
}

#[test]
fn dockerfile_copies_only_files_that_exist_and_are_not_ignored() {
    for stage in dockerfile() {
        for (copy, _) in stage.copies().filter(|(c, _)| c.from.is_none()) {
            for source in copy.sources.iter().filter(|s| *s != ".") {
                assert!(
                    repo().join(source).exists(),
                    "Dockerfile ({}): COPY of `{source}`, which is not in the repository",
                    stage.label()
                );
                assert!(
                    !ignored(source),
                    "Dockerfile ({}): COPY of `{source}`, which .dockerignore excludes",
                    stage.label()
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// .dockerignore

#[test]
fn dockerignore_keeps_build_output_local_data_and_web_out_of_the_context() {
    for path in [
        "target/release/chargeonce",
        ".pgdata/data/PG_VERSION",
        ".git/HEAD",
        "web/package.json",
        "web/node_modules/some-package/index.js",
        "client/node_modules/some-package/index.js",
        "chargeonce.log",
    ] {
        assert!(
            ignored(path),
            ".dockerignore must keep `{path}` out of the build context"
        );
    }
}

// ---------------------------------------------------------------------------
// docker-compose.yml

#[derive(Debug, Deserialize)]
struct Compose {
    services: BTreeMap<String, Service>,
    #[serde(default)]
    volumes: BTreeMap<String, Option<yaml_serde::Value>>,
}

#[derive(Debug, Deserialize)]
struct Service {
    build: Option<Build>,
    command: Option<Vec<String>>,
    #[serde(default)]
    environment: Environment,
    #[serde(default)]
    ports: Vec<Port>,
    #[serde(default)]
    depends_on: DependsOn,
    healthcheck: Option<Healthcheck>,
    #[serde(default)]
    volumes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Build {
    Context(String),
    Long { context: String },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Environment {
    Map(BTreeMap<String, Option<yaml_serde::Value>>),
    List(Vec<String>),
}

impl Default for Environment {
    fn default() -> Self {
        Self::List(Vec::new())
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Port {
    Long { target: u16 },
    Short(yaml_serde::Value),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DependsOn {
    List(Vec<String>),
    Map(BTreeMap<String, Dependence>),
}

impl Default for DependsOn {
    fn default() -> Self {
        Self::List(Vec::new())
    }
}

#[derive(Debug, Deserialize)]
struct Dependence {
    condition: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Healthcheck {
    test: yaml_serde::Value,
}

fn compose() -> Compose {
    yaml_serde::from_str(&read("docker-compose.yml"))
        .unwrap_or_else(|e| panic!("docker-compose.yml does not read as a compose file: {e}"))
}

impl Compose {
    fn service(&self, name: &str) -> &Service {
        self.services
            .get(name)
            .unwrap_or_else(|| panic!("docker-compose.yml: no service `{name}`"))
    }
}

fn scalar(value: &yaml_serde::Value, what: &str) -> String {
    match value {
        yaml_serde::Value::String(s) => s.clone(),
        yaml_serde::Value::Number(n) => n.to_string(),
        yaml_serde::Value::Bool(b) => b.to_string(),
        other => panic!("docker-compose.yml: {what} must be a plain value, found {other:?}"),
    }
}

impl Service {
    /// The `environment`, in map or `KEY=VALUE` list form.
    fn environment(&self, what: &str) -> HashMap<String, String> {
        match &self.environment {
            Environment::Map(map) => map
                .iter()
                .map(|(key, value)| {
                    let value = value.as_ref().unwrap_or_else(|| {
                        panic!("docker-compose.yml: {what} environment `{key}` takes its value from the host; give it one")
                    });
                    (key.clone(), scalar(value, &format!("{what} environment `{key}`")))
                })
                .collect(),
            Environment::List(items) => items
                .iter()
                .map(|item| {
                    let (key, value) = item.split_once('=').unwrap_or_else(|| {
                        panic!("docker-compose.yml: {what} environment entry `{item}` has no =")
                    });
                    (key.to_owned(), value.to_owned())
                })
                .collect(),
        }
    }

    /// The container side of each `ports` entry: "8080", "8080:8080",
    /// "127.0.0.1:8080:8080/tcp", or the long form's `target`.
    fn container_ports(&self) -> Vec<u16> {
        self.ports
            .iter()
            .map(|port| match port {
                Port::Long { target } => *target,
                Port::Short(value) => {
                    let short = scalar(value, "a ports entry");
                    let port = short.split('/').next().unwrap().rsplit(':').next().unwrap();
                    port.parse().unwrap_or_else(|_| {
                        panic!("docker-compose.yml: cannot read the container port of `{short}`")
                    })
                }
            })
            .collect()
    }

    fn depends_on(&self, name: &str) -> Option<Option<&str>> {
        match &self.depends_on {
            DependsOn::List(names) => names.iter().any(|n| n == name).then_some(None),
            DependsOn::Map(map) => map.get(name).map(|d| d.condition.as_deref()),
        }
    }

    fn built_from_this_folder(&self, name: &str) {
        let context = match &self.build {
            Some(Build::Context(context) | Build::Long { context }) => clean(context),
            None => String::new(),
        };
        assert_eq!(
            context, ".",
            "docker-compose.yml: {name} must be built from this folder (build: .), the image of the Dockerfile"
        );
    }
}

#[test]
fn compose_runs_chargeonce_after_a_healthy_postgres() {
    let compose = compose();
    let postgres = compose.service("postgres");
    let chargeonce = compose.service("chargeonce");

    let healthcheck = postgres
        .healthcheck
        .as_ref()
        .map(|h| yaml_serde::to_string(&h.test).unwrap())
        .unwrap_or_default();
    assert!(
        healthcheck.contains("pg_isready"),
        "docker-compose.yml: postgres needs a healthcheck running pg_isready, found `{healthcheck}`"
    );
    assert_eq!(
        chargeonce.depends_on("postgres"),
        Some(Some("service_healthy")),
        "docker-compose.yml: chargeonce must depend on postgres with condition service_healthy"
    );
    chargeonce.built_from_this_folder("chargeonce");

    // Named volumes must be declared at the top level.
    for volume in &postgres.volumes {
        let source = volume.split(':').next().unwrap();
        if !(source.starts_with('.') || source.starts_with('/') || source.starts_with('~')) {
            assert!(
                compose.volumes.contains_key(source),
                "docker-compose.yml: named volume `{source}` is not declared under the top-level volumes"
            );
        }
    }
}

#[test]
fn compose_environment_is_valid_chargeonce_configuration() {
    let compose = compose();
    let chargeonce = compose.service("chargeonce");
    let vars = chargeonce.environment("chargeonce");
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
        .expose_secret()
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
    let pg = compose.service("postgres").environment("postgres");
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
    let ports = chargeonce.container_ports();
    assert!(
        ports.contains(&settings.server.port),
        "docker-compose.yml: chargeonce must publish container port {} (server.port), publishes {ports:?}",
        settings.server.port
    );
}

/// `chargeonce psp-sim ...` as the binary reads it.
#[derive(Parser)]
#[command(name = "psp-sim")]
struct PspSimCommand {
    #[command(flatten)]
    options: SimulatorOptions,
}

#[test]
fn compose_points_chargeonce_at_its_psp_sim() {
    let compose = compose();
    let simulator = compose.service("psp-sim");
    simulator.built_from_this_folder("psp-sim");

    // The command follows the image's ENTRYPOINT (chargeonce): it must be
    // `psp-sim` with options the binary accepts.
    let command = simulator
        .command
        .clone()
        .expect("docker-compose.yml: psp-sim needs a command list");
    assert_eq!(
        command.first().map(String::as_str),
        Some("psp-sim"),
        "docker-compose.yml: psp-sim must run `chargeonce psp-sim`, found {command:?}"
    );
    let options = PspSimCommand::try_parse_from(&command)
        .unwrap_or_else(|e| {
            panic!(
                "docker-compose.yml: `chargeonce {}` is not a valid command: {e}",
                command.join(" ")
            )
        })
        .options;
    options
        .validate()
        .unwrap_or_else(|e| panic!("docker-compose.yml: psp-sim options: {e}"));
    assert_eq!(
        options.host, "0.0.0.0",
        "docker-compose.yml: psp-sim must listen on 0.0.0.0 (--host)"
    );
    let published = simulator.container_ports();
    assert!(
        published.iter().all(|port| *port == options.port),
        "docker-compose.yml: psp-sim publishes container ports {published:?}, but listens on {}",
        options.port
    );

    let chargeonce = compose.service("chargeonce");
    let settings = load_settings(
        &chargeonce.environment("chargeonce"),
        "docker-compose.yml chargeonce environment",
    );
    assert_eq!(
        settings.processor.kind,
        ProcessorKind::Http,
        "docker-compose.yml: chargeonce must use processor.kind = http"
    );
    assert_eq!(
        settings.processor.url,
        format!("http://psp-sim:{}", options.port),
        "docker-compose.yml: processor.url must reach the psp-sim service on its port"
    );
    assert!(
        chargeonce.depends_on("psp-sim").is_some(),
        "docker-compose.yml: chargeonce must depend on psp-sim"
    );
}

//! The one way tests, tools and benchmarks run the `chargeonce` binary:
//! with a clean environment (only what the caller sets, never a developer's
//! `CHARGEONCE__…` variables), as a command run to its end, as `serve` on
//! port 0 announcing the port it bound, or as `psp-sim`. Starting and
//! stopping the process is [`Spawned`]'s job.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::process::Spawned;

/// The log level of spawned processes: warnings, plus the lines that
/// announce the ports (`chargeonce listening` / `psp-sim listening`).
pub const ANNOUNCING_LOG: &str =
    "warn,chargeonce::startup=info,chargeonce::processor::simulator=info";

/// The binary and the folder it runs in: the repository root reads its
/// `config/`; a folder without one gives the defaults embedded in the binary.
#[derive(Debug, Clone)]
pub struct Chargeonce {
    path: PathBuf,
    dir: PathBuf,
}

impl Chargeonce {
    pub fn new(path: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            dir: dir.into(),
        }
    }

    /// `chargeonce` beside the running program (a tool in target/release or
    /// target/debug), built first when the tool was started by cargo
    /// (`cargo run` sets `CARGO`), so it is always the binary of the sources
    /// at hand.
    pub fn beside_this_program(dir: impl Into<PathBuf>) -> Result<Self, String> {
        let this = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
        let path = this.with_file_name("chargeonce");
        if let Some(cargo) = std::env::var_os("CARGO") {
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let mut build = Command::new(cargo);
            build
                .current_dir(workspace)
                .args(["build", "--locked", "--bin", "chargeonce"]);
            if path.parent().and_then(Path::file_name) == Some("release".as_ref()) {
                build.arg("--release");
            }
            // What `cargo run` set for the tool is not a build's environment:
            // build scripts that watch CARGO_MANIFEST_DIR (ring's) would see
            // it change and rebuild, here and again in the next plain build.
            for (name, _) in std::env::vars_os() {
                let by_cargo_run = name.to_str().is_some_and(|name| {
                    [
                        "CARGO_PKG_",
                        "CARGO_MANIFEST_",
                        "CARGO_CRATE_",
                        "CARGO_BIN_",
                    ]
                    .iter()
                    .any(|prefix| name.starts_with(prefix))
                        || name == "CARGO_PRIMARY_PACKAGE"
                        || name == "OUT_DIR"
                });
                if by_cargo_run {
                    build.env_remove(&name);
                }
            }
            eprintln!("building the service: {build:?}");
            let status = build.status().map_err(|e| format!("running cargo: {e}"))?;
            if !status.success() {
                return Err(format!("building the service binary failed ({status})"));
            }
        }
        if !path.is_file() {
            return Err(format!(
                "no service binary at {}: build it with `cargo build --release --bin chargeonce`",
                path.display()
            ));
        }
        Ok(Self::new(path, dir))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The binary with a clean environment: the database (if any) and
    /// warnings only.
    pub fn command(&self, database_url: &str) -> Command {
        let mut command = Command::new(&self.path);
        command
            .env_clear()
            .env("RUST_LOG", "warn")
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        if !database_url.is_empty() {
            command.env("DATABASE_URL", database_url);
        }
        command
    }

    /// `chargeonce ARGS` run to its end: its stdout, trimmed; an error with
    /// its stderr if it failed.
    pub async fn run(&self, database_url: &str, args: &[&str]) -> Result<String, String> {
        let mut command = self.command(database_url);
        command.args(args);
        let output = output(command)
            .await
            .map_err(|e| format!("cannot run {}: {e}", self.path.display()))?;
        if !output.status.success() {
            return Err(format!(
                "`chargeonce {}` failed ({}): {}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// `chargeonce serve` on port 0, logging the line that announces the
    /// port; the caller adds its settings (`CHARGEONCE__…`) before starting
    /// it with [`Spawned::start`] and ready path `/readyz`.
    pub fn serve_command(&self, database_url: &str) -> Command {
        let mut command = self.command(database_url);
        command
            .env("RUST_LOG", ANNOUNCING_LOG)
            .env("CHARGEONCE__SERVER__PORT", "0")
            .arg("serve");
        command
    }

    /// `chargeonce serve` with `settings` (environment variables), ready.
    pub async fn serve(&self, database_url: &str, settings: &[(&str, &str)]) -> Spawned {
        let mut command = self.serve_command(database_url);
        command.envs(settings.iter().copied());
        Spawned::start(command, "/readyz").await
    }

    /// `chargeonce psp-sim` on port 0 with `options`; ready path `/healthz`.
    pub fn psp_sim_command(&self, options: &[&str]) -> Command {
        let mut command = self.command("");
        command
            .env("RUST_LOG", ANNOUNCING_LOG)
            .args(["psp-sim", "--port", "0"])
            .args(options);
        command
    }

    /// `chargeonce psp-sim` with `options`, ready.
    pub async fn psp_sim(&self, options: &[&str]) -> Spawned {
        Spawned::start(self.psp_sim_command(options), "/healthz").await
    }
}

/// Runs `command` to its end, its output captured; killed if the caller
/// gives up waiting (the future is dropped).
pub async fn output(command: Command) -> std::io::Result<Output> {
    tokio::process::Command::from(command)
        .kill_on_drop(true)
        .output()
        .await
}

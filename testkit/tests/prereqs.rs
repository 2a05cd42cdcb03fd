//! `scripts/dev test` checks what the whole suite needs before compiling
//! anything (scripts/lib/prereqs.sh). With Chromium and PgBouncer absent
//! (their paths pointed at nothing) and without root, it stops within
//! seconds naming both and the command that installs them; as root it
//! decides to install them (a dry run: the tests do not call apt-get).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// scripts/dev and scripts/lib copied to a folder any user can read, so the
/// check can run as `nobody` wherever the repository is.
fn scripts_copy(name: &str) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root =
        std::env::temp_dir().join(format!("chargeonce-prereqs-{name}-{}", std::process::id()));
    std::fs::create_dir_all(root.join("scripts/lib")).unwrap();
    std::fs::copy(repo.join("scripts/dev"), root.join("scripts/dev")).unwrap();
    // Every file scripts/dev sources.
    for entry in std::fs::read_dir(repo.join("scripts/lib")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(
            &path,
            root.join("scripts/lib").join(path.file_name().unwrap()),
        )
        .unwrap();
    }
    for dir in [&root, &root.join("scripts"), &root.join("scripts/lib")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    root
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `scripts/dev ARGS` with Chromium and PgBouncer looked for where they are
/// not; as `nobody` when `as_nobody` and we are root.
fn dev(root: &Path, args: &[&str], as_nobody: bool, env: &[(&str, &str)]) -> (Output, Duration) {
    let script = root.join("scripts/dev");
    // Run by bash rather than executed itself: the other test may be
    // copying its scripts while this one forks, and a child forked then
    // holds that file open for writing until it execs, so executing a
    // just-copied file can fail with "Text file busy".
    let mut command = if as_nobody && is_root() {
        let mut setpriv = Command::new("setpriv");
        setpriv.args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "bash",
        ]);
        setpriv
    } else {
        Command::new("bash")
    };
    command
        .arg(&script)
        .args(args)
        .env("CHROMIUM_PATH", "/nonexistent/chromium")
        .env("PGBOUNCER_PATH", "/nonexistent/pgbouncer")
        .envs(env.iter().copied())
        .current_dir(root);
    let started = Instant::now();
    let output = command.output().expect("run scripts/dev");
    (output, started.elapsed())
}

#[test]
fn without_root_a_missing_chromium_and_pgbouncer_stop_the_run_at_once() {
    let root = scripts_copy("stop");
    let (output, took) = dev(&root, &["test"], true, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
    for named in [
        "Chromium (/nonexistent/chromium",
        "PgBouncer (/nonexistent/pgbouncer",
        "sudo apt-get update && sudo apt-get install -y",
    ] {
        assert!(stderr.contains(named), "does not name {named:?}: {stderr}");
    }
    let command = stderr
        .lines()
        .find(|l| l.contains("apt-get install"))
        .unwrap();
    let packages: Vec<&str> = command
        .split_whitespace()
        .skip_while(|w| *w != "-y")
        .collect();
    assert!(
        packages.contains(&"chromium") && packages.contains(&"pgbouncer"),
        "{command}"
    );
    assert!(
        !stderr.contains("Compiling"),
        "nothing is compiled: {stderr}"
    );
    std::fs::remove_dir_all(root).unwrap();
}

/// The decision follows who runs it: root installs (here a dry run), anyone
/// else is told the command.
#[test]
fn root_installs_what_is_missing_and_anyone_else_is_told_how() {
    let root = scripts_copy("decide");
    let (output, _) = dev(&root, &["prereqs"], false, &[("PREREQS_DRY_RUN", "1")]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let decided = if is_root() {
        "installing what the test suite needs: apt-get update && apt-get install -y"
    } else {
        "sudo apt-get update && sudo apt-get install -y"
    };
    assert_eq!(output.status.success(), is_root(), "{stderr}");
    let line = stderr.lines().find(|l| l.contains(decided));
    let line = line.unwrap_or_else(|| panic!("no {decided:?}: {stderr}"));
    assert!(
        line.contains("chromium") && line.contains("pgbouncer"),
        "{line}"
    );
    std::fs::remove_dir_all(root).unwrap();
}

//! scripts/bootstrap.sh on a machine that lacks every package (stand-in `dpkg-query` and
//! `apt-get` (and `sudo`) on PATH, run in a scratch copy of the repository layout): before installing it
//! says how long the first build takes and how much disk it needs, and apt's own download and
//! disk figures; the package manager's thousand lines go to a log file, not the terminal, and
//! when apt fails the tail of that log and its path are shown and the script exits non-zero.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A scratch repository with the script, stand-ins for apt and the two venvs; apt-get fails
/// its install when `fail`.
fn fake_machine(name: &str, fail: bool) -> (common::Scratch, Command) {
    let d = common::scratch(name);
    let repo = d.join("repo");
    std::fs::create_dir_all(repo.join("scripts")).unwrap();
    std::fs::copy(
        common::root().join("scripts/bootstrap.sh"),
        repo.join("scripts/bootstrap.sh"),
    )
    .unwrap();
    // Already there: CMake and maturin (so nothing is fetched from PyPI here).
    script(
        &repo.join(".venv-cmake/bin/cmake"),
        "echo 'cmake version 3.28.3'",
    );
    script(&repo.join(".venv-py/bin/maturin"), "exit 0");
    let bin = d.join("bin");
    script(&bin.join("dpkg-query"), "exit 1"); // nothing installed
    script(&bin.join("sudo"), "exec \"$@\""); // where the test is not root
    let install = if fail {
        "i=0; while [ $i -lt 500 ]; do echo \"Unpacking package $i\"; i=$((i+1)); done; echo 'E: Sub-process /usr/bin/dpkg returned an error code (1)'; exit 100"
    } else {
        "i=0; while [ $i -lt 1000 ]; do echo \"Setting up package $i\"; i=$((i+1)); done"
    };
    script(
        &bin.join("apt-get"),
        &format!(
            "case \"$*\" in\n\
             *update*) echo 'Get:1 http://deb.debian.org bookworm InRelease';;\n\
             *--assume-no*) echo 'The following NEW packages will be installed:'; \
             echo 'Need to get 123 MB of archives.'; \
             echo 'After this operation, 456 MB of additional disk space will be used.'; \
             echo 'Abort.'; exit 1;;\n\
             *) {install};;\n\
             esac"
        ),
    );
    let mut c = Command::new("bash");
    c.arg(repo.join("scripts/bootstrap.sh"))
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("TMPDIR", &d)
        .env_remove("CARGO_TARGET_DIR");
    (d, c)
}

#[test]
fn bootstrap_says_what_it_costs_and_keeps_apt_quiet() {
    let (d, mut c) = fake_machine("bootstrap-ok", false);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("first build ahead: on 2 cores about 15-20 minutes")
            && err.contains("about 10 GB"),
        "{err}"
    );
    assert!(
        err.contains("Need to get 123 MB of archives.")
            && err.contains("After this operation, 456 MB"),
        "{err}"
    );
    assert!(
        err.lines().count() <= 6,
        "apt's output reached the terminal:\n{err}"
    );
    let log = std::fs::read_to_string(d.join("seistomo-bootstrap-apt.log")).unwrap();
    assert!(log.lines().count() >= 1000, "the log holds apt's output");
    // The last stdout line is the CMake to use.
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.trim_end().ends_with(".venv-cmake/bin/cmake"), "{out}");

    // apt fails: the tail of its output and the log's path, exit status non-zero.
    let (d2, mut c) = fake_machine("bootstrap-fail", true);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("returned an error code") && err.contains("seistomo-bootstrap-apt.log"),
        "{err}"
    );
    assert!(err.lines().count() < 45, "{err}");
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&d2);
}

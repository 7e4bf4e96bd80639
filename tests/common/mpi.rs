//! Launching seistomo under mpirun in the MPI tests (tests/mpi.rs, tests/mpiio.rs).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A job that has not ended by then counts as hung.
pub const HANG: Duration = Duration::from_secs(300);

/// Whether mpirun can be started (says why the MPI tests are skipped when not).
pub fn have_mpirun() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipping: mpirun not found on PATH (install openmpi-bin to run the MPI tests)");
    }
    ok
}

/// What CI passes to mpirun: root allowed, more ranks than cores, no binding.
const MPIRUN_FLAGS: [&str; 4] = [
    "--allow-run-as-root",
    "--oversubscribe",
    "--bind-to",
    "none",
];

/// mpirun with the flags CI uses; one rank per core is not assumed.
pub fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    c.args(MPIRUN_FLAGS)
        // Several ranks share 2 cores: one thread each, and yield while waiting.
        .env("RAYON_NUM_THREADS", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
    c
}

/// Run to the end or fail the test after [`HANG`].
pub fn finish(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start process");
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t.elapsed() > HANG {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "job hung for {HANG:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An empty directory CARGO_TARGET_TMPDIR/NAME (emptied first when it exists).
pub fn fresh_dir(name: &str) -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The one `seistomo: error` line of a failed job's output `text` (fails the test when there
/// is none or more than one); `what` names the job in the message.
pub fn the_error_line<'a>(text: &'a str, what: &str) -> &'a str {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("seistomo: error"))
        .collect();
    assert_eq!(lines.len(), 1, "{what}: one error line expected:\n{text}");
    lines[0]
}

/// [`fresh_dir`] NAME when mpirun can be started; None (having said why) when the MPI test is
/// skipped.
pub fn mpi_dir(name: &str) -> Option<std::path::PathBuf> {
    have_mpirun().then(|| fresh_dir(name))
}

/// The test `child` of this test binary on `np` ranks, with the environment variable `var` set
/// to `value` (which tells the child what to do), run to the end.
pub fn child_test(np: usize, child: &str, var: &str, value: impl AsRef<std::ffi::OsStr>) -> Output {
    let mut c = mpirun();
    c.args(["-np", &np.to_string()])
        .arg(std::env::current_exe().unwrap())
        .args([child, "--exact", "--nocapture", "--test-threads=1"])
        .env(var, value);
    finish(c)
}

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

/// mpirun with the flags CI uses; one rank per core is not assumed.
pub fn mpirun() -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
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

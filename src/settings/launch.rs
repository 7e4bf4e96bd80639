//! The launch: what the environment says about how this process was started. This is the one
//! module that reads environment variables (tests/layers.rs holds it to that): the MPI
//! launcher's variables (Open MPI, MPICH/Intel MPI's hydra, PMIx/PMI-2 launchers such as
//! Slurm's srun), `SEISTOMO_MPI` (force MPI on or off), `RAYON_NUM_THREADS`, the memory the job
//! may use (`SEISTOMO_MEMORY_LIMIT`), the host name, and, in builds with the
//! `fault-injection` feature only, the test hooks `SEISTOMO_FAULT_*`. Everything that tunes a
//! run is configuration instead ([`super::tuning`]).

use crate::error::{Error, Result};

/// Environment variables that MPI launchers set in every rank they start.
const LAUNCHER_VARS: [&str; 5] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "MPI_LOCALNRANKS",
];

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn first_usize(names: &[&str]) -> Option<usize> {
    names
        .iter()
        .find_map(|n| var(n).and_then(|v| v.trim().parse().ok()))
}

/// True when this process was started by an MPI launcher (mpirun, mpiexec, srun).
pub fn launched_by_mpi() -> bool {
    LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some())
}

/// The job's rank count according to the launcher, when it says.
pub fn world_size() -> Option<usize> {
    first_usize(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"])
}

/// This process's rank among the ranks on its node (OMPI_COMM_WORLD_LOCAL_RANK,
/// MPI_LOCALRANKID, SLURM_LOCALID, PMI_LOCAL_RANK); 0 when not launched by MPI.
pub fn local_rank() -> usize {
    first_usize(&[
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "PMI_LOCAL_RANK",
    ])
    .unwrap_or(0)
}

/// Ranks on this node according to the launcher (1 when not launched by MPI).
pub fn local_size() -> usize {
    first_usize(&[
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
        "PMI_LOCAL_SIZE",
    ])
    .unwrap_or(1)
    .max(1)
}

/// `SEISTOMO_MPI`: Some(true) forces MPI (singleton init), Some(false) one process, None lets
/// the launcher's variables decide.
pub fn mpi_override() -> Result<Option<bool>> {
    match var("SEISTOMO_MPI").as_deref() {
        Some("1" | "on" | "yes") => Ok(Some(true)),
        Some("0" | "off" | "no") => Ok(Some(false)),
        Some(v) => Err(Error::Invalid(format!(
            "SEISTOMO_MPI={v}: expected 1 (force MPI) or 0 (one process)"
        ))),
        None => Ok(None),
    }
}

/// Whether `RAYON_NUM_THREADS` is set (then it decides the CPU threads when no count is asked
/// for).
pub fn rayon_threads_set() -> bool {
    std::env::var_os("RAYON_NUM_THREADS").is_some()
}

/// `RAYON_NUM_THREADS` as set (checked by `backend::cpu::env_threads`, which every command and
/// the Python module call before rayon would read it unchecked).
pub fn rayon_num_threads() -> Option<String> {
    std::env::var_os("RAYON_NUM_THREADS").map(|v| v.to_string_lossy().into_owned())
}

/// `SEISTOMO_MEMORY_LIMIT`: bytes of memory the job may use (readers compare file headers with
/// it), when set to a number.
pub fn memory_limit() -> Option<u64> {
    var("SEISTOMO_MEMORY_LIMIT").and_then(|v| v.trim().parse::<u64>().ok())
}

/// `$HOME`: the user's home directory (no output directory may be it), when set and not
/// empty.
pub fn home_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(std::path::PathBuf::from)
}

/// Where seistomo keeps what it can make again (compiled GPU kernels):
/// `$XDG_CACHE_HOME/seistomo`, else `$HOME/.cache/seistomo`; None when neither is set.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|h| !h.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| home_dir().map(|h| h.join(".cache")))
        .map(|d| d.join("seistomo"))
}

/// `$HOSTNAME`, where /proc does not say.
pub fn hostname() -> Option<String> {
    var("HOSTNAME")
}

/// A fault-injection hook's value (`SEISTOMO_FAULT_<name>`), in builds with the
/// `fault-injection` feature (tests); release builds have no hooks.
#[cfg(feature = "fault-injection")]
pub fn fault(name: &str) -> Option<String> {
    var(&format!("SEISTOMO_FAULT_{name}"))
}

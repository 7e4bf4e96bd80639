//! `seistomo invert CONFIG.toml`: the TOML form of a run.

use clap::Args;
use std::path::PathBuf;

use crate::comm::{agree, Comm};
use crate::pipeline::config::RunConfig;
use crate::pipeline::distributed;
use crate::pipeline::SystemSource;

#[derive(Debug, Args)]
pub struct InvertArgs {
    /// Run configuration (TOML).
    config: PathBuf,
    /// Print progress every N iterations (0: never).
    #[arg(long, default_value_t = 0)]
    progress: usize,
    /// Continue from the last checkpoint ([output] checkpoint_every) when there is one.
    #[arg(long)]
    resume: bool,
}

pub fn run(a: InvertArgs, comm: &dyn Comm) -> anyhow::Result<()> {
    // Every rank reads and checks the config; an error on any rank ends the job on every rank.
    let cfg = agree(comm, RunConfig::load(&a.config))?;
    // Before any work: no output is an input, and this run alone writes its output directory
    // (rank 0 holds the lock until the end).
    let _lock = agree(
        comm,
        if comm.is_root() {
            crate::io::outpaths::check_and_lock(&cfg.paths()).map(Some)
        } else {
            Ok(None)
        },
    )?;
    super::init_threads(
        cfg.options
            .threads
            .or_else(crate::comm::default_threads_per_rank),
    )?;
    super::log_job(comm);
    if comm.is_root() {
        crate::pipeline::config::note_config(&cfg);
    }
    // Datasets: every rank reads its own rows (greedy LPT over kernel row nnz, damping blocks by
    // rank); Matrix Market: rank 0 reads and sends nonzero-balanced row blocks.
    let (rank, size) = (comm.rank(), comm.size());
    let (load, loading): (Box<dyn FnOnce() -> crate::Result<crate::sparse::System>>, _) = match &cfg
        .system
    {
        SystemSource::Dataset { path, options } => (
            Box::new(move || {
                let (sys, st) = crate::pipeline::load::load_dataset_comm(path, comm, options)?;
                if rank == 0 && size > 1 {
                    eprintln!(
                            "dataset metadata read on rank 0 and broadcast; rows read {} on every rank (rank 0: {} rows, {:.1} MiB in {:.3} s{})",
                            match st.io {
                                crate::io::rowio::IoPath::Mmap => "through memory maps",
                                crate::io::rowio::IoPath::MpiIo => "through MPI-IO",
                            },
                            st.rows,
                            st.bytes as f64 / (1u64 << 20) as f64,
                            st.seconds,
                            if st.read_calls > 0 {
                                format!(", {} read calls", st.read_calls)
                            } else {
                                String::new()
                            }
                        );
                }
                Ok(sys)
            }),
            distributed::Loading::PerRankVia(options.io.resolve(size)),
        ),
        other => (Box::new(move || other.load()), distributed::Loading::Root),
    };
    if let Some(o) = distributed::run_lsqr(
        comm,
        load,
        loading,
        &cfg.options,
        &cfg.output,
        a.progress,
        Some((&cfg, a.resume)),
    )? {
        eprintln!("{}", super::summary(&o));
        if let Some(p) = &cfg.output.solution {
            eprintln!("solution vector written to {}", p.display());
        }
    }
    Ok(())
}

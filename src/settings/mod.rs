//! What a run is told besides its data: [`tuning`] (performance knobs that never change the
//! solution's meaning: GPU layouts, tile sizes, block sizes, read coalescing; a `[tuning]`
//! table or `--tune key=value`, recorded in report.json and the model's provenance) and
//! [`launch`] (the only place that reads environment variables: what describes how the process
//! was launched — the MPI launcher's variables, GPU visibility, the thread count of rayon, the
//! memory the job may use — and, in builds with the `fault-injection` feature, the test hooks).

pub mod launch;
pub mod tuning;

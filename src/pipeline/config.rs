//! Run configuration: TOML -> raw serde structs (unknown keys rejected) -> `validate()` ->
//! [`RunConfig`]. Every error names the file and the key (and the line, for syntax errors).
//! Relative paths in a config are relative to the config file's directory.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::backend::TransposeStrategy;
use crate::error::{Error, Result};
use crate::pipeline::options::{
    BackendChoice, OperatorSpec, OutputPaths, SolveOptions, SystemSource,
};
use crate::settings::tuning::Tuning;
use crate::solver::LsqrParams;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    system: Option<RawSystem>,
    dataset: Option<RawDataset>,
    #[serde(default)]
    solver: RawSolver,
    #[serde(default)]
    backend: RawBackend,
    #[serde(default)]
    output: RawOutput,
    /// What the unknowns are and how to write the model (src/model/spec.rs).
    model: Option<crate::model::spec::RawModel>,
    /// Performance knobs (src/settings/tuning.rs): checked by `Tuning::from_table`.
    tuning: Option<toml::Table>,
    /// Resolution tests (`seistomo resolution`, src/model/resolution.rs).
    resolution: Option<crate::model::resolution::RawResolution>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSystem {
    matrix: PathBuf,
    rhs: Option<PathBuf>,
    reg: Option<PathBuf>,
    reg_weight: Option<f64>,
    x0: Option<PathBuf>,
}

/// `[dataset]`: a dataset directory instead of `[system]` (docs/datasets.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataset {
    /// dataset.toml or its directory.
    path: PathBuf,
    /// Override the manifest's damping weight λ.
    damping_weight: Option<f64>,
    /// Regularisation generated from the grid: norm damping λ0 (FMTOMO ε, tomoDD DAMP).
    norm_damping: Option<f64>,
    /// First-derivative (flattening) weights along x, y, z.
    flattening: Option<[f64; 3]>,
    /// Second-derivative (smoothing; FMTOMO η, tomoDD SMOOTH) weights along x, y, z.
    smoothing: Option<[f64; 3]>,
    x0: Option<PathBuf>,
    /// Progress bar while loading.
    progress: Option<bool>,
    /// How rows are read: "auto" (maps on one node, MPI-IO across nodes), "mmap" or "mpiio".
    io: Option<String>,
    /// Prepared storage (`seistomo prepare`): "auto" (used when valid) or "off".
    prepared: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSolver {
    method: Option<String>,
    damp: Option<f64>,
    atol: Option<f64>,
    btol: Option<f64>,
    conlim: Option<f64>,
    iter_lim: Option<i64>,
    col_scale: Option<bool>,
    calc_var: Option<bool>,
    reorder: Option<String>,
    /// `invert` picks its weight: "lcurve", "gcv" or "discrepancy".
    weight: Option<toml::Value>,
    /// The weights tried: a list, or "FROM:TO:COUNT" evenly spaced in log.
    weights: Option<toml::Value>,
    /// The data's noise level sigma (a number, in data units), or "whitened" (sigma = 1).
    noise: Option<toml::Value>,
    /// The discrepancy principle's safety factor tau (default 1).
    noise_tau: Option<f64>,
    /// Random probes per weight of GCV's trace estimate (default 1; 0: no GCV).
    gcv_probes: Option<i64>,
    /// What the tried weights weigh: "reg" (the regularisation / damping rows, the default
    /// where the system has them) or "damp" (LSQR's damping, the rows kept as they are).
    weight_on: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    kind: Option<String>,
    transpose: Option<String>,
    threads: Option<i64>,
    precision: Option<String>,
    allreduce: Option<String>,
    storage: Option<String>,
    lsqr_loop: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOutput {
    dir: Option<PathBuf>,
    solution: Option<String>,
    report: Option<String>,
    history: Option<String>,
    variance: Option<String>,
    /// Model file (HDF5 + XDMF sidecar); "" disables it. Default: model.h5 in the output dir.
    model: Option<String>,
    /// Write the LSQR state every N iterations (0 or absent: never).
    checkpoint_every: Option<i64>,
    /// Checkpoint file name (default: checkpoint.bin in the output dir).
    checkpoint: Option<String>,
}

use crate::backend::cpu::MAX_THREADS;

/// A validated run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The config file.
    pub path: PathBuf,
    pub system: SystemSource,
    pub options: SolveOptions,
    pub output: OutputPaths,
    /// The TOML text, echoed into outputs.
    pub text: String,
    /// The model description (`[model]` table) and model/checkpoint outputs.
    pub model: crate::model::spec::ModelOutput,
    /// How a weight is chosen from several (`[solver] weight`, `weights`, `noise`, ...).
    pub weight: WeightSettings,
    /// `[resolution]`: the tests `seistomo resolution` runs (None: no table).
    pub resolution: Option<crate::model::resolution::ResolutionSpec>,
}

/// `[solver] weight`, `weights`, `noise`, `noise_tau`, `gcv_probes`: choosing the
/// regularisation weight (`lcurve` reports every rule; `invert` uses `rule`).
#[derive(Debug, Clone)]
pub struct WeightSettings {
    /// The rule `invert` picks its weight by (None: the config's weight).
    pub rule: Option<crate::model::lcurve::WeightRule>,
    /// The weights tried (`invert` with a rule; empty: none given).
    pub weights: Vec<f64>,
    /// The data's noise level sigma (None: not given; no discrepancy choice).
    pub noise: Option<f64>,
    /// The discrepancy principle's factor tau.
    pub tau: f64,
    /// Random probes per weight for GCV's trace (0: no GCV).
    pub gcv_probes: usize,
    /// `weight_on = "damp"`: the weights are LSQR's damping even where the system has
    /// regularisation rows (kept at their weight); false: the rows' weight where there are
    /// rows, else the damping.
    pub on_damp: bool,
    /// The choice made by `invert` before its solve (report.json `weight_choice`).
    pub chosen: Option<crate::model::lcurve::WeightChoice>,
}

impl Default for WeightSettings {
    fn default() -> Self {
        WeightSettings {
            rule: None,
            weights: Vec::new(),
            noise: None,
            tau: 1.0,
            gcv_probes: 1,
            on_damp: false,
            chosen: None,
        }
    }
}

impl WeightSettings {
    /// tau sqrt(m) sigma for `m` data (None without a noise level).
    pub fn noise_norm(&self, m: usize) -> Option<f64> {
        self.noise.map(|s| self.tau * (m as f64).sqrt() * s)
    }
}

/// The most GCV probes per weight (each is a solve per weight).
pub const MAX_GCV_PROBES: usize = 64;

/// `[solver] weight`, `weights`, `noise`, `noise_tau`, `gcv_probes` -> [`WeightSettings`].
fn weight_settings(s: &RawSolver, bad: &dyn Fn(String) -> Error) -> Result<WeightSettings> {
    use crate::model::lcurve::{parse_log_range, WeightRule, MAX_POINTS};
    let mut w = WeightSettings::default();
    match &s.weight {
        None => {}
        Some(toml::Value::String(r)) => {
            w.rule = Some(
                r.parse::<WeightRule>()
                    .map_err(|e| bad(format!("[solver] weight: {e}")))?,
            )
        }
        Some(v) => {
            return Err(bad(format!(
                "[solver] weight: expected \"lcurve\", \"gcv\" or \"discrepancy\" (got {v}); a fixed weight is [system] reg_weight or [solver] damp"
            )))
        }
    }
    match &s.weights {
        None => {}
        Some(toml::Value::String(r)) => {
            w.weights = parse_log_range(r).map_err(|e| bad(format!("[solver] weights: {e}")))?
        }
        Some(toml::Value::Array(a)) => {
            if a.len() > MAX_POINTS {
                return Err(bad(format!("[solver] weights: at most {MAX_POINTS}")));
            }
            for v in a {
                match v.as_float().or_else(|| v.as_integer().map(|i| i as f64)) {
                    Some(x) if x.is_finite() && x >= 0.0 => w.weights.push(x),
                    _ => return Err(bad(format!("[solver] weights: '{v}' is not a number >= 0"))),
                }
            }
        }
        Some(v) => {
            return Err(bad(format!(
                "[solver] weights: a list of numbers or \"FROM:TO:COUNT\" (got {v})"
            )))
        }
    }
    if w.rule.is_some() && w.weights.len() < 3 {
        return Err(bad(
            "[solver] weight picks from [solver] weights: give at least 3 (a list or \"FROM:TO:COUNT\")".into(),
        ));
    }
    w.noise = match &s.noise {
        None => None,
        Some(toml::Value::String(t)) if t == "whitened" => Some(1.0),
        Some(v) => match v.as_float().or_else(|| v.as_integer().map(|i| i as f64)) {
            Some(x) if x.is_finite() && x > 0.0 => Some(x),
            _ => {
                return Err(bad(format!(
                    "[solver] noise: a noise level > 0 or \"whitened\" (got {v})"
                )))
            }
        },
    };
    if let Some(t) = s.noise_tau {
        if !(t.is_finite() && t > 0.0) {
            return Err(bad(format!("[solver] noise_tau must be > 0 (got {t})")));
        }
        w.tau = t;
    }
    if let Some(p) = s.gcv_probes {
        if !(0..=MAX_GCV_PROBES as i64).contains(&p) {
            return Err(bad(format!(
                "[solver] gcv_probes must be in 0..={MAX_GCV_PROBES} (got {p})"
            )));
        }
        w.gcv_probes = p as usize;
    }
    w.on_damp = match s.weight_on.as_deref() {
        None | Some("reg") => false,
        Some("damp") => true,
        Some(o) => {
            return Err(bad(format!(
                "[solver] weight_on: expected \"reg\" or \"damp\" (got \"{o}\")"
            )))
        }
    };
    if w.rule == Some(WeightRule::Discrepancy) && w.noise.is_none() {
        return Err(bad(
            "[solver] weight = \"discrepancy\" needs the noise level: [solver] noise = SIGMA (or \"whitened\")".into(),
        ));
    }
    if w.rule == Some(WeightRule::Gcv) && w.gcv_probes == 0 {
        return Err(bad("[solver] weight = \"gcv\" needs gcv_probes >= 1".into()));
    }
    Ok(w)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

impl RunConfig {
    /// Every file and directory this run reads and writes, for the clash check and the output
    /// lock (src/io/outpaths.rs).
    pub fn paths(&self) -> crate::io::outpaths::PathCheck {
        let mut c = self.input_paths();
        let o = &self.output;
        c.output_opt("[output] solution", o.solution.as_deref())
            .output_opt("[output] report", o.report.as_deref())
            .output_opt("[output] history", o.history.as_deref())
            .output_opt("[output] variance", o.variance.as_deref());
        if let Some(m) = &self.model.path {
            c.output("[output] model", m)
                .output("model sidecar", &crate::model::hdf5::xdmf_path(m));
        }
        if self.model.checkpoint_every > 0 {
            c.output("[output] checkpoint", &self.model.checkpoint);
        }
        c
    }

    /// The files and dataset directory this run reads.
    pub fn input_paths(&self) -> crate::io::outpaths::PathCheck {
        let mut c = crate::io::outpaths::PathCheck::new();
        c.input("config", &self.path);
        match &self.system {
            SystemSource::Mtx {
                matrix, rhs, reg, ..
            } => {
                c.input("[system] matrix", matrix)
                    .input_opt("[system] rhs", rhs.as_deref())
                    .input_opt("[system] reg", reg.as_deref());
            }
            SystemSource::Dataset { path, .. } => {
                c.input("[dataset] path", path);
                if let Some(dir) = path.parent() {
                    let dir = if dir.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        dir
                    };
                    c.input_dir("[dataset] path", dir);
                }
            }
        }
        c.input_opt("x0", self.options.x0.as_deref());
        for (what, p) in self.model.input_files() {
            c.input(what, p);
        }
        c
    }

    /// Read and validate a config file. A dataset directory or its dataset.toml stands for the
    /// run config beside it, or the defaults for the dataset ([`dataset_run`]).
    pub fn load(path: &Path) -> Result<RunConfig> {
        match dataset_run(path)? {
            Some(DatasetRun::Config(p)) => return Self::load(&p),
            Some(DatasetRun::Defaults { manifest, text, .. }) => {
                return Self::parse(&manifest, &text)
            }
            None => {}
        }
        let text = crate::io::read_input_text(path, "config", crate::io::MAX_TEXT)?;
        Self::parse(path, &text)
    }

    /// Validate config text read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<RunConfig> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            Error::parse(path, line, e.message().replace('\n', " "))
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                crate::io::tidy(base.join(p))
            }
        };
        let bad = |msg: String| Error::config(path, msg);
        let existing = |key: &str, p: &Path| -> Result<PathBuf> {
            crate::io::existing_file(resolve(p)).map_err(|e| bad(format!("{key}: {e}")))
        };

        if raw.system.is_some() && raw.dataset.is_some() {
            return Err(bad("give [system] or [dataset], not both".into()));
        }
        let (system, x0) = if let Some(ds) = raw.dataset {
            dataset_source(ds, &resolve, &existing, &bad)?
        } else {
            mtx_source(raw.system, &existing, &bad)?
        };
        let s = raw.solver;
        let params = solver_params(&s, &bad)?;
        let weight = weight_settings(&s, &bad)?;
        let (operator, threads) = operator_spec(&raw.backend, &bad)?;
        let reorder = choice(s.reorder.as_deref(), "[solver] reorder", &bad)?
            .unwrap_or(crate::grid::reorder::Reorder::Auto);

        let o = raw.output;
        let dir = resolve(&o.dir.clone().unwrap_or_else(|| PathBuf::from("out")));
        let output = output_paths(&dir, &o, params.calc_var);
        let model = crate::model::spec::ModelOutput::from_raw(
            path,
            &dir,
            raw.model,
            o.model,
            o.checkpoint_every,
            o.checkpoint,
        )?;
        let tuning = match &raw.tuning {
            Some(t) => Tuning::from_table(t).map_err(|e| bad(format!("[tuning] {e}")))?,
            None => Tuning::default(),
        };
        let options = SolveOptions {
            method: crate::solver::LsqMethod::Lsqr,
            params,
            col_scale: s.col_scale.unwrap_or(false),
            x0,
            operator: OperatorSpec { tuning, ..operator },
            threads,
            reorder,
            grid: None,
            fit: false,
        };
        let resolution = raw
            .resolution
            .map(crate::model::resolution::ResolutionSpec::from_raw)
            .transpose()
            .map_err(bad)?;
        Ok(RunConfig {
            path: path.to_path_buf(),
            system,
            options,
            output,
            text: text.to_string(),
            model,
            weight,
            resolution,
        })
    }
}

/// `[system]` -> SystemSource::Mtx and x0.
fn mtx_source(
    sys: Option<RawSystem>,
    existing: &dyn Fn(&str, &Path) -> Result<PathBuf>,
    bad: &dyn Fn(String) -> Error,
) -> Result<(SystemSource, Option<PathBuf>)> {
    let sys = sys.ok_or_else(|| bad("missing [system] table (matrix = ..., rhs = ...)".into()))?;
    let reg = sys
        .reg
        .as_deref()
        .map(|p| existing("[system] reg", p))
        .transpose()?;
    let reg_weight = sys.reg_weight.unwrap_or(1.0);
    if !reg_weight.is_finite() || reg_weight < 0.0 {
        return Err(bad(format!(
            "[system] reg_weight must be finite and >= 0 (got {reg_weight})"
        )));
    }
    if sys.reg_weight.is_some() && reg.is_none() {
        return Err(bad(
            "[system] reg_weight is set but there is no reg matrix".into()
        ));
    }
    let system = SystemSource::Mtx {
        matrix: existing("[system] matrix", &sys.matrix)?,
        rhs: sys
            .rhs
            .as_deref()
            .map(|p| existing("[system] rhs", p))
            .transpose()?,
        reg,
        reg_weight,
    };
    let x0 = sys
        .x0
        .as_deref()
        .map(|p| existing("[system] x0", p))
        .transpose()?;
    Ok((system, x0))
}

/// `[solver]` -> LSQR's parameters (method, iter_lim, damp, atol, btol, conlim, calc_var).
fn solver_params(s: &RawSolver, bad: &dyn Fn(String) -> Error) -> Result<LsqrParams> {
    if let Some(m) = &s.method {
        if m != "lsqr" {
            return Err(bad(format!(
                "[solver] method '{m}' is not supported by invert (lsqr)"
            )));
        }
    }
    let d = LsqrParams::default();
    let nonneg = |key: &str, v: Option<f64>, default: f64| -> Result<f64> {
        match v {
            None => Ok(default),
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
            Some(x) => Err(bad(format!(
                "[solver] {key} must be finite and >= 0 (got {x})"
            ))),
        }
    };
    let iter_lim = match s.iter_lim {
        None => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(k) => return Err(bad(format!("[solver] iter_lim must be >= 1 (got {k})"))),
    };
    let damp = nonneg("damp", s.damp, d.damp)?;
    if damp > crate::solver::lsqr::MAX_DAMP {
        return Err(bad(format!(
            "[solver] damp must be <= {:e} (got {damp:e})",
            crate::solver::lsqr::MAX_DAMP
        )));
    }
    Ok(LsqrParams {
        damp,
        atol: nonneg("atol", s.atol, d.atol)?,
        btol: nonneg("btol", s.btol, d.btol)?,
        conlim: nonneg("conlim", s.conlim, d.conlim)?,
        iter_lim,
        calc_var: s.calc_var.unwrap_or(false),
    })
}

/// `[backend]` -> the operator (with the default tuning: the caller sets `[tuning]`'s) and the
/// CPU threads.
fn operator_spec(
    b: &RawBackend,
    bad: &dyn Fn(String) -> Error,
) -> Result<(OperatorSpec, Option<usize>)> {
    let backend = choice(b.kind.as_deref(), "[backend] kind", bad)?.unwrap_or(BackendChoice::Auto);
    let transpose = choice(b.transpose.as_deref(), "[backend] transpose", bad)?
        .unwrap_or(TransposeStrategy::Auto);
    let threads = match b.threads {
        None => None,
        Some(t) if t > 0 && t as u64 <= MAX_THREADS as u64 => Some(t as usize),
        Some(t) => {
            return Err(bad(format!(
                "[backend] threads must be in 1..={MAX_THREADS} (got {t})"
            )))
        }
    };
    let precision = choice(b.precision.as_deref(), "[backend] precision", bad)?
        .unwrap_or(crate::backend::Precision::F64);
    let storage = choice(b.storage.as_deref(), "[backend] storage", bad)?.unwrap_or_default();
    let lsqr_loop = choice(b.lsqr_loop.as_deref(), "[backend] lsqr_loop", bad)?.unwrap_or_default();
    let allreduce = choice(b.allreduce.as_deref(), "[backend] allreduce", bad)?.unwrap_or_default();
    let operator = OperatorSpec {
        backend,
        storage,
        precision,
        transpose,
        lsqr_loop,
        allreduce,
        tuning: Tuning::default(),
    };
    Ok((operator, threads))
}

/// `[output]` -> the solution, report, history and (with calc_var) variance files in `dir`.
fn output_paths(dir: &Path, o: &RawOutput, calc_var: bool) -> OutputPaths {
    let name = |v: &Option<String>, default: &str| dir.join(v.as_deref().unwrap_or(default));
    OutputPaths {
        solution: Some(name(&o.solution, "solution.txt")),
        report: Some(name(&o.report, "report.json")),
        history: Some(name(&o.history, "history.csv")),
        variance: if calc_var {
            Some(name(&o.variance, "variance.txt"))
        } else {
            None
        },
    }
}

/// `[dataset]` -> SystemSource::Dataset and x0.
fn dataset_source(
    ds: RawDataset,
    resolve: &dyn Fn(&Path) -> PathBuf,
    existing: &dyn Fn(&str, &Path) -> Result<PathBuf>,
    bad: &dyn Fn(String) -> Error,
) -> Result<(SystemSource, Option<PathBuf>)> {
    let path = resolve(&ds.path);
    let manifest = if path.is_dir() {
        path.join("dataset.toml")
    } else {
        path
    };
    crate::io::existing_file(manifest.clone()).map_err(|e| bad(format!("[dataset] path: {e}")))?;
    let nonneg = |key: &str, v: f64| -> Result<f64> {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(bad(format!(
                "[dataset] {key} must be finite and >= 0 (got {v})"
            )))
        }
    };
    let damping_weight = ds
        .damping_weight
        .map(|w| nonneg("damping_weight", w))
        .transpose()?;
    let norm = nonneg("norm_damping", ds.norm_damping.unwrap_or(0.0))?;
    let first = ds.flattening.unwrap_or([0.0; 3]);
    let second = ds.smoothing.unwrap_or([0.0; 3]);
    for (key, w) in [("flattening", first), ("smoothing", second)] {
        for v in w {
            nonneg(key, v)?;
        }
    }
    let reg = crate::io::dataset::Regularisation {
        norm,
        first,
        second,
    };
    let options = crate::io::LoadOptions {
        progress: ds.progress.unwrap_or(true),
        damping_weight,
        regularisation: (!reg.is_empty()).then_some(reg),
        io: match ds.io.as_deref() {
            None => crate::io::rowio::IoChoice::Auto,
            Some(s) => s.parse().map_err(|e| bad(format!("[dataset] io: {e}")))?,
        },
        io_max_gap: None,
        row_cost: None,
    };
    let x0 = ds
        .x0
        .as_deref()
        .map(|p| existing("[dataset] x0", p))
        .transpose()?;
    Ok((
        SystemSource::Dataset {
            path: manifest,
            options,
            prepared: match ds.prepared.as_deref() {
                None => Default::default(),
                Some(s) => s
                    .parse()
                    .map_err(|e| bad(format!("[dataset] prepared: {e}")))?,
            },
        },
        x0,
    ))
}

/// Note a run config and everything it reads, in place of an earlier run's notes: the config
/// file, the Matrix Market files or every file of the dataset directory (and its manifest), a
/// starting model.
pub fn note_config(cfg: &RunConfig) {
    // this run's inputs only
    crate::model::provenance::forget_inputs();
    // config text given directly (Python's invert(dict)) has no file; its text is recorded
    let mut files: Vec<PathBuf> = std::iter::once(cfg.path.clone())
        .filter(|p| p.is_file())
        .collect();
    match &cfg.system {
        SystemSource::Mtx {
            matrix, rhs, reg, ..
        } => {
            files.push(matrix.clone());
            files.extend(rhs.iter().cloned());
            files.extend(reg.iter().cloned());
        }
        SystemSource::Dataset { path, .. } => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            files.push(
                dir.map(std::path::Path::to_path_buf)
                    .unwrap_or_else(|| path.clone()),
            );
            crate::model::provenance::note_manifest(path);
        }
    }
    files.extend(cfg.options.x0.iter().cloned());
    crate::model::provenance::note_inputs(files);
}

/// What `seistomo invert PATH` runs when PATH is a dataset directory or its dataset.toml.
#[derive(Debug, Clone, PartialEq)]
pub enum DatasetRun {
    /// The run config beside the dataset (`DIR/invert.toml`, written by `import` or `synth`).
    Config(PathBuf),
    /// No invert.toml: the run config text with the defaults ([`dataset_run_text`]), read as if
    /// it were the dataset's `manifest` (paths relative to the dataset directory); the outputs go
    /// to `out_dir`, beside the dataset directory.
    Defaults {
        manifest: PathBuf,
        text: String,
        out_dir: PathBuf,
    },
}

/// None when `path` is an ordinary run config. A dataset directory or a dataset manifest (a
/// TOML file with `format = "seistomo-dataset"`) stands for `DIR/invert.toml` when there is one,
/// else for a run with the defaults, outputs in `NAME-inversion` beside the dataset (as `synth`
/// and `import` write them). A directory that holds neither is an error naming it.
pub fn dataset_run(path: &Path) -> Result<Option<DatasetRun>> {
    let parent = |p: &Path| {
        p.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    let (dir, manifest) = if path.is_dir() {
        (path.to_path_buf(), path.join("dataset.toml"))
    } else if is_dataset_manifest(path) {
        (parent(path), path.to_path_buf())
    } else {
        return Ok(None);
    };
    let config = dir.join("invert.toml");
    if config.is_file() {
        return Ok(Some(DatasetRun::Config(crate::io::tidy(config))));
    }
    if !manifest.is_file() {
        return Err(Error::config(
            path,
            "a directory with neither invert.toml nor dataset.toml: give a run config (docs/configuration.md) or a dataset directory (docs/datasets.md)",
        ));
    }
    let name = std::fs::canonicalize(&dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "dataset".into());
    let out_name = format!("{name}-inversion");
    Ok(Some(DatasetRun::Defaults {
        text: dataset_run_text(
            "seistomo invert (the defaults: the dataset has no invert.toml)",
            &out_name,
            &ModelHints::default(),
        ),
        out_dir: crate::io::tidy(dir.join("..").join(&out_name)),
        manifest: crate::io::tidy(manifest),
    }))
}

/// Whether `path` is a dataset manifest (`format = "seistomo-dataset"`; run configs have no
/// `format` key).
fn is_dataset_manifest(path: &Path) -> bool {
    path.is_file()
        && std::fs::read_to_string(path).is_ok_and(|t| {
            t.parse::<toml::Table>().is_ok_and(|t| {
                t.get("format").and_then(toml::Value::as_str) == Some("seistomo-dataset")
            })
        })
}

/// What the unknowns of an imported dataset are: the `[model]` table of its run config
/// (`seistomo import --unknowns --slowness-unit --reference --cells`). None: the default.
#[derive(Debug, Clone, Default)]
pub struct ModelHints {
    /// "slowness" or "slowness_perturbation".
    pub unknowns: Option<String>,
    /// The unit of the unknowns (and of d per unit of G), e.g. "s/km".
    pub slowness_unit: Option<String>,
    /// A reference velocity; None: the mean.
    pub reference: Option<f64>,
    /// The cell table, as the run config names it (relative to the config's directory).
    pub cells: Option<String>,
}

/// The run config of a dataset, as `import` writes it beside the dataset and `invert DIR` uses
/// without one: LSQR to atol = btol = 1e-8 on the dataset's rows, outputs in `out_name` beside
/// the dataset directory, the `[model]` table from `model`.
pub fn dataset_run_text(written_by: &str, out_name: &str, model: &ModelHints) -> String {
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let unknowns = model.unknowns.as_deref().unwrap_or("slowness");
    let unit = model.slowness_unit.as_deref().unwrap_or("s/km");
    let reference = model
        .reference
        .map_or_else(|| quote("mean"), |v| toml::Value::Float(v).to_string());
    let cells = match &model.cells {
        Some(c) => format!(
            "cells = {}   # one line per column: lat_min lat_max lon_min lon_max (degrees)\n",
            quote(c)
        ),
        None => {
            "# For maps: the dataset's grid (import --grid), or a cell table, one line per column\n\
                 # (lat_min lat_max lon_min lon_max, degrees):\n\
                 # cells = \"cells.txt\"\n"
                .into()
        }
    };
    format!(
        "# Written by {written_by}.\n\
         # Run from anywhere:  seistomo invert THIS_FILE  (or the dataset directory)\n\
         [dataset]\n\
         path = \"dataset.toml\"            # relative to this file\n\
         # More regularisation, generated from the dataset's grid (docs/datasets.md), e.g.\n\
         # norm_damping = 0.01\n\
         # smoothing = [0.1, 0.1, 0.1]\n\n\
         [solver]\n\
         method = \"lsqr\"\n\
         atol = 1e-8\n\
         btol = 1e-8\n\
         # iter_lim = 5000               # default: twice the number of columns\n\n\
         [output]\n\
         dir = {}   # relative to this file: beside the dataset directory\n\
         # checkpoint_every = 100        # long runs: after a kill, `seistomo invert ... --resume`\n\n\
         [model]\n\
         unknowns = {:<16}# or \"slowness_perturbation\" (then reference = a velocity)\n\
         slowness_unit = {:<11}# the unit of the unknowns: d per unit of G\n\
         reference = {:<15}# perturbations relative to the mean slowness, or a velocity\n\
         {cells}",
        quote(&format!("../{out_name}")),
        quote(unknowns),
        quote(unit),
        reference,
    )
}

/// A choice-valued key (`kind = "cuda"`): None when absent, else parsed or an error naming the
/// key.
fn choice<T: std::str::FromStr<Err = String>>(
    value: Option<&str>,
    key: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<Option<T>> {
    value
        .map(|v| v.parse().map_err(|e: String| bad(format!("{key}: {e}"))))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<RunConfig> {
        let dir = std::env::temp_dir().join(format!("seistomo-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("A.mtx"),
            "%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 1\n",
        )
        .unwrap();
        RunConfig::parse(&dir.join("run.toml"), text)
    }

    #[test]
    fn accepts_a_minimal_config_and_resolves_paths() {
        let c =
            cfg("[system]\nmatrix = \"A.mtx\"\n[solver]\natol = 1e-8\niter_lim = 10\n").unwrap();
        match &c.system {
            SystemSource::Mtx { matrix, .. } => {
                assert!(matrix.ends_with("A.mtx") && matrix.starts_with(std::env::temp_dir()))
            }
            other => panic!("expected an mtx source, got {other:?}"),
        }
        assert_eq!(c.options.params.atol, 1e-8);
        assert_eq!(c.options.params.iter_lim, Some(10));
    }

    #[test]
    fn rejects_bad_configs_naming_key_and_file() {
        let cases = [
            (
                "[system]\nmatrix = \"A.mtx\"\nfoo = 1\n",
                "unknown field `foo`",
            ),
            (
                "[system]\nmatrix = \"A.mtx\"\n[solver]\natol = -1.0\n",
                "atol must be",
            ),
            (
                "[system]\nmatrix = \"A.mtx\"\n[solver]\natol = \"x\"\n",
                "run.toml:4",
            ),
            (
                "[system]\nmatrix = \"missing.mtx\"\n",
                "[system] matrix: file",
            ),
            ("[solver]\natol = 1.0\n", "missing [system]"),
            (
                "[system]\nmatrix = \"A.mtx\"\n[dataset]\npath = \"d\"\n",
                "not both",
            ),
            ("[dataset]\npath = \"nowhere\"\n", "[dataset] path"),
            (
                "[system]\nmatrix = \"A.mtx\"\n[backend]\nkind = \"tpu\"\n",
                "[backend] kind",
            ),
            (
                "[system]\nmatrix = \"A.mtx\"\n[solver]\niter_lim = 0\n",
                "iter_lim",
            ),
        ];
        for (text, want) in cases {
            let e = cfg(text).unwrap_err().to_string();
            assert!(e.contains("run.toml") && e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "multi-line error: {e}");
        }
    }
}

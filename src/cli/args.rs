//! Shared pieces of the command line: value parsers that list their possible values in
//! `--help` (and in the error for a wrong word), and "a,b,c" triples.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

/// A parser for an option with a fixed set of values: `names` are shown as `[possible values:
/// ...]` in `--help`; `aliases` are accepted but not shown. The accepted word is turned into
/// `T` by its `FromStr` (the library's one definition of the names).
pub(crate) fn choice<T>(
    names: &'static [&'static str],
    aliases: &'static [&'static str],
) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err = String> + Clone + Send + Sync + 'static,
{
    let values = names
        .iter()
        .map(|n| PossibleValue::new(*n))
        .chain(aliases.iter().map(|n| PossibleValue::new(*n).hide(true)));
    PossibleValuesParser::new(values).try_map(|s| s.parse::<T>())
}

/// Plain words (the value stays a `String`), listed in `--help`.
pub(crate) fn words(names: &'static [&'static str]) -> PossibleValuesParser {
    PossibleValuesParser::new(names.iter().map(|n| PossibleValue::new(*n)))
}

/// A comma-separated list whose items are each one of the names (listed in `--help` as
/// possible values); the value stays the list as given.
#[derive(Clone, Copy)]
pub(crate) struct ListOf(pub &'static [&'static str]);

impl TypedValueParser for ListOf {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let s = clap::builder::StringValueParser::new().parse_ref(cmd, arg, value)?;
        match s.split(',').map(str::trim).find(|w| !self.0.contains(w)) {
            None => Ok(s),
            Some(w) => {
                let mut e = clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd);
                use clap::error::{ContextKind, ContextValue};
                e.insert(
                    ContextKind::InvalidArg,
                    ContextValue::String(arg.map(|a| a.to_string()).unwrap_or_default()),
                );
                e.insert(
                    ContextKind::InvalidValue,
                    ContextValue::String(w.to_string()),
                );
                e.insert(
                    ContextKind::ValidValue,
                    ContextValue::Strings(self.0.iter().map(|n| n.to_string()).collect()),
                );
                Err(e)
            }
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.0.iter().map(|n| PossibleValue::new(*n))))
    }
}

/// A number that must be finite and >= 0 (weights): NaN and infinities are refused where they
/// are given, not inside a solve.
pub(crate) fn finite_nonneg(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(v) => Err(format!("{v} is not a finite number >= 0")),
        Err(_) => Err(format!("'{s}' is not a number")),
    }
}

/// Parse "a,b,c" into three values.
pub(crate) fn triple<T: std::str::FromStr>(s: &str) -> Result<[T; 3], String> {
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    if v.len() != 3 {
        return Err(format!("'{s}': expected three comma-separated values"));
    }
    let p = |x: &str| {
        x.parse::<T>()
            .map_err(|_| format!("'{x}' is not a valid number"))
    };
    Ok([p(v[0])?, p(v[1])?, p(v[2])?])
}

/// `choice` for each of the library's option types, so that every command lists the same words.
pub(crate) mod pick {
    use super::choice;
    use clap::builder::TypedValueParser;

    pub fn backend() -> impl TypedValueParser<Value = crate::pipeline::options::BackendChoice> {
        choice(&["auto", "cpu", "cuda"], &["gpu"])
    }
    pub fn transpose() -> impl TypedValueParser<Value = crate::backend::TransposeStrategy> {
        choice(
            &["auto", "csc", "scatter", "library"],
            &["atomic", "cusparse"],
        )
    }
    pub fn precision() -> impl TypedValueParser<Value = crate::backend::Precision> {
        choice(&["f64", "f32"], &["double", "single"])
    }
    pub fn file_precision() -> impl TypedValueParser<Value = crate::io::dataset::binfmt::Precision>
    {
        choice(&["f64", "f32"], &["double", "single"])
    }
    pub fn allreduce() -> impl TypedValueParser<Value = crate::backend::AllreducePath> {
        choice(&["auto", "host", "nccl", "peer"], &["mpi", "ipc"])
    }
    pub fn reorder() -> impl TypedValueParser<Value = crate::grid::reorder::Reorder> {
        choice(&["none", "rows", "auto"], &[])
    }
    pub fn storage() -> impl TypedValueParser<Value = crate::backend::storage::Storage> {
        choice(&["auto", "csr", "compact"], &[])
    }
    pub fn lsqr_loop() -> impl TypedValueParser<Value = crate::backend::LsqrLoop> {
        choice(&["auto", "host", "device"], &["graph"])
    }
    pub fn layout() -> impl TypedValueParser<Value = crate::io::dataset::manifest::Layout> {
        choice(&["packed", "per-row"], &[])
    }
    pub fn io() -> impl TypedValueParser<Value = crate::io::rowio::IoChoice> {
        choice(&["auto", "mmap", "mpiio"], &["mpi-io"])
    }
    pub fn precond() -> impl TypedValueParser<Value = crate::pipeline::square::PrecondChoice> {
        choice(&["none", "jacobi", "block-ilu0"], &["ilu0", "bjacobi-ilu0"])
    }
    pub fn orthog() -> impl TypedValueParser<Value = crate::solver::gmres::Orthog> {
        choice(&["auto", "mgs", "cgs2", "cgs", "dcgs2"], &[])
    }
    pub fn arnoldi_loop() -> impl TypedValueParser<Value = crate::solver::gmres::ArnoldiLoop> {
        choice(&["auto", "host", "device"], &[])
    }
    pub fn side() -> impl TypedValueParser<Value = crate::solver::gmres::PrecondSide> {
        choice(&["left", "right"], &[])
    }
    pub fn stop() -> impl TypedValueParser<Value = crate::solver::gmres::ConvergenceTest> {
        choice(
            &["preconditioned", "scipy", "petsc"],
            &["preconditioned-only"],
        )
    }
    pub fn pivot() -> impl TypedValueParser<Value = crate::backend::precond::PivotPolicy> {
        choice(&["error", "shift"], &[])
    }
    pub fn partition() -> impl TypedValueParser<Value = crate::partition::graph::PartitionMethod> {
        choice(&["contiguous", "nnz", "metis"], &["rows"])
    }
    pub fn square_kind() -> impl TypedValueParser<Value = crate::testproblems::square::SquareKind> {
        choice(&["poisson", "convdiff"], &["convection-diffusion"])
    }
}

/// The right-hand side and regularisation rows of a Matrix Market system: [A; w R] x = [b; 0].
#[derive(Debug, clap::Args)]
pub struct MtxSystemArgs {
    /// Right-hand side b (Matrix Market array or text, one value per line). Default: b = A 1
    /// (LSQR), b = ones (GMRES).
    #[arg(long)]
    pub rhs: Option<std::path::PathBuf>,
    /// Regularisation matrix R: the system becomes [A; w R] x = [b; 0].
    #[arg(long)]
    pub reg: Option<std::path::PathBuf>,
    /// Weight w of the regularisation rows (finite, >= 0).
    #[arg(long, default_value_t = 1.0, requires = "reg", value_parser = finite_nonneg)]
    pub reg_weight: f64,
}

impl MtxSystemArgs {
    pub fn parts(&self) -> crate::io::mtx::MtxParts<'_> {
        crate::io::mtx::MtxParts {
            rhs: self.rhs.as_deref(),
            reg: self.reg.as_deref(),
            reg_weight: self.reg_weight,
        }
    }
}

/// `--tune KEY=VALUE` (repeatable): performance knobs (docs/configuration.md, `[tuning]`),
/// recorded in report.json.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TuneArgs {
    /// A tuning knob, KEY=VALUE (repeatable; overrides the config's [tuning] table): gpu_layout,
    /// tile_bits, ax_tile_bits, compact_s, compact_r, tiled_s_cols, lsqr_block, atu_pieces,
    /// nvrtc_defines, nccl_max_ctas, io_max_gap, gpu_batch, gpu_encode (docs/configuration.md).
    /// Never changes the solution's meaning.
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
}

impl TuneArgs {
    /// The knobs applied over `base`.
    pub fn over(
        &self,
        base: &crate::settings::tuning::Tuning,
    ) -> crate::Result<crate::settings::tuning::Tuning> {
        let mut t = base.clone();
        t.apply(&self.tune)?;
        Ok(t)
    }
}

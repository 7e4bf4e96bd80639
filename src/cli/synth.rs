//! `seistomo synth`: a synthetic straight-ray travel-time dataset plus its true model.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use crate::grid::synthetic as synth;
use crate::grid::Grid;
use crate::io::dataset::binfmt::Precision;
use crate::io::dataset::manifest::Layout;
use crate::io::dataset::{write_dataset, DatasetSpec};

use super::args::{pick, triple};

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output dataset directory (must not exist or be empty).
    #[arg(short = 'o', long)]
    out: PathBuf,
    /// Cells along x,y,z.
    #[arg(long, default_value = "16,16,8", value_parser = triple::<usize>)]
    grid: [usize; 3],
    /// Cell size along x,y,z (km).
    #[arg(long, default_value = "1,1,1", value_parser = triple::<f64>)]
    spacing: [f64; 3],
    /// Corner of cell (0,0,0) along x,y,z (km).
    #[arg(long, default_value = "0,0,0", value_parser = triple::<f64>)]
    origin: [f64; 3],
    /// Number of rays (kernel rows).
    #[arg(long, default_value_t = 4000)]
    rays: usize,
    /// Seed of the ray geometry and the noise.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// True model: a checkerboard of +-amplitude, or one spike (a box of +amplitude).
    #[arg(long, default_value = "checkerboard", value_parser = super::args::words(&["checkerboard", "spike"]))]
    model: String,
    /// Checker size in cells along x,y,z.
    #[arg(long, default_value = "4,4,2", value_parser = triple::<usize>)]
    checker: [usize; 3],
    /// Spike centre cell i,j,k (default: the middle of the grid).
    #[arg(long, value_parser = triple::<usize>)]
    spike_at: Option<[usize; 3]>,
    /// Spike half-width in cells.
    #[arg(long, default_value_t = 1)]
    spike_width: usize,
    /// Model amplitude (slowness perturbation, s/km).
    #[arg(long, default_value_t = 0.05)]
    amplitude: f64,
    /// Standard deviation of Gaussian noise added to the travel times (s); 0 = noise-free.
    #[arg(long, default_value_t = 0.0)]
    noise: f64,
    /// Store these regularisation rows as damping blocks: norm damping λ0.
    #[arg(long, default_value_t = 0.0)]
    norm_damping: f64,
    /// First-difference (flattening) weights along x,y,z.
    #[arg(long, default_value = "0,0,0", value_parser = triple::<f64>)]
    flattening: [f64; 3],
    /// Second-difference (smoothing) weights along x,y,z.
    #[arg(long, default_value = "0,0,0", value_parser = triple::<f64>)]
    smoothing: [f64; 3],
    /// Number of damping block files.
    #[arg(long, default_value_t = 4)]
    damping_blocks: usize,
    /// Kernel layout: many rows per pack file, or one file per row.
    #[arg(long, default_value = "packed", value_parser = pick::layout())]
    layout: Layout,
    /// Value precision of the kernel and damping files.
    #[arg(long, default_value = "f64", value_parser = pick::file_precision())]
    precision: Precision,
    /// Target pack file size (MiB).
    #[arg(long, default_value_t = 64)]
    pack_mib: u64,
    /// Dataset format version: 3 (CRC32C checksums and the dataset id in every file), 2 (no
    /// id) or 1 (no checksums); 2 and 1 for older readers.
    #[arg(long, default_value_t = crate::io::dataset::binfmt::VERSION)]
    format_version: u32,
    /// Dataset name (default: the directory name).
    #[arg(long)]
    name: Option<String>,
}

pub fn run(a: SynthArgs) -> anyhow::Result<()> {
    if a.grid.contains(&0) || a.spacing.iter().any(|&h| !(h > 0.0 && h.is_finite())) {
        anyhow::bail!("--grid needs cells > 0 and --spacing values > 0");
    }
    if !(1..=MAX_RAYS).contains(&a.rays) {
        anyhow::bail!("--rays must be in 1..={MAX_RAYS} (got {})", a.rays);
    }
    if !(a.noise >= 0.0 && a.noise.is_finite()) {
        anyhow::bail!("--noise must be finite and >= 0");
    }
    check_finite(&a)?;
    if a.checker.contains(&0) || a.spike_width == 0 && a.model == "spike" {
        anyhow::bail!("--checker and --spike-width need sizes > 0");
    }
    if !(1..=1 << 20).contains(&a.pack_mib) {
        anyhow::bail!("--pack-mib must be in 1..=1048576 (got {})", a.pack_mib);
    }
    let cells = a.grid.iter().try_fold(1usize, |p, &n| p.checked_mul(n));
    if cells.is_none_or(|c| c > u32::MAX as usize) {
        anyhow::bail!("the grid {:?} has more than 2^32 cells (columns)", a.grid);
    }
    let grid = Grid::new(a.grid, a.origin, a.spacing);
    // A straight ray crosses at most nx + ny + nz cells: the kernel's size is bounded before a
    // ray is traced.
    let per_ray = a.grid.iter().sum::<usize>() as u128;
    crate::io::limits::check_alloc(
        std::path::Path::new("--rays"),
        &format!(
            "{} rays of up to {per_ray} cells each (12 bytes per nonzero)",
            a.rays
        ),
        a.rays as u128 * (12 * per_ray + 16),
    )?;
    let t = Instant::now();
    let kernel = synth::straight_ray_kernel_with(&grid, a.rays, a.seed, true);
    let t_rays = t.elapsed().as_secs_f64();
    let model = match a.model.as_str() {
        "checkerboard" => synth::checkerboard(&grid, a.checker, a.amplitude),
        "spike" => {
            let at = a.spike_at.unwrap_or(a.grid.map(|n| n / 2));
            if (0..3).any(|i| at[i] >= a.grid[i]) {
                anyhow::bail!("--spike-at {at:?} is outside the grid {:?}", a.grid);
            }
            synth::spike(&grid, at, a.spike_width, a.amplitude)
        }
        m => anyhow::bail!("--model '{m}': expected checkerboard or spike"),
    };
    let b = synth::travel_times(&kernel, &model, a.noise, a.seed);
    let reg = crate::grid::regularisation(&grid, a.norm_damping, a.flattening, a.smoothing);
    let name = a.name.clone().unwrap_or_else(|| {
        a.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let mut spec = DatasetSpec::new(&kernel, &b);
    spec.name = name;
    spec.description = format!(
        "synthetic straight-ray travel times: grid {:?}, {} rays, seed {}, {} model (amplitude {}), noise sd {}",
        a.grid, a.rays, a.seed, a.model, a.amplitude, a.noise
    );
    spec.grid = Some(grid);
    spec.true_model = Some(&model);
    if reg.nrows() > 0 {
        spec.damping = Some(&reg);
        spec.damping_blocks = a.damping_blocks;
    }
    spec.layout = a.layout;
    spec.precision = a.precision;
    spec.pack_bytes = a.pack_mib.max(1) << 20;
    spec.version = a.format_version;
    let t = Instant::now();
    let manifest = write_dataset(&a.out, &spec, true)?;
    eprintln!(
        "synth: {} rays x {} cells, {} nonzeros (traced in {:.2} s), {} damping rows; written to {} in {:.2} s",
        kernel.nrows(),
        kernel.ncols(),
        kernel.nnz(),
        t_rays,
        reg.nrows(),
        crate::io::tidy(&manifest).display(),
        t.elapsed().as_secs_f64()
    );
    let cfg = a.out.join("invert.toml");
    let out_name = format!(
        "{}-inversion",
        a.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "synth".into())
    );
    crate::io::write_atomic(&cfg, |w| {
        w.write_all(run_config_text(&out_name, reg.nrows() > 0).as_bytes())
    })?;
    let cfg = crate::io::tidy(&cfg);
    eprintln!("run config written to {}", cfg.display());
    eprintln!("next: seistomo invert {}", cfg.display());
    Ok(())
}

/// The most rays `synth` traces (kernel rows).
pub const MAX_RAYS: usize = 1 << 32;

/// The options that become values in the dataset are finite: a NaN or an infinity would be
/// written into b.bin or true_model.bin (the dataset's readers refuse such files).
fn check_finite(a: &SynthArgs) -> anyhow::Result<()> {
    let named: [(&str, &[f64]); 6] = [
        ("--amplitude", &[a.amplitude]),
        ("--origin", &a.origin),
        ("--spacing", &a.spacing),
        ("--norm-damping", &[a.norm_damping]),
        ("--flattening", &a.flattening),
        ("--smoothing", &a.smoothing),
    ];
    for (what, v) in named {
        if let Some(x) = v.iter().find(|x| !x.is_finite()) {
            anyhow::bail!("{what}: {x} is not finite; synth writes finite values only");
        }
    }
    if [a.norm_damping]
        .iter()
        .chain(&a.flattening)
        .chain(&a.smoothing)
        .any(|&w| w < 0.0)
    {
        anyhow::bail!("--norm-damping, --flattening and --smoothing must be >= 0");
    }
    Ok(())
}

/// The run config `synth` leaves beside the dataset: the demo's settings, outputs in a
/// sibling directory (never inside the dataset).
fn run_config_text(out_name: &str, has_damping: bool) -> String {
    let reg = if has_damping {
        "# The dataset stores its regularisation rows as damping blocks; more can be generated\n# from the grid here, e.g.\n# norm_damping = 0.01\n# smoothing = [0.1, 0.1, 0.1]\n"
    } else {
        "# The dataset has no regularisation rows: noise-free checkerboards need none, noisy data\n# do (or use `seistomo lcurve`); generated from the grid, e.g.\n# norm_damping = 0.01\n# smoothing = [0.1, 0.1, 0.1]\n"
    };
    format!(
        "# Written by seistomo synth. Run from anywhere:  seistomo invert THIS_FILE\n\
         [dataset]\n\
         path = \"dataset.toml\"          # relative to this file\n\
         {reg}\n\
         [solver]\n\
         method = \"lsqr\"\n\
         atol = 1e-8\n\
         btol = 1e-8\n\
         iter_lim = 1000\n\n\
         [output]\n\
         dir = \"../{out_name}\"   # relative to this file: beside the dataset directory\n\n\
         [model]\n\
         # synth's true model is a slowness perturbation (s/km) around a background that the\n\
         # travel times do not depend on: 2 km/s is assumed for velocities in model.h5.\n\
         unknowns = \"slowness_perturbation\"\n\
         slowness_unit = \"s/km\"\n\
         reference = 2.0\n"
    )
}

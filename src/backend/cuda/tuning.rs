//! The CUDA backend's tuning as plain data ([`GpuTuning`]): compact storage's device layout,
//! tile sizes and launch shapes, the device LSQR loop's block, and preprocessor defines for the
//! kernels. Nothing in the backend reads the environment: a run's `[tuning]` table (or
//! `--tune key=value`) fills this struct, and its default chooses every value as the backend
//! always has (from the matrix, or a fixed default).

use std::str::FromStr;

use super::lsqr_loop::check_lsqr_block;
use super::nvrtc::check_defines;
use crate::error::{Error, Result};

/// Which device layout compact storage uses (`gpu_layout`; `auto` is `None` in [`GpuTuning`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuLayout {
    /// Rows with 16-bit column deltas, and their transpose in the same form.
    Rows,
    /// Column tiles for both products.
    Tiles,
    /// Delta rows for A x, column tiles for A^T.
    Mixed,
    /// Column tiles for both products, each of its own size.
    Split,
}

choice_from_str!(
    GpuLayout,
    "gpu layout",
    "rows" => Self::Rows,
    "tiles" => Self::Tiles,
    "mixed" => Self::Mixed,
    "split" => Self::Split
);

impl std::fmt::Display for GpuLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuLayout::Rows => "rows",
            GpuLayout::Tiles => "tiles",
            GpuLayout::Mixed => "mixed",
            GpuLayout::Split => "split",
        })
    }
}

/// Every tuning knob of the CUDA backend; `None` (or no defines) chooses as by default. Each
/// field's doc starts with its config key (`[tuning]`, `--tune key=value`).
///
/// Where each knob goes: the compact operator's ([`super::CudaCompactOperator::with_options`])
/// `layout` to `tiled_s_cols`; the device LSQR loop's `lsqr_block` (either operator's
/// `set_lsqr_block`, or `with_options` / `CudaCsrOperator::with_tuning`); the kernels'
/// `nvrtc_defines` ([`super::CudaBackend::with_defines`], which compiles them).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct GpuTuning {
    /// `gpu_layout`: auto (`None`) picks split when the matrix has at least 1M nonzeros and
    /// its rows have on average at least 4 nonzeros per tile of 2^tile_bits they touch, else
    /// rows.
    #[serde(rename = "gpu_layout")]
    pub layout: Option<GpuLayout>,
    /// `tile_bits`: column tiles of 2^bits columns, 4..=12 (in the split layout A^T's); default
    /// 9 (512 cells, an 8x8x8 brick in Morton order).
    pub tile_bits: Option<u32>,
    /// `ax_tile_bits`: A x's tiles in the split layout, 4..=12; default 12 (4096 cells, a
    /// 16x16x16 brick).
    pub ax_tile_bits: Option<u32>,
    /// `compact_s`: sub-warp width of the delta-row kernels, 4, 8, 16 or 32; default from the
    /// mean row length (about 4 entries a lane).
    pub compact_s: Option<u32>,
    /// `compact_r`: rows per sub-warp of the delta-row kernels, 1..=65536; default: about 16384
    /// entries a block (1..=64).
    pub compact_r: Option<u32>,
    /// `tiled_s_cols`: sub-warp width of the tiles' column pass (A^T), 4, 8, 16 or 32; default
    /// from the mean column length in a tile.
    pub tiled_s_cols: Option<u32>,
    /// `lsqr_block`: iterations per replay of the device LSQR loop's CUDA graph, 1..=256;
    /// default 32.
    pub lsqr_block: Option<usize>,
    /// `nvrtc_defines`: preprocessor defines the kernels are compiled with, `NAME` or
    /// `NAME=VALUE` (kernel constants for experiments, e.g. `CUNROLL=2`).
    pub nvrtc_defines: Vec<String>,
}

/// The config keys of [`GpuTuning`], in its fields' order.
pub const GPU_TUNING_KEYS: [&str; 8] = [
    "gpu_layout",
    "tile_bits",
    "ax_tile_bits",
    "compact_s",
    "compact_r",
    "tiled_s_cols",
    "lsqr_block",
    "nvrtc_defines",
];

/// Sub-warp widths the kernels are compiled for (kernels/compact.cu, tiled.cu).
const SUB_WARPS: [u32; 4] = [4, 8, 16, 32];
/// Tile bits the tiled kernels take.
const TILE_BITS: std::ops::RangeInclusive<u32> = 4..=12;
/// Rows per sub-warp at most (a block's rows then still fit 32 bits).
const MAX_COMPACT_R: u32 = 1 << 16;
/// Whether a knob's value is in its range.
type Allowed = fn(u32) -> bool;

impl GpuTuning {
    /// An error naming the key when a value is out of its range (see each field).
    pub fn validate(&self) -> Result<()> {
        let bits: Allowed = |b| TILE_BITS.contains(&b);
        let width: Allowed = |s| SUB_WARPS.contains(&s);
        let rows: Allowed = |r| (1..=MAX_COMPACT_R).contains(&r);
        let knobs = [
            ("tile_bits", self.tile_bits, bits, "4..=12"),
            ("ax_tile_bits", self.ax_tile_bits, bits, "4..=12"),
            ("compact_s", self.compact_s, width, "4, 8, 16 or 32"),
            ("compact_r", self.compact_r, rows, "1..=65536"),
            ("tiled_s_cols", self.tiled_s_cols, width, "4, 8, 16 or 32"),
        ];
        for (key, value, ok, want) in knobs {
            if let Some(v) = value.filter(|&v| !ok(v)) {
                return Err(Error::Invalid(format!(
                    "tuning {key} = {v}: expected {want}"
                )));
            }
        }
        if let Some(k) = self.lsqr_block {
            check_lsqr_block(k)?;
        }
        check_defines(&self.nvrtc_defines)
    }

    /// Set the knob `key` (a config key, [`GPU_TUNING_KEYS`]) from its text: `auto` (or an
    /// empty value) restores the default; `nvrtc_defines` takes a comma-separated list. The
    /// value is checked as by [`GpuTuning::validate`]; on an error `self` is unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let mut t = self.clone();
        let value = value.trim();
        let auto = value.is_empty() || value == "auto";
        fn num<T: FromStr>(key: &str, v: &str, auto: bool) -> Result<Option<T>> {
            if auto {
                return Ok(None);
            }
            v.parse().map(Some).map_err(|_| {
                Error::Invalid(format!("tuning {key} = {v}: expected a number or auto"))
            })
        }
        match key {
            "gpu_layout" if auto => t.layout = None,
            "gpu_layout" => {
                let l = value
                    .parse()
                    .map_err(|e| Error::Invalid(format!("tuning gpu_layout: {e}")))?;
                t.layout = Some(l);
            }
            "tile_bits" => t.tile_bits = num(key, value, auto)?,
            "ax_tile_bits" => t.ax_tile_bits = num(key, value, auto)?,
            "compact_s" => t.compact_s = num(key, value, auto)?,
            "compact_r" => t.compact_r = num(key, value, auto)?,
            "tiled_s_cols" => t.tiled_s_cols = num(key, value, auto)?,
            "lsqr_block" => t.lsqr_block = num(key, value, auto)?,
            "nvrtc_defines" => {
                t.nvrtc_defines = value
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty() && !auto)
                    .map(String::from)
                    .collect()
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown tuning key '{key}' ({})",
                    GPU_TUNING_KEYS.join(", ")
                )))
            }
        }
        t.validate()?;
        *self = t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_chooses_everything_and_is_valid() {
        let t = GpuTuning::default();
        assert!(t.layout.is_none() && t.tile_bits.is_none() && t.lsqr_block.is_none());
        assert!(t.nvrtc_defines.is_empty());
        t.validate().unwrap();
    }

    #[test]
    fn set_parses_checks_and_names_the_key() {
        let mut t = GpuTuning::default();
        t.set("gpu_layout", "mixed").unwrap();
        t.set("tile_bits", "10").unwrap();
        t.set("compact_s", "8").unwrap();
        t.set("lsqr_block", "64").unwrap();
        t.set("nvrtc_defines", "CUNROLL=2, CMINB=6").unwrap();
        assert_eq!(t.layout, Some(GpuLayout::Mixed));
        assert_eq!(
            (t.tile_bits, t.compact_s, t.lsqr_block),
            (Some(10), Some(8), Some(64))
        );
        assert_eq!(t.nvrtc_defines, ["CUNROLL=2", "CMINB=6"]);
        t.set("gpu_layout", "auto").unwrap();
        t.set("nvrtc_defines", "").unwrap();
        assert!(t.layout.is_none() && t.nvrtc_defines.is_empty());
        let before = t.clone();
        assert!(t.set("tile_bits", "13").is_err());
        assert_eq!(t, before);
        for (k, v) in [
            ("tile_bits", "13"),
            ("ax_tile_bits", "3"),
            ("compact_s", "12"),
            ("compact_r", "0"),
            ("tiled_s_cols", "64"),
            ("lsqr_block", "0"),
            ("lsqr_block", "257"),
            ("lsqr_block", "many"),
            ("gpu_layout", "diagonal"),
            ("nvrtc_defines", "-O0"),
            ("nvrtc_defines", "A=1 B=2"),
            ("tile_size", "9"),
        ] {
            let e = GpuTuning::default().set(k, v).unwrap_err().to_string();
            assert!(e.contains(k), "{k} = {v}: {e}");
        }
    }

    #[test]
    fn validate_rejects_what_set_would() {
        let t = GpuTuning {
            tiled_s_cols: Some(2),
            ..Default::default()
        };
        assert!(t
            .validate()
            .unwrap_err()
            .to_string()
            .contains("tiled_s_cols"));
        let t = GpuTuning {
            nvrtc_defines: vec!["9LIVES".into()],
            ..Default::default()
        };
        assert!(t.validate().is_err());
    }
}

//! Performance knobs: values that change how fast a run goes, never what it computes (the GPU
//! kernels' layouts and launch shapes, the LSQR device loop's block size, NVRTC defines, the
//! coalescing of dataset reads). One [`Tuning`] is resolved at the face (a config's `[tuning]`
//! table, `--tune key=value` on the command line, `tuning={...}` from Python), carried in the
//! operator spec and the load options, and echoed in report.json (`tuning`) and the model file's
//! provenance. `None` means "chosen automatically" (docs/configuration.md lists the keys).

use serde::Serialize;

use crate::error::{Error, Result};

/// The device layout of compact storage on the GPU (`gpu_layout`; automatic is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuLayout {
    /// 16-bit-delta rows for A x, and their transpose in the same form for A^T y.
    Rows,
    /// Column tiles for both products.
    Tiles,
    /// Delta rows for A x, column tiles for A^T y.
    Mixed,
    /// Column tiles of `ax_tile_bits` for A x and of `tile_bits` for A^T y.
    Split,
}

choice_from_str!(GpuLayout, "GPU layout", "rows" => Self::Rows, "tiles" => Self::Tiles, "mixed" => Self::Mixed, "split" => Self::Split);

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

/// Every tuning knob (see the module docs); `None`/empty: chosen automatically. Each field's
/// doc starts with its key. Where each goes: the GPU's compact operator takes `gpu_layout` to
/// `tiled_s_cols`; the device LSQR loop `lsqr_block`; the CUDA backend, which compiles the
/// kernels, `nvrtc_defines`; the dataset loader `io_max_gap`; a batch of solves `gpu_batch`;
/// where the split layout's tiles are encoded `gpu_encode`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tuning {
    /// `gpu_layout`: auto picks split when the matrix has at least 1M nonzeros and its rows
    /// have on average at least 4 nonzeros per tile of 2^tile_bits they touch, else rows.
    pub gpu_layout: Option<GpuLayout>,
    /// `tile_bits`: column tiles of 2^bits columns, 4..=12 (in the split layout A^T's);
    /// default 9 (512 cells, an 8x8x8 brick in Morton order).
    pub tile_bits: Option<u32>,
    /// `ax_tile_bits`: A x's tiles in the split layout, 4..=12; default 12 (4096 cells).
    pub ax_tile_bits: Option<u32>,
    /// `compact_s`: sub-warp width of the delta-row kernels, 4, 8, 16 or 32; default from the
    /// mean row length (about 4 entries a lane).
    pub compact_s: Option<u32>,
    /// `compact_r`: rows per sub-warp of the delta-row kernels, 1..=65536; default about 16384
    /// entries a block.
    pub compact_r: Option<u32>,
    /// `tiled_s_cols`: sub-warp width of the tiles' column pass (A^T), 4, 8, 16 or 32; default
    /// from the mean column length in a tile.
    pub tiled_s_cols: Option<u32>,
    /// `lsqr_block`: iterations per replay of the device LSQR loop's CUDA graph, 1..=256;
    /// default 32.
    pub lsqr_block: Option<usize>,
    /// `atu_pieces`: on several ranks, the device LSQR loop makes A^T u in this many pieces
    /// of the columns (column tiles), each summed over the ranks (by NCCL, or through the
    /// ranks' memory, on a stream of its own) while the next is made, 1..=64; default 1: the
    /// whole product, then its sum (more pieces measured slower on two NVLink-joined GPUs).
    pub atu_pieces: Option<usize>,
    /// `nvrtc_defines`: preprocessor defines the CUDA kernels are compiled with, `NAME` or
    /// `NAME=VALUE` (kernel constants for experiments, e.g. `CUNROLL=2`).
    pub nvrtc_defines: Vec<String>,
    /// `nccl_max_ctas`: at most this many thread blocks (NCCL channels) per NCCL operation on
    /// several GPUs, 1..=64. Default: NCCL's own choice for LSQR (its allreduce of A^T u is
    /// large), 1 for GMRES (its halo and reductions are small, and NCCL's 24-32 channels cost
    /// more than they move: docs/gmres.md).
    pub nccl_max_ctas: Option<u32>,
    /// `io_max_gap`: dataset reads of records at most this many bytes apart are merged into one
    /// (0: only touching ones); default 64 KiB.
    pub io_max_gap: Option<u64>,
    /// `gpu_batch`: `true` runs a batch of LSQR solves (an L-curve's weights) on the GPU as one
    /// batched solve, `false` one solve after another; default: batched from 4M nonzeros
    /// (`pipeline::batch::GPU_BATCH_MIN_NNZ`), where it measured faster (docs/performance.md,
    /// "Batched LSQR on the GPU").
    pub gpu_batch: Option<bool>,
    /// `gpu_encode`: where a fresh run encodes the split layout's column tiles: default true,
    /// on the GPU from the uploaded CSR rows (kernels/encode.cu; the same arrays as the CPU's);
    /// false on the CPU, then uploaded. The GPU falls back to the CPU where the encoder's
    /// working memory does not fit.
    pub gpu_encode: Option<bool>,
}

/// The keys [`Tuning::set`] takes, in the fields' order.
pub const KEYS: [&str; 13] = [
    "gpu_layout",
    "tile_bits",
    "ax_tile_bits",
    "compact_s",
    "compact_r",
    "tiled_s_cols",
    "lsqr_block",
    "atu_pieces",
    "nvrtc_defines",
    "nccl_max_ctas",
    "io_max_gap",
    "gpu_batch",
    "gpu_encode",
];

/// Sub-warp widths the kernels are compiled for (kernels/compact.cu, tiled.cu).
const SUB_WARPS: [u32; 4] = [4, 8, 16, 32];
/// Iterations of one replay of the LSQR graph at most (the device keeps this many records).
pub const MAX_LSQR_BLOCK: usize = 256;

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    v.trim()
        .parse()
        .map_err(|_| Error::Invalid(format!("tuning {key} = {v}: expected a whole number")))
}

/// A true/false key (None: auto).
fn flag(key: &str, v: &str, auto: bool) -> Result<Option<bool>> {
    if auto {
        return Ok(None);
    }
    v.trim()
        .parse()
        .map(Some)
        .map_err(|_| Error::Invalid(format!("tuning {key} = {v}: expected true or false")))
}

/// Pieces of A^T u the device loop of several ranks makes at most.
pub const MAX_ATU_PIECES: usize = 64;

/// An error unless `p` is a count of A^T u's pieces (tuning `atu_pieces`, 1..=64).
pub fn check_atu_pieces(p: usize) -> Result<()> {
    if (1..=MAX_ATU_PIECES).contains(&p) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "tuning atu_pieces = {p}: expected 1..={MAX_ATU_PIECES}"
        )))
    }
}

/// An error unless `d` is a preprocessor define: NAME (a C identifier) or NAME=VALUE (a value
/// of letters, digits and `_.+-`: nothing an NVRTC option could be smuggled in with).
pub fn check_define(d: &str) -> Result<()> {
    let (name, value) = d.split_once('=').unwrap_or((d, ""));
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let plain = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c));
    if ident && plain {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "tuning nvrtc_defines: '{d}' is not NAME or NAME=VALUE (a C identifier; a value of letters, digits, _ . + -)"
        )))
    }
}

impl Tuning {
    /// An error naming the key when a value is out of its range (see each field).
    pub fn validate(&self) -> Result<()> {
        type Allowed = fn(u32) -> bool;
        let bits: Allowed = |b| (4..=12).contains(&b);
        let width: Allowed = |s| SUB_WARPS.contains(&s);
        let rows: Allowed = |r| (1..=1 << 16).contains(&r);
        let ctas: Allowed = |c| (1..=64).contains(&c);
        let knobs = [
            ("tile_bits", self.tile_bits, bits, "4..=12"),
            ("ax_tile_bits", self.ax_tile_bits, bits, "4..=12"),
            ("compact_s", self.compact_s, width, "4, 8, 16 or 32"),
            ("compact_r", self.compact_r, rows, "1..=65536"),
            ("tiled_s_cols", self.tiled_s_cols, width, "4, 8, 16 or 32"),
            ("nccl_max_ctas", self.nccl_max_ctas, ctas, "1..=64"),
        ];
        for (key, value, ok, want) in knobs {
            if let Some(v) = value.filter(|&v| !ok(v)) {
                return Err(Error::Invalid(format!(
                    "tuning {key} = {v}: expected {want}"
                )));
            }
        }
        if let Some(k) = self
            .lsqr_block
            .filter(|k| !(1..=MAX_LSQR_BLOCK).contains(k))
        {
            return Err(Error::Invalid(format!(
                "tuning lsqr_block = {k}: expected 1..={MAX_LSQR_BLOCK}"
            )));
        }
        if let Some(p) = self.atu_pieces {
            check_atu_pieces(p)?;
        }
        self.nvrtc_defines.iter().try_for_each(|d| check_define(d))
    }

    /// Set one knob from its text, checking its range ("auto" or empty resets it); on an error
    /// `self` is unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let v = value.trim();
        let auto = v.eq_ignore_ascii_case("auto") || v.is_empty();
        fn opt<T: std::str::FromStr>(key: &str, v: &str, auto: bool) -> Result<Option<T>> {
            if auto {
                Ok(None)
            } else {
                number(key, v).map(Some)
            }
        }
        let mut t = self.clone();
        match key {
            "gpu_layout" if auto => t.gpu_layout = None,
            "gpu_layout" => {
                t.gpu_layout = Some(
                    v.parse()
                        .map_err(|e| Error::Invalid(format!("tuning {key}: {e}")))?,
                )
            }
            "tile_bits" => t.tile_bits = opt(key, v, auto)?,
            "ax_tile_bits" => t.ax_tile_bits = opt(key, v, auto)?,
            "compact_s" => t.compact_s = opt(key, v, auto)?,
            "compact_r" => t.compact_r = opt(key, v, auto)?,
            "tiled_s_cols" => t.tiled_s_cols = opt(key, v, auto)?,
            "lsqr_block" => t.lsqr_block = opt(key, v, auto)?,
            "atu_pieces" => t.atu_pieces = opt(key, v, auto)?,
            "nccl_max_ctas" => t.nccl_max_ctas = opt(key, v, auto)?,
            "io_max_gap" => t.io_max_gap = opt(key, v, auto)?,
            "gpu_batch" => t.gpu_batch = flag(key, v, auto)?,
            "gpu_encode" => t.gpu_encode = flag(key, v, auto)?,
            "nvrtc_defines" => {
                t.nvrtc_defines = v
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty() && !auto)
                    .map(String::from)
                    .collect()
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown tuning key '{key}' ({})",
                    KEYS.join(", ")
                )))
            }
        }
        t.validate()?;
        *self = t;
        Ok(())
    }

    /// Apply `key=value` items (`--tune` on the command line), in order.
    pub fn apply<S: AsRef<str>>(&mut self, items: &[S]) -> Result<()> {
        for item in items {
            let item = item.as_ref();
            let (k, v) = item.split_once('=').ok_or_else(|| {
                Error::Invalid(format!(
                    "--tune {item}: expected KEY=VALUE ({})",
                    KEYS.join(", ")
                ))
            })?;
            self.set(k.trim(), v)?;
        }
        Ok(())
    }

    /// Whether every knob is automatic.
    pub fn is_default(&self) -> bool {
        *self == Tuning::default()
    }

    /// A `[tuning]` table of a config: every value as text (strings, integers, arrays of
    /// strings for `nvrtc_defines`) through [`Tuning::set`].
    pub fn from_table(table: &toml::Table) -> Result<Tuning> {
        let mut t = Tuning::default();
        for (k, v) in table {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Array(a) if k == "nvrtc_defines" => a
                    .iter()
                    .map(|d| match d {
                        toml::Value::String(s) => Ok(s.clone()),
                        other => Err(Error::Invalid(format!(
                            "tuning nvrtc_defines: expected strings, got {other}"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?
                    .join(","),
                other => {
                    return Err(Error::Invalid(format!(
                        "tuning {k} = {other}: expected a string, a whole number or true/false"
                    )))
                }
            };
            t.set(k, &text)?;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_checks_and_resets_every_key() {
        let mut t = Tuning::default();
        t.apply(&[
            "gpu_layout=mixed",
            "tile_bits=10",
            "ax_tile_bits=12",
            "compact_s=8",
            "compact_r=13",
            "tiled_s_cols=16",
            "lsqr_block=64",
            "nvrtc_defines=CUNROLL=2,CMINB",
            "nccl_max_ctas=2",
            "io_max_gap=4096",
        ])
        .unwrap();
        assert_eq!(t.gpu_layout, Some(GpuLayout::Mixed));
        assert_eq!((t.tile_bits, t.ax_tile_bits), (Some(10), Some(12)));
        assert_eq!(
            (t.compact_s, t.compact_r, t.tiled_s_cols),
            (Some(8), Some(13), Some(16))
        );
        assert_eq!(t.lsqr_block, Some(64));
        assert_eq!(t.nvrtc_defines, vec!["CUNROLL=2", "CMINB"]);
        assert_eq!(t.io_max_gap, Some(4096));
        assert_eq!(t.nccl_max_ctas, Some(2));
        t.apply(&["gpu_layout=auto", "tile_bits=auto"]).unwrap();
        assert_eq!((t.gpu_layout, t.tile_bits), (None, None));
        for bad in [
            "tile_bits=13",
            "compact_s=5",
            "compact_r=0",
            "compact_r=70000",
            "lsqr_block=300",
            "gpu_layout=diagonal",
            "nvrtc_defines=A;B",
            "nvrtc_defines=X=1 -G",
            "io_max_gap=-1",
            "nccl_max_ctas=0",
            "nccl_max_ctas=65",
            "speed=11",
            "tile_bits",
        ] {
            let mut t = Tuning::default();
            let e = t.apply(&[bad]).unwrap_err().to_string();
            assert!(!e.contains('\n') && e.contains("tun"), "{bad}: {e}");
            assert!(
                t.is_default(),
                "{bad}: a rejected value left the tuning changed"
            );
        }
    }

    #[test]
    fn reads_a_table() {
        let table: toml::Table =
            toml::from_str("gpu_layout = \"rows\"\nlsqr_block = 16\nnvrtc_defines = [\"A=1\"]\n")
                .unwrap();
        let t = Tuning::from_table(&table).unwrap();
        assert_eq!(t.gpu_layout, Some(GpuLayout::Rows));
        assert_eq!(t.lsqr_block, Some(16));
        assert_eq!(t.nvrtc_defines, vec!["A=1"]);
        let bad: toml::Table = toml::from_str("tile_bits = 2.5\n").unwrap();
        assert!(Tuning::from_table(&bad).is_err());
    }
}

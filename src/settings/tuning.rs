//! Performance knobs: values that change how fast a run goes, never what it computes (the GPU
//! kernels' layouts and launch shapes, the LSQR device loop's block size, NVRTC defines, the
//! coalescing of dataset reads). One [`Tuning`] is resolved at the face (a config's `[tuning]`
//! table, `--tune key=value` on the command line, `tuning={...}` from Python), carried in the
//! operator spec and the load options, and echoed in report.json (`tuning`) and the model file's
//! provenance. `None` means "chosen automatically" (docs/configuration.md lists the keys).

use serde::Serialize;

use crate::error::{Error, Result};

/// The device layout of compact storage on the GPU (`gpu_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuLayoutChoice {
    /// 16-bit-delta rows for A x and for A^T y.
    Rows,
    /// Column tiles for both products.
    Tiles,
    /// Delta rows for A x, column tiles for A^T y.
    Mixed,
    /// Column tiles of `ax_tile_bits` for A x and of `tile_bits` for A^T y.
    Split,
}

choice_from_str!(GpuLayoutChoice, "GPU layout", "rows" => Self::Rows, "tiles" => Self::Tiles, "mixed" => Self::Mixed, "split" => Self::Split);

/// Every tuning knob (see the module docs); `None`/empty: chosen automatically.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tuning {
    /// GPU compact storage: the device layout.
    pub gpu_layout: Option<GpuLayoutChoice>,
    /// GPU compact storage: tiles of 2^bits columns for A^T y (4..=12).
    pub tile_bits: Option<u32>,
    /// GPU compact storage, split layout: tiles of 2^bits columns for A x (4..=12).
    pub ax_tile_bits: Option<u32>,
    /// GPU compact rows: the sub-warp width per row (4, 8, 16 or 32 lanes).
    pub compact_s: Option<u32>,
    /// GPU compact rows: rows per sub-warp (1..=64).
    pub compact_r: Option<u32>,
    /// GPU column tiles: the sub-warp width per column (4, 8, 16 or 32 lanes).
    pub tiled_s_cols: Option<u32>,
    /// GPU LSQR device loop: iterations per CUDA-graph replay (1..=256).
    pub lsqr_block: Option<usize>,
    /// Extra preprocessor defines for the CUDA kernels (NAME or NAME=VALUE).
    pub nvrtc_defines: Vec<String>,
    /// Dataset reads: records at most this many bytes apart are read as one (0: only touching
    /// ones).
    pub io_max_gap: Option<u64>,
}

/// The keys [`Tuning::set`] takes, for messages and docs.
pub const KEYS: [&str; 9] = [
    "gpu_layout",
    "tile_bits",
    "ax_tile_bits",
    "compact_s",
    "compact_r",
    "tiled_s_cols",
    "lsqr_block",
    "nvrtc_defines",
    "io_max_gap",
];

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    v.trim()
        .parse()
        .map_err(|_| Error::Invalid(format!("tuning {key} = {v}: expected a whole number")))
}

fn within<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    v: T,
    ok: &[T],
    range: bool,
) -> Result<T> {
    let good = if range {
        ok[0] <= v && v <= ok[1]
    } else {
        ok.contains(&v)
    };
    if good {
        return Ok(v);
    }
    let allowed = if range {
        format!("{}..={}", ok[0], ok[1])
    } else {
        ok.iter()
            .map(|o| o.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(Error::Invalid(format!(
        "tuning {key} = {v}: expected {allowed}"
    )))
}

fn define(key: &str, d: &str) -> Result<String> {
    let d = d.trim();
    let (name, value) = d.split_once('=').unwrap_or((d, ""));
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
    };
    if ident(name) && plain(value) {
        Ok(d.to_string())
    } else {
        Err(Error::Invalid(format!(
            "tuning {key}: '{d}' is not a define (NAME or NAME=VALUE, letters, digits, _)"
        )))
    }
}

impl Tuning {
    /// Set one knob from its text, checking its range ("auto" resets it).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let v = value.trim();
        let auto = v.eq_ignore_ascii_case("auto") || v.is_empty();
        let pow2 = [4u32, 8, 16, 32];
        match key {
            "gpu_layout" => {
                self.gpu_layout = if auto {
                    None
                } else {
                    Some(
                        v.parse()
                            .map_err(|e| Error::Invalid(format!("tuning {key}: {e}")))?,
                    )
                }
            }
            "tile_bits" | "ax_tile_bits" => {
                let b = if auto {
                    None
                } else {
                    Some(within(key, number(key, v)?, &[4, 12], true)?)
                };
                if key == "tile_bits" {
                    self.tile_bits = b
                } else {
                    self.ax_tile_bits = b
                }
            }
            "compact_s" | "tiled_s_cols" => {
                let s = if auto {
                    None
                } else {
                    Some(within(key, number(key, v)?, &pow2, false)?)
                };
                if key == "compact_s" {
                    self.compact_s = s
                } else {
                    self.tiled_s_cols = s
                }
            }
            "compact_r" => {
                self.compact_r = if auto {
                    None
                } else {
                    Some(within(key, number(key, v)?, &[1, 64], true)?)
                }
            }
            "lsqr_block" => {
                self.lsqr_block = if auto {
                    None
                } else {
                    Some(within(key, number(key, v)?, &[1, 256], true)?)
                }
            }
            "nvrtc_defines" => {
                self.nvrtc_defines = v
                    .split(',')
                    .filter(|t| !t.trim().is_empty() && !auto)
                    .map(|t| define(key, t))
                    .collect::<Result<_>>()?
            }
            "io_max_gap" => self.io_max_gap = if auto { None } else { Some(number(key, v)?) },
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown tuning key '{key}' ({})",
                    KEYS.join(", ")
                )))
            }
        }
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

    /// A `[tuning]` table of a config: every value as text (strings, integers, arrays of
    /// strings for `nvrtc_defines`) through [`Tuning::set`].
    pub fn from_table(table: &toml::Table) -> Result<Tuning> {
        let mut t = Tuning::default();
        for (k, v) in table {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
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
                        "tuning {k} = {other}: expected a string or a whole number"
                    )))
                }
            };
            t.set(k, &text)?;
        }
        Ok(t)
    }

    /// Whether every knob is automatic.
    pub fn is_default(&self) -> bool {
        *self == Tuning::default()
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
            "io_max_gap=4096",
        ])
        .unwrap();
        assert_eq!(t.gpu_layout, Some(GpuLayoutChoice::Mixed));
        assert_eq!((t.tile_bits, t.ax_tile_bits), (Some(10), Some(12)));
        assert_eq!(
            (t.compact_s, t.compact_r, t.tiled_s_cols),
            (Some(8), Some(13), Some(16))
        );
        assert_eq!(t.lsqr_block, Some(64));
        assert_eq!(t.nvrtc_defines, vec!["CUNROLL=2", "CMINB"]);
        assert_eq!(t.io_max_gap, Some(4096));
        t.apply(&["gpu_layout=auto", "tile_bits=auto"]).unwrap();
        assert_eq!((t.gpu_layout, t.tile_bits), (None, None));
        for bad in [
            "tile_bits=13",
            "compact_s=5",
            "compact_r=0",
            "lsqr_block=300",
            "gpu_layout=diagonal",
            "nvrtc_defines=A;B",
            "io_max_gap=-1",
            "speed=11",
            "tile_bits",
        ] {
            let e = Tuning::default().apply(&[bad]).unwrap_err().to_string();
            assert!(!e.contains('\n') && e.contains("tun"), "{bad}: {e}");
        }
    }

    #[test]
    fn reads_a_table() {
        let table: toml::Table =
            toml::from_str("gpu_layout = \"rows\"\nlsqr_block = 16\nnvrtc_defines = [\"A=1\"]\n")
                .unwrap();
        let t = Tuning::from_table(&table).unwrap();
        assert_eq!(t.gpu_layout, Some(GpuLayoutChoice::Rows));
        assert_eq!(t.lsqr_block, Some(16));
        assert_eq!(t.nvrtc_defines, vec!["A=1"]);
        let bad: toml::Table = toml::from_str("tile_bits = 2.5\n").unwrap();
        assert!(Tuning::from_table(&bad).is_err());
    }
}

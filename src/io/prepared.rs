//! The prepared-storage file (docs/formats.md, "Prepared storage"): one rank's system as an
//! operator stores it, written by `seistomo prepare` and read instead of the rows and the
//! set-up by the next run. This module is the container only: a JSON header (what the file was
//! made from, and the sections) and raw little-endian arrays, each 64-byte aligned and
//! checksummed per 16 MiB chunk (CRC32C), so that a read can check every byte in parallel as
//! it lands. What the sections mean is the pipeline's ([`crate::pipeline::prepared`]).
//!
//! ```text
//! magic "SEISTOMO-PREPARED\n" (18 bytes) | u32 version | u32 header length | u32 header CRC32C
//! | header JSON | zero padding to 64 | section 0 | padding to 64 | section 1 | ...
//! ```

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The folder of a dataset that holds its prepared storage.
pub const DIR: &str = "prepared";
/// The first bytes of every prepared file.
pub const MAGIC: &[u8; 18] = b"SEISTOMO-PREPARED\n";
/// The container's version: a file of another version is refused (and set up afresh).
pub const VERSION: u32 = 1;
/// Bytes per checksum chunk.
pub const CHUNK: usize = 16 << 20;
const ALIGN: u64 = 64;
/// A header longer than this is not one of ours.
const MAX_HEADER: u32 = 64 << 20;

/// The element type of a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Elem {
    U16,
    U32,
    U64,
    F32,
    F64,
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::U16 => 2,
            Elem::U32 | Elem::F32 => 4,
            Elem::U64 | Elem::F64 => 8,
        }
    }
}

/// One array of the file: its name, type, length, place and chunk checksums.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Section {
    pub name: String,
    pub elem: Elem,
    pub len: u64,
    pub offset: u64,
    pub crcs: Vec<u32>,
}

/// The header: `inputs` says what the file was made from (the reader compares it with what it
/// would make now), `meta` the scalars the arrays need, `sections` the arrays.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    pub inputs: serde_json::Value,
    pub meta: serde_json::Value,
    pub sections: Vec<Section>,
}

/// A numeric array a section holds.
///
/// # Safety
/// The type must have no padding and every bit pattern must be a valid value (its bytes are
/// read and written directly).
pub unsafe trait Plain: Copy + Default + Send + Sync + 'static {
    const ELEM: Elem;
}
// SAFETY: u16, u32, u64, f32 and f64 have no padding and no invalid bit patterns.
unsafe impl Plain for u16 {
    const ELEM: Elem = Elem::U16;
}
// SAFETY: as above.
unsafe impl Plain for u32 {
    const ELEM: Elem = Elem::U32;
}
// SAFETY: as above.
unsafe impl Plain for f32 {
    const ELEM: Elem = Elem::F32;
}
// SAFETY: as above.
unsafe impl Plain for u64 {
    const ELEM: Elem = Elem::U64;
}
// SAFETY: as above.
unsafe impl Plain for f64 {
    const ELEM: Elem = Elem::F64;
}

/// The bytes of `v` as they lie in memory (a section's content).
pub fn bytes_of<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: T is `Plain`: no padding, so every byte is initialised; the length is the
    // slice's size in bytes and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The bytes of `v`, to be filled by [`Reader::fill`].
pub fn bytes_of_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; also every bit pattern is a valid `Plain` value, so any bytes
    // written through the view leave valid values.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn pad(at: u64) -> u64 {
    at.div_ceil(ALIGN) * ALIGN
}

/// The arrays of a file being written, borrowed until [`Writer::write`].
#[derive(Default)]
pub struct Writer<'a> {
    arrays: Vec<(String, Elem, &'a [u8])>,
}

impl<'a> Writer<'a> {
    /// Add array `name` (names are unique within a file).
    pub fn add<T: Plain>(&mut self, name: &str, v: &'a [T]) {
        self.arrays.push((name.to_string(), T::ELEM, bytes_of(v)));
    }

    /// Write the file atomically (a temporary file renamed into place once synced).
    pub fn write(
        self,
        path: &Path,
        inputs: serde_json::Value,
        meta: serde_json::Value,
    ) -> Result<()> {
        let sections: Vec<Section> = self
            .arrays
            .iter()
            .map(|(name, elem, b)| Section {
                name: name.clone(),
                elem: *elem,
                len: (b.len() / elem.size()) as u64,
                offset: 0,
                crcs: b.par_chunks(CHUNK).map(crc32c::crc32c).collect(),
            })
            .collect();
        let mut header = Header {
            inputs,
            meta,
            sections,
        };
        // The offsets depend on the header's length, which depends on the offsets' digits:
        // lay out until it settles.
        let mut text = Vec::new();
        for _ in 0..4 {
            text = serde_json::to_vec(&header).map_err(|e| Error::Invalid(e.to_string()))?;
            let mut at = pad(MAGIC.len() as u64 + 12 + text.len() as u64);
            let mut moved = false;
            for (s, (_, _, b)) in header.sections.iter_mut().zip(&self.arrays) {
                moved |= s.offset != at;
                s.offset = at;
                at = pad(at + b.len() as u64);
            }
            if !moved {
                break;
            }
        }
        crate::io::write_atomic(path, |w| {
            w.write_all(MAGIC)?;
            w.write_all(&VERSION.to_le_bytes())?;
            w.write_all(&(text.len() as u32).to_le_bytes())?;
            w.write_all(&crc32c::crc32c(&text).to_le_bytes())?;
            w.write_all(&text)?;
            let mut at = MAGIC.len() as u64 + 12 + text.len() as u64;
            for (s, (_, _, b)) in header.sections.iter().zip(&self.arrays) {
                w.write_all(&vec![0u8; (s.offset - at) as usize])?;
                w.write_all(b)?;
                at = s.offset + b.len() as u64;
            }
            Ok(())
        })
    }
}

/// A prepared file opened: its header read and checked; arrays read on demand.
pub struct Reader {
    path: std::path::PathBuf,
    file: File,
    pub header: Header,
}

impl Reader {
    /// Open `path` and read its header. An error names the file: not a prepared file, another
    /// version, a damaged header.
    pub fn open(path: &Path) -> Result<Reader> {
        let bad = |why: String| Error::format(path, why);
        let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
        let mut head = [0u8; 30];
        file.read_exact(&mut head)
            .map_err(|_| bad("too short for a prepared-storage file".into()))?;
        if &head[..18] != MAGIC {
            return Err(bad("not a seistomo prepared-storage file".into()));
        }
        let word = |k: usize| u32::from_le_bytes(head[18 + 4 * k..22 + 4 * k].try_into().unwrap());
        let (version, len, crc) = (word(0), word(1), word(2));
        if version != VERSION {
            return Err(bad(format!(
                "prepared-storage format version {version}; this seistomo reads version {VERSION}"
            )));
        }
        if len > MAX_HEADER {
            return Err(bad(format!("header of {len} bytes: the file is corrupted")));
        }
        let mut text = vec![0u8; len as usize];
        file.read_exact(&mut text)
            .map_err(|_| bad("the file ends inside its header (truncated?)".into()))?;
        let computed = crc32c::crc32c(&text);
        if computed != crc {
            return Err(crate::io::dataset::binfmt::checksum_error(
                path, "header", crc, computed,
            ));
        }
        let header: Header = serde_json::from_slice(&text)
            .map_err(|e| bad(format!("header: {e}: the file is corrupted")))?;
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
        for s in &header.sections {
            let end = s.offset + s.len * s.elem.size() as u64;
            let chunks = (s.len as usize * s.elem.size()).div_ceil(CHUNK);
            if end > size || s.crcs.len() != chunks {
                return Err(bad(format!(
                    "section '{}' does not fit the file ({end} bytes of {size}; truncated?)",
                    s.name
                )));
            }
        }
        Ok(Reader {
            path: path.to_path_buf(),
            file,
            header,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The section `name`, if the file has it.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.header.sections.iter().find(|s| s.name == name)
    }

    /// Read array `name` (chunks read in parallel, each checked against its CRC32C as it
    /// lands). Missing, of another type or damaged: an error naming the file and the section.
    pub fn read<T: Plain>(&self, name: &str) -> Result<Vec<T>> {
        let mut v = self.empty::<T>(name)?;
        self.fill(vec![(name, bytes_of_mut(&mut v))])?;
        Ok(v)
    }

    /// A zeroed array of section `name`'s length, for [`Self::fill`]: missing or of another
    /// type than T is an error naming the file and the section. Large arrays are asked to be
    /// backed by huge pages (Linux), so that reading faults them in 2 MiB at a time.
    pub fn empty<T: Plain>(&self, name: &str) -> Result<Vec<T>> {
        let s = self
            .section(name)
            .ok_or_else(|| Error::format(&self.path, format!("no section '{name}'")))?;
        if s.elem != T::ELEM {
            return Err(Error::format(
                &self.path,
                format!("section '{name}' holds {:?}, not {:?}", s.elem, T::ELEM),
            ));
        }
        let mut v = vec![T::default(); s.len as usize];
        crate::sparse::par::advise_huge(bytes_of_mut(&mut v));
        Ok(v)
    }

    /// Read sections into their arrays (`(name, bytes)`, each as long as its section: made by
    /// [`Self::empty`]): every chunk of every section in parallel, each checked against its
    /// CRC32C as it lands.
    pub fn fill(&self, parts: Vec<(&str, &mut [u8])>) -> Result<()> {
        let mut jobs: Vec<(&str, u64, u32, &mut [u8])> = Vec::new();
        for (name, bytes) in parts {
            let s = self
                .section(name)
                .ok_or_else(|| Error::format(&self.path, format!("no section '{name}'")))?;
            if bytes.len() as u64 != s.len * s.elem.size() as u64 {
                return Err(Error::format(
                    &self.path,
                    format!("section '{name}': {} bytes asked for", bytes.len()),
                ));
            }
            for (k, (buf, &crc)) in bytes.chunks_mut(CHUNK).zip(&s.crcs).enumerate() {
                jobs.push((name, s.offset + (k * CHUNK) as u64, crc, buf));
            }
        }
        jobs.into_par_iter()
            .try_for_each(|(name, at, crc, buf)| -> Result<()> {
                self.file
                    .read_exact_at(buf, at)
                    .map_err(|e| Error::io(&self.path, e))?;
                let computed = crc32c::crc32c(buf);
                if computed != crc {
                    return Err(crate::io::dataset::binfmt::checksum_error(
                        &self.path,
                        &format!("section '{name}' bytes {at}..{}", at + buf.len() as u64),
                        crc,
                        computed,
                    ));
                }
                Ok(())
            })
    }

    /// Read and check every section (`seistomo verify`); returns the bytes checked.
    pub fn verify(&self) -> Result<u64> {
        let mut bytes = 0;
        for s in &self.header.sections {
            bytes += match s.elem {
                Elem::U16 => self.read::<u16>(&s.name)?.len() * 2,
                Elem::U32 => self.read::<u32>(&s.name)?.len() * 4,
                Elem::U64 => self.read::<u64>(&s.name)?.len() * 8,
                Elem::F32 => self.read::<f32>(&s.name)?.len() * 4,
                Elem::F64 => self.read::<f64>(&s.name)?.len() * 8,
            } as u64;
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        crate::io::test_dir("prepared").join(name)
    }

    #[test]
    fn arrays_round_trip_and_damage_is_refused() {
        let a: Vec<u64> = (0..100_000).map(|i| i * 3).collect();
        let b: Vec<f64> = (0..7).map(|i| i as f64 * 0.5 - 1.0).collect();
        let c: Vec<u32> = Vec::new();
        let p = tmp("rt.prep");
        let mut w = Writer::default();
        w.add("a", &a);
        w.add("b", &b);
        w.add("c", &c);
        w.write(&p, serde_json::json!({"k": 1}), serde_json::json!({"n": 7}))
            .unwrap();
        let r = Reader::open(&p).unwrap();
        assert_eq!(r.header.inputs["k"], 1);
        assert_eq!(r.read::<u64>("a").unwrap(), a);
        assert_eq!(r.read::<f64>("b").unwrap(), b);
        assert_eq!(r.read::<u32>("c").unwrap(), c);
        assert!(r
            .read::<u32>("a")
            .unwrap_err()
            .to_string()
            .contains("holds"));
        assert!(r
            .read::<u32>("zz")
            .unwrap_err()
            .to_string()
            .contains("no section"));
        assert_eq!(r.verify().unwrap(), 800_000 + 56);
        // one flipped byte inside section a: the read names the section and the file
        let off = r.section("a").unwrap().offset + 1000;
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[off as usize] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        let e = Reader::open(&p)
            .unwrap()
            .read::<u64>("a")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains("section 'a'") && e.contains("rt.prep"),
            "{e}"
        );
        // another version, a damaged header, a truncated file, not ours
        bytes[off as usize] ^= 1;
        let mut v2 = bytes.clone();
        v2[18] = 2;
        std::fs::write(&p, &v2).unwrap();
        let e = Reader::open(&p).err().unwrap().to_string();
        assert!(e.contains("version 2"), "{e}");
        let mut h = bytes.clone();
        h[40] ^= 0x20;
        std::fs::write(&p, &h).unwrap();
        let e = Reader::open(&p).err().unwrap().to_string();
        assert!(
            e.contains("checksum mismatch") && e.contains("header"),
            "{e}"
        );
        std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
        let e = Reader::open(&p).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&p, b"hello world, this is not it at all").unwrap();
        let e = Reader::open(&p).err().unwrap().to_string();
        assert!(e.contains("not a seistomo prepared-storage file"), "{e}");
    }
}

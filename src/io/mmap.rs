//! Read-only memory maps of dataset files: the one place in the I/O layer with `unsafe`. Small
//! files (per-row kernel files) are read instead: a map costs more than a read below 64 KiB.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// A read-only view of a whole file: memory-mapped, or an empty slice for an empty file (a
/// zero-length map is an error on some systems).
pub struct MappedFile {
    map: Option<Mmap>,
    /// Small files are read into memory instead (a map costs more than a read below ~64 KiB).
    owned: Vec<u8>,
}

/// Open a data file for reading: a directory, FIFO, socket or device in its place is a one-line
/// error naming it (a FIFO would block forever; a directory fails with a confusing OS error).
pub fn open_regular(path: &Path) -> Result<File> {
    crate::io::open_input(path)
}

/// Files below this size are read, not mapped.
const SMALL: u64 = 64 << 10;

impl MappedFile {
    /// Map `path` read-only. Errors name the file.
    pub fn open(path: &Path) -> Result<MappedFile> {
        Self::map(path, false)
    }

    /// Map `path`, populating the page tables up front when `populate` (one system call
    /// instead of a page fault per 4 KiB page, for files read in full).
    fn map(path: &Path, populate: bool) -> Result<MappedFile> {
        let f = open_regular(path)?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        if len == 0 {
            return Ok(MappedFile {
                map: None,
                owned: Vec::new(),
            });
        }
        let mut opts = memmap2::MmapOptions::new();
        if populate {
            opts.populate();
        }
        // SAFETY: the map is read-only and private to this process. Dataset files are written
        // atomically (temporary file + rename) and never modified in place by seistomo; if
        // another program truncates or rewrites a file while it is mapped, reads may see the
        // new bytes or fault (SIGBUS), which memmap2 documents as the caller's responsibility.
        // Every byte read through the map is validated (magic, counts, ranges, finiteness)
        // before it is trusted, so changed contents cannot cause undefined behaviour in Rust
        // code, only wrong values or a load error.
        let map = unsafe { opts.map(&f) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile {
            map: Some(map),
            owned: Vec::new(),
        })
    }

    /// Read `path` into memory when it is small (per-row kernel files), else map it.
    pub fn open_small(path: &Path) -> Result<MappedFile> {
        use std::io::Read;
        let mut f = open_regular(path)?;
        let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
        if len >= SMALL {
            return Self::open(path);
        }
        let mut owned = Vec::with_capacity(len as usize);
        f.read_to_end(&mut owned).map_err(|e| Error::io(path, e))?;
        Ok(MappedFile { map: None, owned })
    }

    /// Map `path` read-only and populate the page tables up front (one system call instead of
    /// a page fault per 4 KiB page; for files that will be read in full).
    pub fn open_populated(path: &Path) -> Result<MappedFile> {
        Self::map(path, true)
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.map {
            Some(m) => m,
            None => &self.owned,
        }
    }

    /// Advise the kernel that the file will be read sequentially (a hint; errors ignored).
    pub fn advise_sequential(&self) {
        #[cfg(unix)]
        if let Some(m) = &self.map {
            let _ = m.advise(memmap2::Advice::Sequential);
        }
    }
}

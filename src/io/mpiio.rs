//! Byte-range reads of a file by many ranks at once through MPI-IO: the one place that calls
//! `MPI_File_*` (rsmpi has no safe MPI-IO API, so this wraps `mpi::ffi`).
//!
//! - [`MpiFile::open_self`] + [`MpiFile::read_at`]: independent reads (MPI_COMM_SELF), each rank
//!   its own file or range; [`read_at`] does open + read + close in one call.
//! - [`MpiFile::open_world`] + [`MpiFile::read_at_all`]: collective open and read by every rank
//!   of MPI_COMM_WORLD (same path on every rank, each its own range), which lets the MPI library
//!   merge the ranks' requests (two-phase I/O) on parallel file systems.
//!
//! Built with the `mpi` feature only. Without it (or outside an MPI job) the loaders use the
//! positioned std reads of [`crate::io::rowio::LocalReads`]. Errors always name the file, the
//! offset and the length.
//!
//! Reads larger than 2^31 - 1 bytes are split into chunks (MPI counts are C ints); the collective
//! variant agrees on the number of chunks across ranks first so that every rank makes the same
//! number of collective calls.

use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};

use mpi::collective::SystemOperation;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::error::{Error, Result};
use crate::io::rowio::short_read;

/// Largest byte count of one MPI read call.
const CHUNK: usize = i32::MAX as usize;

/// The text of an MPI error code.
fn mpi_error_text(code: c_int) -> String {
    let mut buf = vec![0 as c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: buf holds MPI_MAX_ERROR_STRING + 1 chars as MPI_Error_string requires; len is
    // a valid out-pointer. MPI_Error_string may be called at any time after MPI_Init.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if rc != 0 {
        return format!("MPI error code {code}");
    }
    let bytes: Vec<u8> = buf[..len.clamp(0, buf.len() as c_int) as usize]
        .iter()
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

/// An open MPI file handle (read-only), closed on drop.
pub struct MpiFile {
    fh: ffi::MPI_File,
    path: PathBuf,
    collective: bool,
}

impl MpiFile {
    /// Open `path` read-only for this rank alone (MPI_COMM_SELF). MPI must be initialised
    /// (an [`crate::comm::MpiComm`] exists).
    pub fn open_self(path: &Path) -> Result<MpiFile> {
        Self::open(SimpleCommunicator::self_comm(), path, false)
    }

    /// Collective: every rank of MPI_COMM_WORLD opens the same `path` read-only. Either
    /// all ranks succeed or all get the error.
    pub fn open_world(path: &Path) -> Result<MpiFile> {
        Self::open(SimpleCommunicator::world(), path, true)
    }

    fn open(comm: SimpleCommunicator, path: &Path, collective: bool) -> Result<MpiFile> {
        if !mpi::is_initialized() || mpi::is_finalized() {
            return Err(Error::Comm(format!(
                "{}: MPI-IO needs an initialised MPI (run under mpirun)",
                path.display()
            )));
        }
        // The reader policy (crate::io::check_regular): MPI_File_open on a FIFO blocks. A
        // collective open agrees first, so that no rank enters MPI_File_open alone.
        let local = crate::io::check_regular(path);
        if collective {
            let bad = i32::from(local.is_err());
            let mut any = 0i32;
            comm.all_reduce_into(&bad, &mut any, SystemOperation::max());
            if any != 0 {
                return Err(local.err().unwrap_or_else(|| {
                    Error::format(path, "is not a regular file on another rank: refused")
                }));
            }
        } else {
            local?;
        }
        let cpath = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            Error::format(path, "file name contains a NUL byte; MPI cannot open it")
        })?;
        let mut fh: ffi::MPI_File = std::ptr::null_mut();
        // SAFETY: MPI is initialised and not finalised (checked above); comm is a valid
        // communicator handle for the duration of the call; cpath is NUL-terminated and
        // outlives the call; RSMPI_INFO_NULL is MPI_INFO_NULL; fh is a valid out-pointer.
        // File operations default to MPI_ERRORS_RETURN, so failure comes back as a code.
        let rc = unsafe {
            ffi::MPI_File_open(
                comm.as_raw(),
                cpath.as_ptr(),
                ffi::MPI_MODE_RDONLY as c_int,
                ffi::RSMPI_INFO_NULL,
                &mut fh,
            )
        };
        if rc != 0 {
            return Err(Error::io(
                path,
                std::io::Error::other(format!("MPI_File_open: {}", mpi_error_text(rc))),
            ));
        }
        Ok(MpiFile {
            fh,
            path: path.to_path_buf(),
            collective,
        })
    }

    /// The file's size in bytes.
    pub fn size(&self) -> Result<u64> {
        let mut size: ffi::MPI_Offset = 0;
        // SAFETY: self.fh is an open file handle (closed only in Drop); size is a valid
        // out-pointer.
        let rc = unsafe { ffi::MPI_File_get_size(self.fh, &mut size) };
        self.check(rc, "MPI_File_get_size", 0, 0)?;
        Ok(size as u64)
    }

    fn check(&self, rc: c_int, call: &str, offset: u64, len: usize) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        Err(Error::io(
            &self.path,
            std::io::Error::other(format!(
                "{call} of {len} bytes at offset {offset}: {}",
                mpi_error_text(rc)
            )),
        ))
    }

    /// Read one chunk (< 2^31 bytes) at `offset` into `buf`; returns the bytes read.
    fn read_chunk(&self, offset: u64, buf: &mut [u8], collective: bool) -> Result<usize> {
        debug_assert!(buf.len() <= CHUNK);
        let off = ffi::MPI_Offset::try_from(offset).map_err(|_| {
            Error::format(&self.path, format!("offset {offset} is too large for MPI"))
        })?;
        // SAFETY: MPI_Status is a plain C struct of integers; all-zero is a valid value and
        // MPI overwrites it.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        let count = buf.len() as c_int;
        let read = if collective {
            ffi::MPI_File_read_at_all
        } else {
            ffi::MPI_File_read_at
        };
        // SAFETY: self.fh is open; buf is valid for writes of buf.len() bytes (= count
        // elements of MPI_UINT8_T) and stays borrowed for the whole (blocking) call; status
        // is a valid out-pointer. The collective form is only called when every rank of the
        // file's communicator makes the same number of calls (see read_at_all).
        let rc = unsafe {
            read(
                self.fh,
                off,
                buf.as_mut_ptr().cast(),
                count,
                ffi::RSMPI_UINT8_T,
                &mut status,
            )
        };
        let call = if collective {
            "MPI_File_read_at_all"
        } else {
            "MPI_File_read_at"
        };
        self.check(rc, call, offset, buf.len())?;
        let mut got: c_int = 0;
        // SAFETY: status was filled by the successful read above; got is a valid out-pointer.
        let rc = unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut got) };
        self.check(rc, "MPI_Get_count", offset, buf.len())?;
        Ok(got.max(0) as usize)
    }

    /// Independent read of `len` bytes at `offset`. Fails (naming the file) on a short read.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        self.read_into(offset, &mut buf)?;
        Ok(buf)
    }

    /// Independent read of `buf.len()` bytes at `offset` into `buf`. Fails (naming the
    /// file) on a short read.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        let mut done = 0;
        while done < len {
            let end = (done + CHUNK).min(len);
            let got = self.read_chunk(offset + done as u64, &mut buf[done..end], false)?;
            if got == 0 {
                return Err(short_read(&self.path, offset, len, done));
            }
            done += got;
        }
        Ok(())
    }

    /// Collective read: every rank of the file's communicator calls this (each with its own
    /// range, possibly empty). A short read on any rank is an error on that rank only; the
    /// caller should [`crate::comm::agree`] on the result.
    pub fn read_at_all(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        if !self.collective {
            return Err(Error::Invalid(format!(
                "{}: read_at_all on a file opened for one rank (use open_world)",
                self.path.display()
            )));
        }
        let world = SimpleCommunicator::world();
        let mine = len.div_ceil(CHUNK) as u64;
        let mut rounds = 0u64;
        world.all_reduce_into(&mine, &mut rounds, SystemOperation::max());
        let mut buf = vec![0u8; len];
        let mut done = 0usize;
        let mut short = None;
        for round in 0..rounds as usize {
            let start = (round * CHUNK).min(len);
            let end = (start + CHUNK).min(len);
            // Every rank takes part in every round, with an empty range when it has
            // nothing (left) to read.
            let got = self.read_chunk(offset + start as u64, &mut buf[start..end], true)?;
            if got < end - start && short.is_none() {
                short = Some(start + got);
            }
            done = done.max(start + got);
        }
        match short {
            Some(got) => Err(short_read(&self.path, offset, len, got)),
            None => {
                debug_assert_eq!(done, len);
                Ok(buf)
            }
        }
    }
}

impl Drop for MpiFile {
    fn drop(&mut self) {
        if mpi::is_finalized() {
            return;
        }
        // SAFETY: self.fh was opened by MPI_File_open and is closed exactly once, here,
        // before MPI_Finalize (checked above). A collective handle is dropped on every rank
        // since every rank opened it. The return code is ignored: nothing can be done about
        // a failed close of a read-only file.
        unsafe {
            ffi::MPI_File_close(&mut self.fh);
        }
    }
}

/// Open `path` for this rank alone, read `len` bytes at `offset`, close.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    MpiFile::open_self(path)?.read_at(offset, len)
}

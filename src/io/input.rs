//! The one reader policy: every file the program opens for reading is a regular file, or a
//! one-line refusal naming it. A FIFO would block the open (or the first read) forever, and a
//! device such as /dev/zero or /dev/urandom never ends: a reader that grows as it reads would
//! take the machine's memory. Directories fail with a confusing OS error ("Is a directory")
//! at the first read only.
//!
//! [`open_input`] opens without blocking (`O_NONBLOCK`, so that a FIFO without a writer does not
//! hang the open), asks the open file what it is (`fstat`: no race with a rename between a
//! check and the open) and only then reads; [`check_regular`] is the same check by name, for
//! files that another library opens (HDF5, MPI-IO). [`read_input`] reads a whole file whose
//! length was checked against a limit first.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::error::{Error, Result};

/// The refusal for a file that is not a regular file, or None.
fn refusal(path: &Path, m: &Metadata) -> Option<Error> {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    let what = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Some(Error::format(
        path,
        format!("is {what}, not a regular file: refused (give a file)"),
    ))
}

/// Error unless `path` (links followed) is a regular file. For files that another library
/// opens; readers of our own use [`open_input`].
pub fn check_regular(path: &Path) -> Result<()> {
    let m = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    match refusal(path, &m) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Open `path` for reading: a regular file (links followed), or a one-line error naming it.
/// Never blocks, also on a FIFO.
pub fn open_input(path: &Path) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let m = f.metadata().map_err(|e| Error::io(path, e))?;
    if let Some(e) = refusal(path, &m) {
        return Err(e);
    }
    // A regular file ignores O_NONBLOCK; cleared anyway so that the descriptor is an ordinary
    // one for whoever reads it.
    // SAFETY: fcntl(2) on a descriptor that `f` owns and keeps open during the calls.
    unsafe {
        let fd = f.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(f)
}

/// The whole of `path` (a regular file, see [`open_input`]) when it has at most `max` bytes
/// (and fits the machine's memory); `what` names the file's role in the error ("config",
/// "checkpoint").
pub fn read_input(path: &Path, what: &str, max: u64) -> Result<Vec<u8>> {
    let mut f = open_input(path)?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    if len > max {
        return Err(Error::format(
            path,
            format!(
                "{len} bytes is more than a {what} may have ({max} bytes): refused (is this the right file?)"
            ),
        ));
    }
    crate::io::limits::check_alloc(path, what, u128::from(len))?;
    let mut buf = Vec::with_capacity(len as usize);
    // At most one byte past the length taken at the open: a file that grows while it is read
    // (another program appending) stops here instead of growing this buffer.
    (&mut f)
        .take(len.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(path, e))?;
    if buf.len() as u64 > len {
        return Err(Error::format(
            path,
            format!("grew while it was read (from {len} bytes): refused"),
        ));
    }
    Ok(buf)
}

/// [`read_input`] as UTF-8 text.
pub fn read_input_text(path: &Path, what: &str, max: u64) -> Result<String> {
    String::from_utf8(read_input(path, what, max)?).map_err(|e| {
        Error::format(
            path,
            format!(
                "not UTF-8 text (byte {} of the {what}): is this the right file?",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// Largest config, dataset manifest or output manifest read (text files of a few KiB).
pub const MAX_TEXT: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_at_once_regular_ones_read() {
        let dir = crate::io::test_dir("input");
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        for (p, want) in [
            (fifo.as_path(), "is a FIFO"),
            (Path::new("/dev/zero"), "is a device"),
            (Path::new("/dev/urandom"), "is a device"),
            (dir.as_path(), "is a directory"),
        ] {
            let e = open_input(p).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("refused"), "{e}");
            assert!(!e.contains('\n'));
            let e = read_input(p, "config", MAX_TEXT).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            let e = check_regular(p).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        assert!(t.elapsed().as_secs_f64() < 1.0);
        let f = dir.join("a.txt");
        std::fs::write(&f, "hello").unwrap();
        assert_eq!(read_input_text(&f, "config", 5).unwrap(), "hello");
        let e = read_input(&f, "config", 4).unwrap_err().to_string();
        assert!(e.contains("5 bytes is more than a config"), "{e}");
        std::fs::write(&f, [0xffu8, 0xfe]).unwrap();
        assert!(read_input_text(&f, "config", 5)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

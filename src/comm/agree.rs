//! Collective agreements: every rank returns the same outcome ([`agree`]), or the same value
//! computed on rank 0 ([`agree_on`]).

use super::Comm;
use crate::error::{Error, Result};

/// Collective: make every rank return the same outcome. When any rank holds an error, every rank
/// returns [`Error::Rank`] with the message of the lowest failing rank (the message names the
/// file, as every file error does), so that the job can end cleanly with that one line instead
/// of hanging in the next collective. On one rank the result is returned unchanged.
pub fn agree<T>(comm: &dyn Comm, r: Result<T>) -> Result<T> {
    if comm.size() == 1 {
        return r;
    }
    let (rank, size) = (comm.rank(), comm.size());
    let mine = if r.is_err() {
        (size - rank) as f64
    } else {
        0.0
    };
    let worst = comm.allreduce_max(mine)?;
    if worst == 0.0 {
        return r;
    }
    let failed = size - worst as usize;
    let mut msg = match (&r, rank == failed) {
        (Err(e), true) => match e {
            Error::Rank { msg, .. } => msg.clone().into_bytes(),
            e => e.to_string().into_bytes(),
        },
        _ => Vec::new(),
    };
    comm.broadcast_bytes(failed, &mut msg)?;
    Err(Error::Rank {
        rank: failed,
        msg: String::from_utf8_lossy(&msg).into_owned(),
    })
}

/// A value that rank 0 can hand to every rank as bytes ([`agree_on`]).
pub trait Broadcast: Sized {
    /// The value as bytes.
    fn to_bytes(&self) -> Vec<u8>;
    /// The value back from [`Broadcast::to_bytes`]'s bytes; `None` when they hold none.
    fn from_bytes(bytes: &[u8]) -> Option<Self>;
}

impl Broadcast for Vec<u32> {
    fn to_bytes(&self) -> Vec<u8> {
        self.iter().flat_map(|v| v.to_le_bytes()).collect()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (bytes.len() % 4 == 0).then(|| {
            bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }
}

/// Collective: rank 0 computes a value with `root` (no other rank calls it) and every rank
/// returns that value; an error of `root` reaches every rank (through [`agree`]). For choices
/// every rank must share, e.g. the METIS parts of a square system. On one rank this is `root()`.
pub fn agree_on<T: Broadcast>(comm: &dyn Comm, root: impl FnOnce() -> Result<T>) -> Result<T> {
    if comm.size() == 1 {
        return root();
    }
    let mine = if comm.is_root() {
        root().map(Some)
    } else {
        Ok(None)
    };
    let mine = agree(comm, mine)?;
    let mut bytes = mine.as_ref().map(T::to_bytes).unwrap_or_default();
    comm.broadcast_bytes(0, &mut bytes)?;
    match mine {
        Some(v) => Ok(v),
        None => T::from_bytes(&bytes).ok_or_else(|| {
            Error::Comm(format!(
                "rank 0's value: {} bytes that hold no {}",
                bytes.len(),
                std::any::type_name::<T>()
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{SerialComm, ThreadComm};

    #[test]
    fn agree_on_one_rank_passes_through() {
        let e: Result<()> = Err(Error::Invalid("x".into()));
        assert!(matches!(agree(&SerialComm, e), Err(Error::Invalid(_))));
        let v = agree_on(&SerialComm, || Ok(vec![3u32, 1])).unwrap();
        assert_eq!(v, vec![3, 1]);
        let e = agree_on(&SerialComm, || -> Result<Vec<u32>> {
            Err(Error::Invalid("y".into()))
        });
        assert!(matches!(e, Err(Error::Invalid(_))));
    }

    #[test]
    fn agree_on_hands_rank_0s_value_or_error_to_every_rank() {
        let out = std::thread::scope(|s| {
            let handles: Vec<_> = ThreadComm::create(3)
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = c.rank() as u32;
                        let ok = agree_on(&c, || Ok(vec![7, r, u32::MAX]));
                        let err = agree_on(&c, || -> Result<Vec<u32>> {
                            Err(Error::Invalid(format!("rank {r} failed")))
                        });
                        (ok, err)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (ok, err) in out {
            assert_eq!(ok.unwrap(), vec![7, 0, u32::MAX]);
            let e = err.unwrap_err().to_string();
            assert!(e.contains("rank 0 failed"), "{e}");
        }
        assert_eq!(Vec::<u32>::from_bytes(&[1, 2, 3]), None);
    }
}

//! Ranks as threads of one process: a [`Comm`] for tests of distributed code without MPI.

use std::sync::{Arc, Barrier, Mutex};

use crate::comm::Comm;
use crate::error::{Error, Result};

/// P ranks as threads of one process: a [`Comm`] for tests of distributed code without MPI.
/// Collectives meet at a barrier; reductions sum in rank order (deterministic).
pub struct ThreadComm {
    rank: usize,
    shared: Arc<ThreadShared>,
}

struct ThreadShared {
    size: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Vec<Vec<u64>>>>,
}

impl ThreadComm {
    /// Communicators for ranks 0..size (hand one to each thread).
    pub fn create(size: usize) -> Vec<ThreadComm> {
        let shared = Arc::new(ThreadShared {
            size,
            barrier: Barrier::new(size),
            slots: Mutex::new(vec![Vec::new(); size]),
        });
        (0..size)
            .map(|rank| ThreadComm {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }
    /// Everyone deposits `send` (one list per destination); returns what each rank sent here.
    fn exchange(&self, send: Vec<Vec<u64>>) -> Vec<Vec<u64>> {
        let sh = &self.shared;
        sh.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = send;
        sh.barrier.wait();
        let out = {
            let s = sh.slots.lock().unwrap_or_else(|e| e.into_inner());
            (0..sh.size)
                .map(|src| s[src].get(self.rank).cloned().unwrap_or_default())
                .collect()
        };
        sh.barrier.wait();
        out
    }
    /// One send list per rank, or an error naming the collective.
    fn check_lists(&self, what: &str, lists: usize) -> Result<()> {
        if lists != self.shared.size {
            return Err(Error::Comm(format!(
                "{what}: {lists} send lists for {} ranks",
                self.shared.size
            )));
        }
        Ok(())
    }
    fn to_bits(x: &[f64]) -> Vec<u64> {
        x.iter().map(|v| v.to_bits()).collect()
    }
    fn from_bits(x: &[u64]) -> Vec<f64> {
        x.iter().map(|&v| f64::from_bits(v)).collect()
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn barrier(&self) -> Result<()> {
        self.shared.barrier.wait();
        Ok(())
    }
    fn allreduce_sum(&self, buf: &mut [f64]) -> Result<()> {
        let bits = Self::to_bits(buf);
        let all = self.exchange(vec![bits; self.shared.size]);
        buf.fill(0.0);
        for v in &all {
            for (b, &x) in buf.iter_mut().zip(v) {
                *b += f64::from_bits(x);
            }
        }
        Ok(())
    }
    fn allreduce_max(&self, x: f64) -> Result<f64> {
        let all = self.exchange(vec![vec![x.to_bits()]; self.shared.size]);
        Ok(all
            .iter()
            .map(|v| f64::from_bits(v[0]))
            .fold(f64::NEG_INFINITY, f64::max))
    }
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<()> {
        let send = if self.rank == root {
            vec![buf.iter().map(|&b| b as u64).collect(); self.shared.size]
        } else {
            vec![Vec::new(); self.shared.size]
        };
        let all = self.exchange(send);
        *buf = all[root].iter().map(|&b| b as u8).collect();
        Ok(())
    }
    fn gather_to_root(&self, local: &[f64]) -> Result<Option<Vec<f64>>> {
        let mut send = vec![Vec::new(); self.shared.size];
        send[0] = Self::to_bits(local);
        let all = self.exchange(send);
        Ok(if self.rank == 0 {
            Some(all.iter().flat_map(|v| Self::from_bits(v)).collect())
        } else {
            None
        })
    }
    fn alltoallv(&self, send: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
        self.check_lists("alltoallv", send.len())?;
        let all = self.exchange(send.iter().map(|v| Self::to_bits(v)).collect());
        Ok(all.iter().map(|v| Self::from_bits(v)).collect())
    }
    fn alltoallv_u64(&self, send: &[Vec<u64>]) -> Result<Vec<Vec<u64>>> {
        self.check_lists("alltoallv_u64", send.len())?;
        Ok(self.exchange(send.to_vec()))
    }
}

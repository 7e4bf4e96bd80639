//! The one-process communicator: every collective is the identity.

use super::Comm;
use crate::error::Result;

/// A job of one rank.
#[derive(Debug, Default, Clone, Copy)]
pub struct SerialComm;

impl Comm for SerialComm {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn allreduce_sum(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn allreduce_max(&self, x: f64) -> Result<f64> {
        Ok(x)
    }
    fn broadcast_bytes(&self, _root: usize, _buf: &mut Vec<u8>) -> Result<()> {
        Ok(())
    }
    fn alltoallv(&self, send: &[Vec<f64>]) -> Result<Vec<Vec<f64>>> {
        Ok(send.to_vec())
    }
    fn alltoallv_u64(&self, send: &[Vec<u64>]) -> Result<Vec<Vec<u64>>> {
        Ok(send.to_vec())
    }
    fn gather_to_root(&self, local: &[f64]) -> Result<Option<Vec<f64>>> {
        Ok(Some(local.to_vec()))
    }
}

//! Errors of the CUDA backend.

use cudarc::driver::result as dres;

use crate::error::Error;

pub(crate) fn cuda_err(what: &str) -> impl Fn(dres::DriverError) -> Error + '_ {
    move |e| Error::backend("cuda", format!("{what}: {e:?}"))
}

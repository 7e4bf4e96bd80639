//! The CUDA backend's errors: [`CudaError`] holds what a CUDA library reported (the driver,
//! NVRTC, cuBLAS, cuSPARSE, NCCL) and what the backend was doing at the time; it reaches the
//! caller as the library error [`Error::Device`], whose message reads
//! `backend cuda: <what>: <the library's error>`.

use std::borrow::Cow;

use cudarc::cublas::result::CublasError;
use cudarc::cusparse::result::CusparseError;
use cudarc::driver::DriverError;
use cudarc::nccl::result::NcclError;
use cudarc::nvrtc::CompileError;

use crate::error::Error;

/// An error of the CUDA backend (its message follows "backend cuda: ").
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A CUDA driver call failed.
    #[error("{0:?}")]
    Driver(#[from] DriverError),
    /// NVRTC could not compile kernels/*.cu (the message holds the compiler's log).
    #[error("NVRTC could not compile kernels/*.cu: {}", compile_detail(.0))]
    Compile(#[from] CompileError),
    /// A cuBLAS call failed.
    #[error("{0:?}")]
    Cublas(#[from] CublasError),
    /// A cuSPARSE call failed (the message holds its status). cudarc's `CusparseError` is no
    /// `std::error::Error`, so it is held, not chained as a source.
    #[error("{:?}", cusparse_status(.0))]
    Cusparse(CusparseError),
    /// An NCCL call failed (cudarc's `NcclError` is no `std::error::Error` either).
    #[error("{0:?}")]
    Nccl(NcclError),
    /// CUDA is not usable here: why (missing libraries, no device, a device too old).
    #[error("{0}")]
    Unusable(String),
    /// The backend could not start on the device.
    #[error("no usable CUDA GPU: {0}")]
    NoDevice(#[source] Box<CudaError>),
    /// `source` happened while the backend was doing `what`.
    #[error("{what}: {source}")]
    During {
        what: Cow<'static, str>,
        #[source]
        source: Box<CudaError>,
    },
}

impl From<CusparseError> for CudaError {
    fn from(e: CusparseError) -> Self {
        CudaError::Cusparse(e)
    }
}

impl From<NcclError> for CudaError {
    fn from(e: NcclError) -> Self {
        CudaError::Nccl(e)
    }
}

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Self {
        Error::Device {
            backend: "cuda",
            err: Box::new(e),
        }
    }
}

impl CudaError {
    /// `e` with what the backend was doing.
    pub(crate) fn during(what: impl Into<Cow<'static, str>>, e: impl Into<CudaError>) -> Self {
        CudaError::During {
            what: what.into(),
            source: Box::new(e.into()),
        }
    }
}

/// The compiler's log of a failed compilation, else the error itself.
fn compile_detail(e: &CompileError) -> String {
    match e {
        CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

fn cusparse_status(e: &CusparseError) -> &cudarc::cusparse::sys::cusparseStatus_t {
    &e.0
}

/// Say what the backend was doing when a CUDA call failed, as the library's error:
/// `call().doing("copying x")?` ([`CudaError::During`] in [`Error::Device`]).
pub(crate) trait Doing<T> {
    fn doing(self, what: &'static str) -> crate::error::Result<T>;
    /// [`Doing::doing`] with a description made only when the call failed.
    fn doing_with(self, what: impl FnOnce() -> String) -> crate::error::Result<T>;
}

impl<T, E: Into<CudaError>> Doing<T> for Result<T, E> {
    fn doing(self, what: &'static str) -> crate::error::Result<T> {
        self.map_err(|e| CudaError::during(what, e).into())
    }
    fn doing_with(self, what: impl FnOnce() -> String) -> crate::error::Result<T> {
        self.map_err(|e| CudaError::during(what(), e).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_before_and_print_once() {
        let no_gpu = CudaError::NoDevice(Box::new(CudaError::Unusable("missing NVRTC".into())));
        let e = Error::from(no_gpu);
        assert_eq!(
            e.to_string(),
            "backend cuda: no usable CUDA GPU: missing NVRTC"
        );
        let st = cudarc::cusparse::sys::cusparseStatus_t::CUSPARSE_STATUS_NOT_INITIALIZED;
        let e = Error::from(CudaError::during("cuSPARSE create", CusparseError(st)));
        let msg = "backend cuda: cuSPARSE create: CUSPARSE_STATUS_NOT_INITIALIZED";
        assert_eq!(e.to_string(), msg);
        // the CLI prints the whole chain on one line: the device error is said once
        assert_eq!(format!("{:#}", anyhow::Error::from(e)), msg);
        let Err(e) = Err::<(), _>(CusparseError(st)).doing("cuSPARSE SpMV") else {
            unreachable!()
        };
        let Error::Device { backend, err } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*backend, "cuda");
        assert!(matches!(
            err.downcast_ref::<CudaError>(),
            Some(CudaError::During { what, .. }) if what == "cuSPARSE SpMV"
        ));
    }
}

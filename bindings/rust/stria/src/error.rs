//! Status codes and errors: every failing call becomes an [`Error`] carrying the library's
//! status and the message it left for `stria_get_last_error` on the calling thread.

use std::ffi::CStr;
use std::fmt;

use stria_sys as sys;

/// Why a call failed (`stria_status_t` without `STRIA_SUCCESS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// An argument is wrong (shape, dtype, range, a destroyed context, ...).
    InvalidArgument,
    /// Valid but not supported here (a head dimension, a device, a missing module).
    Unsupported,
    /// Host or device memory ran out.
    OutOfMemory,
    /// The transport failed, or a peer left the ring.
    Transport,
    /// A wait took longer than the context's timeout.
    Timeout,
    /// A CUDA call failed.
    Cuda,
    /// The context was aborted ([`AbortHandle::abort`](crate::AbortHandle::abort)).
    Aborted,
    /// A bug in the library.
    Internal,
    /// A status this crate does not know (from a newer library); the raw code.
    Unknown(u32),
}

impl Status {
    pub(crate) fn from_raw(code: sys::stria_status_t) -> Status {
        match code {
            sys::STRIA_ERROR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::STRIA_ERROR_UNSUPPORTED => Status::Unsupported,
            sys::STRIA_ERROR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::STRIA_ERROR_TRANSPORT => Status::Transport,
            sys::STRIA_ERROR_TIMEOUT => Status::Timeout,
            sys::STRIA_ERROR_CUDA => Status::Cuda,
            sys::STRIA_ERROR_ABORTED => Status::Aborted,
            sys::STRIA_ERROR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        }
    }

    /// The C value (`stria_status_t`).
    pub fn code(self) -> u32 {
        match self {
            Status::InvalidArgument => sys::STRIA_ERROR_INVALID_ARGUMENT,
            Status::Unsupported => sys::STRIA_ERROR_UNSUPPORTED,
            Status::OutOfMemory => sys::STRIA_ERROR_OUT_OF_MEMORY,
            Status::Transport => sys::STRIA_ERROR_TRANSPORT,
            Status::Timeout => sys::STRIA_ERROR_TIMEOUT,
            Status::Cuda => sys::STRIA_ERROR_CUDA,
            Status::Aborted => sys::STRIA_ERROR_ABORTED,
            Status::Internal => sys::STRIA_ERROR_INTERNAL,
            Status::Unknown(code) => code,
        }
    }
}

impl fmt::Display for Status {
    /// The library's name for the status (`stria_status_string`), e.g. "invalid argument".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: stria_status_string takes any value and returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(sys::stria_status_string(self.code())) };
        f.write_str(&name.to_string_lossy())
    }
}

/// A failed call: its [`Status`] and the library's message.
///
/// ```
/// let err = stria::Layout::Striped.positions(10, 3, 0).unwrap_err();
/// assert_eq!(err.status(), stria::Status::InvalidArgument);
/// assert!(err.message().contains("10"), "{}", err); // names the length that does not divide
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error raised by this crate before reaching the library (e.g. a slice shorter than its
    /// shape): it has no library message, so it says what is wrong itself.
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// What went wrong, as a status code.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The explanation: the library's `stria_get_last_error()` text, or this crate's own for
    /// arguments it rejects before the call.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stria: {}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a status into a `Result`, reading the message of a failure at once: it lives in a
/// thread-local buffer that the next stria call on this thread overwrites.
pub(crate) fn check(code: sys::stria_status_t) -> Result<()> {
    if code == sys::STRIA_SUCCESS {
        return Ok(());
    }
    // SAFETY: stria_get_last_error never returns NULL and the text stays valid until the next
    // stria call on this thread; it is copied before that.
    let message = unsafe { CStr::from_ptr(sys::stria_get_last_error()) }
        .to_string_lossy()
        .into_owned();
    Err(Error::new(Status::from_raw(code), message))
}

/// An argument this crate rejects itself (never reaches the library).
pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::new(Status::InvalidArgument, message)
}

//! The ranks crate's one error type. Every message is for the user: it says what happened, which
//! rank, host or port it concerns, and what to do; the kind decides the exit code (see
//! [`gpukit_types::ErrorKind`]).
//!
//! To use: return [`Result`] from anything that can fail; the CLI prints the message after
//! "error: " and exits with `error.kind().exit_code()`.

use gpukit_types::{ErrorKind, HasKind};

/// Why finding the world, meeting the other ranks or launching them failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The launcher's environment variables or the options are wrong (a value that is not a
    /// number, a rank outside the world, two processes claiming one rank): nothing ran.
    #[error("{0}")]
    BadInput(String),
    /// The ranks could not meet: rank 0 unreachable, a rank that never arrived, a port in use.
    #[error("{0}")]
    Unavailable(String),
    /// A rank exited, failed or went silent while the others were working with it.
    #[error("{0}")]
    PeerLost(String),
    /// Something else went wrong during the work (a peer that does not follow the protocol, a
    /// call that did not finish within the timeout, rank 0 unable to create the blob).
    #[error("{0}")]
    Failed(String),
}

/// The ranks crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of the given kind carrying `message` (used where the kind travels on the wire).
    pub(crate) fn of_kind(kind: ErrorKind, message: String) -> Error {
        match kind {
            ErrorKind::BadInput => Error::BadInput(message),
            ErrorKind::Unavailable => Error::Unavailable(message),
            ErrorKind::Failed => Error::Failed(message),
        }
    }
}

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::BadInput(_) => ErrorKind::BadInput,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::PeerLost(_) | Error::Failed(_) => ErrorKind::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_decide_the_exit_code() {
        assert_eq!(Error::BadInput("x".into()).kind().exit_code(), 2);
        assert_eq!(Error::Unavailable("x".into()).kind().exit_code(), 1);
        assert_eq!(Error::PeerLost("x".into()).kind().exit_code(), 1);
        assert_eq!(Error::Failed("x".into()).kind().exit_code(), 1);
        for kind in [
            ErrorKind::BadInput,
            ErrorKind::Unavailable,
            ErrorKind::Failed,
        ] {
            assert_eq!(Error::of_kind(kind, "m".into()).kind(), kind);
        }
    }
}

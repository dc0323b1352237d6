//! What kind of failure an error is. Every crate's error type says its kind ([`HasKind`]); the
//! CLI turns the kind into the process's exit code in one place.

use serde::{Deserialize, Serialize};

/// The kinds of failure, each with its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The user's arguments or input files are wrong (exit code 2): nothing was measured.
    BadInput,
    /// A GPU, driver or library needed for the work is missing or unusable (exit code 1).
    Unavailable,
    /// The work ran and failed: a device error, a wrong result, out of memory (exit code 1).
    Failed,
}

impl ErrorKind {
    /// The process exit code for this kind: 2 for bad input, 1 otherwise.
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::BadInput => 2,
            ErrorKind::Unavailable | ErrorKind::Failed => 1,
        }
    }
}

/// An error that knows its [`ErrorKind`].
pub trait HasKind {
    fn kind(&self) -> ErrorKind;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_alone_exits_with_two() {
        assert_eq!(ErrorKind::BadInput.exit_code(), 2);
        assert_eq!(ErrorKind::Unavailable.exit_code(), 1);
        assert_eq!(ErrorKind::Failed.exit_code(), 1);
    }
}

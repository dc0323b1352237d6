//! gpukit's shared vocabulary, at the bottom of the workspace so that every crate above speaks
//! it: what an element is ([`DType`]), how a 4-D activation is laid out ([`Layout`]), where data
//! lives ([`Device`]), the shape of a 2-D convolution ([`ConvShape`]) and what kind of failure an
//! error is ([`ErrorKind`], which decides the process's exit code).
//!
//! To use: depend on `gpukit-types` (or on `gpukit-tensor`, which re-exports all of it); convert
//! to a library's own enums only at that library's boundary (cuBLAS, cuDNN, NVRTC: in the cuda
//! crate).
#![forbid(unsafe_code)]

pub mod arena;
pub mod conv;
pub mod device;
pub mod dtype;
pub mod error;
pub mod files;
pub mod layout;
pub mod resources;
pub mod throttle;

pub use conv::ConvShape;
pub use device::{Device, DeviceSelection, ParseDeviceError};
pub use dtype::{DType, ParseDTypeError};
pub use error::{ErrorKind, HasKind};
pub use layout::{Layout, ParseLayoutError};

/// `text` as an error message shows a value the user typed: at most 40 characters, the rest
/// counted (a 100,000-character argument is not echoed back whole).
pub fn shown(text: &str) -> String {
    const KEEP: usize = 40;
    let count = text.chars().count();
    if count <= KEEP {
        return text.to_string();
    }
    let head: String = text.chars().take(KEEP).collect();
    format!("{head}... ({count} characters)")
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_values_are_shortened_on_a_character_boundary() {
        assert_eq!(super::shown("f16"), "f16");
        let long = "é".repeat(100_000);
        let s = super::shown(&long);
        assert!(s.starts_with(&"é".repeat(40)) && s.ends_with("... (100000 characters)"));
        assert!(s.len() < 120);
    }
}

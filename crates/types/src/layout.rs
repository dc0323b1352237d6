//! Memory layouts of 4-D activations (and their filters), as cuDNN and PyTorch name them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Memory layout of a 4-D `[n, c, h, w]` tensor; the logical indexing is the same in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Layout {
    /// Batch, channels, height, width: row-major, PyTorch's default. Filters are KCRS.
    Nchw,
    /// Batch, height, width, channels: channels-last, what tensor cores prefer. Filters are
    /// KRSC.
    Nhwc,
}

impl Layout {
    pub const ALL: [Layout; 2] = [Layout::Nchw, Layout::Nhwc];

    /// `nchw` or `nhwc`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        }
    }

    /// `NCHW` or `NHWC`, as tables and sentences write it.
    pub fn label(self) -> &'static str {
        match self {
            Layout::Nchw => "NCHW",
            Layout::Nhwc => "NHWC",
        }
    }

    pub fn is_nhwc(self) -> bool {
        self == Layout::Nhwc
    }

    /// Strides in elements of a `[n, c, h, w]` shape in this layout.
    pub fn strides(self, [_, c, h, w]: [usize; 4]) -> [usize; 4] {
        match self {
            Layout::Nchw => [c * h * w, h * w, w, 1],
            Layout::Nhwc => [h * w * c, 1, w * c, c],
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layout '{given}': expected nchw or nhwc")]
pub struct ParseLayoutError {
    pub given: String,
}

impl FromStr for Layout {
    type Err = ParseLayoutError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nchw" | "channels-first" => Ok(Layout::Nchw),
            "nhwc" | "channels-last" | "channels_last" => Ok(Layout::Nhwc),
            _ => Err(ParseLayoutError {
                given: crate::shown(s),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strides_follow_the_layout() {
        for l in Layout::ALL {
            assert_eq!(l.name().parse(), Ok(l));
        }
        assert!("nwhc"
            .parse::<Layout>()
            .unwrap_err()
            .to_string()
            .contains("nwhc"));
        assert_eq!(Layout::Nchw.strides([2, 3, 4, 5]), [60, 20, 5, 1]);
        assert_eq!(Layout::Nhwc.strides([2, 3, 4, 5]), [60, 1, 15, 3]);
    }
}

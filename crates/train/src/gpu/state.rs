//! The step state a training step's kernels read and [`super::kernels::TrainKernels::advance`]
//! updates on the device (the loss scale, Adam's bias corrections, whether the gradients
//! overflowed, the update and skip counts), as the host reads and writes its bytes.

use gpukit_cuda::{Error, Result};

/// Bytes of the device-side step state.
pub const STATE_BYTES: usize = 32;

/// The step state as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepState {
    pub scale: f32,
    pub step_size: f32,
    pub bc2_sqrt: f32,
    pub found_inf: bool,
    pub step: u32,
    pub growth: u32,
    pub skipped: u32,
}

impl StepState {
    pub fn to_bytes(&self) -> [u8; STATE_BYTES] {
        let mut b = [0u8; STATE_BYTES];
        for (i, f) in [self.scale, self.step_size, self.bc2_sqrt, 0.0]
            .iter()
            .enumerate()
        {
            b[i * 4..i * 4 + 4].copy_from_slice(&f.to_ne_bytes());
        }
        for (i, v) in [
            u32::from(self.found_inf),
            self.step,
            self.growth,
            self.skipped,
        ]
        .iter()
        .enumerate()
        {
            b[16 + i * 4..20 + i * 4].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<StepState> {
        if b.len() < STATE_BYTES {
            return Err(Error::Invalid("step state: too few bytes".into()));
        }
        let word = |i: usize| [b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]];
        let f = |i: usize| f32::from_ne_bytes(word(i));
        let u = |i: usize| u32::from_ne_bytes(word(i));
        Ok(StepState {
            scale: f(0),
            step_size: f(1),
            bc2_sqrt: f(2),
            found_inf: u(4) != 0,
            step: u(5),
            growth: u(6),
            skipped: u(7),
        })
    }
}

//! Which of cuBLASLt's candidates (or gpukit's alternatives) a step keeps: the candidates to
//! ask for, the epilogue they can hold, and the rule that picks one from their timings.

use crate::error::Result;
use crate::graph::Activation;
use gpukit_cuda::lt::{Epilogue as LtEpilogue, LtMatmul, MatmulSpec};
use gpukit_tensor::DType;

/// Algorithms of cuBLASLt's heuristic timed for each Gemm step: at the small products of small
/// batches its first choice is not always the fastest.
pub(super) const GEMM_CANDIDATES: usize = 8;

/// Below this fraction of the heuristic's first choice's time another candidate replaces it
/// (within it, timing noise would decide).
const GEMM_WIN: f64 = 0.97;

/// A product `m x n x k` of `dtype` with A transposed or not, no epilogue, all multiprocessors
/// (the epilogue is set where candidates are asked for, [`lt_candidates`]).
pub(super) fn lt_spec(dtype: DType, (m, n, k): (usize, usize, usize), trans_a: bool) -> MatmulSpec {
    MatmulSpec {
        m,
        n,
        k,
        trans_a,
        trans_b: false,
        inputs: dtype,
        output: dtype,
        epilogue: LtEpilogue::None,
        bias_type: dtype.storage(),
        b_ld: None,
        sm_count_target: None,
    }
}

/// Each of `count` candidates' device time (ms a launch; infinite where one did not run), as
/// planning times a step's alternatives: graphs of up to 32 launches (about 0.1 ms) replayed in
/// 5 turns.
pub(super) fn time_candidates<E: From<gpukit_cuda::Error>>(
    stream: &gpukit_cuda::Stream,
    count: usize,
    enqueue: impl FnMut(usize) -> std::result::Result<(), E>,
) -> std::result::Result<Vec<f64>, E> {
    gpukit_cuda::timing::replays_in_turns(stream, count, 0.1, 32, 5, enqueue)
}

/// The candidate to keep from their device times (in the heuristic's order; infinite: it did
/// not run): the heuristic's first unless another is faster by more than 3%, the fastest that
/// ran where the first did not; None where none ran.
pub(super) fn pick_gemm(times: &[f64]) -> Option<usize> {
    let best = (0..times.len())
        .filter(|&i| times[i].is_finite())
        .min_by(|&i, &j| times[i].total_cmp(&times[j]))?;
    match times[0].is_finite() && times[best] >= times[0] * GEMM_WIN {
        true => Some(0),
        false => Some(best),
    }
}

/// cuBLASLt's epilogue for `act(product + bias)` (with or without a bias), where it has one.
pub(super) fn lt_epilogue(bias: bool, act: Option<Activation>) -> Option<LtEpilogue> {
    match (bias, act) {
        (false, None) => Some(LtEpilogue::None),
        (true, None) => Some(LtEpilogue::Bias),
        (false, Some(Activation::Relu)) => Some(LtEpilogue::Relu),
        (true, Some(Activation::Relu)) => Some(LtEpilogue::ReluBias),
        (false, Some(Activation::Gelu)) => Some(LtEpilogue::Gelu),
        (true, Some(Activation::Gelu)) => Some(LtEpilogue::GeluBias),
        _ => None,
    }
}

/// cuBLASLt's first [`GEMM_CANDIDATES`] for `spec` with `epilogue`, and true; where it has
/// none (or no epilogue is given), those of the bare product, and false.
pub(super) fn lt_candidates(
    blas: &gpukit_cuda::blas::Blas,
    spec: MatmulSpec,
    epilogue: Option<LtEpilogue>,
) -> Result<(Vec<LtMatmul>, bool)> {
    if let Some(e) = epilogue {
        let fused = blas.lt_matmul_candidates(
            MatmulSpec {
                epilogue: e,
                ..spec
            },
            GEMM_CANDIDATES,
        )?;
        if !fused.is_empty() {
            return Ok((fused, true));
        }
    }
    Ok((blas.lt_matmul_candidates(spec, GEMM_CANDIDATES)?, false))
}

#[cfg(test)]
mod tests {
    use super::pick_gemm;

    #[test]
    fn the_heuristics_first_gemm_stays_unless_another_is_clearly_faster() {
        // within 3%: the first (noise would decide otherwise)
        assert_eq!(pick_gemm(&[10.0, 9.8, 9.9]), Some(0));
        // more than 3% faster: that one, the fastest of them
        assert_eq!(pick_gemm(&[10.0, 9.0, 8.5, 9.6]), Some(2));
        // the first did not run: the fastest that did
        assert_eq!(pick_gemm(&[f64::INFINITY, 12.0, 11.0]), Some(2));
        // one candidate, none that ran, none at all
        assert_eq!(pick_gemm(&[5.0]), Some(0));
        assert_eq!(pick_gemm(&[f64::INFINITY, f64::INFINITY]), None);
        assert_eq!(pick_gemm(&[]), None);
        // NaN never wins
        assert_eq!(pick_gemm(&[10.0, f64::NAN, 9.0]), Some(2));
    }
}

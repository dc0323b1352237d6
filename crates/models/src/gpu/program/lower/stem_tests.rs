//! The stem and its max pool lowered as one step ([`StemPoolStep`]), checked without a GPU by
//! the lowering's emulator against the graph interpreter.

use super::tests::{max_rel, optimized, random_run, Emu};
use super::*;
use crate::onnx::fixtures;
use gpukit_tensor::random::fresh_seed;

fn stems(p: &Program) -> usize {
    p.steps
        .iter()
        .filter(|(_, s)| matches!(s, Step::StemPool(_)))
        .count()
}

#[test]
fn resnets_stem_and_its_pool_lower_to_one_step_in_16_bit_channel_last() {
    let g = optimized(&fixtures::resnet_stem(fresh_seed()));
    let (inputs, want) = random_run(&g);
    let xs: Vec<&[f32]> = inputs.iter().map(|a| a.as_f32().unwrap()).collect();
    for dtype in [DType::F16, DType::Bf16] {
        let p = Program::lower(&g, dtype, Layout::Nhwc).unwrap();
        assert_eq!(stems(&p), 1, "{:?}", p.step_counts());
        assert!(
            !p.steps
                .iter()
                .any(|(_, s)| matches!(s, Step::Pool { .. } | Step::Conv(_))),
            "{:?}",
            p.step_counts()
        );
        for (o, (got, w)) in Emu::run(&p, &xs).iter().zip(&want).enumerate() {
            let rel = max_rel(got, w.as_f32().unwrap());
            assert!(rel <= 1e-5, "{dtype} output {o}: max rel. diff {rel:.1e}");
        }
        // the convolution's output is never stored: the plan holds no more than the slots
        // some step touches
        let touched: usize = p
            .slots
            .iter()
            .enumerate()
            .filter(|(s, _)| {
                p.steps.iter().any(|(_, step)| {
                    let (reads, write) = step.operands();
                    reads
                        .iter()
                        .chain(Some(&write))
                        .any(|t| t.buf == Buf::Slot(*s))
                })
            })
            .map(|(_, slot)| slot.bytes.div_ceil(crate::plan::ALIGN) * crate::plan::ALIGN)
            .sum();
        assert!(
            p.arena_bytes() <= touched,
            "{} > {touched}",
            p.arena_bytes()
        );
    }
    // f32 and NCHW keep the convolution and the pool apart
    for (dtype, layout) in [(DType::F32, Layout::Nhwc), (DType::F16, Layout::Nchw)] {
        let p = Program::lower(&g, dtype, layout).unwrap();
        assert_eq!(stems(&p), 0, "{dtype} {layout:?}");
        for (o, (got, w)) in Emu::run(&p, &xs).iter().zip(&want).enumerate() {
            let rel = max_rel(got, w.as_f32().unwrap());
            assert!(
                rel <= 1e-5,
                "{dtype} {layout:?} output {o}: max rel. diff {rel:.1e}"
            );
        }
    }
    // a GPU before Ampere keeps the two steps (its kernel needs cp.async and mma.sync m16n8k16)
    let turing = Program::lower_for(&g, DType::F16, Layout::Nhwc, (7, 5)).unwrap();
    assert_eq!(stems(&turing), 0);
    assert!(!turing.needs_ampere());
    let hopper = Program::lower_for(&g, DType::F16, Layout::Nhwc, (9, 0)).unwrap();
    assert!(stems(&hopper) == 1 && hopper.needs_ampere());
    for (o, (got, w)) in Emu::run(&turing, &xs).iter().zip(&want).enumerate() {
        let rel = max_rel(got, w.as_f32().unwrap());
        assert!(
            rel <= 1e-5,
            "compute capability 7.5 output {o}: max rel. diff {rel:.1e}"
        );
    }
    // a stem of 8 channels (the tiny ResNet's) stays two steps
    let tiny = optimized(&fixtures::tiny_resnet(fresh_seed()));
    assert_eq!(
        stems(&Program::lower(&tiny, DType::F16, Layout::Nhwc).unwrap()),
        0
    );
}

//! The general GPU engine against gpukit's graph interpreter on fresh random weights and
//! inputs: every ONNX fixture (ResNet, MobileNetV3, EfficientNet, RegNet, DenseNet and ConvNeXt
//! blocks, a flatten by shape arithmetic), every precision in both layouts, eager and replayed
//! as a CUDA graph; and the channel-last global average at shapes the fixtures do not reach
//! (split over blocks at small batches) against float64. Ignored, with the reason, without a GPU; GPUKIT_REQUIRE_GPU=1 makes a
//! missing GPU a failure.

use gpukit_cuda::loader::Discovery;
use gpukit_cuda::DeviceBuffer;
use gpukit_models::gpu::program::{
    Branching, OwnConvs, Program, ProgramKernels, ProgramSession, Strided,
};
use gpukit_models::gpu::{GpuContext, ENGINE_DTYPES};
use gpukit_models::graph::{forward_cpu, passes::optimize, Array, Graph};
use gpukit_models::onnx::{fixtures, import_model, ImportOptions};
/// max |got - want| / max |want|, infinite for a value that is not finite.
use gpukit_models::sums::relative as rel;
use gpukit_tensor::codec::{decode_f32, decode_f64, encode_f32};
use gpukit_tensor::random::{fresh_seed, normal_f32};
use gpukit_tensor::{DType, Layout};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::OnceLock;

static DISCOVERY: OnceLock<Discovery> = OnceLock::new();

#[path = "gpu_program/depthwise.rs"]
mod depthwise;
use depthwise::{depthwise_matches_float64, depthwise_variants_agree};
#[path = "gpu_program/exact.rs"]
mod exact;
use exact::{exact_convolutions_match_float64, exact_sums_bring_fixtures_to_float64};
#[path = "gpu_program/fp8_conv.rs"]
mod fp8_conv;
#[path = "gpu_program/stem.rs"]
mod stem;
use fp8_conv::fp8_conv_matches_float64;
use stem::stem_pool_matches_float64;

fn tolerance(d: DType) -> f64 {
    match d {
        DType::F32 => 1e-4,
        DType::Tf32 | DType::F16 => 2e-2,
        _ => 6e-2,
    }
}

fn graph(model: &gpukit_models::onnx::ModelProto, batch: usize) -> Result<Graph, Failed> {
    let options = ImportOptions {
        batch: Some(batch),
        dims: Vec::new(),
    };
    let mut g = import_model(model, None, "fixture", &options)?;
    optimize(&mut g)?;
    Ok(g)
}

fn every_fixture_matches_the_interpreter() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let mut failures = Vec::new();
    let (mut own_runs, mut product_runs, mut stem_runs, mut matvec_runs) = (0, 0, 0, 0);
    let mut branch_runs = 0;
    for batch in [2, 5] {
        // and the dilated, unevenly padded model, which runs in 16-bit channel-last only
        let seed = fresh_seed();
        let atrous = fixtures::Fixture {
            name: "atrous",
            model: fixtures::atrous(seed),
        };
        // and ResNet's stem at its width, whose convolution and pool run as one step
        let stem = fixtures::Fixture {
            name: "resnet_stem",
            model: fixtures::resnet_stem(seed),
        };
        for f in fixtures::all(seed).into_iter().chain([atrous, stem]) {
            let g = graph(&f.model, batch)?;
            let inputs: Vec<Array> = g
                .inputs
                .iter()
                .map(|&i| {
                    let shape = g.value(i).shape.clone();
                    Array::f32(&shape, normal_f32(shape.iter().product(), fresh_seed()))
                })
                .collect();
            let want = forward_cpu(&g, &inputs)?;
            let xs: Vec<&[f32]> = inputs.iter().filter_map(Array::as_f32).collect();
            // each dtype and layout as the engine runs them, and 16-bit channel-last with 1x1
            // convolutions as products (Gemm steps, or convolution steps on cuBLASLt's
            // product), or with every convolution on gpukit's kernel
            let (timed, always) = (OwnConvs::Timed, OwnConvs::Always);
            let products = OwnConvs::Products;
            let variants = ENGINE_DTYPES
                .iter()
                .flat_map(|&d| {
                    [
                        (d, Layout::Nchw, false, timed),
                        (d, Layout::Nhwc, false, timed),
                    ]
                })
                .chain([DType::F16, DType::Bf16].into_iter().flat_map(|d| {
                    [
                        (d, Layout::Nhwc, true, timed),
                        (d, Layout::Nhwc, false, always),
                        (d, Layout::Nhwc, false, products),
                    ]
                }));
            let sixteen_nhwc =
                |d: &DType, l: &Layout| matches!(d, DType::F16 | DType::Bf16) && *l == Layout::Nhwc;
            let variants = variants.filter(|(d, l, _, _)| f.name != "atrous" || sixteen_nhwc(d, l));
            for (dtype, layout, conv1x1_gemm, own) in variants {
                let what = format!(
                    "{} batch {batch} {dtype} {layout:?}{}{}",
                    f.name,
                    if conv1x1_gemm { " 1x1 as gemm" } else { "" },
                    match own {
                        OwnConvs::Always => " own convolutions",
                        OwnConvs::Products => " cuBLASLt's products",
                        _ => "",
                    }
                );
                let p = Program::lower_with_conv1x1_gemm(&g, dtype, layout, conv1x1_gemm)
                    .map_err(|e| format!("{what}: {e}"))?;
                stem_runs += p
                    .step_counts()
                    .iter()
                    .filter(|(k, _)| k.starts_with("stem conv"))
                    .count();
                let mut s = ProgramSession::with_own_convs(&ctx, discovery, &p, &mut |_| {}, own)
                    .map_err(|e| format!("{what}: {e}"))?;
                own_runs += s
                    .algorithms
                    .iter()
                    .filter(|a| a.starts_with("gpukit"))
                    .count();
                product_runs += s
                    .algorithms
                    .iter()
                    .filter(|a| a.starts_with("cuBLASLt product"))
                    .count();
                matvec_runs += s
                    .step_counts()
                    .iter()
                    .filter(|(k, _)| k.contains("matrix-vector"))
                    .count();
                let eager = s.run(&xs).map_err(|e| format!("{what}: {e}"))?;
                s.capture_as(Branching::On)
                    .map_err(|e| format!("{what}: capture: {e}"))?;
                // the eager pass's values gone: the replay (its branches beside the steps
                // before them) must write every value it reads
                branch_runs += s.branch_count() * usize::from(s.graph_branched());
                s.poison_arena()?;
                s.set_inputs(&xs)?;
                s.replay()?;
                let replayed = s.outputs()?;
                for (o, w) in want.iter().enumerate() {
                    let w = w.as_f32().ok_or("an output that is not f32")?;
                    let (e, r) = (rel(&eager[o], w), rel(&replayed[o], w));
                    if e > tolerance(dtype) || r > tolerance(dtype) {
                        failures.push(format!(
                            "{what} output {o}: eager {e:.1e}, replayed {r:.1e} (tolerance \
                             {:.0e}); steps {:?}",
                            tolerance(dtype),
                            p.step_counts()
                        ));
                    }
                }
            }
        }
    }
    // the "own convolutions" variants put every convolution the kernel takes on it
    if own_runs == 0 {
        failures.push("no convolution ran on gpukit's kernel".into());
    }
    if product_runs == 0 {
        failures.push("no convolution ran as cuBLASLt's product".into());
    }
    if stem_runs == 0 {
        failures.push("no stem and pool ran as one step".into());
    }
    if branch_runs == 0 {
        failures.push("no step ran as a branch in a CUDA graph".into());
    }
    // the "own convolutions" variants put every product of few rows on it
    if matvec_runs == 0 {
        failures.push("no product ran on the matrix-vector kernel".into());
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// `values` rounded to `dtype`'s storage, on the device; and the rounded values.
fn upload(
    ctx: &GpuContext,
    values: &[f32],
    dtype: DType,
) -> Result<(DeviceBuffer, Vec<f64>), Failed> {
    let bytes = encode_f32(values, dtype.storage());
    let back = decode_f64(&bytes, dtype.storage());
    Ok((ctx.gpu.upload(&bytes)?, back))
}

fn download(ctx: &GpuContext, b: &DeviceBuffer, dtype: DType) -> Result<Vec<f32>, Failed> {
    ctx.gpu.synchronize()?;
    Ok(decode_f32(&ctx.gpu.download(b)?, dtype.storage()))
}

/// Output rounding only: the references take the rounded inputs.
fn kernel_tolerance(d: DType) -> f64 {
    match d {
        DType::F32 | DType::Tf32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

/// The channel-last global average against float64, at small batches too (where each image's
/// pixels are split over blocks and the last block adds the partial sums), each shape run twice
/// (the counters must be back at 0 after a launch).
fn global_average_matches_float64() -> Result<(), Failed> {
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let k = ProgramKernels::new(discovery, &ctx.gpu)?;
    let mut failures = Vec::new();
    let shapes = [
        (1, 32, 112, 112),
        (1, 144, 56, 56),
        (2, 40, 28, 28),
        (1, 1152, 7, 7),
        (3, 96, 56, 56),
        (32, 16, 8, 8),
        // batch 32 of MobileNetV3's and EfficientNet's squeeze-excitation maps: fewer channel
        // vectors a block, whole images
        (32, 960, 7, 7),
        (32, 120, 28, 28),
        (32, 40, 13, 13),
    ];
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for (n, c, h, w) in shapes {
            let seed = fresh_seed();
            let (x, xs) = upload(&ctx, &normal_f32(n * c * h * w, seed), dtype)?;
            let want: Vec<f32> = (0..n * c)
                .map(|o| {
                    let (img, ch) = (o / c, o % c);
                    let sum: f64 = (0..h * w).map(|px| xs[(img * h * w + px) * c + ch]).sum();
                    (sum / (h * w) as f64) as f32
                })
                .collect();
            let y = ctx.gpu.alloc(n * c * dtype.storage().size_bytes())?;
            let sx = Strided::image([n, c, h, w], Layout::Nhwc);
            let sy = Strided::row_major([n, c, 1, 1]);
            for turn in 0..2 {
                k.global_average(dtype, (x.view(), &sx), (y.view(), &sy))?;
                let got = download(&ctx, &y, dtype)?;
                let r = rel(&got, &want);
                if r > kernel_tolerance(dtype) {
                    failures.push(format!(
                        "{dtype} {n}x{c}x{h}x{w} (seed {seed}) launch {turn}: {r:.1e}"
                    ));
                }
            }
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}

/// Each of the kernels `names` (run by `run`) timed in graph replays in turns: "name us, ..."
/// with `prefix` cut from each name.
fn kernels_timed(
    ctx: &GpuContext,
    names: &[&str],
    prefix: &str,
    run: impl Fn(&str) -> gpukit_cuda::Result<()>,
) -> Result<String, Failed> {
    let ms =
        gpukit_cuda::timing::replays_in_turns(ctx.gpu.stream(), names.len(), 0.2, 32, 7, |i| {
            run(names[i])
        })?;
    let row: Vec<String> = names
        .iter()
        .zip(&ms)
        .map(|(v, t)| format!("{} {:.1}", v.trim_start_matches(prefix), t * 1e3))
        .collect();
    Ok(row.join(", "))
}

/// Every layer-norm kernel that takes a shape against the one the engine chooses (the fixtures
/// check that one against the interpreter), at ConvNeXt-T's rows at batch 1 and 32, f16 and
/// bf16; with `GPUKIT_LN_TIMINGS=1`, each one's device time in f16 too (graphs replayed in
/// turns).
fn layer_norm_variants_agree() -> Result<(), Failed> {
    use gpukit_models::gpu::program::kernels::LAYER_NORM_VARIANTS;
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let k = ProgramKernels::new(discovery, &ctx.gpu)?;
    let timings = std::env::var("GPUKIT_LN_TIMINGS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for (rows, cols) in [
            (3136, 96),
            (196, 384),
            (49, 768),
            (100_352, 96),
            (25_088, 192),
            (6272, 384),
            (1568, 768),
        ] {
            let seed = fresh_seed();
            let (x, _) = upload(&ctx, &normal_f32(rows * cols, seed), dtype)?;
            let gamma: Vec<f32> = normal_f32(cols, seed + 1)
                .iter()
                .map(|v| 1.0 + 0.2 * v)
                .collect();
            let (gamma, _) = upload(&ctx, &gamma, dtype)?;
            let (beta, _) = upload(&ctx, &normal_f32(cols, seed + 2), dtype)?;
            let bytes = rows * cols * dtype.storage().size_bytes();
            let (want, got) = (ctx.gpu.alloc(bytes)?, ctx.gpu.alloc(bytes)?);
            let run = |variant: Option<&str>, y: &DeviceBuffer| {
                let (x, g, b, y) = (x.view(), gamma.view(), Some(beta.view()), y.view());
                match variant {
                    Some(v) => k.layer_norm_variant(v, dtype, x, g, b, y, (rows, cols), 1e-6),
                    None => k.layer_norm(dtype, x, g, b, y, (rows, cols), 1e-6),
                }
            };
            run(None, &want)?;
            let reference = download(&ctx, &want, dtype)?;
            let mut runs = Vec::new();
            for v in LAYER_NORM_VARIANTS {
                if run(Some(v), &got).is_err() {
                    continue; // it does not take these rows
                }
                let r = rel(&download(&ctx, &got, dtype)?, &reference);
                if r > kernel_tolerance(dtype) {
                    failures.push(format!("{v} {dtype} {rows}x{cols} (seed {seed}): {r:.1e}"));
                }
                runs.push(v);
            }
            if timings && dtype == DType::F16 {
                let row = kernels_timed(&ctx, &runs, "layer_norm", |v| run(Some(v), &got))?;
                println!("ln timing {rows}x{cols} us: {row}");
            }
        }
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("\n").into()),
    }
}

type Test = fn() -> Result<(), Failed>;

/// The epilogues the small kernels are checked with: (label, bias, residual, ReLU).
const EPILOGUES: [(&str, bool, bool, bool); 3] = [
    ("bias+relu", true, false, true),
    ("bias+residual", true, true, false),
    ("plain", false, false, false),
];

/// `sums` (rows of `n`) + `bias` (a value a column) + `z`, then ReLU where `relu`.
fn with_epilogue(
    sums: &[f64],
    n: usize,
    bias: Option<&[f64]>,
    z: Option<&[f64]>,
    relu: bool,
) -> Vec<f32> {
    sums.iter()
        .enumerate()
        .map(|(i, &v)| {
            let v = v + bias.map_or(0.0, |b| b[i % n]) + z.map_or(0.0, |z| z[i]);
            (if relu { v.max(0.0) } else { v }) as f32
        })
        .collect()
}

/// gpukit's kernel for products of few rows against float64 at ConvNeXt-T's batch-1 products
/// and a row count that is not a multiple of 64, in every piece count it takes, with bias and
/// ReLU, bias and a residual, or neither, f16 and bf16; each run twice (the pieces' counters
/// must be back at 0). GPUKIT_GEMM_TIMINGS=1 prints its times (the engine's trace, with
/// GPUKIT_TRACE=1, shows them beside cuBLASLt's candidates).
fn small_gemm_matches_float64() -> Result<(), Failed> {
    use gpukit_models::gpu::program::kernels::gemm::{pieces, SmallGemm};
    use gpukit_models::graph::Activation;
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let small = SmallGemm::new(discovery, &ctx.gpu)?;
    let timings = std::env::var("GPUKIT_GEMM_TIMINGS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for (m, n, k) in [
            (49, 768, 3072),
            (196, 384, 1536),
            (196, 1536, 384),
            (3136, 384, 96),
            (100, 128, 256),
        ] {
            let seed = fresh_seed();
            let (x, xv) = upload(&ctx, &normal_f32(m * k, seed), dtype)?;
            let w: Vec<f32> = normal_f32(k * n, seed + 1)
                .iter()
                .map(|v| v / (k as f32).sqrt())
                .collect();
            let (w, wv) = upload(&ctx, &w, dtype)?;
            let (bias, bv) = upload(&ctx, &normal_f32(n, seed + 2), dtype)?;
            let (z, zv) = upload(&ctx, &normal_f32(m * n, seed + 3), dtype)?;
            let mut product = vec![0f64; m * n];
            for i in 0..m {
                for kk in 0..k {
                    let a = xv[i * k + kk];
                    let row = &wv[kk * n..(kk + 1) * n];
                    for (p, b) in product[i * n..(i + 1) * n].iter_mut().zip(row) {
                        *p += a * b;
                    }
                }
            }
            let y = ctx.gpu.alloc(m * n * dtype.storage().size_bytes())?;
            for (label, with_bias, with_z, relu) in EPILOGUES {
                let act = relu.then_some(Activation::Relu);
                let (b, r) = (with_bias.then_some(&bv[..]), with_z.then_some(&zv[..]));
                let want = with_epilogue(&product, n, b, r, relu);
                let operands = (
                    x.view(),
                    w.view(),
                    with_bias.then(|| bias.view()),
                    with_z.then(|| z.view()),
                    y.view(),
                );
                for p in pieces(m, n, k) {
                    for run in 0..2 {
                        ctx.gpu.fill(y.view(), 0xff)?;
                        small.run(ctx.gpu.stream(), dtype, operands, (m, n, k), act, p)?;
                        let r = rel(&download(&ctx, &y, dtype)?, &want);
                        if r > kernel_tolerance(dtype) {
                            failures.push(format!(
                                "{dtype} {m}x{n}x{k} {label} in {p} pieces, run {run} \
                                 (seed {seed}): {r:.1e}"
                            ));
                        }
                    }
                }
            }
            if timings && dtype == DType::F16 {
                let ps = pieces(m, n, k);
                let operands = (x.view(), w.view(), Some(bias.view()), None, y.view());
                let act = Some(Activation::Relu);
                let ms = gpukit_cuda::timing::replays_in_turns(
                    ctx.gpu.stream(),
                    ps.len(),
                    0.1,
                    32,
                    7,
                    |i| small.run(ctx.gpu.stream(), dtype, operands, (m, n, k), act, ps[i]),
                )?;
                let row: Vec<String> = ps
                    .iter()
                    .zip(&ms)
                    .map(|(p, t)| format!("{p} pieces {:.1}", t * 1e3))
                    .collect();
                println!("gemm timing {m}x{n}x{k} us: {}", row.join(", "));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// gpukit's implicit-product convolution against float64 on the 16-bit inputs: channels and
/// filters of 8 to 64, 1x1 to 7x7 taps, strides 1 and 2, paddings that read zeros, each of its
/// cuts (staged and whole pieces), with a bias, a residual and ReLU or plain; each run twice
/// (the pieces' sums and counters must be back at 0).
fn conv_small_matches_float64() -> Result<(), Failed> {
    use gpukit_models::gpu::program::kernels::gemm::{conv_cuts, ConvGeometry, SmallGemm};
    use gpukit_models::graph::Activation;
    let discovery = DISCOVERY.get().ok_or("no discovery")?;
    let ctx = GpuContext::open(discovery, 0)?;
    let small = SmallGemm::new(discovery, &ctx.gpu)?;
    let mut failures = Vec::new();
    let shapes = [
        // (n, h, w, c, k, r, s, stride, pads top left bottom right, dilation)
        (1, 14, 14, 256, 256, 3, 3, 1, [1; 4], [1, 1]),
        (2, 9, 7, 16, 24, 3, 3, 2, [1; 4], [1, 1]),
        (1, 23, 23, 16, 64, 4, 4, 1, [0; 4], [1, 1]),
        (3, 8, 8, 64, 128, 1, 1, 1, [0; 4], [1, 1]),
        (1, 12, 10, 8, 8, 7, 7, 2, [3; 4], [1, 1]),
        (1, 7, 7, 512, 512, 3, 3, 1, [1; 4], [1, 1]),
        // dilated (DeepLab's atrous layers), uneven padding (TensorFlow's "same")
        (2, 17, 17, 64, 64, 3, 3, 1, [2; 4], [2, 2]),
        (1, 11, 9, 16, 16, 3, 3, 2, [0, 0, 1, 1], [1, 1]),
        (1, 11, 9, 16, 24, 3, 3, 1, [2, 1, 2, 3], [2, 3]),
    ];
    for dtype in [DType::F16, DType::Bf16] {
        for (n, h, w, c, k, r, s, stride, pads, dilation) in shapes {
            let g = ConvGeometry {
                n,
                h,
                w,
                c,
                k,
                r,
                s,
                stride,
                pads,
                dilation,
            };
            let (m, _, kw) = g.product();
            let (p, q) = g.out();
            let seed = fresh_seed();
            let (x, xv) = upload(&ctx, &normal_f32(n * h * w * c, seed), dtype)?;
            let filter: Vec<f32> = normal_f32(k * c * r * s, seed + 1)
                .iter()
                .map(|v| v / (kw as f32).sqrt())
                .collect();
            let (wt, wv) = upload(&ctx, &g.filter(&filter), dtype)?;
            let (bias, bv) = upload(&ctx, &normal_f32(k, seed + 2), dtype)?;
            let (z, zv) = upload(&ctx, &normal_f32(m * k, seed + 3), dtype)?;
            // float64 on the rounded values: wv is [r, s, c, k]
            let mut sums = vec![0f64; m * k];
            for (row, out) in sums.chunks_mut(k).enumerate() {
                let (b, op, oq) = (row / (p * q), row / q % p, row % q);
                for i in 0..r {
                    for j in 0..s {
                        let (yy, xx) = (
                            (op * stride + i * dilation[0]) as isize - pads[0] as isize,
                            (oq * stride + j * dilation[1]) as isize - pads[1] as isize,
                        );
                        if yy < 0 || xx < 0 || yy >= h as isize || xx >= w as isize {
                            continue;
                        }
                        let at = ((b * h + yy as usize) * w + xx as usize) * c;
                        for ch in 0..c {
                            let a = xv[at + ch];
                            let taps = &wv[((i * s + j) * c + ch) * k..][..k];
                            for (o, t) in out.iter_mut().zip(taps) {
                                *o += a * t;
                            }
                        }
                    }
                }
            }
            let y = ctx.gpu.alloc(m * k * dtype.storage().size_bytes())?;
            for (label, with_bias, with_z, relu) in EPILOGUES {
                let act = relu.then_some(Activation::Relu);
                let (b, r) = (with_bias.then_some(&bv[..]), with_z.then_some(&zv[..]));
                let want = with_epilogue(&sums, k, b, r, relu);
                let operands = (
                    x.view(),
                    wt.view(),
                    with_bias.then(|| bias.view()),
                    with_z.then(|| z.view()),
                    y.view(),
                );
                for cut in conv_cuts(m, k, kw, small.sms) {
                    for run in 0..2 {
                        ctx.gpu.fill(y.view(), 0xff)?;
                        small.run_conv(ctx.gpu.stream(), dtype, operands, &g, act, cut)?;
                        let e = rel(&download(&ctx, &y, dtype)?, &want);
                        if e > kernel_tolerance(dtype) {
                            failures.push(format!(
                                "{dtype} {g:?} {label} in {cut}, run {run} (seed {seed}): \
                                 {e:.1e}"
                            ));
                        }
                    }
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

fn main() {
    let (discovery, skip) = gpukit_cuda::testing::gpu_test_gate();
    DISCOVERY.set(discovery).ok();
    let args = Arguments::from_args();
    let tests: [(&str, Test); 11] = [
        (
            "gpu::program::every_fixture_matches_the_interpreter",
            every_fixture_matches_the_interpreter,
        ),
        (
            "gpu::program::global_average_matches_float64",
            global_average_matches_float64,
        ),
        (
            "gpu::program::depthwise_matches_float64",
            depthwise_matches_float64,
        ),
        (
            "gpu::program::depthwise_variants_agree",
            depthwise_variants_agree,
        ),
        (
            "gpu::program::layer_norm_variants_agree",
            layer_norm_variants_agree,
        ),
        (
            "gpu::program::small_gemm_matches_float64",
            small_gemm_matches_float64,
        ),
        (
            "gpu::program::conv_small_matches_float64",
            conv_small_matches_float64,
        ),
        (
            "gpu::program::exact_convolutions_match_float64",
            exact_convolutions_match_float64,
        ),
        (
            "gpu::program::exact_sums_bring_fixtures_to_float64",
            exact_sums_bring_fixtures_to_float64,
        ),
        (
            "gpu::program::stem_pool_matches_float64",
            stem_pool_matches_float64,
        ),
        (
            "gpu::program::fp8_conv_matches_float64",
            fp8_conv_matches_float64,
        ),
    ];
    let trials = tests
        .into_iter()
        .map(|(name, f)| Trial::test(name, f).with_ignored_flag(skip.is_some()))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

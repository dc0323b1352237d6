//! `infer --onnx`'s bad input: files that are not a model gpukit runs (truncated, another
//! format, an unsupported operator, a missing external data file, ...) and flags that do not go
//! with it.

use super::{case, safetensors, with_path, Case};
use std::path::Path;

/// An ONNX model of one node `op` over inputs `names` (f32 `[batch, 3, h, w]` each).
fn one_node_model(op: &str, names: &[&str], (h, w): (usize, usize)) -> Vec<u8> {
    use gpukit_models::onnx::builder::{Dim, ModelBuilder};
    let dims = [
        Dim::Named("batch"),
        Dim::Fixed(3),
        Dim::Fixed(h),
        Dim::Fixed(w),
    ];
    let mut m = ModelBuilder::new(17, 1);
    let inputs: Vec<String> = names.iter().map(|n| m.input(n, &dims)).collect();
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let y = m.node(op, &refs, Vec::new());
    m.output(&y, &dims);
    m.bytes()
}

/// `infer --onnx`: files that are not a model gpukit runs, and flags that do not go with it.
pub(super) fn onnx_cases(dir: &Path) -> Vec<Case> {
    use gpukit_models::onnx::fixtures;
    let model = dir.join("model.onnx");
    let bytes = fixtures::bytes(&fixtures::tiny_resnet(1));
    std::fs::write(&model, &bytes).unwrap();
    let truncated = dir.join("truncated.onnx");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let text = dir.join("text.onnx");
    std::fs::write(&text, b"this is not an ONNX model\n").unwrap();
    let unsupported = dir.join("unsupported.onnx");
    std::fs::write(
        &unsupported,
        one_node_model("Frobnicate", &["input"], (8, 8)),
    )
    .unwrap();
    let two_inputs = dir.join("two-inputs.onnx");
    std::fs::write(
        &two_inputs,
        one_node_model("Add", &["left", "right"], (8, 8)),
    )
    .unwrap();
    let mut fixed = fixtures::tiny_resnet(1);
    if let Some(d) = fixed
        .graph
        .as_mut()
        .and_then(|g| g.input.first_mut())
        .and_then(|i| i.r#type.as_mut())
        .and_then(|t| t.tensor_type.as_mut())
        .and_then(|t| t.shape.as_mut())
        .and_then(|s| s.dim.first_mut())
    {
        d.dim_param = None;
        d.dim_value = Some(1);
    }
    let fixed_batch = dir.join("fixed-batch.onnx");
    std::fs::write(&fixed_batch, fixtures::bytes(&fixed)).unwrap();
    let weights = dir.join("w.safetensors");
    safetensors(&weights, "conv1.weight", &[1], &[0.5]);
    let not_square = dir.join("not-square.onnx");
    std::fs::write(&not_square, one_node_model("Relu", &["input"], (8, 4))).unwrap();
    let p = |path: &Path| path.to_str().unwrap().to_string();
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let (model, weights) = (leak(p(&model)), leak(p(&weights)));
    let missing = leak(p(&dir.join("missing.safetensors")));
    let not_square = leak(p(&not_square));
    let samples_8x8 = dir.join("samples-8x8.safetensors");
    safetensors(
        &samples_8x8,
        "input",
        &[16, 3, 8, 8],
        &[0.5; 16 * 3 * 8 * 8],
    );
    let samples_8x8 = leak(p(&samples_8x8));
    let peer = ["--compare-pytorch", "--torchvision"];
    // the fixture's model beside PyTorch's resnet18, and `more`
    let tv = |more: &[&'static str]| -> Vec<&'static str> {
        [
            &["infer", "--onnx", model, peer[0], peer[1], "resnet18"][..],
            more,
        ]
        .concat()
    };
    vec![
        // --torchvision: what it goes with, a name torchvision has, files that exist, images
        // PyTorch's classifiers take; all said before PyTorch is asked
        case(&["infer", "--torchvision", "resnet50"], &["--onnx"]),
        // --fp8-check: with --onnx; its calibration method; its scales not over the model
        case(&["infer", "--fp8-check"], &["--fp8-check", "--onnx"]),
        case(
            &[
                "infer",
                "--onnx",
                model,
                "--fp8-check",
                "--fp8-calibration",
                "percentile:0",
            ],
            &["--fp8-calibration", "(0, 100]"],
        ),
        case(
            &[
                "infer",
                "--onnx",
                model,
                "--fp8-check",
                "--fp8-calibration",
                "mean",
            ],
            &["--fp8-calibration", "percentile:P"],
        ),
        case(
            &[
                "infer",
                "--onnx",
                model,
                "--fp8-check",
                "--save-fp8-scales",
                model,
            ],
            &["--save-fp8-scales", "the model file itself"],
        ),
        case(
            &[
                "infer",
                "--onnx",
                model,
                "--fp8-check",
                "--calibrate",
                samples_8x8,
            ],
            &["--calibrate", "[n, 3, 32, 32]"],
        ),
        case(
            &[
                "infer",
                "--onnx",
                model,
                "--fp8-check",
                "--calibrate",
                missing,
            ],
            &["--calibrate", "missing.safetensors"],
        ),
        case(
            &["infer", "--onnx", model, "--torchvision", "resnet50"],
            &["--compare-pytorch"],
        ),
        case(
            &["infer", "--onnx", model, "--compare-pytorch"],
            &[
                "--compare-pytorch with --onnx needs --torchvision NAME",
                "mobilenet_v3_large",
            ],
        ),
        case(
            &["infer", "--onnx", model, peer[0], peer[1], "mobilenet"],
            &[
                "--torchvision",
                "not one of torchvision's classifiers",
                "mobilenet_v3_large",
                "resnet50",
            ],
        ),
        case(
            &["infer", "--onnx", model, "--torchvision-weights", weights],
            &["--torchvision"],
        ),
        case(
            &tv(&["--torchvision-weights", missing]),
            &[
                "--torchvision-weights",
                "missing.safetensors",
                "cannot be read",
            ],
        ),
        case(
            &[
                &["--save-json", weights][..],
                &tv(&["--torchvision-weights", weights]),
            ]
            .concat(),
            &["--save-json", "is also the input --torchvision-weights"],
        ),
        case(
            &["infer", "--onnx", not_square, peer[0], peer[1], "resnet18"],
            &[
                "--torchvision",
                "square images",
                "not-square.onnx",
                "[8, 3, 8, 4]",
            ],
        ),
        with_path(
            &["infer", "--onnx"],
            &dir.join("missing.onnx"),
            &["missing.onnx", "cannot be read"],
        ),
        with_path(
            &["infer", "--onnx"],
            &truncated,
            &["truncated.onnx", "is not a valid ONNX protobuf"],
        ),
        with_path(&["infer", "--onnx"], &text, &["text.onnx", "ONNX"]),
        with_path(
            &["infer", "--onnx"],
            &unsupported,
            &[
                "unsupported.onnx",
                "node frobnicate_1_node (Frobnicate)",
                "operator Frobnicate is not supported",
            ],
        ),
        with_path(
            &["infer", "--onnx"],
            &two_inputs,
            &["two-inputs.onnx", "2 inputs (left, right)", "one input"],
        ),
        with_path(
            &["infer", "--batch-sizes", "1,4", "--onnx"],
            &fixed_batch,
            &["fixed-batch.onnx", "fixed batch of 1", "--batch-sizes"],
        ),
        case(
            &["infer", "--onnx", model, "--model-name", "resnet18"],
            &["--onnx", "cannot be used with", "--model-name"],
        ),
        case(
            &["infer", "--onnx", model, "--weights", weights],
            &["--onnx", "cannot be used with", "--weights"],
        ),
        case(
            &["infer", "--onnx", model, "--image-size", "64"],
            &["--onnx", "cannot be used with", "--image-size"],
        ),
        case(
            &["--save-json", model, "infer", "--onnx", model],
            &["--save-json", "is also the input --onnx"],
        ),
        case(
            &["--html", model, "infer", "--onnx", model],
            &["--html", "is also the input --onnx"],
        ),
        case(&["infer", "--input-dims", "height=8"], &["--onnx"]),
        case(
            &["infer", "--onnx", model, "--input-dims", "height"],
            &["--input-dims", "not NAME=N"],
        ),
        case(
            &["infer", "--onnx", model, "--input-dims", "height=0"],
            &["--input-dims", "at least 1"],
        ),
        case(
            &["infer", "--onnx", model, "--input-dims", "height=8"],
            &["--input-dims height", "no axis named height"],
        ),
        case(
            &["infer", "--onnx", model, "--input-dims", "batch=8"],
            &["--input-dims batch", "--batch-sizes"],
        ),
    ]
}

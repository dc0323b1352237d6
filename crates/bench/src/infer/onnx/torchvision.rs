//! What `infer --onnx --torchvision NAME` knows of torchvision's classifiers: their names, the
//! layers an ONNX graph computes with, and the structural check that PyTorch's model is the
//! file's (as many convolutions and linear layers, the same output shape per image).
//!
//! To use:
//! 1. [`check_name`] on the name the user gave (the CLI refuses others, listing these);
//! 2. [`layers_of`] on the graph as imported (before gpukit's passes fold or fuse anything);
//! 3. [`PytorchStructure::parse`] on the script's `structure`, then [`same_structure`].

use crate::infer::peer::Layers;
use gpukit_models::graph::{Graph, Op};
use serde_json::Value;

/// torchvision's image classifiers (`torchvision.models.list_models(module=torchvision.models)`
/// in torchvision 0.29), the names `--torchvision` takes; scripts/pytorch_reference.py's
/// `TORCHVISION_CLASSIFIERS` is the same list (a test holds them equal).
pub const TORCHVISION_CLASSIFIERS: [&str; 80] = [
    "alexnet",
    "convnext_base",
    "convnext_large",
    "convnext_small",
    "convnext_tiny",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "efficientnet_v2_m",
    "efficientnet_v2_s",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_16gf",
    "regnet_x_1_6gf",
    "regnet_x_32gf",
    "regnet_x_3_2gf",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_8gf",
    "regnet_y_128gf",
    "regnet_y_16gf",
    "regnet_y_1_6gf",
    "regnet_y_32gf",
    "regnet_y_3_2gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_8gf",
    "resnet101",
    "resnet152",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_b",
    "swin_s",
    "swin_t",
    "swin_v2_b",
    "swin_v2_s",
    "swin_v2_t",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
    "wide_resnet101_2",
    "wide_resnet50_2",
];

/// `name` when torchvision has a classifier of that name; else why not, listing them.
pub fn check_name(name: &str) -> Result<&str, String> {
    if TORCHVISION_CLASSIFIERS.contains(&name) {
        return Ok(name);
    }
    Err(format!(
        "not one of torchvision's classifiers: {}",
        TORCHVISION_CLASSIFIERS.join(", ")
    ))
}

/// The Conv nodes of `graph`, and its Gemm and MatMul nodes with an operand computed from
/// constants alone (a linear layer's weight, transposed or not): what torch.onnx.export writes
/// for each convolution and linear layer a forward pass calls.
pub fn layers_of(graph: &Graph) -> Layers {
    // values known before any input arrives: the constants, and what nodes compute from them
    let mut constant: Vec<bool> = graph.values.iter().map(|v| v.constant.is_some()).collect();
    let mut layers = Layers { conv: 0, linear: 0 };
    for node in &graph.nodes {
        let is_constant = |id: &usize| constant.get(*id).copied().unwrap_or(false);
        match node.op {
            Op::Conv(_) => layers.conv += 1,
            Op::Gemm(_) | Op::MatMul if node.inputs.iter().take(2).any(is_constant) => {
                layers.linear += 1
            }
            _ => {}
        }
        if node.inputs.iter().all(is_constant) {
            for &o in &node.outputs {
                if let Some(c) = constant.get_mut(o) {
                    *c = true;
                }
            }
        }
    }
    layers
}

/// PyTorch's model as scripts/pytorch_reference.py counts it (its `structure`).
#[derive(Debug, Clone, PartialEq)]
pub struct PytorchStructure {
    pub layers: Layers,
    pub parameters: u64,
    /// One image's output shape (the batch axis left out).
    pub output_shape: Vec<usize>,
}

impl PytorchStructure {
    /// From the script's document; None where it has no `structure`.
    pub fn parse(document: &Value) -> Option<PytorchStructure> {
        let s = &document["structure"];
        let count = |key: &str| s[key].as_u64().and_then(|n| usize::try_from(n).ok());
        let shape: Option<Vec<usize>> = s["output_shape"]
            .as_array()?
            .iter()
            .map(|d| d.as_u64().and_then(|n| usize::try_from(n).ok()))
            .collect();
        Some(PytorchStructure {
            layers: Layers {
                conv: count("conv")?,
                linear: count("linear")?,
            },
            parameters: s["parameters"].as_u64()?,
            output_shape: shape?.into_iter().skip(1).collect(),
        })
    }
}

/// Whether PyTorch's `name` is the graph's model by structure: the same count of convolutions
/// and of linear layers (`onnx`, [`layers_of`]) and one output of the same shape per image
/// (`onnx_outputs`: each output's shape, the batch axis left out). Err: the difference, naming
/// both sides' figures.
pub fn same_structure(
    name: &str,
    onnx: Layers,
    onnx_outputs: &[Vec<usize>],
    pytorch: &PytorchStructure,
) -> Result<(), String> {
    let mut differences = Vec::new();
    if onnx != pytorch.layers {
        differences.push(format!(
            "the file has {} Conv and {} Gemm/MatMul node(s) on constant weights, PyTorch's \
             {name} calls {} convolution(s) and {} linear layer(s)",
            onnx.conv, onnx.linear, pytorch.layers.conv, pytorch.layers.linear
        ));
    }
    match onnx_outputs {
        [one] if *one == pytorch.output_shape => {}
        [one] => differences.push(format!(
            "the file's output is {one:?} per image, PyTorch's {name} gives {:?}",
            pytorch.output_shape
        )),
        many => differences.push(format!(
            "the file has {} outputs, PyTorch's {name} one",
            many.len()
        )),
    }
    if differences.is_empty() {
        return Ok(());
    }
    Err(format!(
        "--torchvision {name} is not the model in the file: {}",
        differences.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_models::onnx::fixtures;
    use gpukit_models::onnx::{ImportOptions, ModelFile};
    use serde_json::json;

    fn imported(model: &gpukit_models::onnx::ModelProto) -> Graph {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx");
        std::fs::write(&path, fixtures::bytes(model)).unwrap();
        ModelFile::read(&path)
            .unwrap()
            .import(&ImportOptions {
                batch: Some(2),
                dims: Vec::new(),
            })
            .unwrap()
    }

    fn pytorch(conv: usize, linear: usize, output: &[usize]) -> PytorchStructure {
        PytorchStructure {
            layers: Layers { conv, linear },
            parameters: 1000,
            output_shape: output.to_vec(),
        }
    }

    #[test]
    fn the_names_are_the_scripts_names() {
        let script = crate::peer::SCRIPT;
        let start = script
            .find("TORCHVISION_CLASSIFIERS = (")
            .expect("the script lists torchvision's classifiers");
        let end = start + script[start..].find("\n)").unwrap();
        let listed: Vec<&str> = script[start..end].split('"').skip(1).step_by(2).collect();
        assert_eq!(listed, TORCHVISION_CLASSIFIERS);
        let mut sorted = TORCHVISION_CLASSIFIERS.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted, TORCHVISION_CLASSIFIERS, "sorted, each once");
    }

    #[test]
    fn an_unknown_name_is_refused_listing_the_known_ones() {
        assert_eq!(check_name("mobilenet_v3_large"), Ok("mobilenet_v3_large"));
        let why = check_name("mobilenet").unwrap_err();
        assert!(
            why.contains("resnet50") && why.contains("convnext_tiny"),
            "{why}"
        );
        assert!(check_name("").is_err() && check_name("ResNet50").is_err());
    }

    #[test]
    fn layers_are_counted_in_each_fixture() {
        // tiny_resnet: stem, two basic blocks of two convolutions and a projection; one Gemm
        let resnet = layers_of(&imported(&fixtures::tiny_resnet(1)));
        assert_eq!(resnet, Layers { conv: 6, linear: 1 });
        // convnext: the Linear layers on [n, h, w, c] are MatMuls on constant weights
        let convnext = layers_of(&imported(&fixtures::convnext(1)));
        assert!(convnext.conv >= 1 && convnext.linear >= 2, "{convnext:?}");
        for f in fixtures::all(1) {
            let g = imported(&f.model);
            let convs = g
                .nodes
                .iter()
                .filter(|n| matches!(n.op, Op::Conv(_)))
                .count();
            assert_eq!(layers_of(&g).conv, convs, "{}", f.name);
        }
    }

    #[test]
    fn a_product_of_two_activations_is_not_a_linear_layer() {
        use gpukit_models::onnx::builder::{Dim, ModelBuilder};
        let dims = [Dim::Named("batch"), Dim::Fixed(4), Dim::Fixed(4)];
        let mut m = ModelBuilder::new(17, 1);
        let x = m.input("x", &dims);
        let y = m.node("MatMul", &[&x, &x], Vec::new());
        // a weight transposed by a node is still a weight
        let w = m.random("w", &[4, 4], 0.0, 1.0);
        let wt = m.node("Transpose", &[&w], Vec::new());
        let z = m.node("MatMul", &[&y, &wt], Vec::new());
        m.output(&z, &dims);
        let layers = layers_of(&imported(&m.model()));
        assert_eq!(layers, Layers { conv: 0, linear: 1 });
    }

    #[test]
    fn the_scripts_structure_is_read_per_image() {
        let doc = json!({"structure": {"conv": 62, "linear": 2, "parameters": 5483032,
                                       "output_shape": [1, 1000]}});
        assert_eq!(
            PytorchStructure::parse(&doc),
            Some(PytorchStructure {
                layers: Layers {
                    conv: 62,
                    linear: 2
                },
                parameters: 5_483_032,
                output_shape: vec![1000],
            })
        );
        assert_eq!(PytorchStructure::parse(&json!({"ok": true})), None);
        let partial = json!({"structure": {"conv": 1, "parameters": 3, "output_shape": [1, 2]}});
        assert_eq!(PytorchStructure::parse(&partial), None);
    }

    #[test]
    fn the_same_structure_passes_and_any_difference_names_both_sides() {
        let file = Layers {
            conv: 53,
            linear: 1,
        };
        let out = [vec![1000]];
        assert_eq!(
            same_structure("resnet50", file, &out, &pytorch(53, 1, &[1000])),
            Ok(())
        );
        let why = same_structure("resnet18", file, &out, &pytorch(20, 1, &[1000])).unwrap_err();
        assert!(
            why.contains("--torchvision resnet18 is not the model in the file")
                && why.contains("53 Conv and 1 Gemm/MatMul")
                && why.contains("20 convolution(s) and 1 linear"),
            "{why}"
        );
        let why = same_structure("resnet50", file, &out, &pytorch(53, 2, &[1000])).unwrap_err();
        assert!(why.contains("2 linear layer(s)"), "{why}");
        let why = same_structure("resnet50", file, &out, &pytorch(53, 1, &[10])).unwrap_err();
        assert!(
            why.contains("[1000] per image") && why.contains("[10]"),
            "{why}"
        );
        let two = [vec![1000], vec![1000]];
        let why = same_structure("resnet50", file, &two, &pytorch(53, 1, &[1000])).unwrap_err();
        assert!(why.contains("2 outputs"), "{why}");
    }
}

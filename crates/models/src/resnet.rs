//! ResNet-18/34/50/101/152 as torchvision builds them: the stage layout, and every parameter
//! with its torchvision state-dict name and shape (so published weights load as they are).

use gpukit_tensor::ConvShape;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// A ResNet variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResNet {
    R18,
    R34,
    R50,
    R101,
    R152,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown model '{given}': expected one of resnet18, resnet34, resnet50, resnet101, resnet152"
)]
pub struct UnknownModel {
    pub given: String,
}

impl FromStr for ResNet {
    type Err = UnknownModel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s
            .trim()
            .to_ascii_lowercase()
            .replace(['-', '_'], "")
            .as_str()
        {
            "resnet18" => Ok(ResNet::R18),
            "resnet34" => Ok(ResNet::R34),
            "resnet50" => Ok(ResNet::R50),
            "resnet101" => Ok(ResNet::R101),
            "resnet152" => Ok(ResNet::R152),
            _ => Err(UnknownModel {
                given: gpukit_types::shown(s),
            }),
        }
    }
}

/// One named parameter or buffer of the state dict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Learnable (weights, biases) or a running statistic (batch-norm buffers).
    pub trainable: bool,
}

impl ResNet {
    pub fn name(self) -> &'static str {
        match self {
            ResNet::R18 => "resnet18",
            ResNet::R34 => "resnet34",
            ResNet::R50 => "resnet50",
            ResNet::R101 => "resnet101",
            ResNet::R152 => "resnet152",
        }
    }

    /// Blocks per stage (layer1..layer4).
    pub fn blocks(self) -> [usize; 4] {
        match self {
            ResNet::R18 => [2, 2, 2, 2],
            ResNet::R34 | ResNet::R50 => [3, 4, 6, 3],
            ResNet::R101 => [3, 4, 23, 3],
            ResNet::R152 => [3, 8, 36, 3],
        }
    }

    /// Bottleneck blocks (1x1, 3x3, 1x1 with 4x expansion) from ResNet-50 up; basic blocks below.
    pub fn bottleneck(self) -> bool {
        !matches!(self, ResNet::R18 | ResNet::R34)
    }

    /// Every state-dict entry in torchvision's order, `num_batches_tracked` excluded (it is a
    /// counter, not a tensor of the model's arithmetic).
    pub fn state_dict(self, num_classes: usize) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        conv(&mut out, "conv1", 64, 3, 7);
        bn(&mut out, "bn1", 64);
        let expansion = if self.bottleneck() { 4 } else { 1 };
        let mut in_ch = 64;
        for (stage, &n) in self.blocks().iter().enumerate() {
            let width = 64 << stage;
            for b in 0..n {
                let p = format!("layer{}.{b}", stage + 1);
                if self.bottleneck() {
                    conv(&mut out, &format!("{p}.conv1"), width, in_ch, 1);
                    bn(&mut out, &format!("{p}.bn1"), width);
                    conv(&mut out, &format!("{p}.conv2"), width, width, 3);
                    bn(&mut out, &format!("{p}.bn2"), width);
                    conv(&mut out, &format!("{p}.conv3"), width * 4, width, 1);
                    bn(&mut out, &format!("{p}.bn3"), width * 4);
                } else {
                    conv(&mut out, &format!("{p}.conv1"), width, in_ch, 3);
                    bn(&mut out, &format!("{p}.bn1"), width);
                    conv(&mut out, &format!("{p}.conv2"), width, width, 3);
                    bn(&mut out, &format!("{p}.bn2"), width);
                }
                let out_ch = width * expansion;
                // torchvision adds a projection where the stride or the width changes
                let stride = if b == 0 && stage > 0 { 2 } else { 1 };
                if b == 0 && (stride != 1 || in_ch != out_ch) {
                    conv(&mut out, &format!("{p}.downsample.0"), out_ch, in_ch, 1);
                    bn(&mut out, &format!("{p}.downsample.1"), out_ch);
                }
                in_ch = out_ch;
            }
        }
        out.push(ParamSpec {
            name: "fc.weight".into(),
            shape: vec![num_classes, in_ch],
            trainable: true,
        });
        out.push(ParamSpec {
            name: "fc.bias".into(),
            shape: vec![num_classes],
            trainable: true,
        });
        out
    }

    /// Every convolution of the network in torchvision's order, with its module name and its
    /// shape at batch 1 on `image x image` inputs (stride on the 3x3 convolution, as torchvision's
    /// v1.5).
    pub fn convolutions(self, image: usize) -> Vec<(String, ConvShape)> {
        let mut out = Vec::new();
        let conv = |c, h, k, r, stride, pad| ConvShape {
            n: 1,
            c,
            h,
            w: h,
            k,
            r,
            s: r,
            stride,
            pad,
            groups: 1,
        };
        let stem = conv(3, image, 64, 7, 2, 3);
        // after the stem and the 3x3/2 max pooling
        let mut size = stem.out_h().saturating_sub(1) / 2 + 1;
        out.push(("conv1".to_string(), stem));
        let expansion = if self.bottleneck() { 4 } else { 1 };
        let mut in_ch = 64;
        for (stage, &n) in self.blocks().iter().enumerate() {
            let width = 64 << stage;
            for b in 0..n {
                let p = format!("layer{}.{b}", stage + 1);
                let stride = if b == 0 && stage > 0 { 2 } else { 1 };
                let out_ch = width * expansion;
                let after = (size + 2 - 3) / stride + 1;
                if self.bottleneck() {
                    out.push((format!("{p}.conv1"), conv(in_ch, size, width, 1, 1, 0)));
                    out.push((format!("{p}.conv2"), conv(width, size, width, 3, stride, 1)));
                    out.push((format!("{p}.conv3"), conv(width, after, out_ch, 1, 1, 0)));
                } else {
                    out.push((format!("{p}.conv1"), conv(in_ch, size, width, 3, stride, 1)));
                    out.push((format!("{p}.conv2"), conv(width, after, width, 3, 1, 1)));
                }
                if b == 0 && (stride != 1 || in_ch != out_ch) {
                    let ds = conv(in_ch, size, out_ch, 1, stride, 0);
                    out.push((format!("{p}.downsample.0"), ds));
                }
                in_ch = out_ch;
                size = after;
            }
        }
        out
    }

    /// Learnable parameters (what torchvision's `sum(p.numel() for p in model.parameters())` says).
    pub fn parameter_count(self, num_classes: usize) -> usize {
        self.state_dict(num_classes)
            .iter()
            .filter(|p| p.trainable)
            .map(|p| p.shape.iter().product::<usize>())
            .sum()
    }
}

fn conv(out: &mut Vec<ParamSpec>, name: &str, out_ch: usize, in_ch: usize, k: usize) {
    out.push(ParamSpec {
        name: format!("{name}.weight"),
        shape: vec![out_ch, in_ch, k, k],
        trainable: true,
    });
}

fn bn(out: &mut Vec<ParamSpec>, name: &str, ch: usize) {
    for (suffix, trainable) in [
        ("weight", true),
        ("bias", true),
        ("running_mean", false),
        ("running_var", false),
    ] {
        out.push(ParamSpec {
            name: format!("{name}.{suffix}"),
            shape: vec![ch],
            trainable,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts_match_torchvision() {
        // torchvision's published counts for the ImageNet (1000-class) models
        assert_eq!(ResNet::R18.parameter_count(1000), 11_689_512);
        assert_eq!(ResNet::R34.parameter_count(1000), 21_797_672);
        assert_eq!(ResNet::R50.parameter_count(1000), 25_557_032);
        assert_eq!(ResNet::R101.parameter_count(1000), 44_549_160);
        assert_eq!(ResNet::R152.parameter_count(1000), 60_192_808);
    }

    #[test]
    fn state_dict_names_are_torchvisions() {
        let sd = ResNet::R50.state_dict(1000);
        let names: Vec<&str> = sd.iter().map(|p| p.name.as_str()).collect();
        for key in [
            "conv1.weight",
            "bn1.running_var",
            "layer1.0.downsample.0.weight",
            "layer3.5.conv3.weight",
            "layer4.2.bn3.bias",
            "fc.weight",
        ] {
            assert!(names.contains(&key), "{key} missing");
        }
        assert!(!names.contains(&"layer1.1.downsample.0.weight"));
        // resnet18's first stage keeps width 64: no projection there
        let r18: Vec<String> = ResNet::R18
            .state_dict(10)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert!(!r18.contains(&"layer1.0.downsample.0.weight".to_string()));
        assert!(r18.contains(&"layer2.0.downsample.0.weight".to_string()));
        assert_eq!(
            sd.iter()
                .find(|p| p.name == "layer2.0.conv2.weight")
                .unwrap()
                .shape,
            vec![128, 128, 3, 3]
        );
    }

    #[test]
    fn convolutions_follow_the_state_dict_and_the_image_size() {
        for model in [ResNet::R18, ResNet::R50, ResNet::R101] {
            let convs = model.convolutions(224);
            let weights: Vec<ParamSpec> = model
                .state_dict(1000)
                .into_iter()
                .filter(|p| p.shape.len() == 4)
                .collect();
            assert_eq!(convs.len(), weights.len(), "{model:?}");
            for ((name, sh), w) in convs.iter().zip(&weights) {
                assert_eq!(format!("{name}.weight"), w.name);
                assert_eq!(vec![sh.k, sh.c, sh.r, sh.s], w.shape, "{name}");
            }
            // every layer's input is the previous layer's output size
            let last = &convs[convs.len() - 1].1;
            assert_eq!(last.out_h(), 7, "{model:?}");
        }
        let r50 = ResNet::R50.convolutions(224);
        let find = |n: &str| r50.iter().find(|(name, _)| name == n).unwrap().1;
        assert_eq!(find("conv1").out_h(), 112);
        assert_eq!(
            (find("layer1.0.conv1").h, find("layer2.0.conv2").h),
            (56, 56)
        );
        assert_eq!(find("layer2.0.conv2").out_h(), 28);
        assert_eq!(find("layer4.2.conv3").h, 7);
        assert_eq!(find("layer3.0.downsample.0").stride, 2);
    }

    #[test]
    fn parses_model_names() {
        assert_eq!("ResNet-50".parse(), Ok(ResNet::R50));
        assert_eq!("resnet_101".parse(), Ok(ResNet::R101));
        let e = "vgg16".parse::<ResNet>().unwrap_err();
        assert!(e.to_string().contains("vgg16"));
    }
}

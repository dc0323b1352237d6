//! The convolutions `bench conv` measures: every distinct convolution of ResNet-50 (torchvision's
//! v1.5 at 224 x 224), each with how many times the network runs it, so that per-shape times
//! add up to the network's convolution time.

use gpukit_models::ResNet;
use gpukit_tensor::ConvShape;
use serde::{Deserialize, Serialize};

/// One distinct convolution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedShape {
    /// `layer2 3x3/2 128->128 @56`: the stage, the filter (and stride), channels in and out, and
    /// the input's height.
    pub name: String,
    /// The torchvision modules that run it, e.g. `layer1.0.conv3, layer1.0.downsample.0`.
    pub modules: Vec<String>,
    pub shape: ConvShape,
}

impl NamedShape {
    /// How many times one forward pass runs this convolution.
    pub fn count(&self) -> usize {
        self.modules.len()
    }
}

/// `layer2 3x3/2 128->128 @56`.
fn name_of(module: &str, s: &ConvShape) -> String {
    let stage = module.split('.').next().unwrap_or(module);
    let stride = if s.stride > 1 {
        format!("/{}", s.stride)
    } else {
        String::new()
    };
    format!("{stage} {}x{}{stride} {}->{} @{}", s.r, s.s, s.c, s.k, s.h)
}

/// ResNet-50's distinct convolutions at batch `n`, in the order the network first runs them.
pub fn resnet50_shapes(n: usize) -> Vec<NamedShape> {
    let mut out: Vec<NamedShape> = Vec::new();
    for (module, shape) in ResNet::R50.convolutions(224) {
        let shape = shape.with_batch(n);
        match out.iter_mut().find(|d| d.shape == shape) {
            Some(d) => d.modules.push(module),
            None => out.push(NamedShape {
                name: name_of(&module, &shape),
                modules: vec![module],
                shape,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resnet50_has_23_distinct_convolutions_run_53_times() {
        let s = resnet50_shapes(32);
        assert_eq!(s.len(), 23);
        assert_eq!(s.iter().map(NamedShape::count).sum::<usize>(), 53);
        assert!(s.iter().all(|x| x.shape.n == 32));
        assert_eq!(s[0].name, "conv1 7x7/2 3->64 @224");
        assert_eq!(s[0].shape.out_hw(), (112, 112));
        // layer1's expansion and its projection are the same convolution
        let expand = s
            .iter()
            .find(|x| x.name == "layer1 1x1 64->256 @56")
            .unwrap();
        assert_eq!(
            expand.modules,
            [
                "layer1.0.conv3",
                "layer1.0.downsample.0",
                "layer1.1.conv3",
                "layer1.2.conv3"
            ]
        );
        let reduce = s
            .iter()
            .find(|x| x.name == "layer4 1x1 2048->512 @7")
            .unwrap();
        assert_eq!(reduce.count(), 2);
        // every name is distinct
        let mut names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 23);
        assert_eq!(s[4].shape.spec(), "32x256x56x56:64x1x1:s1p0");
    }
}

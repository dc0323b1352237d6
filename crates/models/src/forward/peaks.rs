//! How large each layer's output got on the CPU's f32 forward pass: what tells a user that a
//! half-precision run failed because its activations passed fp16's range, and where.

/// The largest magnitude each layer's stored output reached, by torchvision module name
/// (`conv1`, `layer3.4.conv2`, `layer2.0.downsample.0`, `fc`), in the order the layers run. A
/// NaN counts as infinite. Over several passes of one batch, a layer keeps its largest value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peaks(pub Vec<(String, f32)>);

impl Peaks {
    /// Takes `data`'s largest magnitude into `layer`'s entry.
    pub(crate) fn record(&mut self, layer: &str, data: &[f32]) {
        let peak = data.iter().fold(0f32, |m, &v| {
            if v.is_nan() {
                f32::INFINITY
            } else {
                m.max(v.abs())
            }
        });
        match self.0.iter_mut().find(|(name, _)| name == layer) {
            Some((_, m)) => *m = m.max(peak),
            None => self.0.push((layer.to_string(), peak)),
        }
    }

    /// The first layer whose output passed `limit`, with its peak.
    pub fn first_over(&self, limit: f32) -> Option<(&str, f32)> {
        self.0
            .iter()
            .find(|(_, peak)| *peak > limit)
            .map(|(name, peak)| (name.as_str(), *peak))
    }

    /// The largest magnitude of any layer.
    pub fn max(&self) -> f32 {
        self.0.iter().fold(0f32, |m, (_, p)| m.max(*p))
    }
}

/// torchvision's name of block `index` (counted over the whole network) of a network whose
/// stages hold `blocks` blocks each: `layer3.4`.
pub(crate) fn block_name(blocks: &[usize], index: usize) -> String {
    let mut start = 0;
    for (stage, &count) in blocks.iter().enumerate() {
        if index < start + count {
            return format!("layer{}.{}", stage + 1, index - start);
        }
        start += count;
    }
    format!("block{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_keep_the_largest_magnitude_and_count_nan_as_infinite() {
        let mut p = Peaks::default();
        p.record("conv1", &[1.0, -70000.0, 3.0]);
        p.record("layer1.0.conv1", &[2.0]);
        p.record("conv1", &[5.0]);
        p.record("fc", &[f32::NAN, 1.0]);
        assert_eq!(
            p.0,
            vec![
                ("conv1".to_string(), 70000.0),
                ("layer1.0.conv1".to_string(), 2.0),
                ("fc".to_string(), f32::INFINITY)
            ]
        );
        assert_eq!(p.first_over(65504.0), Some(("conv1", 70000.0)));
        assert_eq!(p.first_over(f32::MAX), Some(("fc", f32::INFINITY)));
        assert_eq!(p.max(), f32::INFINITY);
    }

    #[test]
    fn block_names_follow_torchvision() {
        let r50 = [3, 4, 6, 3];
        assert_eq!(block_name(&r50, 0), "layer1.0");
        assert_eq!(block_name(&r50, 3), "layer2.0");
        assert_eq!(block_name(&r50, 12), "layer3.5");
        assert_eq!(block_name(&r50, 14), "layer4.1");
        assert_eq!(block_name(&r50, 16), "block16");
    }
}

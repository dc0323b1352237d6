//! Inference strategies: one way of running the model, a named row of `gpukit infer`
//! (`fp16-nhwc-graph`, `fp32`, ...).

use crate::error::{Error, Result};
use gpukit_types::{DType, Layout};

/// The dtypes the GPU engine runs, in the order reports list them.
pub const ENGINE_DTYPES: [DType; 4] = [DType::F32, DType::Tf32, DType::F16, DType::Bf16];

/// One way of running the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Strategy {
    /// Storage and arithmetic of the convolutions (`F32`: no tensor cores, the reference).
    pub dtype: DType,
    /// NHWC activations and KRSC filters (tensor-core friendly), or NCHW and KCRS.
    pub layout: Layout,
    /// Replayed as a CUDA graph instead of launched call by call.
    pub graph: bool,
}

impl Strategy {
    /// `fp16-nhwc-graph`, `fp32`, ...
    pub fn name(&self) -> String {
        let mut s = self.dtype.precision_name().to_string();
        if self.layout == Layout::Nhwc {
            s.push_str("-nhwc");
        }
        if self.graph {
            s.push_str("-graph");
        }
        s
    }

    /// Parses a name as [`Strategy::name`] writes it (`nchw` and `eager` may be written too).
    pub fn parse(text: &str) -> Result<Strategy> {
        let bad = |why: String| Error::Invalid(why);
        let mut parts = text.trim().split('-');
        let p = parts.next().unwrap_or("");
        let dtype = ENGINE_DTYPES
            .into_iter()
            .find(|d| d.precision_name() == p)
            .ok_or_else(|| {
                bad(format!(
                    "unknown precision {:?} in strategy {:?}",
                    gpukit_types::shown(p),
                    gpukit_types::shown(text)
                ))
            })?;
        let (mut layout, mut graph, mut named_layout) = (Layout::Nchw, false, false);
        for part in parts {
            match part {
                "nhwc" | "nchw" if !named_layout && !graph => {
                    named_layout = true;
                    if part == "nhwc" {
                        layout = Layout::Nhwc;
                    }
                }
                "graph" if !graph => graph = true,
                "eager" if !graph => {}
                _ => {
                    return Err(bad(format!(
                        "unknown part {:?} in strategy {:?}",
                        gpukit_types::shown(part),
                        gpukit_types::shown(text)
                    )))
                }
            }
        }
        Ok(Strategy {
            dtype,
            layout,
            graph,
        })
    }

    /// The default set: every precision in the layout that suits it, eager and as a graph.
    pub fn defaults() -> Vec<Strategy> {
        let mut v = Vec::new();
        for (dtype, layout) in [
            (DType::F32, Layout::Nchw),
            (DType::Tf32, Layout::Nchw),
            (DType::Tf32, Layout::Nhwc),
            (DType::F16, Layout::Nchw),
            (DType::F16, Layout::Nhwc),
            (DType::Bf16, Layout::Nhwc),
        ] {
            for graph in [false, true] {
                v.push(Strategy {
                    dtype,
                    layout,
                    graph,
                });
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::defaults() {
            assert_eq!(Strategy::parse(&s.name()).unwrap(), s);
        }
        assert_eq!(
            Strategy::parse("fp16-nchw-eager").unwrap(),
            Strategy {
                dtype: DType::F16,
                layout: Layout::Nchw,
                graph: false
            }
        );
        for bad in [
            "",
            "fp8",
            "fp64",
            "fp16-nhwc-nhwc",
            "fp16-nchw-nhwc",
            "fp16-graph-nhwc",
            "fp16-fast",
        ] {
            assert!(Strategy::parse(bad).is_err(), "{bad}");
        }
    }
}

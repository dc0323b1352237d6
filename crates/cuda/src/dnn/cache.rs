//! The convolution choices measured before, kept on disk per GPU model and cuDNN version so that
//! a shape is measured once, not at every run. The file is JSON (a list of key and choice), read
//! whole at start and written whole (atomically) when the choices changed; an unreadable or
//! foreign file is ignored and rebuilt. `GPUKIT_REPLAN=1` measures again and overwrites.

use super::legacy::{algo_name, math_name, AlgoRow, FWD_ALGOS, MATH_TYPES};
use super::Conv;
use crate::driver::Gpu;
use cudarc::cudnn::sys as dn;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a choice was made for: the convolution, the operation around it and what else the
/// measurement depended on (a legacy-only or workspace-limited choice must never stand in for
/// the measured best of both APIs).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(super) struct Key {
    pub conv: Conv,
    /// `fused` (bias, ReLU, optional residual) or `plain` (the bare convolution).
    pub op: Op,
    pub legacy_only: bool,
    /// The workspace limit, when below the default.
    pub workspace_limit: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Op {
    Fused { residual: bool },
    Plain,
}

/// How the convolution ran best.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "api", rename_all = "snake_case")]
pub(super) enum Choice {
    /// A legacy algorithm and math type, by the names in `legacy::FWD_ALGOS` / `MATH_TYPES`.
    Legacy { algo: String, math: String },
    /// The backend engine configuration at this rank of the heuristic's list.
    Graph { rank: usize },
    /// The bare convolution's own choice, then the epilogue kernel.
    Split,
}

impl Choice {
    pub fn legacy(row: AlgoRow) -> Choice {
        Choice::Legacy {
            algo: algo_name(row.algo).to_string(),
            math: math_name(row.math).to_string(),
        }
    }

    /// The legacy row this choice names (time and workspace unknown), if it is one.
    pub fn legacy_row(&self) -> Option<AlgoRow> {
        let Choice::Legacy { algo, math } = self else {
            return None;
        };
        let algo = FWD_ALGOS.iter().find(|(n, _)| n == algo)?.1;
        let math = MATH_TYPES.iter().find(|(n, _)| n == math)?.1;
        Some(AlgoRow {
            algo,
            math,
            workspace_bytes: 0,
            ms: 0.0,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: Key,
    choice: Choice,
}

/// The choices of one GPU model and cuDNN version.
#[derive(Default)]
pub(super) struct Choices {
    path: Option<PathBuf>,
    map: BTreeMap<Key, Choice>,
    dirty: bool,
    replan: bool,
}

/// The selection policy's version, in the file name: choices made under another policy (other
/// candidates) are not reused. 2: strict f32 also tries the backend's non-tensor-core engines,
/// and NHWC the fallback list too. 3: the heuristic's whole list (up to 64) is timed, which also
/// moves the fallback engines' ranks.
const POLICY: u32 = 3;

/// `cudnn-choices-v<policy>-<gpu>-sm<cc>-cudnn<version>.json`, in characters safe for a file
/// name.
fn file_name(gpu_name: &str, (major, minor): (u32, u32), cudnn_version: usize) -> String {
    let tag: String = format!("{gpu_name}-sm{major}{minor}-cudnn{cudnn_version}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("cudnn-choices-v{POLICY}-{tag}.json")
}

impl Choices {
    pub fn open(gpu: &Gpu) -> Choices {
        // SAFETY: cuDNN is loaded (checked by the caller); no handle needed.
        let version = unsafe { dn::cudnnGetVersion() };
        let name = file_name(
            &gpu.name().unwrap_or_default(),
            gpu.compute_capability().unwrap_or((0, 0)),
            version,
        );
        let path = crate::loader::cache_dir().map(|d| d.join(name));
        let map = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .map(|bytes| Self::parse(&bytes))
            .unwrap_or_default();
        Choices {
            path,
            map,
            dirty: false,
            replan: std::env::var("GPUKIT_REPLAN").is_ok_and(|v| v == "1"),
        }
    }

    /// The entries of a cache file; nothing from a file that does not parse.
    fn parse(bytes: &[u8]) -> BTreeMap<Key, Choice> {
        serde_json::from_slice::<Vec<Entry>>(bytes)
            .map(|entries| entries.into_iter().map(|e| (e.key, e.choice)).collect())
            .unwrap_or_default()
    }

    fn render(&self) -> Vec<u8> {
        let entries: Vec<Entry> = self
            .map
            .iter()
            .map(|(key, choice)| Entry {
                key: key.clone(),
                choice: choice.clone(),
            })
            .collect();
        serde_json::to_vec_pretty(&entries).unwrap_or_default()
    }

    pub fn get(&self, key: &Key) -> Option<Choice> {
        if self.replan {
            return None;
        }
        self.map.get(key).cloned()
    }

    pub fn put(&mut self, key: Key, choice: Choice) {
        if self.map.get(&key) != Some(&choice) {
            self.map.insert(key, choice);
            self.dirty = true;
        }
    }

    /// Writes the file whole, then renames it: a reader never sees half of it. A cache that
    /// cannot be written is measured again next time.
    pub fn save(&mut self) {
        let Some(path) = &self.path else { return };
        if self.dirty && gpukit_types::files::write_atomically(path, &self.render()).is_ok() {
            self.dirty = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_types::{ConvShape, DType, Layout};

    fn key(residual: bool) -> Key {
        Key {
            conv: Conv {
                shape: ConvShape {
                    n: 32,
                    c: 64,
                    h: 56,
                    w: 56,
                    k: 256,
                    r: 1,
                    s: 1,
                    stride: 1,
                    pad: 0,
                },
                layout: Layout::Nhwc,
                dtype: DType::F16,
            },
            op: Op::Fused { residual },
            legacy_only: false,
            workspace_limit: None,
        }
    }

    #[test]
    fn choices_round_trip_through_the_file_format() {
        let mut c = Choices::default();
        let row = AlgoRow {
            algo: dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
            math: dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            workspace_bytes: 0,
            ms: 0.0,
        };
        c.put(key(true), Choice::legacy(row));
        c.put(key(false), Choice::Graph { rank: 3 });
        let back = Choices::parse(&c.render());
        assert_eq!(back, c.map);
        let again = back[&key(true)].legacy_row().unwrap();
        assert_eq!((again.algo, again.math), (row.algo, row.math));
        assert_eq!(back[&key(false)].legacy_row().map(|r| r.ms), None);
    }

    #[test]
    fn a_foreign_or_broken_file_is_ignored() {
        assert!(Choices::parse(b"fused {...}\tlegacy X Y\n").is_empty());
        assert!(Choices::parse(b"[{\"key\": 1}]").is_empty());
        let unknown = Choice::Legacy {
            algo: "NO_SUCH".into(),
            math: "FMA".into(),
        };
        assert!(unknown.legacy_row().is_none());
    }

    #[test]
    fn file_names_are_safe() {
        assert_eq!(
            file_name("NVIDIA H100 80GB HBM3", (9, 0), 91900),
            "cudnn-choices-v3-NVIDIA_H100_80GB_HBM3-sm90-cudnn91900.json"
        );
    }
}

//! The convolution choices measured before, kept on disk per GPU model and cuDNN version so that
//! a shape is measured once, not at every run. The file is JSON (a list of key and choice), read
//! whole at start and written whole (atomically) when the choices changed; a file that cannot
//! be read is never trusted: it is measured again and rewritten, with a note saying so. The file
//! name carries the selection policy's version, the GPU model and compute capability and the
//! cuDNN version, so a new gpukit with the same policy keeps using it and a new cuDNN or GPU
//! starts afresh. `GPUKIT_REPLAN=1` measures again and overwrites.

use super::legacy::{algo_name, exact_f32_algo, math_name, AlgoRow, FWD_ALGOS, MATH_TYPES};
use super::Act;
use super::{Conv, Search, Strict};
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
    /// Planned as exact f32 ([`super::Strict::Exact`]); absent in files from before it existed,
    /// whose choices were made without the rule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact_f32: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Op {
    /// `relu(conv + bias [+ z])`.
    Fused {
        residual: bool,
    },
    Plain,
    /// `act(conv + bias [+ z])` with any other activation, or none.
    Epilogue {
        residual: bool,
        act: Option<Act>,
    },
}

/// How the convolution ran best.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "api", rename_all = "snake_case")]
pub(super) enum Choice {
    /// A legacy algorithm and math type, by the names in `legacy::FWD_ALGOS` / `MATH_TYPES`.
    Legacy { algo: String, math: String },
    /// The backend engine configuration at this index of one of cuDNN's lists.
    Graph { list: List, index: usize },
    /// The bare convolution's own choice, then the epilogue kernel.
    Split,
}

/// Which of cuDNN's engine lists a backend choice is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum List {
    /// The heuristic's ranking (mode A).
    Heuristic,
    /// The fallback engines.
    Fallback,
}

impl Choice {
    pub fn legacy(row: AlgoRow) -> Choice {
        Choice::Legacy {
            algo: algo_name(row.algo).to_string(),
            math: math_name(row.math).to_string(),
        }
    }

    /// The legacy row this choice names (time and workspace unknown), if it is one a
    /// convolution held to `strict` may run; None means measure again. None too for names this
    /// build does not know, for strict f32 (or f64) with any math type but FMA (a hand-edited or
    /// foreign file must not put a strict convolution on TF32 tensor cores: default math allows
    /// them on Ampere and newer), and for exact f32 with a Winograd or FFT algorithm.
    pub fn legacy_row(&self, strict: Strict) -> Option<AlgoRow> {
        let Choice::Legacy { algo, math } = self else {
            return None;
        };
        let algo = FWD_ALGOS.iter().find(|(n, _)| n == algo)?.1;
        let math = MATH_TYPES.iter().find(|(n, _)| n == math)?.1;
        if strict.f32() && math != dn::cudnnMathType_t::CUDNN_FMA_MATH
            || strict == Strict::Exact && !exact_f32_algo(algo)
        {
            return None;
        }
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
    /// How hard the search that made it looked: a fast search's choice does not stand in for
    /// an exhaustive one.
    search: Search,
}

/// A choice and the search that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stored {
    pub choice: Choice,
    pub search: Search,
}

/// The choices of one GPU model and cuDNN version.
#[derive(Default)]
pub(super) struct Choices {
    path: Option<PathBuf>,
    map: BTreeMap<Key, Stored>,
    dirty: bool,
    replan: bool,
    /// Why the file on disk was not used (it could not be parsed).
    note: Option<String>,
}

/// The selection policy's version, in the file name: choices made under another policy (other
/// candidates) are not reused. 2: strict f32 also tries the backend's non-tensor-core engines,
/// and NHWC the fallback list too. 3: the heuristic's whole list (up to 64) is timed, which also
/// moves the fallback engines' ranks. 4: finalists are ranked by their time back to back in a
/// graph. 5: fast and exhaustive searches, finalists confirmed in interleaved rounds, backend
/// choices named by their list and index.
const POLICY: u32 = 5;

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
        let mut note = None;
        let map = match path.as_ref().map(|p| (p, std::fs::read(p))) {
            Some((p, Ok(bytes))) => Self::parse(&bytes).unwrap_or_else(|why| {
                // never trusted, never fatal: measured again and written whole
                note = Some(format!(
                    "the cuDNN choice cache {} could not be read ({why}): its choices are \
                     measured again and the file rewritten",
                    p.display()
                ));
                BTreeMap::new()
            }),
            _ => BTreeMap::new(),
        };
        Choices {
            path,
            map,
            // a broken file is replaced even when nothing new is measured
            dirty: note.is_some(),
            replan: std::env::var("GPUKIT_REPLAN").is_ok_and(|v| v == "1"),
            note,
        }
    }

    /// The entries of a cache file, or why it is not one.
    fn parse(bytes: &[u8]) -> Result<BTreeMap<Key, Stored>, String> {
        serde_json::from_slice::<Vec<Entry>>(bytes)
            .map(|entries| {
                entries
                    .into_iter()
                    .map(|e| {
                        let stored = Stored {
                            choice: e.choice,
                            search: e.search,
                        };
                        (e.key, stored)
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    fn render(&self) -> Vec<u8> {
        let entries: Vec<Entry> = self
            .map
            .iter()
            .map(|(key, stored)| Entry {
                key: key.clone(),
                choice: stored.choice.clone(),
                search: stored.search,
            })
            .collect();
        serde_json::to_vec_pretty(&entries).unwrap_or_default()
    }

    /// The choice for `key` made by a search at least as thorough as `search` (an exhaustive
    /// choice serves a fast search, not the other way round).
    pub fn get(&self, key: &Key, search: Search) -> Option<Choice> {
        if self.replan {
            return None;
        }
        self.map
            .get(key)
            .filter(|s| s.search >= search)
            .map(|s| s.choice.clone())
    }

    /// Keeps the choice a `search` made; a faster search does not replace a more thorough
    /// one's choice. A heuristic pick is kept too (asking cuDNN's heuristics again costs tens of
    /// milliseconds a convolution in every process) but serves only a heuristic search, since
    /// it is not a measurement.
    pub fn put(&mut self, key: Key, choice: Choice, search: Search) {
        if self.map.get(&key).is_some_and(|s| s.search > search) {
            return;
        }
        let stored = Stored { choice, search };
        if self.map.get(&key) != Some(&stored) {
            self.map.insert(key, stored);
            self.dirty = true;
        }
    }

    /// Why the file was not used, when it could not be read.
    pub fn note(&self) -> Option<String> {
        self.note.clone()
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
                    groups: 1,
                },
                layout: Layout::Nhwc,
                dtype: DType::F16,
            },
            op: Op::Fused { residual },
            legacy_only: false,
            workspace_limit: None,
            exact_f32: false,
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
        c.put(key(true), Choice::legacy(row), Search::Fast);
        let graph = Choice::Graph {
            list: List::Fallback,
            index: 3,
        };
        c.put(key(false), graph.clone(), Search::Exhaustive);
        let back = Choices::parse(&c.render()).unwrap();
        assert_eq!(back, c.map);
        let again = back[&key(true)].choice.legacy_row(Strict::Any).unwrap();
        assert_eq!((again.algo, again.math), (row.algo, row.math));
        assert!(back[&key(false)].choice.legacy_row(Strict::Any).is_none());
        assert_eq!(c.get(&key(false), Search::Fast), Some(graph));
    }

    #[test]
    fn a_fast_choice_does_not_stand_in_for_an_exhaustive_one() {
        let mut c = Choices::default();
        let fast = Choice::Graph {
            list: List::Heuristic,
            index: 0,
        };
        c.put(key(true), fast.clone(), Search::Fast);
        assert_eq!(c.get(&key(true), Search::Fast), Some(fast.clone()));
        assert_eq!(c.get(&key(true), Search::Heuristic), Some(fast.clone()));
        assert_eq!(c.get(&key(true), Search::Exhaustive), None);
        let thorough = Choice::Graph {
            list: List::Heuristic,
            index: 7,
        };
        c.put(key(true), thorough.clone(), Search::Exhaustive);
        // a later fast search does not replace it, nor does a heuristic pick
        c.put(key(true), fast.clone(), Search::Fast);
        c.put(key(true), fast.clone(), Search::Heuristic);
        assert_eq!(c.get(&key(true), Search::Exhaustive), Some(thorough));
    }

    #[test]
    fn a_heuristic_pick_serves_only_a_heuristic_search() {
        let mut c = Choices::default();
        let pick = Choice::Legacy {
            algo: "IMPLICIT_PRECOMP_GEMM".into(),
            math: "FMA".into(),
        };
        c.put(key(false), pick.clone(), Search::Heuristic);
        assert_eq!(c.get(&key(false), Search::Heuristic), Some(pick.clone()));
        assert_eq!(c.get(&key(false), Search::Fast), None);
        assert_eq!(c.get(&key(false), Search::Exhaustive), None);
        let back = Choices::parse(&c.render()).unwrap();
        assert_eq!(back[&key(false)].search, Search::Heuristic);
        // a measured choice then takes its place and serves both
        let measured = Choice::Graph {
            list: List::Heuristic,
            index: 2,
        };
        c.put(key(false), measured.clone(), Search::Fast);
        assert_eq!(
            c.get(&key(false), Search::Heuristic),
            Some(measured.clone())
        );
        assert_eq!(c.get(&key(false), Search::Fast), Some(measured));
    }

    #[test]
    fn a_foreign_or_broken_file_is_not_trusted_and_says_why() {
        assert!(Choices::parse(b"fused {...}\tlegacy X Y\n").is_err());
        assert!(Choices::parse(b"[{\"key\": 1}]").is_err());
        let unknown = Choice::Legacy {
            algo: "NO_SUCH".into(),
            math: "FMA".into(),
        };
        assert!(unknown.legacy_row(Strict::Any).is_none());
    }

    #[test]
    fn a_cached_row_never_puts_strict_f32_on_tensor_cores() {
        let choice = |math: &str| Choice::Legacy {
            algo: "IMPLICIT_GEMM".into(),
            math: math.into(),
        };
        for (math, _) in MATH_TYPES {
            let strict = choice(math).legacy_row(Strict::NoTensorCores);
            assert_eq!(strict.is_some(), math == "FMA", "{math}");
            assert!(choice(math).legacy_row(Strict::Any).is_some(), "{math}");
        }
    }

    #[test]
    fn a_cached_row_never_puts_exact_f32_on_winograd_or_fft() {
        for (algo, a) in FWD_ALGOS {
            let row = |math: &str, strict| {
                Choice::Legacy {
                    algo: algo.into(),
                    math: math.into(),
                }
                .legacy_row(strict)
            };
            let transform = algo.starts_with("WINOGRAD") || algo.starts_with("FFT");
            assert_eq!(row("FMA", Strict::Exact).is_some(), !transform, "{algo}");
            assert_eq!(exact_f32_algo(a), !transform, "{algo}");
            assert!(row("FMA", Strict::NoTensorCores).is_some(), "{algo}");
            assert!(row("TENSOR_OP", Strict::Exact).is_none(), "{algo}");
        }
    }

    #[test]
    fn exact_choices_are_kept_apart_and_old_files_read_as_not_exact() {
        let plain = key(false);
        let exact = Key {
            exact_f32: true,
            ..key(false)
        };
        let mut c = Choices::default();
        let legacy = |algo: &str| Choice::Legacy {
            algo: algo.into(),
            math: "FMA".into(),
        };
        c.put(plain.clone(), legacy("WINOGRAD_NONFUSED"), Search::Fast);
        c.put(exact.clone(), legacy("IMPLICIT_GEMM"), Search::Fast);
        let text = String::from_utf8(c.render()).unwrap();
        // a key planned without the rule is written as before it existed
        assert_eq!(text.matches("exact_f32").count(), 1, "{text}");
        let back = Choices::parse(text.as_bytes()).unwrap();
        assert_eq!(back[&plain].choice, legacy("WINOGRAD_NONFUSED"));
        assert_eq!(back[&exact].choice, legacy("IMPLICIT_GEMM"));
    }

    #[test]
    fn file_names_are_safe() {
        assert_eq!(
            file_name("NVIDIA H100 80GB HBM3", (9, 0), 91900),
            "cudnn-choices-v5-NVIDIA_H100_80GB_HBM3-sm90-cudnn91900.json"
        );
    }

    /// Property tests of `parse` on corrupt and hand-edited files: it never panics, and what it
    /// keeps is a cache it would write again the same way.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;
        use proptest::test_runner::Config;

        /// Dimensions from tiny to absurd: the cache only compares keys, so none may matter.
        fn dim() -> impl Strategy<Value = usize> {
            prop_oneof![0usize..600, Just(usize::MAX), any::<usize>()]
        }

        fn key() -> impl Strategy<Value = Key> {
            let shape =
                (prop::array::uniform9(dim())).prop_map(|[n, c, h, w, k, r, s, stride, pad]| {
                    ConvShape {
                        n,
                        c,
                        h,
                        w,
                        k,
                        r,
                        s,
                        stride,
                        pad,
                        groups: 1,
                    }
                });
            (
                shape,
                prop::sample::select(vec![Layout::Nchw, Layout::Nhwc]),
                prop::sample::select(DType::ALL.to_vec()),
                prop_oneof![
                    any::<bool>().prop_map(|residual| Op::Fused { residual }),
                    Just(Op::Plain),
                    (
                        any::<bool>(),
                        prop::option::of(prop::sample::select(vec![
                            Act::Relu,
                            Act::Swish,
                            Act::Gelu,
                            Act::Sigmoid
                        ]))
                    )
                        .prop_map(|(residual, act)| Op::Epilogue { residual, act }),
                ],
                any::<bool>(),
                prop::option::of(dim()),
                any::<bool>(),
            )
                .prop_map(
                    |(shape, layout, dtype, op, legacy_only, workspace_limit, exact_f32)| Key {
                        conv: Conv {
                            shape,
                            layout,
                            dtype,
                        },
                        op,
                        legacy_only,
                        workspace_limit,
                        exact_f32,
                    },
                )
        }

        /// Names this build knows, and some it does not.
        fn name<T>(known: &[(&'static str, T)]) -> impl Strategy<Value = String> {
            let mut names: Vec<&str> = known.iter().map(|(n, _)| *n).collect();
            names.extend(["", "NO_SUCH", "implicit_gemm", "WINOGRAD ", "\u{0}"]);
            prop::sample::select(names).prop_map(str::to_string)
        }

        fn choice() -> impl Strategy<Value = Choice> {
            prop_oneof![
                (name(&FWD_ALGOS), name(&MATH_TYPES))
                    .prop_map(|(algo, math)| Choice::Legacy { algo, math }),
                (
                    prop::sample::select(vec![List::Heuristic, List::Fallback]),
                    prop_oneof![0usize..40, Just(usize::MAX)]
                )
                    .prop_map(|(list, index)| Choice::Graph { list, index }),
                Just(Choice::Split),
            ]
        }

        /// A damage to a file's text: at a fraction of its length, bytes removed and others
        /// put in their place.
        fn edit() -> impl Strategy<Value = (f64, usize, Vec<u8>)> {
            let token = prop_oneof![
                prop::sample::select(vec![
                    "-1",
                    "1e400",
                    "18446744073709551616",
                    "null",
                    "{",
                    "}",
                    "[",
                    "]",
                    ",",
                    "\"",
                    "\\u0000",
                    "\\ud800",
                    "NaN",
                    "\"api\":\"legacy\"",
                    "\"rank\":",
                    "\"fused\"",
                    "\"f17\"",
                ])
                .prop_map(|t| t.as_bytes().to_vec()),
                prop::collection::vec(any::<u8>(), 1..4),
            ];
            (0.0f64..1.0, 0usize..6, prop_oneof![Just(Vec::new()), token])
        }

        /// `parse` of its own output gives the same map back: whatever was kept from a damaged
        /// file is a well-formed cache.
        fn kept_entries_are_well_formed(map: &BTreeMap<Key, Stored>) {
            let c = Choices {
                map: map.clone(),
                ..Choices::default()
            };
            assert_eq!(&Choices::parse(&c.render()).unwrap(), map);
        }

        fn search() -> impl Strategy<Value = Search> {
            prop::sample::select(vec![Search::Fast, Search::Exhaustive])
        }

        proptest! {
            // about a second each in a debug build; PROPTEST_CASES raises it
            #![proptest_config(Config {
                cases: std::env::var("PROPTEST_CASES")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(2000),
                failure_persistence: None,
                ..Config::default()
            })]

            #[test]
            fn arbitrary_bytes_parse_without_panic(
                bytes in prop::collection::vec(any::<u8>(), 0..512),
            ) {
                kept_entries_are_well_formed(&Choices::parse(&bytes).unwrap_or_default());
            }

            #[test]
            fn damaged_files_parse_without_panic(
                entries in prop::collection::vec((key(), choice(), search()), 0..4),
                edits in prop::collection::vec(edit(), 0..4),
            ) {
                let mut c = Choices::default();
                for (k, v, how) in entries {
                    c.put(k, v, how);
                }
                let mut bytes = c.render();
                // the undamaged file reads back whole
                prop_assert_eq!(&Choices::parse(&bytes).unwrap(), &c.map);
                for (at, remove, insert) in edits {
                    let i = (bytes.len() as f64 * at) as usize;
                    let end = (i + remove).min(bytes.len());
                    bytes.splice(i..end, insert);
                }
                let kept = Choices::parse(&bytes).unwrap_or_default();
                kept_entries_are_well_formed(&kept);
                for (k, stored) in &kept {
                    let v = &stored.choice;
                    // an unknown name, a rank past the list or a strict tensor-core math type
                    // comes back as no row, which means measure again
                        let strict = match (k.conv.dtype.uses_tensor_cores(), k.exact_f32) {
                        (true, _) => Strict::Any,
                        (false, false) => Strict::NoTensorCores,
                        (false, true) => Strict::Exact,
                    };
                    if let Some(row) = v.legacy_row(strict) {
                        prop_assert!(
                            k.conv.dtype.uses_tensor_cores()
                                || row.math == dn::cudnnMathType_t::CUDNN_FMA_MATH
                        );
                        prop_assert!(strict != Strict::Exact || exact_f32_algo(row.algo));
                        prop_assert_eq!(&Choice::legacy(row), v);
                    }
                }
            }
        }
    }
}

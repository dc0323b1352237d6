//! The arithmetic of a collective sweep, exactly as NVIDIA's nccl-tests does it, so that figures
//! compare one to one: which sizes, how many elements each rank sends and receives for a row's
//! size, the bus-bandwidth factor, and what each rank's output must hold.

use gpukit_cuda::nccl::RedOp;
use gpukit_cuda::pattern::Expect;
use serde::{Deserialize, Serialize};

/// The collectives `bench nccl` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    /// `alltoall`, as nccl-tests and the tables name it.
    #[serde(rename = "alltoall")]
    AllToAll,
}

impl Collective {
    pub const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
    ];

    /// As nccl-tests' binaries and torch.distributed name them (`all_reduce`, `alltoall`).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
        }
    }

    pub fn parse(s: &str) -> Option<Collective> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        let s = if s == "all_to_all" { "alltoall" } else { &s };
        Collective::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Whether the collective reduces (and so has a reduction operation).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }

    /// Whether a single root sends or receives.
    pub fn rooted(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// busbw = algbw x this: what each link carries, so that figures of different rank counts
    /// compare with the hardware's bandwidth (nccl-tests' PERFORMANCE.md).
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (n - 1.0) / n
            }
            Collective::Broadcast | Collective::Reduce => 1.0,
        }
    }
}

/// The sizes of a sweep: `min`, `min x factor`, ... up to `max` (both in bytes).
pub fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        out.push(s);
        match s.checked_mul(factor.max(2)) {
            Some(next) => s = next,
            None => break,
        }
    }
    out
}

/// Element counts of one row (nccl-tests' `getCollByteCount`): `count` is what the size column
/// describes (the larger of the two buffers), `send` and `recv` what each rank's buffers hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub count: usize,
    pub send: usize,
    pub recv: usize,
}

impl Counts {
    /// For a row of `bytes` bytes of `word`-byte elements over `ranks` ranks; None when the size
    /// holds no element to send.
    pub fn of(op: Collective, bytes: usize, word: usize, ranks: usize) -> Option<Counts> {
        let n = ranks.max(1);
        let elems = bytes / word.max(1);
        let c = match op {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => Counts {
                count: elems,
                send: elems,
                recv: elems,
            },
            Collective::AllGather => {
                let per = elems / n;
                Counts {
                    count: per * n,
                    send: per,
                    recv: per * n,
                }
            }
            Collective::ReduceScatter => {
                let per = elems / n;
                Counts {
                    count: per * n,
                    send: per * n,
                    recv: per,
                }
            }
            Collective::AllToAll => {
                let per = elems / n;
                Counts {
                    count: per * n,
                    send: per * n,
                    recv: per * n,
                }
            }
        };
        (c.send > 0 && c.recv > 0).then_some(c)
    }
}

/// What rank `rank`'s output must hold after `op` when every rank's input holds the pattern
/// (`gpukit_cuda::pattern::value`); None where the output is not defined (reduce off the root).
pub fn expectation(
    op: Collective,
    counts: Counts,
    rank: usize,
    ranks: usize,
    redop: RedOp,
    root: usize,
) -> Option<Expect> {
    let reduced = |offset| Expect::Reduced {
        ranks,
        max: redop == RedOp::Max,
        min: redop == RedOp::Min,
        offset,
    };
    match op {
        Collective::AllReduce => Some(reduced(0)),
        Collective::Reduce => (rank == root).then(|| reduced(0)),
        Collective::ReduceScatter => Some(reduced(rank * counts.recv)),
        Collective::AllGather => Some(Expect::Gathered {
            block: counts.send,
            rank: None,
            offset: 0,
        }),
        Collective::Broadcast => Some(Expect::Gathered {
            block: counts.count,
            rank: Some(root),
            offset: 0,
        }),
        Collective::AllToAll => {
            let block = counts.count / ranks.max(1);
            Some(Expect::Gathered {
                block,
                rank: None,
                offset: rank * block,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpukit_cuda::pattern::value;

    #[test]
    fn sizes_double_from_min_to_max_inclusive() {
        assert_eq!(sizes(8, 64, 2), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 8), vec![8, 64]);
        assert_eq!(sizes(1 << 30, 1 << 30, 2), vec![1 << 30]);
        assert!(sizes(16, 8, 2).is_empty());
        assert_eq!(sizes(1, usize::MAX, 1 << 40).len(), 2);
    }

    #[test]
    fn counts_follow_nccl_tests() {
        // 2 ranks, f32, 1 KiB rows
        let ag = Counts::of(Collective::AllGather, 1024, 4, 2).unwrap();
        assert_eq!((ag.count, ag.send, ag.recv), (256, 128, 256));
        let rs = Counts::of(Collective::ReduceScatter, 1024, 4, 2).unwrap();
        assert_eq!((rs.count, rs.send, rs.recv), (256, 256, 128));
        let ar = Counts::of(Collective::AllReduce, 1024, 4, 2).unwrap();
        assert_eq!((ar.count, ar.send, ar.recv), (256, 256, 256));
        // 3 ranks: rounded down to a multiple of the rank count
        let a2a = Counts::of(Collective::AllToAll, 40, 4, 3).unwrap();
        assert_eq!(a2a.count, 9);
        // nothing to send: no row
        assert_eq!(Counts::of(Collective::AllGather, 4, 4, 2), None);
        assert_eq!(Counts::of(Collective::AllReduce, 2, 4, 2), None);
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Collective::AllToAll.bus_factor(2), 0.5);
    }

    #[test]
    fn expectations_match_a_host_simulation_of_each_collective() {
        let ranks = 3;
        for op in Collective::ALL {
            let c = Counts::of(op, 36 * 4, 4, ranks).unwrap();
            let inputs: Vec<Vec<f64>> = (0..ranks)
                .map(|r| (0..c.send).map(|i| value(r, i)).collect())
                .collect();
            for rank in 0..ranks {
                let want: Vec<f64> = match op {
                    Collective::AllReduce | Collective::Reduce => (0..c.recv)
                        .map(|i| inputs.iter().map(|v| v[i]).sum())
                        .collect(),
                    Collective::ReduceScatter => (0..c.recv)
                        .map(|i| inputs.iter().map(|v| v[rank * c.recv + i]).sum())
                        .collect(),
                    Collective::AllGather => inputs.concat(),
                    Collective::Broadcast => inputs[1].clone(),
                    Collective::AllToAll => {
                        let b = c.count / ranks;
                        (0..ranks)
                            .flat_map(|p| inputs[p][rank * b..(rank + 1) * b].to_vec())
                            .collect()
                    }
                };
                match expectation(op, c, rank, ranks, RedOp::Sum, 1) {
                    Some(e) => {
                        let got: Vec<f64> = (0..c.recv).map(|i| e.at(i)).collect();
                        assert_eq!(got, want, "{op:?} rank {rank}");
                    }
                    None => assert!(op == Collective::Reduce && rank != 1),
                }
            }
        }
    }

    #[test]
    fn collectives_parse_by_their_usual_names() {
        for c in Collective::ALL {
            assert_eq!(Collective::parse(c.name()), Some(c));
            // JSON names them as the tables do
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                serde_json::Value::from(c.name())
            );
        }
        assert_eq!(Collective::parse("all-reduce"), Some(Collective::AllReduce));
        assert_eq!(Collective::parse("all_to_all"), Some(Collective::AllToAll));
        assert_eq!(Collective::parse("gather"), None);
    }
}

//! Checking collectives on the GPU, as nccl-tests does: every rank fills its input with small
//! integers that depend on the rank and the element ([`value`]), so that every collective's exact
//! result is known in every dtype, and a kernel counts the output elements that differ from it.
//! Nothing is copied to the host but the count, so a 1 GiB result is checked in microseconds.
//!
//! To use: [`Pattern::new`] once per GPU; [`Pattern::fill`] an input; run the collective;
//! [`Pattern::count_wrong`] with the [`Expect`] that describes its result.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::kernel::{grid_for, tag, Arg, KernelModule, KernelSource, HALF};
use crate::loader::Discovery;
use crate::memory::{DeviceBuffer, View};
use crate::stream::Stream;
use gpukit_types::DType;

/// Element `index` of rank `rank`'s input: an integer in -8..=8, exact in every float type, and
/// any sum of up to 32 of them is exact in bf16 (and of up to 256 in f16).
pub fn value(rank: usize, index: usize) -> f64 {
    ((index as u64 * 7 + rank as u64 * 13) % 17) as f64 - 8.0
}

/// What each output element should be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// `op` over ranks 0..ranks of `value(r, offset + i)` (all_reduce, reduce, reduce_scatter).
    Reduced {
        ranks: usize,
        max: bool,
        min: bool,
        offset: usize,
    },
    /// Element i comes from rank `i / block` (or `rank` when given), element `offset + i % block`
    /// of its input (all_gather, alltoall, broadcast).
    Gathered {
        block: usize,
        rank: Option<usize>,
        offset: usize,
    },
}

impl Expect {
    /// The expected element `i`, computed on the host (for tests, and to document the kernel).
    pub fn at(&self, i: usize) -> f64 {
        match *self {
            Expect::Reduced {
                ranks,
                max,
                min,
                offset,
            } => {
                let vals = (0..ranks).map(|r| value(r, offset + i));
                if max {
                    vals.fold(f64::NEG_INFINITY, f64::max)
                } else if min {
                    vals.fold(f64::INFINITY, f64::min)
                } else {
                    vals.sum()
                }
            }
            Expect::Gathered {
                block,
                rank,
                offset,
            } => value(rank.unwrap_or(i / block.max(1)), offset + i % block.max(1)),
        }
    }
}

const SOURCE: &str = r#"
__device__ __forceinline__ float pattern(long rank, long index) {
    return (float)((unsigned long long)(index * 7 + rank * 13) % 17ull) - 8.0f;
}

template <class T>
__device__ void fill(T* x, long n, int rank, long offset) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n;
         i += (long)gridDim.x * blockDim.x) {
        x[i] = from_f<T>(pattern(rank, offset + i));
    }
}

// mode 0: reduce over `ranks` ranks of pattern(r, offset + i); op 0 sum, 1 max, 2 min.
// mode 1: pattern(fixed >= 0 ? fixed : i / block, offset + i % block).
template <class T>
__device__ void count_wrong(const T* y, long n, int mode, int ranks, int op, long block,
                            int fixed, long offset, unsigned long long* wrong) {
    unsigned long long mine = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n;
         i += (long)gridDim.x * blockDim.x) {
        float want;
        if (mode == 0) {
            want = pattern(0, offset + i);
            for (int r = 1; r < ranks; ++r) {
                float v = pattern(r, offset + i);
                want = op == 1 ? fmaxf(want, v) : op == 2 ? fminf(want, v) : want + v;
            }
        } else {
            long src = fixed >= 0 ? fixed : i / block;
            want = pattern(src, offset + i % block);
        }
        if (to_f(y[i]) != want) mine += 1;
    }
    if (mine) atomicAdd(wrong, mine);
}

#define PATTERN(T, TAG)                                                                       \
extern "C" __global__ void fill_##TAG(T* x, long n, int rank, long offset)                   \
    { fill<T>(x, n, rank, offset); }                                                          \
extern "C" __global__ void count_wrong_##TAG(const T* y, long n, int mode, int ranks, int op, \
    long block, int fixed, long offset, unsigned long long* wrong)                            \
    { count_wrong<T>(y, n, mode, ranks, op, block, fixed, offset, wrong); }

PATTERN(float, f32)
PATTERN(H, f16)
PATTERN(B, bf16)
"#;

/// The module's name in the kernel cache.
const STEM: &str = "pattern";

/// The pattern kernels' module: its name in the cache, its whole CUDA C source and the kernels
/// loaded from it (also what `gpukit all` compiles ahead).
pub fn kernel_source() -> KernelSource {
    let mut names = Vec::new();
    for t in ["f32", "f16", "bf16"] {
        names.push(format!("fill_{t}"));
        names.push(format!("count_wrong_{t}"));
    }
    KernelSource {
        stem: STEM,
        source: format!("{HALF}{SOURCE}"),
        names,
    }
}

/// The pattern kernels of one GPU, with the counter they add to.
pub struct Pattern {
    stream: Stream,
    module: KernelModule,
    counter: DeviceBuffer,
}

impl Pattern {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Pattern> {
        let module = KernelModule::load(discovery, gpu, &kernel_source())?;
        Ok(Pattern {
            stream: gpu.stream().clone(),
            module,
            counter: gpu.alloc(8)?,
        })
    }

    /// `x[i] = value(rank, offset + i)` for `count` elements (queued on the GPU's stream).
    pub fn fill(&self, x: View<'_>, count: usize, dtype: DType, rank: usize) -> Result<()> {
        x.require(count * dtype.size_bytes(), "pattern fill")?;
        let args = [Arg::Ptr(x), Arg::Size(count), Arg::Size(rank), Arg::I64(0)];
        let name = format!("fill_{}", tag(dtype));
        self.module
            .launch(&name, &self.stream, grid_for(count), &args)
    }

    /// How many of `count` elements of `y` differ from `expect` (waits for the GPU's stream).
    pub fn count_wrong(
        &self,
        y: View<'_>,
        count: usize,
        dtype: DType,
        expect: Expect,
    ) -> Result<u64> {
        y.require(count * dtype.size_bytes(), "pattern check")?;
        let (mode, ranks, op, block, fixed, offset) = match expect {
            Expect::Reduced {
                ranks,
                max,
                min,
                offset,
            } => (
                0i32,
                ranks,
                i32::from(max) + 2 * i32::from(min),
                1,
                -1,
                offset,
            ),
            Expect::Gathered {
                block,
                rank,
                offset,
            } => {
                let fixed = match rank {
                    Some(r) => i32::try_from(r)
                        .map_err(|_| Error::Invalid(format!("rank {r} exceeds i32")))?,
                    None => -1,
                };
                (1, 1, 0, block.max(1), fixed, offset)
            }
        };
        if ranks > i32::MAX as usize {
            return Err(Error::Invalid(format!("{ranks} ranks")));
        }
        // SAFETY: the counter holds 8 bytes of this GPU's memory.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.counter.view().addr(),
                0,
                8,
                self.stream.cu(),
            )
        }?;
        // y holds `count` elements (checked); the counter holds one u64
        let args = [
            Arg::Ptr(y),
            Arg::Size(count),
            Arg::I32(mode),
            Arg::Size(ranks),
            Arg::I32(op),
            Arg::Size(block),
            Arg::I32(fixed),
            Arg::Size(offset),
            Arg::Ptr(self.counter.view()),
        ];
        let name = format!("count_wrong_{}", tag(dtype));
        self.module
            .launch(&name, &self.stream, grid_for(count), &args)?;
        let mut out = [0u8; 8];
        crate::transfer::copy_d2h(&self.stream, &self.counter, &mut out)?;
        self.stream.synchronize()?;
        Ok(u64::from_le_bytes(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Param;

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        use Param::{Ptr, I32, I64};
        let got = kernel_source().signatures().unwrap();
        assert_eq!(got.len(), 6);
        for t in ["f32", "f16", "bf16"] {
            assert_eq!(got[&format!("fill_{t}")], [Ptr, I64, I32, I64]);
            assert_eq!(
                got[&format!("count_wrong_{t}")],
                [Ptr, I64, I32, I32, I32, I64, I32, I64, Ptr]
            );
        }
    }

    #[test]
    fn values_are_small_integers_and_sums_of_32_ranks_stay_exact_in_bf16() {
        for r in 0..40 {
            for i in 0..200 {
                let v = value(r, i);
                assert!(v.fract() == 0.0 && (-8.0..=8.0).contains(&v));
            }
        }
        // bf16 has 8 significant bits: integers up to 256 are exact
        let e = Expect::Reduced {
            ranks: 32,
            max: false,
            min: false,
            offset: 0,
        };
        assert!((0..1000).all(|i| e.at(i).abs() <= 256.0));
    }

    #[test]
    fn expectations_describe_each_collective() {
        // all_gather of 3 ranks, 4 elements each: element 5 is rank 1's element 1
        let g = Expect::Gathered {
            block: 4,
            rank: None,
            offset: 0,
        };
        assert_eq!(g.at(5), value(1, 1));
        // broadcast from root 2
        let b = Expect::Gathered {
            block: 10,
            rank: Some(2),
            offset: 0,
        };
        assert_eq!(b.at(7), value(2, 7));
        // reduce_scatter, rank 1 of 2 with 8 elements each: its block starts at 8
        let rs = Expect::Reduced {
            ranks: 2,
            max: false,
            min: false,
            offset: 8,
        };
        assert_eq!(rs.at(3), value(0, 11) + value(1, 11));
        let mx = Expect::Reduced {
            ranks: 3,
            max: true,
            min: false,
            offset: 0,
        };
        assert_eq!(mx.at(0), value(0, 0).max(value(1, 0)).max(value(2, 0)));
    }
}

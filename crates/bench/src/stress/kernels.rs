//! The stress test's CUDA C: memory patterns written and counted on the GPU, a word-by-word
//! comparison of two results that counts the words that differ, and the one-word flip of the
//! planted fault. Nothing but counts comes back to the host.
//!
//! To use: [`StressKernels::load`] once per GPU; [`StressKernels::fill`] then
//! [`StressKernels::count_wrong`] over a range of words; [`StressKernels::count_unequal`] into
//! a counter read back with [`StressKernels::take_count`].

use crate::error::Result;
use gpukit_cuda::kernel::{grid_for, Arg, KernelModule, KernelSource};
use gpukit_cuda::loader::Discovery;
use gpukit_cuda::{DeviceBuffer, Gpu, Stream, View};
use serde::{Deserialize, Serialize};

/// A memory test pattern: what word `i` of the tested range holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// The word's own index mixed with the seed: a word written to the wrong address is read
    /// back as another's.
    Address,
    /// One bit set, walking across the word from index to index.
    WalkingOnes,
    /// One bit clear, walking.
    WalkingZeros,
    /// Seeded pseudo-random words (splitmix64 of the seed and the index).
    Random,
}

impl Pattern {
    /// The patterns in the order a pass writes them.
    pub const ALL: [Pattern; 4] = [
        Pattern::Address,
        Pattern::WalkingOnes,
        Pattern::WalkingZeros,
        Pattern::Random,
    ];

    fn code(self) -> i32 {
        match self {
            Pattern::Address => 0,
            Pattern::WalkingOnes => 1,
            Pattern::WalkingZeros => 2,
            Pattern::Random => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pattern::Address => "address",
            Pattern::WalkingOnes => "walking ones",
            Pattern::WalkingZeros => "walking zeros",
            Pattern::Random => "random",
        }
    }

    /// Word `index` of this pattern under `seed`: the host's copy of the kernel's
    /// `pattern_word`, which documents it and is what the tests check.
    pub fn word(self, index: u64, seed: u64) -> u32 {
        match self {
            Pattern::Address => ((index ^ (index >> 32)) as u32) ^ (seed as u32),
            Pattern::WalkingOnes => 1u32 << (index.wrapping_add(seed) & 31),
            Pattern::WalkingZeros => !(1u32 << (index.wrapping_add(seed) & 31)),
            Pattern::Random => {
                let mut z =
                    seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)) as u32
            }
        }
    }
}

const SOURCE: &str = r#"
__device__ __forceinline__ unsigned pattern_word(int kind, unsigned long long i,
                                                 unsigned long long seed) {
    if (kind == 0) return (unsigned)(i ^ (i >> 32)) ^ (unsigned)seed;
    if (kind == 1) return 1u << ((i + seed) & 31ull);
    if (kind == 2) return ~(1u << ((i + seed) & 31ull));
    unsigned long long z = seed + (i + 1ull) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (unsigned)(z ^ (z >> 31));
}

// x[i] = pattern(base + i) for `words` words.
extern "C" __global__ void mem_fill(unsigned* x, long words, long base, int kind,
                                    unsigned long long seed) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < words;
         i += (long)gridDim.x * blockDim.x) {
        x[i] = pattern_word(kind, (unsigned long long)(base + i), seed);
    }
}

// wrong[0] += how many of `words` words differ from pattern(base + i).
extern "C" __global__ void mem_check(const unsigned* x, long words, long base, int kind,
                                     unsigned long long seed, unsigned long long* wrong) {
    unsigned long long mine = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < words;
         i += (long)gridDim.x * blockDim.x) {
        mine += x[i] != pattern_word(kind, (unsigned long long)(base + i), seed);
    }
    if (mine) atomicAdd(wrong, mine);
}

// wrong[0] += how many of `words` 32-bit words of a and b differ.
extern "C" __global__ void count_unequal_words(const unsigned* a, const unsigned* b, long words,
                                               unsigned long long* wrong) {
    unsigned long long mine = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < words;
         i += (long)gridDim.x * blockDim.x) {
        mine += a[i] != b[i];
    }
    if (mine) atomicAdd(wrong, mine);
}

// The planted fault: x[index] ^= mask (one thread).
extern "C" __global__ void flip_word(unsigned* x, long index, int mask) {
    if (blockIdx.x == 0 && threadIdx.x == 0) x[index] ^= (unsigned)mask;
}
"#;

/// The module's name in the kernel cache.
const STEM: &str = "stress";

/// The stress kernels' module: its name in the cache, its source and the kernels it loads.
pub fn kernel_source() -> KernelSource {
    KernelSource {
        stem: STEM,
        source: SOURCE.to_string(),
        names: ["mem_fill", "mem_check", "count_unequal_words", "flip_word"]
            .map(String::from)
            .to_vec(),
    }
}

/// The stress kernels of one GPU, with the counter they add to.
pub struct StressKernels {
    stream: Stream,
    module: KernelModule,
    counter: DeviceBuffer,
}

impl StressKernels {
    pub fn load(discovery: &Discovery, gpu: &Gpu) -> Result<StressKernels> {
        Ok(StressKernels {
            stream: gpu.stream().clone(),
            module: KernelModule::load(discovery, gpu, &kernel_source())?,
            counter: gpu.alloc(8)?,
        })
    }

    /// Writes `pattern` over the `words` 32-bit words of `x`, numbered from `base` (queued).
    pub fn fill(
        &self,
        x: View<'_>,
        words: usize,
        base: usize,
        p: Pattern,
        seed: u64,
    ) -> Result<()> {
        x.require(words * 4, "memory pattern fill")?;
        let args = [
            Arg::Ptr(x),
            Arg::Size(words),
            Arg::Size(base),
            Arg::I32(p.code()),
            Arg::U64(seed),
        ];
        Ok(self
            .module
            .launch("mem_fill", &self.stream, grid_for(words), &args)?)
    }

    /// Adds to the counter how many of the `words` words of `x` differ from `pattern` (queued).
    pub fn count_wrong(
        &self,
        x: View<'_>,
        words: usize,
        base: usize,
        p: Pattern,
        seed: u64,
    ) -> Result<()> {
        x.require(words * 4, "memory pattern check")?;
        let args = [
            Arg::Ptr(x),
            Arg::Size(words),
            Arg::Size(base),
            Arg::I32(p.code()),
            Arg::U64(seed),
            Arg::Ptr(self.counter.view()),
        ];
        Ok(self
            .module
            .launch("mem_check", &self.stream, grid_for(words), &args)?)
    }

    /// Adds to the counter how many of the first `words` 32-bit words of `a` and `b` differ
    /// (queued).
    pub fn count_unequal(&self, a: View<'_>, b: View<'_>, words: usize) -> Result<()> {
        a.require(words * 4, "result comparison a")?;
        b.require(words * 4, "result comparison b")?;
        let args = [
            Arg::Ptr(a),
            Arg::Ptr(b),
            Arg::Size(words),
            Arg::Ptr(self.counter.view()),
        ];
        Ok(self
            .module
            .launch("count_unequal_words", &self.stream, grid_for(words), &args)?)
    }

    /// The planted fault: flips the bits of `mask` in word `index` of `x` (queued).
    pub fn flip(&self, x: View<'_>, index: usize, mask: u32) -> Result<()> {
        x.require((index + 1) * 4, "planted fault")?;
        let args = [Arg::Ptr(x), Arg::Size(index), Arg::I32(mask as i32)];
        Ok(self
            .module
            .launch("flip_word", &self.stream, grid_for(1), &args)?)
    }

    /// The counter's value (waits for the stream), and resets it to zero.
    pub fn take_count(&self, gpu: &Gpu) -> Result<u64> {
        self.stream.synchronize()?;
        let bytes = gpu.download(&self.counter)?;
        gpu.fill(self.counter.view(), 0)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes.get(..8).unwrap_or(&[0; 8]));
        Ok(u64::from_le_bytes(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_take_what_the_launchers_pass() {
        let expected = [
            ("mem_fill", "p l l i u"),
            ("mem_check", "p l l i u p"),
            ("count_unequal_words", "p p l p"),
            ("flip_word", "p l i"),
        ];
        let differences = kernel_source().signature_differences(&expected, &[]);
        assert!(differences.is_empty(), "{differences:#?}");
    }

    #[test]
    fn walking_patterns_set_or_clear_exactly_one_bit() {
        for i in 0..100u64 {
            assert_eq!(Pattern::WalkingOnes.word(i, 7).count_ones(), 1);
            assert_eq!(Pattern::WalkingZeros.word(i, 7).count_zeros(), 1);
        }
        // the bit walks: 32 neighbours cover every bit
        let all = (0..32u64).fold(0u32, |m, i| m | Pattern::WalkingOnes.word(i, 0));
        assert_eq!(all, u32::MAX);
    }

    #[test]
    fn address_and_random_words_differ_from_their_neighbours_and_by_seed() {
        for p in [Pattern::Address, Pattern::Random] {
            let words: Vec<u32> = (0..1000u64).map(|i| p.word(i, 42)).collect();
            assert!(words.windows(2).all(|w| w[0] != w[1]), "{p:?}");
            let other: Vec<u32> = (0..1000u64).map(|i| p.word(i, 43)).collect();
            assert!(words.iter().zip(&other).all(|(a, b)| a != b), "{p:?}");
        }
        // random words use the whole word: about half the bits set
        let ones: u32 = (0..4096u64)
            .map(|i| Pattern::Random.word(i, 1).count_ones())
            .sum();
        let mean = f64::from(ones) / 4096.0;
        assert!((15.0..17.0).contains(&mean), "{mean}");
    }
}

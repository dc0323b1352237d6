//! The packed convolution's AVX-512 micro-kernel: the `Tile` it computes, laid out for the
//! assembly, and the inline assembly itself (x86-64 only, run after runtime detection).

/// Output channels per weight panel and per micro-kernel tile (four 16-float vectors): the tile
/// shape the assembly is written for.
pub(super) const PANEL: usize = 64;

/// Output pixels per micro-kernel tile: 7 rows x 4 vectors = 28 accumulators, plus 3 weight
/// vectors and a broadcast fill the 32 AVX-512 registers. Seven divides every ResNet feature
/// map at 224 x 224 (112, 56, 28, 14, 7), so no tile is partly wasted.
pub(super) const ROWS: usize = 7;

/// What one micro-kernel call computes: for each of `ROWS` output rows j,
/// `out[j][0..64] = epilogue(init + sum over taps t, depth d of row(t, j)[d] * weight[t][d][..])`
/// where `row(t, j)` is `rows[t][j]` advanced by `offset` bytes, `init` is `out[j]` itself when
/// `accumulate` (a partial sum from an earlier call) and the bias otherwise, and the epilogue
/// adds `residual[j]` when `has_residual` and clamps at zero when `relu`. The layout is shared
/// with the assembly kernel, which reads fields by byte offset.
#[repr(C)]
pub(super) struct Tile {
    /// `taps` groups of `ROWS` row pointers, each row `depth` floats past `offset`.
    pub(super) rows: *const *const f32,
    /// The panel: `taps * depth` steps of 64 floats.
    pub(super) weight: *const f32,
    pub(super) taps: usize,
    pub(super) depth: usize,
    /// 64 floats.
    pub(super) bias: *const f32,
    /// 64 writable floats per row (readable too when `accumulate`).
    pub(super) out: [*mut f32; ROWS],
    /// 64 readable floats per row when `has_residual`.
    pub(super) residual: [*const f32; ROWS],
    pub(super) relu: usize,
    pub(super) has_residual: usize,
    /// Where to prefetch weights for a later tile from, one cache line per depth step (into
    /// L2; prefetching never faults, any address will do).
    pub(super) prefetch: *const f32,
    pub(super) accumulate: usize,
    /// Bytes to skip at the start of every row.
    pub(super) offset: usize,
}

/// Row j's part of one depth step of the AVX-512 kernel: broadcast its value at byte `$a` of
/// its row pointer `$row`, multiply it by the panel's four weight vectors (three in zmm28-30,
/// the fourth read from `[rsi + $w3]`) into its accumulators `$a0..$a3`.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_fma {
    ($row:literal, $a:literal, $w3:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "vbroadcastss zmm31, dword ptr [", $row, " + ", $a, "]\n",
            "vfmadd231ps zmm", $a0, ", zmm28, zmm31\n",
            "vfmadd231ps zmm", $a1, ", zmm29, zmm31\n",
            "vfmadd231ps zmm", $a2, ", zmm30, zmm31\n",
            "vfmadd231ps zmm", $a3, ", zmm31, [rsi + ", $w3, "]\n",
        )
    };
}

/// One depth step of the AVX-512 kernel, `$a` bytes into the rows and `$w0` into the panel:
/// 7 rows x 4 vectors = 28 FMAs. The fourth weight vector is a memory operand (there is no
/// register left for it), which keeps the loads at 10 full vectors and 7 scalars per 28 FMAs.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_step {
    ($a:literal, $w0:literal, $w1:literal, $w2:literal, $w3:literal) => {
        concat!(
            "vmovups zmm28, [rsi + ", $w0, "]\n",
            "vmovups zmm29, [rsi + ", $w1, "]\n",
            "vmovups zmm30, [rsi + ", $w2, "]\n",
            avx512_row_fma!("rax", $a, $w3, "0", "1", "2", "3"),
            avx512_row_fma!("rcx", $a, $w3, "4", "5", "6", "7"),
            avx512_row_fma!("rdx", $a, $w3, "8", "9", "10", "11"),
            avx512_row_fma!("r10", $a, $w3, "12", "13", "14", "15"),
            avx512_row_fma!("r11", $a, $w3, "16", "17", "18", "19"),
            avx512_row_fma!("r12", $a, $w3, "20", "21", "22", "23"),
            avx512_row_fma!("r14", $a, $w3, "24", "25", "26", "27"),
        )
    };
}

/// Advances the seven row pointers by `$b` bytes (a number, or a memory operand).
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_advance_rows {
    ($b:literal) => {
        concat!(
            "add rax, ", $b, "\n", "add rcx, ", $b, "\n", "add rdx, ", $b, "\n",
            "add r10, ", $b, "\n", "add r11, ", $b, "\n", "add r12, ", $b, "\n",
            "add r14, ", $b, "\n",
        )
    };
}

/// Loads the pointer at byte `$field` of the tile into rax, then applies `$op` to accumulators
/// `$a0..$a3` with the four vectors there: `$op zmm, zmm, [rax + 64v]`.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_mem {
    ($op:literal, $field:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "mov rax, [rdi + ", $field, "]\n",
            $op, " zmm", $a0, ", zmm", $a0, ", [rax]\n",
            $op, " zmm", $a1, ", zmm", $a1, ", [rax + 64]\n",
            $op, " zmm", $a2, ", zmm", $a2, ", [rax + 128]\n",
            $op, " zmm", $a3, ", zmm", $a3, ", [rax + 192]\n",
        )
    };
}

/// Loads the pointer at byte `$field` of the tile into rax and loads accumulators `$a0..$a3`
/// from there.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_load {
    ($field:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "mov rax, [rdi + ", $field, "]\n",
            "vmovups zmm", $a0, ", [rax]\n",
            "vmovups zmm", $a1, ", [rax + 64]\n",
            "vmovups zmm", $a2, ", [rax + 128]\n",
            "vmovups zmm", $a3, ", [rax + 192]\n",
        )
    };
}

/// Loads the pointer at byte `$field` of the tile into rax and stores accumulators `$a0..$a3`
/// there.
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_store {
    ($field:literal, $a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "mov rax, [rdi + ", $field, "]\n",
            "vmovups [rax], zmm", $a0, "\n",
            "vmovups [rax + 64], zmm", $a1, "\n",
            "vmovups [rax + 128], zmm", $a2, "\n",
            "vmovups [rax + 192], zmm", $a3, "\n",
        )
    };
}

/// Sets accumulators `$a0..$a3` to the bias in zmm28-31, or clamps them at zero (zmm28).
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_init {
    ($a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "vmovaps zmm", $a0, ", zmm28\n", "vmovaps zmm", $a1, ", zmm29\n",
            "vmovaps zmm", $a2, ", zmm30\n", "vmovaps zmm", $a3, ", zmm31\n",
        )
    };
}
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! avx512_row_relu {
    ($a0:literal, $a1:literal, $a2:literal, $a3:literal) => {
        concat!(
            "vmaxps zmm", $a0, ", zmm", $a0, ", zmm28\n", "vmaxps zmm", $a1, ", zmm", $a1, ", zmm28\n",
            "vmaxps zmm", $a2, ", zmm", $a2, ", zmm28\n", "vmaxps zmm", $a3, ", zmm", $a3, ", zmm28\n",
        )
    };
}

/// The AVX-512 micro-kernel: a 7 x 64 tile in 28 zmm accumulators (row j in zmm4j..4j+3), the
/// depth loop unrolled by 4. Written as inline assembly because the AVX-512 intrinsics and
/// target feature are newer than this crate's minimum Rust; it only ever runs after runtime
/// detection, and declares every register it touches: the System V ABI's caller-saved set
/// (named explicitly, so that on Windows too, where rsi, rdi and xmm6-15 are callee-saved, the
/// compiler saves what it needs), plus r12, r13, r14 and r15.
///
/// # Safety
///
/// As `Kernel::run`, on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn tile_avx512(t: &Tile) {
    // SAFETY: the kernel reads the rows, weights, bias and residual rows and writes the output
    // rows within the extents the caller guarantees, at the `Tile` field offsets checked below;
    // it uses no stack, and vzeroupper avoids AVX-SSE transition penalties after it.
    unsafe {
        std::arch::asm!(
            // accumulators = the partial sums in out (accumulate at 176), else the bias
            "cmp qword ptr [rdi + 176], 0",
            "je 9f",
            avx512_row_load!("40", "0", "1", "2", "3"),
            avx512_row_load!("48", "4", "5", "6", "7"),
            avx512_row_load!("56", "8", "9", "10", "11"),
            avx512_row_load!("64", "12", "13", "14", "15"),
            avx512_row_load!("72", "16", "17", "18", "19"),
            avx512_row_load!("80", "20", "21", "22", "23"),
            avx512_row_load!("88", "24", "25", "26", "27"),
            "jmp 23f",
            "9:",
            "mov rax, [rdi + 32]",
            "vmovups zmm28, [rax]",
            "vmovups zmm29, [rax + 64]",
            "vmovups zmm30, [rax + 128]",
            "vmovups zmm31, [rax + 192]",
            avx512_row_init!("0", "1", "2", "3"),
            avx512_row_init!("4", "5", "6", "7"),
            avx512_row_init!("8", "9", "10", "11"),
            avx512_row_init!("12", "13", "14", "15"),
            avx512_row_init!("16", "17", "18", "19"),
            avx512_row_init!("20", "21", "22", "23"),
            avx512_row_init!("24", "25", "26", "27"),
            "23:",
            "mov r15, [rdi + 168]",
            "mov rsi, [rdi + 8]",
            "mov r9, [rdi]",
            "mov r8, [rdi + 16]",
            // for each tap: its seven row pointers, then the depth loop
            "2:",
            "mov rax, [r9]",
            "mov rcx, [r9 + 8]",
            "mov rdx, [r9 + 16]",
            "mov r10, [r9 + 24]",
            "mov r11, [r9 + 32]",
            "mov r12, [r9 + 40]",
            "mov r14, [r9 + 48]",
            "add r9, 56",
            avx512_advance_rows!("[rdi + 184]"),
            "mov r13, [rdi + 24]",
            "cmp r13, 4",
            "jb 4f",
            // (aligned: the loop's placement otherwise moved with unrelated code, ~2% either way)
            ".p2align 6",
            "3:",
            avx512_step!("0", "0", "64", "128", "192"),
            avx512_step!("4", "256", "320", "384", "448"),
            avx512_step!("8", "512", "576", "640", "704"),
            avx512_step!("12", "768", "832", "896", "960"),
            "prefetcht1 [r15]",
            "prefetcht1 [r15 + 64]",
            "prefetcht1 [r15 + 128]",
            "prefetcht1 [r15 + 192]",
            "add r15, 256",
            "add rsi, 1024",
            avx512_advance_rows!("16"),
            "sub r13, 4",
            "cmp r13, 4",
            "jae 3b",
            "4:",
            "test r13, r13",
            "jz 6f",
            "5:",
            avx512_step!("0", "0", "64", "128", "192"),
            "prefetcht1 [r15]",
            "add r15, 64",
            "add rsi, 256",
            avx512_advance_rows!("4"),
            "dec r13",
            "jnz 5b",
            "6:",
            "dec r8",
            "jnz 2b",
            // epilogue: + residual (has_residual at 160, pointers from 96), ReLU (relu at
            // 152), store (pointers from 40)
            "cmp qword ptr [rdi + 160], 0",
            "je 7f",
            avx512_row_mem!("vaddps", "96", "0", "1", "2", "3"),
            avx512_row_mem!("vaddps", "104", "4", "5", "6", "7"),
            avx512_row_mem!("vaddps", "112", "8", "9", "10", "11"),
            avx512_row_mem!("vaddps", "120", "12", "13", "14", "15"),
            avx512_row_mem!("vaddps", "128", "16", "17", "18", "19"),
            avx512_row_mem!("vaddps", "136", "20", "21", "22", "23"),
            avx512_row_mem!("vaddps", "144", "24", "25", "26", "27"),
            "7:",
            "cmp qword ptr [rdi + 152], 0",
            "je 8f",
            "vpxord zmm28, zmm28, zmm28",
            avx512_row_relu!("0", "1", "2", "3"),
            avx512_row_relu!("4", "5", "6", "7"),
            avx512_row_relu!("8", "9", "10", "11"),
            avx512_row_relu!("12", "13", "14", "15"),
            avx512_row_relu!("16", "17", "18", "19"),
            avx512_row_relu!("20", "21", "22", "23"),
            avx512_row_relu!("24", "25", "26", "27"),
            "8:",
            avx512_row_store!("40", "0", "1", "2", "3"),
            avx512_row_store!("48", "4", "5", "6", "7"),
            avx512_row_store!("56", "8", "9", "10", "11"),
            avx512_row_store!("64", "12", "13", "14", "15"),
            avx512_row_store!("72", "16", "17", "18", "19"),
            avx512_row_store!("80", "20", "21", "22", "23"),
            avx512_row_store!("88", "24", "25", "26", "27"),
            "vzeroupper",
            in("rdi") t as *const Tile,
            out("r12") _,
            out("r13") _,
            out("r14") _,
            out("r15") _,
            clobber_abi("sysv64"),
            options(nostack),
        );
    }
}

// The byte offsets the assembly kernel reads `Tile` at, and the shape it is written for.
#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(std::mem::offset_of!(Tile, rows) == 0);
    assert!(std::mem::offset_of!(Tile, weight) == 8);
    assert!(std::mem::offset_of!(Tile, taps) == 16);
    assert!(std::mem::offset_of!(Tile, depth) == 24);
    assert!(std::mem::offset_of!(Tile, bias) == 32);
    assert!(std::mem::offset_of!(Tile, out) == 40);
    assert!(std::mem::offset_of!(Tile, residual) == 96);
    assert!(std::mem::offset_of!(Tile, relu) == 152);
    assert!(std::mem::offset_of!(Tile, has_residual) == 160);
    assert!(std::mem::offset_of!(Tile, prefetch) == 168);
    assert!(std::mem::offset_of!(Tile, accumulate) == 176);
    assert!(std::mem::offset_of!(Tile, offset) == 184);
    assert!(ROWS == 7 && PANEL == 64);
};

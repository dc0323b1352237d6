//! Packed NHWC convolution with a fused epilogue (the inference engine's path).
//!
//! The weights are packed once into panels of `PANEL` output channels, each panel stored
//! depth-major (for every filter tap and input channel, its `PANEL` weights side by side), so the
//! micro-kernel streams one panel with plain vector loads. Activations stay NHWC, where the S
//! filter taps of one filter row read S * C adjacent input values: the kernel reads them in
//! place through a table of row pointers, one per filter row and output pixel (rows wholly in
//! the padding point at a zero row; only rows clipped by the left or right padding are copied,
//! zero-filled), so there is no im2col matrix. Each micro-kernel tile is `ROWS` output pixels by
//! `PANEL` channels held in registers over the reduction, then bias, residual and ReLU are
//! applied before the store. Panels larger than L2 are reduced in chunks (partial sums kept in
//! the output rows), and tiles prefetch the weights the next tiles will need. CPUs without
//! AVX-512, and any CPU under `GPUKIT_CPU_KERNEL=gemm`, run the same decomposition through the
//! gemm crate instead (`Kernel::Gemm`). The AVX-512 micro-kernel itself is in `avx512`; the
//! threads that share the work out are the team's (`team`).

#[cfg(target_arch = "x86_64")]
use super::avx512::{tile_avx512, Tile, PANEL, ROWS};
use super::im2col::im2col_nhwc_row;
use super::team::run_parts;
use super::{threads, SharedOut};
use gemm::Parallelism;
use gpukit_types::ConvShape;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::OnceLock;

/// Bytes of input a block of pixel groups should touch, so that the block stays in a core's
/// L2 while every weight panel streams past it.
const BLOCK_INPUT_BYTES: usize = 512 << 10;

/// One cache line of floats: the unit of the aligned buffers.
#[derive(Clone, Copy, Default, PartialEq)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A buffer of f32 whose data starts on a 64-byte boundary, so that vector loads and stores of
/// rows whose length is a multiple of 16 never straddle two cache lines (a plain `Vec<f32>` of
/// this size is 16 bytes past a page boundary). Dereferences to `[f32]`.
#[derive(Clone, Default)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::default();
        b.resize(len);
        b
    }

    /// Sets the length to `len`. Within `capacity()` this writes nothing: the elements keep
    /// whatever values they last had (callers overwrite what they use); past it the buffer
    /// grows, and elements never used before are zero.
    pub fn resize(&mut self, len: usize) {
        let lines = len.div_ceil(16);
        if lines > self.lines.len() {
            self.lines.resize(lines, Line::default());
        }
        self.len = len;
    }

    /// How long the buffer can be made without writing anything.
    pub fn capacity(&self) -> usize {
        self.lines.len() * 16
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is a repr(C) [f32; 16] (no padding), the lines are contiguous and
        // initialised, and `len <= 16 * lines.len()`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as for Deref; the borrow is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

/// Equal when the elements are (what lies past the length does not count).
impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} floats)", self.len)
    }
}

/// A convolution's weight and bias packed for [`conv2d_nhwc_packed`]: panels of 64 output
/// channels (the last zero-padded), each laid out (r, s, c, channel-in-panel).
#[derive(Clone, PartialEq)]
pub struct PackedConv {
    k: usize,
    c: usize,
    r: usize,
    s: usize,
    weight: AlignedBuf,
    bias: AlignedBuf,
}

impl std::fmt::Debug for PackedConv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedConv({}x{}x{}x{})", self.k, self.c, self.r, self.s)
    }
}

impl PackedConv {
    /// Packs a K x C x R x S (PyTorch order) weight and its bias (K values; empty for none).
    ///
    /// # Panics
    ///
    /// If `weight` does not hold K * C * R * S values or `bias` is neither empty nor K long.
    pub fn new((k, c, r, s): (usize, usize, usize, usize), weight: &[f32], bias: &[f32]) -> Self {
        assert_eq!(
            weight.len(),
            k.saturating_mul(c).saturating_mul(r).saturating_mul(s),
            "PackedConv: weight length"
        );
        assert!(
            bias.is_empty() || bias.len() == k,
            "PackedConv: bias length"
        );
        let panels = k.div_ceil(PANEL);
        let depth = r * s * c;
        let mut packed = AlignedBuf::zeroed(panels * depth * PANEL);
        // (max(1): with no depth there is nothing to fill, and chunks must not be empty)
        for (p, panel) in packed.chunks_exact_mut((depth * PANEL).max(1)).enumerate() {
            let k0 = p * PANEL;
            let width = PANEL.min(k - k0);
            for (d, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
                let (tap, ci) = (d / c, d % c);
                let (ri, si) = (tap / s, tap % s);
                for (j, v) in dst[..width].iter_mut().enumerate() {
                    *v = weight[(((k0 + j) * c + ci) * r + ri) * s + si];
                }
            }
        }
        let mut b = AlignedBuf::zeroed(panels * PANEL);
        b[..bias.len()].copy_from_slice(bias);
        PackedConv {
            k,
            c,
            r,
            s,
            weight: packed,
            bias: b,
        }
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.k
    }
}

/// Whether the packed convolutions run on the AVX-512 kernel (else im2col + gemm); see
/// `GPUKIT_CPU_KERNEL`.
pub fn uses_avx512_kernel() -> bool {
    Kernel::best() == Kernel::Avx512
}

/// How the packed convolutions are computed in this process, in words for reports.
pub fn conv_kernel_name() -> &'static str {
    match Kernel::best() {
        Kernel::Avx512 => "packed AVX-512 kernel",
        Kernel::Gemm => "im2col + gemm",
    }
}

/// How the tiles are computed; the fastest way this CPU supports unless a test asks otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// The AVX-512F assembly micro-kernel (x86-64 only).
    Avx512,
    /// Anywhere else: per block of pixels their im2col rows, then per weight panel one gemm
    /// (the gemm crate, with its own SIMD dispatch: AVX2, NEON, ...) onto output rows
    /// prefilled with bias and residual, then the ReLU over those rows.
    Gemm,
}

impl Kernel {
    /// The AVX-512 kernel where the CPU has it, unless `GPUKIT_CPU_KERNEL=gemm` asks for the
    /// portable path (so one machine can test both; CI runs the suite both ways).
    fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("GPUKIT_CPU_KERNEL").is_ok_and(|v| v == "gemm");
            if Kernel::Avx512.available() && !forced {
                Kernel::Avx512
            } else {
                Kernel::Gemm
            }
        })
    }

    /// Whether this CPU can run the kernel.
    fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 => false,
            Kernel::Gemm => true,
        }
    }

    /// Runs one tile.
    ///
    /// # Safety
    ///
    /// Every pointer of `t` must address what its field's documentation says, `taps >= 1`,
    /// no output row may alias any input, and the kernel must be `available`.
    unsafe fn run(self, t: &Tile) {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: per the caller.
            Kernel::Avx512 => unsafe { tile_avx512(t) },
            _ => unreachable!("{self:?} computes no tiles (asked for {:p})", t),
        }
    }
}

/// Per-thread buffers of the packed convolution, kept between calls.
#[derive(Default)]
struct Scratch {
    /// Row pointers of the block being computed: groups x filter rows x `ROWS`.
    table: Vec<*const f32>,
    /// Copies of the filter rows clipped by the left or right padding, zero-filled.
    cols: AlignedBuf,
    /// Table entries that point into `cols`, as (index, offset), set once `cols` has stopped
    /// growing.
    pending: Vec<(usize, usize)>,
    /// At least `depth` zeros: the row every padding tap and missing pixel reads.
    zeros: AlignedBuf,
    /// Stand-in output and residual rows for pixels past the end and channels past K.
    tmp_out: AlignedBuf,
    tmp_res: AlignedBuf,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Most depth steps (64-float weight rows, 256 bytes each) of a panel one tile call reads: a
/// chunk of at most 512 KB stays in a core's L2 while every tile of the thread's run uses it,
/// where a larger panel (up to 1.2 MB in ResNet-50) would be streamed from L3 or memory for each.
const CHUNK_STEPS: usize = 2048;

/// A piece of the reduction: `taps` filter rows from `tap0`, `depth` values of each from `d0`
/// (whole filter rows, or a part of one).
#[derive(Clone, Copy)]
struct Chunk {
    tap0: usize,
    taps: usize,
    d0: usize,
    depth: usize,
}

/// One packed convolution call, shared by its tasks.
struct PackedRun<'a> {
    sh: ConvShape,
    q_len: usize,
    /// Output pixels per image, and in all.
    pq: usize,
    npq: usize,
    input: &'a [f32],
    packed: &'a PackedConv,
    /// The residual's first element: another buffer, or the output itself.
    residual: Option<SharedOut>,
    relu: bool,
    out: SharedOut,
    /// Filter rows (at least 1), and what each reads: S * C.
    taps: usize,
    /// Pieces the reduction is split into (see `chunk`), of at most `chunk_steps` steps.
    chunks: usize,
    chunk_steps: usize,
    depth: usize,
    /// Tiles of `ROWS` pixels, weight panels, tiles per block.
    groups: usize,
    panels: usize,
    block: usize,
    kernel: Kernel,
}

impl PackedRun<'_> {
    /// Fills `sc.table` (and `sc.cols`) for groups `g0..g1`: for each group, filter row and
    /// pixel, where that pixel's S * C values under that filter row start.
    fn prepare(&self, sc: &mut Scratch, g0: usize, g1: usize) {
        let sh = &self.sh;
        let zero = sc.zeros.as_ptr();
        let (h, w, c) = (sh.h, sh.w, sh.c);
        // rows clipped by the left/right padding: copied into `cols` as (table index, offset)
        sc.pending.clear();
        let mut used = 0;
        let input = self.input.as_ptr();
        // a local vector, so its length stays in a register across the pushes
        let mut table = std::mem::take(&mut sc.table);
        table.clear();
        table.reserve((g1 - g0) * self.taps * ROWS);
        let (stride, pad) = (sh.stride as isize, sh.pad as isize);
        let (hi, wi, ci) = (h as isize, w as isize, c as isize);
        for g in g0..g1 {
            // The group's pixels, as (input row of image 0 at filter row 0 counting every image
            // row before it, that row within its image, input column at filter column 0).
            let mut pixels = [(0isize, 0isize, 0isize); ROWS];
            let first = g * ROWS;
            let valid = ROWS.min(self.npq - first);
            let (mut n, rest) = (first / self.pq, first % self.pq);
            let (mut pi, mut qi) = (rest / self.q_len, rest % self.q_len);
            for px in &mut pixels[..valid] {
                let row = pi as isize * stride - pad;
                *px = (n as isize * hi + row, row, qi as isize * stride - pad);
                qi += 1;
                if qi == self.q_len {
                    qi = 0;
                    pi += 1;
                    if pi * self.q_len == self.pq {
                        pi = 0;
                        n += 1;
                    }
                }
            }
            for ri in 0..self.taps as isize {
                for &(abs_row, row, iw0) in &pixels[..valid] {
                    let ih = row + ri;
                    let mut ptr = zero;
                    if (0..hi).contains(&ih) {
                        let at = |iw: isize| ((abs_row + ri) * wi + iw) * ci;
                        if iw0 >= 0 && iw0 + sh.s as isize <= wi {
                            // in bounds: image n, row ih < h, columns iw0..iw0 + S <= w
                            ptr = input.wrapping_offset(at(iw0));
                        } else {
                            sc.cols.resize(used + self.depth);
                            let dst = &mut sc.cols[used..used + self.depth];
                            for (si, dst) in dst.chunks_exact_mut(c.max(1)).enumerate() {
                                let iw = iw0 + si as isize;
                                if (0..wi).contains(&iw) {
                                    let at = at(iw) as usize;
                                    dst.copy_from_slice(&self.input[at..at + c]);
                                } else {
                                    dst.fill(0.0);
                                }
                            }
                            sc.pending.push((table.len(), used));
                            used += self.depth;
                        }
                    }
                    table.push(ptr);
                }
                for _ in valid..ROWS {
                    table.push(zero);
                }
            }
        }
        sc.table = table;
        let base = sc.cols.as_ptr();
        for &(i, offset) in &sc.pending {
            sc.table[i] = base.wrapping_add(offset);
        }
    }

    /// Computes tile `g` (the `local`-th group of the table) x panel `p`.
    ///
    /// Only chunk `c` of the reduction is added: the first chunk starts from the bias, later
    /// ones from the partial sums in the output rows, and the last applies the epilogue (and
    /// copies a partial panel out of the scratch rows).
    fn tile(
        &self,
        sc: &mut Scratch,
        (local, g): (usize, usize),
        (p, c): (usize, usize),
        prefetch: *const f32,
    ) {
        let k = self.sh.k;
        let k0 = p * PANEL;
        let width = PANEL.min(k - k0);
        let tmp_out = sc.tmp_out.as_mut_ptr();
        let tmp_res = sc.tmp_res.as_mut_ptr();
        let chunk = self.chunk(c);
        let last = c + 1 == self.chunks;
        let residual = self.residual.filter(|_| last);
        let mut t = Tile {
            rows: sc.table[(local * self.taps + chunk.tap0) * ROWS..].as_ptr(),
            weight: self.packed.weight[self.weights_at(p, &chunk)..].as_ptr(),
            taps: chunk.taps,
            depth: chunk.depth,
            bias: self.packed.bias[k0..].as_ptr(),
            out: [tmp_out; ROWS],
            residual: [tmp_res.cast_const(); ROWS],
            relu: usize::from(last && self.relu),
            has_residual: usize::from(residual.is_some()),
            prefetch,
            accumulate: usize::from(c > 0),
            offset: chunk.d0 * 4,
        };
        let valid = ROWS.min(self.npq - g * ROWS);
        for j in 0..ROWS {
            let spare_out = tmp_out.wrapping_add(j * PANEL);
            let spare_res = tmp_res.wrapping_add(j * PANEL);
            t.out[j] = spare_out;
            t.residual[j] = spare_res;
            if j >= valid {
                continue;
            }
            let at = (g * ROWS + j) * k + k0;
            if width == PANEL {
                // SAFETY: pixel g*ROWS+j < NPQ, so `at + PANEL <= NPQ*K`, the output's length.
                t.out[j] = unsafe { self.out.get().add(at) };
                if let Some(r) = residual {
                    // SAFETY: the residual has the output's length.
                    t.residual[j] = unsafe { r.get().add(at) };
                }
            } else if let Some(r) = residual {
                // SAFETY: as above, `at + width <= NPQ*K`; the scratch row is another buffer.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        r.get().add(at),
                        sc.tmp_res.as_mut_ptr().add(j * PANEL),
                        width,
                    );
                }
            }
        }
        // SAFETY: rows: the table holds taps x ROWS pointers for this group, each to `depth`
        // readable floats (input rows, copied clipped rows or the zero row, all at least depth
        // long);
        // weight: panel p holds taps*depth*64 floats; bias: 64 per panel; out/residual: whole
        // 64-float rows of this tile's pixels (disjoint from every other tile's, and from every
        // input; the residual may be the output itself, which the kernel reads before it
        // writes) or the ROWS x 64 scratch rows; taps >= 1; the kernel is available.
        unsafe { self.kernel.run(&t) };
        if width < PANEL && last {
            for j in 0..valid {
                let at = (g * ROWS + j) * k + k0;
                // SAFETY: as above, `at + width <= NPQ*K`; the scratch row is not borrowed.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        sc.tmp_out.as_ptr().add(j * PANEL),
                        self.out.get().add(at),
                        width,
                    );
                }
            }
        }
    }

    /// Chunk `c` of the reduction: `taps` filter rows from `tap0`, each `depth` values from `d0`.
    fn chunk(&self, c: usize) -> Chunk {
        if self.chunks == 1 {
            Chunk {
                tap0: 0,
                taps: self.taps,
                d0: 0,
                depth: self.depth,
            }
        } else if self.depth <= self.chunk_steps {
            let per = self.chunk_steps / self.depth;
            Chunk {
                tap0: c * per,
                taps: per.min(self.taps - c * per),
                d0: 0,
                depth: self.depth,
            }
        } else {
            let pieces = self.depth.div_ceil(self.chunk_steps);
            let len = self.depth.div_ceil(pieces);
            let d0 = c % pieces * len;
            Chunk {
                tap0: c / pieces,
                taps: 1,
                d0,
                depth: len.min(self.depth - d0),
            }
        }
    }

    /// Where chunk `chunk` of panel `p` starts in the packed weights.
    fn weights_at(&self, p: usize, chunk: &Chunk) -> usize {
        (p * self.taps * self.depth + chunk.tap0 * self.depth + chunk.d0) * PANEL
    }

    /// Tiles of panel `p` for groups `g0 + gs` (whose table starts at group `g0 + first`).
    ///
    /// With the reduction in chunks, chunk by chunk: every tile's first chunk, then every
    /// tile's second, and so on, so that one chunk of the panel stays in cache while all the
    /// tiles use it; tiles that write through the scratch rows (partial panels, the last
    /// pixels) go last, one at a time. Meanwhile the tiles prefetch the next chunk (or the next
    /// panel's first), each its share, so that it is in L2 by the time it is needed rather than
    /// fetched from memory by the first tile that uses it.
    fn panel(&self, sc: &mut Scratch, p: usize, (g0, first): (usize, usize), gs: Range<usize>) {
        let partial = (p + 1) * PANEL > self.sh.k;
        let scratch = |g: usize| self.chunks > 1 && (partial || (g0 + g + 1) * ROWS > self.npq);
        let count = gs.clone().filter(|&g| !scratch(g)).count();
        for c in 0..self.chunks {
            let chunk = self.chunk(c);
            let here = self.weights_at(p, &chunk);
            let next = if c + 1 < self.chunks {
                Some((p, c + 1))
            } else {
                (p + 1 < self.panels).then_some((p + 1, 0))
            };
            let next = next.map(|(p, c)| {
                let chunk = self.chunk(c);
                (self.weights_at(p, &chunk), chunk.taps * chunk.depth * PANEL)
            });
            // Shares under 4 KB would only repeat each other's prefetches: then every tile
            // prefetches the weights it reads anyway (cached).
            let next = next.filter(|&(_, len)| len / count.max(1) >= 1024);
            for (i, g) in gs.clone().filter(|&g| !scratch(g)).enumerate() {
                let at = next.map_or(here, |(at, len)| at + len * i / count / 16 * 16);
                let prefetch = self.packed.weight[at..].as_ptr();
                self.tile(sc, (g - first, g0 + g), (p, c), prefetch);
            }
        }
        for g in gs.filter(|&g| scratch(g)) {
            for c in 0..self.chunks {
                let here = self.weights_at(p, &self.chunk(c));
                let prefetch = self.packed.weight[here..].as_ptr();
                self.tile(sc, (g - first, g0 + g), (p, c), prefetch);
            }
        }
    }

    /// `run` with `Kernel::Gemm`: for each block, the im2col rows of the pixels the units touch
    /// (none for a 1x1 stride-1 unpadded convolution, whose input rows are those rows), then
    /// per panel one gemm over that panel's pixels.
    fn run_gemm(&self, sc: &mut Scratch, u0: usize, u1: usize) {
        let sh = &self.sh;
        let k = sh.k;
        let rsc = sh.r * sh.s * sh.c;
        let pointwise = sh.is_pointwise();
        let img_in = sh.h * sh.w * sh.c;
        for units in BlockUnits::split(u0, u1, (self.groups, self.panels, self.block)) {
            let g0 = units.g0;
            let pixels = |groups: Range<usize>| {
                ((g0 + groups.start) * ROWS).min(self.npq)..((g0 + groups.end) * ROWS).min(self.npq)
            };
            let touched = pixels(units.touched());
            let (lhs, lhs_first) = if pointwise {
                (self.input, 0)
            } else {
                sc.cols.resize(touched.len() * rsc);
                for (pix, row) in touched.clone().zip(sc.cols.chunks_exact_mut(rsc.max(1))) {
                    let img = &self.input[pix / self.pq * img_in..][..img_in];
                    // SAFETY: viewing initialised f32 as MaybeUninit<f32> only allows writes of
                    // valid f32, which the function does to every element.
                    let dst = unsafe { &mut *(row as *mut [f32] as *mut [MaybeUninit<f32>]) };
                    im2col_nhwc_row(sh, img, pix % self.pq, dst);
                }
                (&sc.cols[..], touched.start)
            };
            for (p, groups) in units.panels() {
                let rows = pixels(groups);
                if rows.is_empty() {
                    continue;
                }
                let k0 = p * PANEL;
                let width = PANEL.min(k - k0);
                let bias = &self.packed.bias[k0..k0 + width];
                let out = self.out.get();
                // SAFETY: rows < NPQ, channels k0..k0 + width < K: inside the output (and the
                // residual, of the same length); these rows x channels are this unit range's
                // alone.
                unsafe {
                    for pix in rows.clone() {
                        let dst = std::slice::from_raw_parts_mut(out.add(pix * k + k0), width);
                        match self.residual {
                            Some(r) if r.get() == out => {
                                for (d, &b) in dst.iter_mut().zip(bias) {
                                    *d += b;
                                }
                            }
                            Some(r) => {
                                let res =
                                    std::slice::from_raw_parts(r.get().add(pix * k + k0), width);
                                for ((d, &b), &r) in dst.iter_mut().zip(bias).zip(res) {
                                    *d = b + r;
                                }
                            }
                            None => dst.copy_from_slice(bias),
                        }
                    }
                    gemm::gemm(
                        rows.len(),
                        width,
                        rsc,
                        out.add(rows.start * k + k0),
                        1,
                        k as isize,
                        true,
                        lhs.as_ptr().wrapping_add((rows.start - lhs_first) * rsc),
                        1,
                        rsc as isize,
                        self.packed.weight.as_ptr().wrapping_add(p * rsc * PANEL),
                        1,
                        PANEL as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                    if self.relu {
                        for pix in rows {
                            let dst = std::slice::from_raw_parts_mut(out.add(pix * k + k0), width);
                            for d in dst {
                                *d = if *d > 0.0 { *d } else { 0.0 };
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs work units `u0..u1`: unit `u` is, within block `b = u / (block * panels)`, panel
    /// `local / len` of group `b * block + local % len`, so consecutive units sweep a block's
    /// groups under one weight panel before moving to the next panel.
    fn run(&self, u0: usize, u1: usize) {
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let sc = &mut *guard;
            if sc.zeros.len() < self.depth {
                sc.zeros.resize(self.depth);
            }
            sc.tmp_out.resize(ROWS * PANEL);
            sc.tmp_res.resize(ROWS * PANEL);
            if self.kernel == Kernel::Gemm {
                self.run_gemm(sc, u0, u1);
                return;
            }
            for units in BlockUnits::split(u0, u1, (self.groups, self.panels, self.block)) {
                let touched = units.touched();
                self.prepare(sc, units.g0 + touched.start, units.g0 + touched.end);
                for (p, groups) in units.panels() {
                    self.panel(sc, p, (units.g0, touched.start), groups);
                }
            }
        });
    }
}

/// The work units of one block that a thread's run of units covers.
struct BlockUnits {
    /// The block's first group, and how many groups it has.
    g0: usize,
    len: usize,
    /// The units covered, counted from the block's first (`l0 < l1`).
    l0: usize,
    l1: usize,
}

impl BlockUnits {
    /// Work units `u0..u1` block by block, for `groups` groups in blocks of `block` under
    /// `panels` weight panels (see `PackedRun::run` for which unit is which).
    fn split(
        u0: usize,
        u1: usize,
        (groups, panels, block): (usize, usize, usize),
    ) -> impl Iterator<Item = BlockUnits> {
        let mut u = u0;
        std::iter::from_fn(move || {
            if u >= u1 {
                return None;
            }
            let g0 = u / (block * panels) * block;
            let len = block.min(groups - g0);
            let base = g0 * panels;
            let end = (base + len * panels).min(u1);
            let units = BlockUnits {
                g0,
                len,
                l0: u - base,
                l1: end - base,
            };
            u = end;
            Some(units)
        })
    }

    /// The groups (counted from `g0`) the units touch: a sub-range unless they wrap past a
    /// panel.
    fn touched(&self) -> Range<usize> {
        let (l0, l1, len) = (self.l0, self.l1, self.len);
        if l0 / len == (l1 - 1) / len {
            l0 % len..(l1 - 1) % len + 1
        } else {
            0..len
        }
    }

    /// Each panel the units reach, with its groups among them (counted from `g0`).
    fn panels(&self) -> impl Iterator<Item = (usize, Range<usize>)> {
        let (l0, l1, len) = (self.l0, self.l1, self.len);
        (l0 / len..=(l1 - 1) / len).map(move |p| {
            let from = if p == l0 / len { l0 % len } else { 0 };
            let to = if p == (l1 - 1) / len {
                (l1 - 1) % len + 1
            } else {
                len
            };
            (p, from..to)
        })
    }
}

/// NHWC convolution with packed weights and a fused epilogue:
/// `output = relu?(conv(input, weight) + bias + residual)`, ReLU when `relu`.
///
/// Input N,H,W,C; output and `residual` N,P,Q,K; the packed weight's K, C, R, S must be the
/// shape's. Zero padding `pad` on all sides, `stride` in both directions. Overwrites output.
/// Work is split in tiles of 7 pixels x 64 channels, each of `threads()` threads taking one
/// contiguous run of tiles (on the spinning team, see `parallel_ranges`).
///
/// # Panics
///
/// If the lengths or the packed weight's shape do not match `shape`.
pub fn conv2d_nhwc_packed(
    shape: &ConvShape,
    input: &[f32],
    packed: &PackedConv,
    residual: Option<&[f32]>,
    relu: bool,
    output: &mut [f32],
) {
    let residual = residual.map_or(Residual::None, Residual::Separate);
    conv_packed_with(
        shape,
        (input, packed, residual),
        relu,
        output,
        (threads(), Kernel::best(), CHUNK_STEPS),
    );
}

/// [`conv2d_nhwc_packed`] with the residual already in `output`, which the result overwrites:
/// `output = relu?(conv(input, weight) + bias + output)`. Saves a buffer, and the memory
/// traffic of a third activation-sized array.
///
/// # Panics
///
/// As [`conv2d_nhwc_packed`].
pub fn conv2d_nhwc_packed_onto(
    shape: &ConvShape,
    input: &[f32],
    packed: &PackedConv,
    relu: bool,
    output: &mut [f32],
) {
    conv_packed_with(
        shape,
        (input, packed, Residual::InPlace),
        relu,
        output,
        (threads(), Kernel::best(), CHUNK_STEPS),
    );
}

/// Where a packed convolution's residual comes from.
#[derive(Clone, Copy)]
enum Residual<'a> {
    None,
    Separate(&'a [f32]),
    /// The output buffer holds it.
    InPlace,
}

/// `conv2d_nhwc_packed` with the thread count, kernel and chunk size explicit, for tests.
fn conv_packed_with(
    sh: &ConvShape,
    (input, packed, residual): (&[f32], &PackedConv, Residual<'_>),
    relu: bool,
    output: &mut [f32],
    (threads, kernel, chunk_steps): (usize, Kernel, usize),
) {
    assert_eq!(
        (packed.k, packed.c, packed.r, packed.s),
        (sh.k, sh.c, sh.r, sh.s),
        "conv2d_nhwc_packed: packed weight shape"
    );
    assert_eq!(
        input.len(),
        sh.input_len(),
        "conv2d_nhwc_packed: input length"
    );
    assert_eq!(
        output.len(),
        sh.output_len(),
        "conv2d_nhwc_packed: output length"
    );
    if let Residual::Separate(r) = residual {
        assert_eq!(r.len(), output.len(), "conv2d_nhwc_packed: residual length");
    }
    assert!(
        kernel.available(),
        "conv2d_nhwc_packed: kernel {kernel:?} unavailable"
    );
    let chunk_steps = chunk_steps.max(1);
    if output.is_empty() {
        return;
    }
    let (p_len, q_len) = (sh.out_h(), sh.out_w());
    let pq = p_len * q_len;
    let npq = sh.n * pq;
    // With no filter rows there is nothing to read: one tap of depth 0 leaves the bias.
    let (taps, depth) = if sh.r == 0 {
        (1, 0)
    } else {
        (sh.r, sh.s * sh.c)
    };
    // Partial sums go to the output rows, so a residual already there must stay whole.
    let chunks = if taps * depth <= chunk_steps || matches!(residual, Residual::InPlace) {
        1
    } else if depth <= chunk_steps {
        taps.div_ceil(chunk_steps / depth)
    } else {
        taps * depth.div_ceil(chunk_steps)
    };
    let groups = npq.div_ceil(ROWS);
    let panels = sh.k.div_ceil(PANEL);
    // The input a group reads: its pixels' rows (with a stride the filter spans, the rows
    // between them too).
    let group_bytes = ROWS * sh.c * 4 * sh.stride.min(sh.r) * sh.stride.min(sh.s);
    // (With the reduction in chunks, a chunk of weights shares L2 with the block: half as much.)
    let budget = if chunks > 1 {
        BLOCK_INPUT_BYTES / 2
    } else {
        BLOCK_INPUT_BYTES
    };
    let block = (budget / group_bytes.max(1)).clamp(1, groups);
    let run = PackedRun {
        sh: *sh,
        q_len,
        pq,
        npq,
        input,
        packed,
        residual: match residual {
            Residual::None => None,
            // read only, through the shared pointer
            Residual::Separate(r) => Some(SharedOut(r.as_ptr().cast_mut())),
            Residual::InPlace => Some(SharedOut(output.as_mut_ptr())),
        },
        relu,
        out: SharedOut(output.as_mut_ptr()),
        taps,
        chunks,
        chunk_steps,
        depth,
        groups,
        panels,
        block,
        kernel,
    };
    // One contiguous run of units per thread: the units of a layer cost the same, so this
    // balances to within one unit, and each thread reads the fewest weight panels and input
    // rows. (Guided self-scheduling from a shared counter measured a few percent slower.)
    let units = groups * panels;
    run_parts(threads.clamp(1, units), &|i, parts| {
        run.run(units * i / parts, units * (i + 1) / parts)
    });
}

#[cfg(test)]
mod tests;

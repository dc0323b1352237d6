//! The small product kernel's piece counts, parameters and convolution geometry, without a GPU.

use super::{conv_cuts, conv_pieces, pieces, ConvGeometry, Cut, Loads, WHOLE_KC};

#[test]
fn few_tiles_cut_k_into_pieces_many_do_not() {
    // ConvNeXt-T at batch 1: 49 rows of 768 over 3,072 (12 tiles: up to 16 pieces of 192,
    // and the counts within a half and a quarter of the blocks)
    assert_eq!(pieces(49, 768, 3072), vec![1, 4, 8, 16]);
    // 196 x 384 over 1,536 (24 tiles: 8 pieces of 192, 11 does not divide)
    assert_eq!(pieces(196, 384, 1536), vec![1, 2, 4, 8]);
    // 196 x 1,536 over 384 (96 tiles: 2 pieces of 192)
    assert_eq!(pieces(196, 1536, 384), vec![1, 2]);
    // 3,136 x 384 over 96: 294 tiles, K too short to cut
    assert_eq!(pieces(3136, 384, 96), vec![1]);
    // the kernel's limits: n a multiple of 8, k of 32
    assert!(pieces(1, 1001, 768).is_empty());
    // pieces of at least 128 values: 6 at most
    assert_eq!(pieces(1, 1000, 768), vec![1, 4, 6]);
    assert!(pieces(49, 768, 3070).is_empty());
    assert!(pieces(0, 768, 3072).is_empty());
}

#[test]
fn the_kernels_parameters_read_as_the_launcher_passes_them() {
    let signatures = super::kernel_source()
        .signatures()
        .expect("parameters read");
    for name in ["gemm_small_f16", "gemm_small_bf16"] {
        assert_eq!(signatures[name].len(), 14, "{name}");
    }
    for name in [
        "conv_small_f16",
        "conv_small_bf16",
        "conv_whole_f16",
        "conv_whole_bf16",
    ] {
        assert_eq!(signatures[name].len(), 25, "{name}");
    }
}

#[test]
fn the_partial_tiles_stay_within_the_scratch() {
    for (m, n, k) in [
        (49, 768, 3072),
        (196, 384, 1536),
        (784, 768, 192),
        (8192, 4096, 4096),
    ] {
        for p in pieces(m, n, k) {
            assert!(
                p == 1 || p * m * n <= super::PART_FLOATS,
                "{m}x{n}x{k} in {p}"
            );
            assert!(k.is_multiple_of(32 * p) && (p == 1 || k / p >= super::MIN_PIECE));
        }
    }
}

/// A convolution's pieces cover its K (rounded up to 32s), each piece non-empty; the
/// filter is rearranged as [r, s, c, k]; the geometry refuses what the kernel does not take.
#[test]
fn convolution_pieces_cover_k_and_the_filter_is_laid_out_by_taps() {
    for (m, n, kw) in [
        (3136, 64, 576),
        (196, 256, 2304),
        (49, 512, 4608),
        (100, 24, 72),
    ] {
        for (p, kc) in conv_pieces(m, n, kw) {
            assert!(
                kc.is_multiple_of(32) && p * kc >= kw && (p - 1) * kc < kw,
                "{m}x{n}x{kw} {p}x{kc}"
            );
        }
    }
    // ResNet-50's 3x3 of layer3 at batch 1: 16 tiles, cut in 4, 8 or 15 pieces
    let counts: Vec<usize> = conv_pieces(196, 256, 2304).iter().map(|c| c.0).collect();
    assert_eq!(counts, vec![1, 4, 8, 15]);
    let g = geometry((1, 5, 4, 8, 16), (3, 2, 2), [1; 4], [1, 1]);
    assert_eq!(g.out(), (3, 3));
    assert_eq!(g.product(), (9, 16, 48));
    assert!(g.runs());
    let w: Vec<f32> = (0..16 * 8 * 3 * 2).map(|v| v as f32).collect();
    let f = g.filter(&w);
    // filter 5, channel 3, tap (2, 1) is at ((2 * 2 + 1) * 8 + 3) * 16 + 5
    assert_eq!(
        f[((2 * 2 + 1) * 8 + 3) * 16 + 5],
        w[((5 * 8 + 3) * 3 + 2) * 2 + 1]
    );
    assert!(!ConvGeometry { c: 3, ..g }.runs());
    assert!(!ConvGeometry { k: 12, ..g }.runs());
    assert!(!ConvGeometry { stride: 0, ..g }.runs());
}

/// A convolution: input `[n, h, w, c]` and `k` filters, taps `r x s` and the stride, pads
/// (top, left, bottom, right) and dilation.
fn geometry(
    (n, h, w, c, k): (usize, usize, usize, usize, usize),
    (r, s, stride): (usize, usize, usize),
    pads: [usize; 4],
    dilation: [usize; 2],
) -> ConvGeometry {
    ConvGeometry {
        n,
        h,
        w,
        c,
        k,
        r,
        s,
        stride,
        pads,
        dilation,
    }
}

/// An input value of the loaders' tests: its index + 1 (a zero is padding, a wrong index
/// shows).
fn value(g: &ConvGeometry, b: usize, y: usize, x: usize, ch: usize) -> i64 {
    (((b * g.h + y) * g.w + x) * g.c + ch + 1) as i64
}

/// What the implicit im2col product of `g` holds at output pixel `row`, K index `kidx`:
/// [`value`]'s input there, zero for padding and past the rows and K.
fn im2col(g: &ConvGeometry, row: usize, kidx: usize) -> i64 {
    let ((m, _, kw), (p, q)) = (g.product(), g.out());
    if kidx >= kw || row >= m {
        return 0;
    }
    let (b, op, oq) = (row / (p * q), row / q % p, row % q);
    let (tap, ch) = (kidx / g.c, kidx % g.c);
    let (i, j) = (tap / g.s, tap % g.s);
    let (yy, xx) = (
        (op * g.stride + i * g.dilation[0]) as i64 - g.pads[0] as i64,
        (oq * g.stride + j * g.dilation[1]) as i64 - g.pads[1] as i64,
    );
    if yy < 0 || xx < 0 || yy >= g.h as i64 || xx >= g.w as i64 {
        return 0;
    }
    value(g, b, yy as usize, xx as usize, ch)
}

/// The whole-piece cuts: offered only where the output has few tiles, each piece at most
/// [`WHOLE_KC`] values (its shared memory within every GPU's grant), the pieces covering K;
/// with 4 warp groups, as many pieces as fill an H100's 132 multiprocessors once.
#[test]
fn whole_pieces_are_offered_for_few_tiles_and_cover_k() {
    let whole = |m, n, kw| -> Vec<(usize, usize, usize)> {
        conv_cuts(m, n, kw, 132)
            .into_iter()
            .filter_map(|c| match c.loads {
                Loads::Whole { groups } => Some((c.pieces, c.kc, groups)),
                Loads::Staged => None,
            })
            .collect()
    };
    // ResNet-50 at batch 1: layer4's 3x3 (8 tiles: 16 pieces fill 128 multiprocessors),
    // layer3's (16 tiles: 8 pieces), layer1's (49 tiles: 2 pieces)
    assert_eq!(
        whole(49, 512, 4608),
        vec![(36, 128, 2), (18, 256, 2), (18, 256, 4), (16, 288, 4)]
    );
    assert_eq!(
        whole(196, 256, 2304),
        vec![
            (36, 64, 2),
            (18, 128, 2),
            (9, 256, 2),
            (9, 256, 4),
            (8, 288, 4)
        ]
    );
    assert_eq!(
        whole(3136, 64, 576),
        vec![
            (9, 64, 2),
            (5, 128, 2),
            (3, 192, 2),
            (3, 192, 4),
            (2, 288, 4)
        ]
    );
    // one piece where K fits; the one tile would fill the GPU with 132 pieces: more than K
    // has (5 pieces of 32 cover it)
    assert_eq!(
        whole(40, 24, 144),
        vec![(3, 64, 2), (2, 96, 2), (1, 160, 2), (1, 160, 4)]
    );
    // many tiles (batch 256): the staged kernel only
    assert!(whole(256 * 196, 256, 2304).is_empty());
    for (m, n, kw) in [
        (49, 512, 4608),
        (196, 256, 2304),
        (784, 128, 1152),
        (40, 24, 144),
    ] {
        for c in conv_cuts(m, n, kw, 132) {
            assert!(c.kc.is_multiple_of(32) && c.pieces * c.kc >= kw && (c.pieces - 1) * c.kc < kw);
            if let Loads::Whole { groups } = c.loads {
                assert!(c.kc <= WHOLE_KC);
                assert!(super::whole::shared_bytes(c.kc, groups) <= 99 * 1024, "{c}");
            }
        }
    }
    let c = Cut {
        pieces: 18,
        kc: 256,
        loads: Loads::Whole { groups: 2 },
    };
    assert_eq!(c.to_string(), "18 pieces of 256 (whole, 8 warps)");
}

/// `conv_whole`'s loader (blockDim / 64 threads a row, each walking chunks of 8 that many
/// chunks apart, as its CUDA writes it) fills every row and K value of every piece's tile
/// once, with what im2col holds there.
#[test]
fn the_whole_loaders_walk_reads_the_im2col_rows() {
    let shapes = [
        geometry((1, 11, 9, 16, 16), (3, 3, 1), [2, 1, 2, 3], [2, 3]),
        geometry((2, 9, 7, 8, 24), (3, 3, 2), [1; 4], [1, 1]),
        geometry((1, 7, 7, 64, 64), (3, 3, 1), [1; 4], [1, 1]),
    ];
    for g in shapes {
        let (m, n, kw) = g.product();
        let (p, q) = g.out();
        let (x, im2col) = (
            |b, y, xx, ch| value(&g, b, y, xx, ch),
            |r, k| im2col(&g, r, k),
        );
        let cuts: Vec<Cut> = conv_cuts(m, n, kw, 132)
            .into_iter()
            .filter(|c| c.loads != Loads::Staged)
            .collect();
        assert!(!cuts.is_empty(), "{g:?}");
        for cut in cuts {
            let Loads::Whole { groups } = cut.loads else {
                continue;
            };
            let (threads, kc) = (128 * groups, cut.kc);
            let tpr = threads / 64;
            for z in 0..cut.pieces {
                for by in 0..m.div_ceil(64) {
                    let mut filled = vec![0u8; 64 * kc];
                    for t in 0..threads {
                        let (r, step, row) = (t / tpr, tpr * 8, by * 64 + t / tpr);
                        let live = row < m;
                        let pix = if live { row } else { 0 };
                        let (b, rest) = (pix / (p * q), pix % (p * q));
                        let (ih, iw) = (
                            ((rest / q) * g.stride) as i64 - g.pads[0] as i64,
                            ((rest % q) * g.stride) as i64 - g.pads[1] as i64,
                        );
                        let mut next = z * kc + (t % tpr) * 8;
                        let mut ch = next % g.c;
                        let tap = next / g.c;
                        let (mut tr, mut ts) = (tap / g.s, tap % g.s);
                        let mut kk = (t % tpr) * 8;
                        while kk < kc {
                            let (yy, xx) = (
                                ih + (tr * g.dilation[0]) as i64,
                                iw + (ts * g.dilation[1]) as i64,
                            );
                            let ok = next < kw
                                && live
                                && yy >= 0
                                && yy < g.h as i64
                                && xx >= 0
                                && xx < g.w as i64;
                            for e in 0..8 {
                                let got = if ok {
                                    x(b, yy as usize, xx as usize, ch + e)
                                } else {
                                    0
                                };
                                assert_eq!(got, im2col(row, z * kc + kk + e), "{g:?} {cut}");
                                filled[r * kc + kk + e] += 1;
                            }
                            next += step;
                            ch += step;
                            while ch >= g.c {
                                ch -= g.c;
                                ts += 1;
                                if ts == g.s {
                                    ts = 0;
                                    tr += 1;
                                }
                            }
                            kk += step;
                        }
                    }
                    assert!(filled.iter().all(|&f| f == 1), "{g:?} {cut}");
                }
            }
        }
    }
}

/// The convolution loader's walk, step for step as `conv_small`'s CUDA writes it (each
/// thread's two rows and chunk column, its running K index, tap and channel), fills every
/// tile of every piece with what im2col holds there: zeros for padding, past the image and
/// past K.
#[test]
fn the_convolution_loaders_walk_reads_the_im2col_rows() {
    let shapes = [
        // dilated, padded unevenly (as DeepLab's and TensorFlow's "same" exports are)
        geometry((1, 11, 9, 16, 16), (3, 3, 1), [2, 1, 2, 3], [2, 3]),
        geometry((2, 9, 7, 16, 24), (3, 3, 2), [1; 4], [1, 1]),
        geometry((1, 12, 10, 8, 8), (7, 7, 2), [3; 4], [1, 1]),
        geometry((1, 14, 14, 48, 64), (3, 2, 1), [1; 4], [1, 1]),
        geometry((3, 5, 5, 64, 128), (1, 1, 1), [0; 4], [1, 1]),
    ];
    for g in shapes {
        let (m, n, kw) = g.product();
        let (p, q) = g.out();
        let (x, im2col) = (
            |b, y, xx, ch| value(&g, b, y, xx, ch),
            |r, k| im2col(&g, r, k),
        );
        assert!(g.runs(), "{g:?}");
        for (pieces, kc) in conv_pieces(m, n, kw) {
            for z in 0..pieces {
                for by in 0..m.div_ceil(64) {
                    let (m0, k0) = (by * 64, z * kc);
                    for t in 0..128usize {
                        let col = (t & 3) * 8;
                        let mut next = k0 + col;
                        let (mut tap, mut ch) = (next / g.c, next % g.c);
                        let mut corners = [(0usize, 0i64, 0i64, false); 2];
                        for kt in 0..kc / 32 {
                            if kt == 0 {
                                for (j, corner) in corners.iter_mut().enumerate() {
                                    let row = m0 + (t >> 2) + 32 * j;
                                    let pix = if row < m { row } else { 0 };
                                    let (b, rest) = (pix / (p * q), pix % (p * q));
                                    let (op, oq) = (rest / q, rest % q);
                                    *corner = (
                                        b,
                                        (op * g.stride) as i64 - g.pads[0] as i64,
                                        (oq * g.stride) as i64 - g.pads[1] as i64,
                                        row < m,
                                    );
                                }
                            }
                            let (r, sc) = (tap / g.s, tap % g.s);
                            let inside = next < kw;
                            for (j, &(b, ih, iw, live)) in corners.iter().enumerate() {
                                let (yy, xx) = (
                                    ih + (r * g.dilation[0]) as i64,
                                    iw + (sc * g.dilation[1]) as i64,
                                );
                                let ok = inside
                                    && live
                                    && yy >= 0
                                    && yy < g.h as i64
                                    && xx >= 0
                                    && xx < g.w as i64;
                                let row = m0 + (t >> 2) + 32 * j;
                                for e in 0..8 {
                                    let got = if ok {
                                        x(b, yy as usize, xx as usize, ch + e)
                                    } else {
                                        0
                                    };
                                    let want = im2col(row, k0 + kt * 32 + col + e);
                                    assert_eq!(
                                        got,
                                        want,
                                        "{g:?} piece {z} of {pieces} row {row} k {}",
                                        k0 + kt * 32 + col + e
                                    );
                                }
                            }
                            next += 32;
                            ch += 32;
                            while ch >= g.c {
                                ch -= g.c;
                                tap += 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

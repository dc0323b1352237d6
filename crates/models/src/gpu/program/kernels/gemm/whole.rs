//! The small convolution kernel whose blocks hold their whole piece of K in shared memory
//! (decision 189): where a convolution has fewer output tiles than the GPU has
//! multiprocessors (ResNet-50's layers at batch 1), `conv_small`'s stages of 32 leave one warp
//! a scheduler waiting on its own loads, barriers and address arithmetic at every step. Here a
//! block loads its whole piece (at most [`super::WHOLE_KC`] values of K) at once, the filter's
//! part before it waits for the kernel ahead, and then multiplies without a barrier; 4 x G
//! warps share the piece (warp group g takes every G-th slice of 16), their f32 tiles added in
//! shared memory; the pieces' sums meet in `part` as `conv_small`'s do, the last block
//! finding itself through an acquire-release count.

/// CUDA C of the kernels `conv_whole_f16` / `conv_whole_bf16` (after `gemm.rs`'s source: it
/// uses `TENSOR_CORES`, `GS_WP` and the prelude's helpers).
pub(crate) const SOURCE: &str = r#"
extern __shared__ __align__(16) unsigned char whole_shared[];
#define GW_TP 72

// four 8 x 8 matrices from the shared address `at` (transposed or not)
__device__ __forceinline__ void ldsm4(unsigned* r, unsigned at, bool trans) {
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
}

// The tile's pairs a thread finishes at a time: their loads (sums, residual) all issued
// before any store (z may be y, so a store would otherwise hold back the next pair's loads).
#define GW_ROUND 4

// The block's 64 x 64 tile of y = act(X w + bias + z) over K range [k0, k0 + kc), kc a
// multiple of 32: w's rows k0.. (zeros past kw and past column n) into ws [kc][GS_WP] before
// the wait for the kernel ahead, X's into xs [64][kc + 8] by `load_x()` after it, then
// 4 x G warps (G = blockDim.x / 128): warp (g, quad) computes the quad's 32 x 32 outputs over
// the slices of 16 at g, g + G, ...; the groups' tiles are added through shared memory (over
// xs and ws, `sums` [G][64][GW_TP] f32) by every thread a pair of columns at a time. One piece
// (gridDim.z 1): the epilogue. Several: the pair added into part [m][n] (zeros between
// launches); the tile's last block (counts[tile], an acquire-release count it sets back to 0)
// takes the sums, leaving zeros, and writes y.
template <class T, class LoadX>
__device__ void whole_tile(LoadX& load_x, const T* __restrict__ w, const T* __restrict__ bias,
                           const T* z, T* y, float* part, unsigned* counts, int m, int n, int kw,
                           int kc, int act, float alpha, float beta) {
    __shared__ unsigned last;
    T* xs = (T*)whole_shared;
    T* ws = xs + GS_BM * (kc + 8);
    float* sums = (float*)whole_shared;
    const int xp = kc + 8;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, groups = blockDim.x >> 7;
    const int g = warp >> 2, quad = warp & 3;
    const int m0 = blockIdx.y * GS_BM, n0 = blockIdx.x * GS_BN, k0 = blockIdx.z * kc;
    let_next_grid_start();
    // the filter (a constant) before the wait: rows of 8 chunks of 8 values
    for (int i = t; i < kc * 8; i += blockDim.x) {
        const int r = i >> 3, cc = (i & 7) * 8;
        const bool ok = n0 + cc < n && k0 + r < kw;
        copy16(ws + r * GS_WP + cc, ok ? w + (long long)(k0 + r) * n + n0 + cc : w, ok ? 16 : 0);
    }
    // every thread's epilogue pairs lie in one column pair: c = 2 (t % 32) (blockDim a
    // multiple of 32); its bias (a constant) read before the wait too
    const int c = (t & 31) * 2, col = n0 + c;
    const float2 bv = bias && col < n ? load_pair(bias + col) : make_float2(0.0f, 0.0f);
    wait_for_previous_grid();
    load_x(xs, xp);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    float acc[2][4][4] = {};
    const int wm = (quad >> 1) * 32, wn = (quad & 1) * 32, q = lane >> 3;
    // the lane's ldmatrix rows as shared addresses at slice g, advanced a slice of the
    // group's at a time: x's two 16-row blocks, w's two 16-column pieces
    unsigned xa = shared_address(&xs[(wm + (lane & 15)) * xp + 16 * g + (lane >> 4) * 8]);
    unsigned wa = shared_address(&ws[(16 * g + (q & 1) * 8 + (lane & 7)) * GS_WP + wn +
                                     (q >> 1) * 8]);
    const unsigned xstep = 32 * groups, wstep = 32 * groups * GS_WP, xblock = 32 * xp;
#pragma unroll 2
    for (int kk = 16 * g; kk < kc; kk += 16 * groups, xa += xstep, wa += wstep) {
        unsigned a[2][4], w[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) ldsm4(a[i], xa + i * xblock, false);
#pragma unroll
        for (int j = 0; j < 2; ++j) ldsm4(w[j], wa + j * 32, true);
        mma_step<T>(acc, a, w);
    }
    // every warp done with xs and ws: the groups' tiles over them
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm + i * 16 + h * 8 + (lane >> 2), c = wn + j * 8 + (lane & 3) * 2;
                *(float2*)&sums[(g * GS_BM + r) * GW_TP + c] =
                    make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
    __syncthreads();
    const bool pieces = gridDim.z > 1;
    if (pieces) {
        for (int i = t; i < GS_BM * GS_BN / 2; i += blockDim.x) {
            const int r = i >> 5, row = m0 + r;
            if (row >= m || col >= n) continue;
            float2 s = *(const float2*)&sums[r * GW_TP + c];
            for (int o = 1; o < groups; ++o) {
                const float2 v = *(const float2*)&sums[(o * GS_BM + r) * GW_TP + c];
                s.x += v.x;
                s.y += v.y;
            }
            add_pair(part + (long long)row * n + col, s.x, s.y);
        }
        const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
        if (!last_piece(counts, tile, &last)) return;
        if (t == 0) counts[tile] = 0;
    }
    // the epilogue, GW_ROUND pairs a thread at a time: their sums (the groups' from shared
    // memory, or the pieces' from part, leaving zeros) and residuals loaded, then stored
    for (int i0 = t; i0 < GS_BM * GS_BN / 2; i0 += GW_ROUND * blockDim.x) {
        float2 s[GW_ROUND], zv[GW_ROUND];
        bool ok[GW_ROUND];
#pragma unroll
        for (int u = 0; u < GW_ROUND; ++u) {
            const int i = i0 + u * blockDim.x, r = i >> 5, row = m0 + r;
            ok[u] = i < GS_BM * GS_BN / 2 && row < m && col < n;
            s[u] = make_float2(0.0f, 0.0f);
            zv[u] = make_float2(0.0f, 0.0f);
            if (!ok[u]) continue;
            const long long at = (long long)row * n + col;
            if (pieces) {
                s[u] = __ldcg((const float2*)(part + at));
            } else {
                for (int o = 0; o < groups; ++o) {
                    const float2 v = *(const float2*)&sums[(o * GS_BM + r) * GW_TP + c];
                    s[u].x += v.x;
                    s[u].y += v.y;
                }
            }
            if (z) zv[u] = load_pair(z + at);
        }
#pragma unroll
        for (int u = 0; u < GW_ROUND; ++u) {
            if (!ok[u]) continue;
            const int row = m0 + ((i0 + u * blockDim.x) >> 5);
            const long long at = (long long)row * n + col;
            if (pieces) __stcg((float2*)(part + at), make_float2(0.0f, 0.0f));
            const float2 v = make_float2(s[u].x + bv.x + zv[u].x, s[u].y + bv.y + zv[u].y);
            store_pair(y + at, v, act, alpha, beta);
        }
    }
}

// conv_small's convolution (same parameters and layouts) with the whole piece in shared
// memory: blockDim.x / 64 threads a row of the tile, each walking its row's chunks of 8 K
// values that many chunks apart (a chunk lies in one tap: c a multiple of 8).
template <class T>
__device__ void conv_whole(const T* __restrict__ x, const T* __restrict__ w,
                           const T* __restrict__ bias, const T* z, T* y, float* part,
                           unsigned* counts, int m, int n, int kw, int kc, int act, float alpha,
                           float beta, int h, int wd, int c, int p, int q, int ks, int stride,
                           int pt, int pl, int dh, int dw) {
    auto load_x = [&](T* xs, int xp) {
        const int tpr = blockDim.x / GS_BM, t = threadIdx.x;
        const int r = t / tpr, step = tpr * 8, row = blockIdx.y * GS_BM + r;
        const bool live = row < m;
        const int pix = live ? row : 0, b = pix / (p * q), rest = pix - b * p * q;
        const int op = rest / q, oq = rest - op * q;
        const T* img = x + (long long)b * h * wd * c;
        const int ih = op * stride - pt, iw = oq * stride - pl;
        int next = blockIdx.z * kc + (t % tpr) * 8;
        int ch = next % c, tap = next / c;
        int tr = tap / ks, ts = tap - tr * ks;
        for (int kk = (t % tpr) * 8; kk < kc; kk += step) {
            const int yy = ih + tr * dh, xx = iw + ts * dw;
            const bool in = next < kw && live && yy >= 0 && yy < h && xx >= 0 && xx < wd;
            const T* src = in ? img + (yy * wd + xx) * c + ch : x;
            copy16(&xs[r * xp + kk], src, in ? 16 : 0);
            next += step;
            ch += step;
            while (ch >= c) {
                ch -= c;
                if (++ts == ks) {
                    ts = 0;
                    ++tr;
                }
            }
        }
    };
    whole_tile<T>(load_x, w, bias, z, y, part, counts, m, n, kw, kc, act, alpha, beta);
}

CONV_KERNEL(conv_whole, H, f16)
CONV_KERNEL(conv_whole, B, bf16)
"#;

/// Dynamic shared memory of a block holding a piece of `kc` values of K with `groups` warp
/// groups: the x and w tiles, or the groups' f32 tiles laid over them, whichever is larger.
pub(super) fn shared_bytes(kc: usize, groups: usize) -> usize {
    let tiles = (64 * (kc + 8) + kc * 72) * 2;
    tiles.max(groups * 64 * 72 * 4)
}

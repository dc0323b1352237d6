//! The training kernels' device code (CUDA C, compiled by NVRTC): the step state's layout,
//! batch gathering and casting, the losses with their gradients, the epilogue kernels, the
//! optimizers and the scaler, each typed kernel instantiated for f32, f16 and bf16 (one part
//! each, compiled apart). The launchers are in the parent module; `State` here must match the
//! bytes the step state module (`gpu::state`) writes.

pub(super) const SOURCE: &str = r#"
// The step state: floats then ints (see trainkit.rs).
struct State {
    float scale;      // the loss scale (1 without a scaler)
    float step_size;  // Adam: lr / (1 - beta1^t) for the next update
    float bc2_sqrt;   // Adam: sqrt(1 - beta2^t) for the next update
    float spare;
    int found_inf;    // the gradients of this update hold an inf or NaN
    int step;         // updates applied
    int growth;       // clean updates since the scale last changed
    int skipped;      // updates skipped because of inf/NaN gradients
};

#define LOOP(i, n) for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < (n); \
                        i += (long)gridDim.x * blockDim.x)

// dst[r, :] = src[idx[r], :] for a row-major f32 matrix, converted to T. Blocks along y take
// rows, along x a row's columns; four columns a thread (one 16-byte load) when every row starts
// 16-byte aligned.
template <class T> __device__ void gather_rows(const float* src, T* dst, const unsigned* idx,
                                               int rows, int cols) {
    bool vec = (cols & 3) == 0 && ((unsigned long long)src & 15) == 0;
    int per = vec ? 4 : 1;
    long stride = (long)gridDim.x * blockDim.x * per;
    for (long r = blockIdx.y; r < rows; r += gridDim.y) {
        const float* s = src + (long)idx[r] * cols;
        T* d = dst + r * cols;
        for (long c = ((long)blockIdx.x * blockDim.x + threadIdx.x) * per; c < cols; c += stride) {
            if (vec) {
                float4 v = *reinterpret_cast<const float4*>(s + c);
                d[c] = from_f<T>(v.x);
                d[c + 1] = from_f<T>(v.y);
                d[c + 2] = from_f<T>(v.z);
                d[c + 3] = from_f<T>(v.w);
            } else {
                d[c] = from_f<T>(s[c]);
            }
        }
    }
}

template <class T> __device__ void cast(const float* src, T* dst, long n) {
    LOOP(o, n) dst[o] = from_f<T>(src[o]);
}

template <class T> __device__ void widen(const T* src, float* dst, long n) {
    LOOP(o, n) dst[o] = to_f(src[o]);
}

// One block: the loss's sum in double over a fixed assignment of elements to threads and a
// fixed tree, so the same inputs always give the same bits.
__device__ double block_sum(double v, double* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    double r = shared[0];
    __syncthreads();
    return r;
}

// MSE over n elements: *loss = mean((o - t)^2); grad = 2 (o - t) / n * mult * scale.
template <class T> __device__ void mse(const T* out, const float* target, T* grad, int n,
                                       const State* st, float mult, double* loss) {
    __shared__ double part[1024];
    float k = 2.0f / (float)n * mult * (st ? st->scale : 1.0f);
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float d = to_f(out[i]) - target[i];
        s += (double)d * (double)d;
        if (grad) grad[i] = from_f<T>(k * d);
    }
    double total = block_sum(s, part);
    if (threadIdx.x == 0) *loss = total / (double)n;
}

// Cross-entropy over rows x width logits with label smoothing eps (PyTorch's):
// *loss = mean((1 - eps) (logsumexp(row) - row[c]) + eps mean_j(logsumexp(row) - row[j]));
// grad = (softmax(row) - q) / rows * mult * scale, q = (1 - eps) onehot(c) + eps / width;
// *correct = rows whose largest logit (the first, on ties) is the target's. Without smoothing
// every operation is the plain cross-entropy's.
template <class T> __device__ void cross_entropy(const T* out, const unsigned* cls, T* grad,
                                                 int rows, int width, const State* st,
                                                 float mult, float eps, double* loss,
                                                 unsigned* correct) {
    __shared__ double part[1024];
    float k = 1.0f / (float)rows * mult * (st ? st->scale : 1.0f);
    float off = eps / (float)width, on = 1.0f - eps;
    double s = 0.0, right = 0.0;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        const T* row = out + (long)r * width;
        int c = (int)cls[r];
        float mx = to_f(row[0]); int arg = 0;
        for (int j = 1; j < width; ++j) { float v = to_f(row[j]); if (v > mx) { mx = v; arg = j; } }
        float total = 0.0f;
        for (int j = 0; j < width; ++j) total += expf(to_f(row[j]) - mx);
        double term = (double)(logf(total) + mx - to_f(row[c]));
        if (eps != 0.0f) {
            // the smoothed loss summed in double, as the CPU reference does
            double lse = (double)logf(total) + (double)mx, spread = 0.0;
            for (int j = 0; j < width; ++j) spread += lse - (double)to_f(row[j]);
            term = (1.0 - (double)eps) * (lse - (double)to_f(row[c]))
                 + (double)eps * spread / (double)width;
        }
        s += term;
        right += arg == c ? 1.0 : 0.0;
        if (grad) {
            T* g = grad + (long)r * width;
            for (int j = 0; j < width; ++j) {
                float p = expf(to_f(row[j]) - mx) / total;
                g[j] = from_f<T>(k * (p - (j == c ? off + on : off)));
            }
        }
    }
    double total = block_sum(s, part);
    double hits = block_sum(right, part);
    if (threadIdx.x == 0) { *loss = total / (double)rows; if (correct) *correct = (unsigned)hits; }
}

// The cross-entropy above with one block of CE_THREADS threads a row (a row of 1000 classes
// was one thread's serial work): the row's term and whether its largest logit is the target's
// into part[2 r] and part[2 r + 1], its gradient row when grad is given; cross_entropy_total
// then sums the rows in a fixed order. Every reduction is a fixed tree: reproducible bits.
#define CE_THREADS 256
template <class T> __device__ void cross_entropy_row(const T* out, const unsigned* cls, T* grad,
                                                     int rows, int width, const State* st,
                                                     float mult, float eps, double* part) {
    __shared__ float fv[CE_THREADS];
    __shared__ int fi[CE_THREADS];
    __shared__ double dv[1024];
    int r = blockIdx.x, t = threadIdx.x;
    const T* row = out + (long)r * width;
    int c = (int)cls[r];
    // the largest logit, the first on ties (each thread's in order, then the lower index)
    float mx = -__int_as_float(0x7f800000); int arg = 0x7fffffff;
    if (t < width) { mx = to_f(row[t]); arg = t; }
    for (int j = t + CE_THREADS; j < width; j += CE_THREADS) {
        float v = to_f(row[j]);
        if (v > mx) { mx = v; arg = j; }
    }
    fv[t] = mx; fi[t] = arg;
    __syncthreads();
    for (int s = CE_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            float a = fv[t], b = fv[t + s];
            if (b > a || (b == a && fi[t + s] < fi[t])) { fv[t] = b; fi[t] = fi[t + s]; }
        }
        __syncthreads();
    }
    mx = fv[0]; arg = fi[0];
    __syncthreads();
    float e = 0.0f;
    for (int j = t; j < width; j += CE_THREADS) e += expf(to_f(row[j]) - mx);
    fv[t] = e;
    __syncthreads();
    for (int s = CE_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) fv[t] += fv[t + s];
        __syncthreads();
    }
    float total = fv[0];
    double term = (double)(logf(total) + mx - to_f(row[c]));
    if (eps != 0.0f) {
        // sum_j (lse - row[j]) = width lse - sum_j row[j], in double
        double sv = 0.0;
        for (int j = t; j < width; j += CE_THREADS) sv += (double)to_f(row[j]);
        double sum = block_sum(sv, dv);
        double lse = (double)logf(total) + (double)mx;
        term = (1.0 - (double)eps) * (lse - (double)to_f(row[c]))
             + (double)eps * ((double)width * lse - sum) / (double)width;
    }
    if (grad) {
        float k = 1.0f / (float)rows * mult * (st ? st->scale : 1.0f);
        float off = eps / (float)width, on = 1.0f - eps;
        T* g = grad + (long)r * width;
        for (int j = t; j < width; j += CE_THREADS) {
            float p = expf(to_f(row[j]) - mx) / total;
            g[j] = from_f<T>(k * (p - (j == c ? off + on : off)));
        }
    }
    if (t == 0) { part[2 * (long)r] = term; part[2 * (long)r + 1] = arg == c ? 1.0 : 0.0; }
}

// y (m x n column-major) = y + bias[i] (then relu): the forward epilogue run apart.
template <class T> __device__ void bias_act(T* y, const float* bias, int m, int n, int relu) {
    LOOP(o, (long)m * n) {
        float v = to_f(y[o]) + bias[o % m];
        y[o] = from_f<T>(relu && v < 0.0f ? 0.0f : v);
    }
}

// dx = h > 0 ? dx : 0 (h: the forward's output after its ReLU).
template <class T> __device__ void relu_grad(T* dx, const T* h, long n) {
    LOOP(o, n) if (!(to_f(h[o]) > 0.0f)) dx[o] = from_f<T>(0.0f);
}

// db[i] = beta * db[i] + sum_j dy[i + j m]: the bias gradient of an m x n column-major dy.
// A block takes 32 rows; its 32 x 32 threads read 32 consecutive rows (coalesced) of every
// 32nd column, then one thread a row adds the 32 partial sums in order (reproducible).
template <class T> __device__ void bias_grad(const T* dy, float* db, int m, int n, float beta) {
    __shared__ float part[32][33];
    int i = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (i < m) for (int j = threadIdx.y; j < n; j += 32) s += to_f(dy[i + (long)j * m]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < m) {
        float t = 0.0f;
        for (int k = 0; k < 32; ++k) t += part[k][threadIdx.x];
        db[i] = beta != 0.0f ? beta * db[i] + t : t;
    }
}

// relu_grad then bias_grad in one pass: dy[i + j m] = h > 0 ? dy : 0 (h the forward's output
// after its ReLU), db[i] = beta db[i] + sum_j of the masked dy, in bias_grad's order (the same
// bits as the two kernels one after the other).
template <class T> __device__ void relu_bias_grad(T* dy, const T* h, float* db, int m, int n,
                                                  float beta) {
    __shared__ float part[32][33];
    int i = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (i < m) for (int j = threadIdx.y; j < n; j += 32) {
        long o = i + (long)j * m;
        if (to_f(h[o]) > 0.0f) s += to_f(dy[o]);
        else dy[o] = from_f<T>(0.0f);
    }
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < m) {
        float t = 0.0f;
        for (int k = 0; k < 32; ++k) t += part[k][threadIdx.x];
        db[i] = beta != 0.0f ? beta * db[i] + t : t;
    }
}

// The gradient an update reads: g, or with another rank's g2 (may be null) the two averaged
// as (g + g2) * s.
__device__ __forceinline__ float grad_at(const float* g, const float* g2, float s, long i) {
    return g2 ? (g[i] + g2[i]) * s : g[i];
}

// Adam / AdamW over n parameters (PyTorch's rules, in the CPU engine's order of operations),
// skipped whole when the gradients overflowed; `half` (may be null) receives the new weights
// in the compute type.
template <class T> __device__ void adam(float* p, const float* g, const float* g2, float g2s,
                                        float* m, float* v, T* half, long n, const State* st,
                                        float wd, float decay, float b1c, float b2, float b2c,
                                        float eps, int adamw, int scaled) {
    if (st->found_inf) return;
    float inv = scaled ? 1.0f / st->scale : 1.0f;
    float step_size = st->step_size, bc2 = st->bc2_sqrt;
    LOOP(i, n) {
        float pi = p[i], d = grad_at(g, g2, g2s, i) * inv;
        if (adamw) pi *= decay; else d += wd * pi;
        float mi = m[i] + b1c * (d - m[i]);
        float vi = b2 * v[i] + b2c * d * d;
        float denom = sqrtf(vi) / bc2 + eps;
        pi -= step_size * (mi / denom);
        p[i] = pi; m[i] = mi; v[i] = vi;
        if (half) half[i] = from_f<T>(pi);
    }
}

// SGD with optional momentum (buffer = d on the first update; Nesterov: the step is
// d + momentum buffer) and weight decay.
template <class T> __device__ void sgd(float* p, const float* g, const float* g2, float g2s,
                                       float* m, T* half, long n, const State* st, float lr,
                                       float wd, float momentum, int nesterov, int scaled) {
    if (st->found_inf) return;
    float inv = scaled ? 1.0f / st->scale : 1.0f;
    int first = st->step == 0;
    LOOP(i, n) {
        float pi = p[i], d = grad_at(g, g2, g2s, i) * inv + wd * pi;
        if (m) {
            float b = first ? d : momentum * m[i] + d;
            m[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        pi -= lr * d;
        p[i] = pi;
        if (half) half[i] = from_f<T>(pi);
    }
}

#define INSTANCES(T, TAG)                                                                      \
extern "C" __global__ void gather_rows_##TAG(const float* s, T* d, const unsigned* idx, int r, \
    int c) { gather_rows<T>(s, d, idx, r, c); }                                                \
extern "C" __global__ void cast_##TAG(const float* s, T* d, long n) { cast<T>(s, d, n); }      \
extern "C" __global__ void widen_##TAG(const T* s, float* d, long n) { widen<T>(s, d, n); }    \
extern "C" __global__ void mse_##TAG(const T* o, const float* t, T* g, int n, const State* st,  \
    float mult, double* loss) { mse<T>(o, t, g, n, st, mult, loss); }                          \
extern "C" __global__ void cross_entropy_##TAG(const T* o, const unsigned* c, T* g, int r,      \
    int w, const State* st, float mult, float eps, double* loss, unsigned* correct)             \
    { cross_entropy<T>(o, c, g, r, w, st, mult, eps, loss, correct); }                         \
extern "C" __global__ void cross_entropy_row_##TAG(const T* o, const unsigned* c, T* g, int r,  \
    int w, const State* st, float mult, float eps, double* part)                               \
    { cross_entropy_row<T>(o, c, g, r, w, st, mult, eps, part); }                              \
extern "C" __global__ void bias_act_##TAG(T* y, const float* b, int m, int n, int relu)        \
    { bias_act<T>(y, b, m, n, relu); }                                                         \
extern "C" __global__ void relu_grad_##TAG(T* dx, const T* h, long n) { relu_grad<T>(dx, h, n); } \
extern "C" __global__ void bias_grad_##TAG(const T* dy, float* db, int m, int n, float beta)   \
    { bias_grad<T>(dy, db, m, n, beta); }                                                      \
extern "C" __global__ void relu_bias_grad_##TAG(T* dy, const T* h, float* db, int m, int n,     \
    float beta) { relu_bias_grad<T>(dy, h, db, m, n, beta); }                                  \
extern "C" __global__ void adam_##TAG(float* p, const float* g, const float* g2, float g2s,   \
    float* m, float* v, T* h, long n, const State* st, float wd, float decay, float b1c,        \
    float b2, float b2c, float eps, int adamw, int scaled) { adam<T>(p, g, g2, g2s, m, v, h, n,  \
    st, wd, decay, b1c, b2, b2c, eps, adamw, scaled); }                                        \
extern "C" __global__ void sgd_##TAG(float* p, const float* g, const float* g2, float g2s,    \
    float* m, T* h, long n, const State* st, float lr, float wd, float mom, int nesterov,        \
    int scaled) { sgd<T>(p, g, g2, g2s, m, h, n, st, lr, wd, mom, nesterov, scaled); }

"#;

/// The typed instances, one part each, and the untyped kernels with the f32 ones (compiled
/// apart: see `gpukit_cuda::kernel::PART`).
pub(super) const PARTS: [&str; 3] = ["INSTANCES(H, f16)", "INSTANCES(B, bf16)", UNTYPED];

const UNTYPED: &str = r#"
INSTANCES(float, f32)

extern "C" __global__ void gather_u32(const unsigned* s, unsigned* d, const unsigned* idx, int r,
                                      int c) {
    LOOP(o, (long)r * c) { long row = o / c; d[o] = s[(long)idx[row] * c + o % c]; }
}

// The rows' terms and hits of cross_entropy_row summed in a fixed order (one block of 1024).
extern "C" __global__ void cross_entropy_total(const double* part, int rows, double* loss,
                                               unsigned* correct) {
    __shared__ double sh[1024];
    double s = 0.0, right = 0.0;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        s += part[2 * (long)r]; right += part[2 * (long)r + 1];
    }
    double total = block_sum(s, sh);
    double hits = block_sum(right, sh);
    if (threadIdx.x == 0) { *loss = total / (double)rows; if (correct) *correct = (unsigned)hits; }
}

extern "C" __global__ void axpy_f32(float* y, const float* x, long n) { LOOP(i, n) y[i] += x[i]; }

// Marks the state when any of n gradients is inf or NaN (the scaler's check).
extern "C" __global__ void check_finite(const float* g, long n, State* st) {
    LOOP(i, n) if (!isfinite(g[i])) st->found_inf = 1;
}

// After an update: count it (or the skip), move the loss scale by GradScaler's rules, and
// prepare Adam's bias corrections for the next one. One thread.
extern "C" __global__ void advance(State* st, int scaled, double lr, double beta1, double beta2,
                                   int growth_interval) {
    if (scaled && st->found_inf) {
        st->scale *= 0.5f; st->growth = 0; st->skipped += 1; st->found_inf = 0;
    } else {
        st->step += 1;
        if (scaled && ++st->growth == growth_interval) { st->scale *= 2.0f; st->growth = 0; }
    }
    double t = (double)(st->step + 1);
    st->step_size = (float)(lr / (1.0 - pow(beta1, t)));
    st->bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
}
"#;

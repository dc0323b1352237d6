//! A convolution's three passes for training, on algorithms from cuDNN's heuristic ranking.

use super::*;

/// One of a convolution's three computations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pass {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx = conv_transposed(dy, w)`.
    BackwardData,
    /// `dw = correlation of x with dy`.
    BackwardFilter,
}

impl Pass {
    pub const ALL: [Pass; 3] = [Pass::Forward, Pass::BackwardData, Pass::BackwardFilter];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::BackwardData => "backward data",
            Pass::BackwardFilter => "backward filter",
        }
    }

    fn index(self) -> usize {
        match self {
            Pass::Forward => 0,
            Pass::BackwardData => 1,
            Pass::BackwardFilter => 2,
        }
    }
}

/// The legacy backward-data algorithms with the names reports use.
const DATA_ALGOS: [(&str, dn::cudnnConvolutionBwdDataAlgo_t); 6] = {
    use dn::cudnnConvolutionBwdDataAlgo_t as D;
    [
        ("ALGO_0", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0),
        ("ALGO_1", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1),
        ("FFT", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT),
        ("FFT_TILING", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING),
        ("WINOGRAD", D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD),
        (
            "WINOGRAD_NONFUSED",
            D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
        ),
    ]
};

/// The legacy backward-filter algorithms with the names reports use.
const FILTER_ALGOS: [(&str, dn::cudnnConvolutionBwdFilterAlgo_t); 7] = {
    use dn::cudnnConvolutionBwdFilterAlgo_t as F;
    [
        ("ALGO_0", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0),
        ("ALGO_1", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1),
        ("FFT", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT),
        ("ALGO_3", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3),
        ("WINOGRAD", F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD),
        (
            "WINOGRAD_NONFUSED",
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
        ),
        (
            "FFT_TILING",
            F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
        ),
    ]
};

/// The name of `algo` in `table`.
fn named<A: PartialEq + Copy>(table: &[(&'static str, A)], algo: A) -> &'static str {
    table
        .iter()
        .find(|(_, a)| *a == algo)
        .map_or("unknown algorithm", |(n, _)| n)
}

/// An algorithm of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algo {
    Fwd(dn::cudnnConvolutionFwdAlgo_t),
    Data(dn::cudnnConvolutionBwdDataAlgo_t),
    Filter(dn::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    fn name(self) -> &'static str {
        match self {
            Algo::Fwd(a) => named(&FWD_ALGOS, a),
            Algo::Data(a) => named(&DATA_ALGOS, a),
            Algo::Filter(a) => named(&FILTER_ALGOS, a),
        }
    }
}

/// One row of cuDNN's heuristic ranking, whatever the pass.
#[derive(Debug, Clone, Copy)]
struct Ranked {
    algo: Algo,
    math: dn::cudnnMathType_t,
    supported: bool,
    deterministic: bool,
}

impl Algo {
    /// Whether the algorithm sums the products as written: not through Winograd's or FFT's
    /// transforms, whose rounding moved f32 training away from float64 within a few updates
    /// (the inference engine's exact f32 leaves them out for the same reason).
    fn exact(self) -> bool {
        use dn::cudnnConvolutionBwdDataAlgo_t as D;
        use dn::cudnnConvolutionBwdFilterAlgo_t as F;
        match self {
            Algo::Fwd(a) => super::super::legacy::exact_f32_algo(a),
            Algo::Data(a) => !matches!(
                a,
                D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT
                    | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING
                    | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD
                    | D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED
            ),
            Algo::Filter(a) => !matches!(
                a,
                F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT
                    | F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING
                    | F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD
                    | F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED
            ),
        }
    }
}

/// Whether a ranked algorithm may run `conv`: supported, and for strict f32 listed under FMA or
/// default math (the descriptor's FMA math type then keeps it off tensor cores) and exact
/// ([`Algo::exact`]): f32 training is the precise path, compared with float64.
fn usable(conv: &Conv, algo: Algo, math: dn::cudnnMathType_t, supported: bool) -> bool {
    use dn::cudnnMathType_t as M;
    supported
        && (conv.dtype.uses_tensor_cores()
            || matches!(math, M::CUDNN_FMA_MATH | M::CUDNN_DEFAULT_MATH) && algo.exact())
}

/// One way cuDNN can run a pass, with the workspace it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    algo: Algo,
    /// The algorithm's name (cuDNN's enum without its prefix).
    pub name: &'static str,
    pub workspace_bytes: usize,
    /// Whether cuDNN says the algorithm gives the same bits on every run.
    pub deterministic: bool,
}

/// A convolution's descriptors and, for each pass, cuDNN's ranked algorithms that fit the
/// workspace limit (heuristic order) and which of them runs: the first unless
/// [`ConvTrain::choose`] picked another (a timed search may do that).
pub struct ConvTrain {
    plan: ConvPlan,
    candidates: [Vec<Candidate>; 3],
    chosen: Cell<[usize; 3]>,
}

impl ConvTrain {
    pub fn conv(&self) -> Conv {
        self.plan.conv
    }

    /// The pass's usable algorithms, cuDNN's heuristic order.
    pub fn candidates(&self, pass: Pass) -> &[Candidate] {
        &self.candidates[pass.index()]
    }

    /// The algorithm that runs the pass.
    pub fn chosen(&self, pass: Pass) -> Result<Candidate> {
        let i = self.chosen.get()[pass.index()];
        self.candidates(pass).get(i).copied().ok_or_else(|| {
            Error::NoAlgorithm(format!("{:?}: no {} algorithm", self.conv(), pass.name()))
        })
    }

    /// Runs the pass with its candidate `index` from now on.
    pub fn choose(&self, pass: Pass, index: usize) -> Result<()> {
        let n = self.candidates(pass).len();
        if index >= n {
            return Err(Error::Invalid(format!(
                "{} algorithm {index} of {n} candidates",
                pass.name()
            )));
        }
        let mut c = self.chosen.get();
        c[pass.index()] = index;
        self.chosen.set(c);
        Ok(())
    }

    /// The workspace every chosen algorithm fits in.
    pub fn workspace_bytes(&self) -> usize {
        Pass::ALL
            .iter()
            .filter_map(|&p| self.chosen(p).ok())
            .map(|c| c.workspace_bytes)
            .max()
            .unwrap_or(0)
    }
}

/// cuDNN's heuristic ranking of one pass's algorithms: the `_v7` query into as many result
/// slots as cuDNN has algorithms for the pass, each row converted to a [`Ranked`].
macro_rules! ranking {
    ($handle:expr, $max:ident, $query:ident, $perf:ty, $variant:ident, ($($desc:expr),*)) => {{
        let mut max = 0;
        // SAFETY: live handle, out-pointer to a local.
        ok(stringify!($max), unsafe { dn::$max($handle, &mut max) })?;
        // SAFETY: zeroed POD structs, overwritten by cuDNN.
        let mut perf: Vec<$perf> = vec![unsafe { std::mem::zeroed() }; max.max(1) as usize];
        let mut returned = 0;
        // SAFETY: live handle and descriptors; `perf` holds as many structs as asked for.
        ok(stringify!($query), unsafe {
            dn::$query($handle, $($desc,)* perf.len() as i32, &mut returned, perf.as_mut_ptr())
        })?;
        perf.truncate(returned.max(0) as usize);
        perf.iter()
            .map(|r| Ranked {
                algo: Algo::$variant(r.algo),
                math: r.mathType,
                supported: r.status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
                deterministic: r.determinism == dn::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
            })
            .collect::<Vec<Ranked>>()
    }};
}

impl Dnn {
    /// The training plan of `conv`: its descriptors and each pass's usable algorithms, from
    /// cuDNN's heuristic ranking (nothing is run), within the workspace limit. Kept on the
    /// handle: the same shape asked again gets the same plan.
    pub fn plan_conv_train(&self, conv: Conv) -> Result<Rc<ConvTrain>> {
        if let Some(plan) = self.train_plans.borrow().get(&conv) {
            return Ok(plan.clone());
        }
        if !conv.shape.groups_fit() {
            return Err(Error::Invalid(format!(
                "a convolution of {} groups over {} input and {} output channels",
                conv.shape.groups, conv.shape.c, conv.shape.k
            )));
        }
        let plan = ConvPlan::describe(conv)?;
        let mut candidates: [Vec<Candidate>; 3] = Default::default();
        for pass in Pass::ALL {
            let list = &mut candidates[pass.index()];
            for row in self.ranking(&plan, pass)? {
                if !usable(&conv, row.algo, row.math, row.supported)
                    || list.iter().any(|c| c.algo == row.algo)
                {
                    continue;
                }
                // an algorithm whose size cuDNN will not give (not supported after all) is
                // skipped like one over the limit
                let Ok(bytes) = self.pass_workspace(&plan, row.algo) else {
                    continue;
                };
                if bytes <= self.workspace_limit() {
                    list.push(Candidate {
                        algo: row.algo,
                        name: row.algo.name(),
                        workspace_bytes: bytes,
                        deterministic: row.deterministic,
                    });
                }
            }
            if list.is_empty() {
                return Err(Error::NoAlgorithm(format!(
                    "{conv:?}: cuDNN suggests no {} algorithm within {} bytes of workspace{}",
                    pass.name(),
                    self.workspace_limit(),
                    if conv.dtype.uses_tensor_cores() {
                        ""
                    } else {
                        " off tensor cores"
                    }
                )));
            }
        }
        let plan = Rc::new(ConvTrain {
            plan,
            candidates,
            chosen: Cell::new([0; 3]),
        });
        self.train_plans.borrow_mut().insert(conv, plan.clone());
        Ok(plan)
    }

    /// Times every algorithm cuDNN has for each of the plan's passes on scratch buffers of its
    /// shapes (`cudnnFind*AlgorithmEx`, what PyTorch's `cudnn.benchmark` calls, with the planning
    /// workspace) and makes the fastest of the plan's candidates its choice. A pass whose search
    /// fails, or finds none of the candidates, keeps the heuristic's choice; a strict f32 plan
    /// keeps its math type, so the times are of what will run.
    pub fn benchmark_conv_train(&self, plan: &ConvTrain) -> Result<()> {
        let conv = plan.conv();
        let alloc = |bytes: usize| -> Result<crate::memory::DeviceBuffer> {
            Ok(crate::memory::DeviceBuffer::new(
                self.gpu_stream.raw().alloc_zeros::<u8>(bytes.max(256))?,
            ))
        };
        let (x, w, y) = (
            alloc(conv.input_bytes())?,
            alloc(conv.filter_bytes())?,
            alloc(conv.output_bytes())?,
        );
        let wsb = self.planning_workspace()?;
        let ws = wsb.view();
        for pass in Pass::ALL {
            let timed = match self.find(plan, pass, (x.view(), w.view(), y.view()), ws) {
                Ok(t) => t,
                Err(e) => {
                    crate::trace::note(|| {
                        format!("{conv:?} {}: cuDNN's search failed ({e})", pass.name())
                    });
                    continue;
                }
            };
            let fastest = timed.iter().find_map(|(algo, math)| {
                usable(&conv, *algo, *math, true)
                    .then(|| plan.candidates(pass).iter().position(|c| c.algo == *algo))
                    .flatten()
            });
            if let Some(i) = fastest {
                plan.choose(pass, i)?;
            }
        }
        Ok(())
    }

    /// cuDNN's timed search of one pass on (input, filter, output) buffers: the algorithms
    /// that ran, fastest first, with their math types.
    fn find(
        &self,
        plan: &ConvTrain,
        pass: Pass,
        (x, w, y): (View<'_>, View<'_>, View<'_>),
        ws: View<'_>,
    ) -> Result<Vec<(Algo, dn::cudnnMathType_t)>> {
        let (p, h) = (&plan.plan, self.handle());
        let (xa, wa, ya) = (
            x.addr() as *mut c_void,
            w.addr() as *mut c_void,
            y.addr() as *mut c_void,
        );
        let (wsa, wsn) = (ws.addr() as *mut c_void, ws.bytes());
        macro_rules! find {
            ($max:ident, $query:ident, $perf:ty, $variant:ident, ($($arg:expr),*)) => {{
                let mut max = 0;
                // SAFETY: live handle, out-pointer to a local.
                ok(stringify!($max), unsafe { dn::$max(h, &mut max) })?;
                // SAFETY: zeroed POD structs, overwritten by cuDNN.
                let mut perf: Vec<$perf> = vec![unsafe { std::mem::zeroed() }; max.max(1) as usize];
                let mut returned = 0;
                // SAFETY: the buffers hold the descriptors' shapes (allocated from them); the
                // workspace is the planning workspace of `wsn` bytes; `perf` holds as many
                // structs as asked for.
                ok(stringify!($query), unsafe {
                    dn::$query(h, $($arg,)* perf.len() as i32, &mut returned, perf.as_mut_ptr(), wsa, wsn)
                })?;
                perf.truncate(returned.max(0) as usize);
                perf.iter()
                    .filter(|r| r.status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
                    .map(|r| (Algo::$variant(r.algo), r.mathType))
                    .collect()
            }};
        }
        Ok(match pass {
            Pass::Forward => find!(
                cudnnGetConvolutionForwardAlgorithmMaxCount,
                cudnnFindConvolutionForwardAlgorithmEx,
                dn::cudnnConvolutionFwdAlgoPerfStruct,
                Fwd,
                (p.x, xa, p.w, wa, p.desc, p.y, ya)
            ),
            Pass::BackwardData => find!(
                cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
                cudnnFindConvolutionBackwardDataAlgorithmEx,
                dn::cudnnConvolutionBwdDataAlgoPerfStruct,
                Data,
                (p.w, wa, p.y, ya, p.desc, p.x, xa)
            ),
            Pass::BackwardFilter => find!(
                cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
                cudnnFindConvolutionBackwardFilterAlgorithmEx,
                dn::cudnnConvolutionBwdFilterAlgoPerfStruct,
                Filter,
                (p.x, xa, p.y, ya, p.desc, p.w, wa)
            ),
        })
    }

    /// cuDNN's heuristic ranking of `pass` for the plan's descriptors.
    fn ranking(&self, plan: &ConvPlan, pass: Pass) -> Result<Vec<Ranked>> {
        let h = self.handle();
        Ok(match pass {
            Pass::Forward => ranking!(
                h,
                cudnnGetConvolutionForwardAlgorithmMaxCount,
                cudnnGetConvolutionForwardAlgorithm_v7,
                dn::cudnnConvolutionFwdAlgoPerfStruct,
                Fwd,
                (plan.x, plan.w, plan.desc, plan.y)
            ),
            Pass::BackwardData => ranking!(
                h,
                cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
                cudnnGetConvolutionBackwardDataAlgorithm_v7,
                dn::cudnnConvolutionBwdDataAlgoPerfStruct,
                Data,
                (plan.w, plan.y, plan.desc, plan.x)
            ),
            Pass::BackwardFilter => ranking!(
                h,
                cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
                cudnnGetConvolutionBackwardFilterAlgorithm_v7,
                dn::cudnnConvolutionBwdFilterAlgoPerfStruct,
                Filter,
                (plan.x, plan.y, plan.desc, plan.w)
            ),
        })
    }

    /// The workspace `algo` needs for the plan, asked of cuDNN.
    fn pass_workspace(&self, plan: &ConvPlan, algo: Algo) -> Result<usize> {
        let mut bytes = 0;
        let h = self.handle();
        // SAFETY: live handle and descriptors; out-pointer to a local.
        unsafe {
            match algo {
                Algo::Fwd(a) => ok(
                    "cudnnGetConvolutionForwardWorkspaceSize",
                    dn::cudnnGetConvolutionForwardWorkspaceSize(
                        h, plan.x, plan.w, plan.desc, plan.y, a, &mut bytes,
                    ),
                ),
                Algo::Data(a) => ok(
                    "cudnnGetConvolutionBackwardDataWorkspaceSize",
                    dn::cudnnGetConvolutionBackwardDataWorkspaceSize(
                        h, plan.w, plan.y, plan.desc, plan.x, a, &mut bytes,
                    ),
                ),
                Algo::Filter(a) => ok(
                    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                    dn::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                        h, plan.x, plan.y, plan.desc, plan.w, a, &mut bytes,
                    ),
                ),
            }
        }?;
        Ok(bytes)
    }

    /// `y = conv(x, w)` with the plan's chosen forward algorithm.
    pub fn conv_train_forward(
        &self,
        plan: &ConvTrain,
        x: View<'_>,
        w: View<'_>,
        y: View<'_>,
        ws: View<'_>,
    ) -> Result<()> {
        let (p, c) = (&plan.plan, plan.chosen(Pass::Forward)?);
        p.conv.check(x, w, y)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        let Algo::Fwd(algo) = c.algo else {
            return Err(wrong_pass(Pass::Forward));
        };
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked against the descriptors; f32 scalars for float/half/bf16 data;
        // the workspace holds what the algorithm asked for.
        ok("cudnnConvolutionForward", unsafe {
            dn::cudnnConvolutionForward(
                self.handle(),
                scalar(&alpha),
                p.x,
                x.addr() as *const c_void,
                p.w,
                w.addr() as *const c_void,
                p.desc,
                algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
                scalar(&beta),
                p.y,
                y.addr() as *mut c_void,
            )
        })
    }

    /// `dx = conv^T(dy, w)` (added to what `dx` holds when `accumulate`), the chosen
    /// backward-data algorithm.
    pub fn conv_backward_data(
        &self,
        plan: &ConvTrain,
        (w, dy, dx): (View<'_>, View<'_>, View<'_>),
        ws: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        let (p, c) = (&plan.plan, plan.chosen(Pass::BackwardData)?);
        p.conv.check(dx, w, dy)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        let Algo::Data(algo) = c.algo else {
            return Err(wrong_pass(Pass::BackwardData));
        };
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        // SAFETY: as conv_train_forward; dx and dy have the input's and output's descriptors.
        ok("cudnnConvolutionBackwardData", unsafe {
            dn::cudnnConvolutionBackwardData(
                self.handle(),
                scalar(&alpha),
                p.w,
                w.addr() as *const c_void,
                p.y,
                dy.addr() as *const c_void,
                p.desc,
                algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
                scalar(&beta),
                p.x,
                dx.addr() as *mut c_void,
            )
        })
    }

    /// `dw = x (*) dy` (added to what `dw` holds when `accumulate`), the chosen
    /// backward-filter algorithm.
    pub fn conv_backward_filter(
        &self,
        plan: &ConvTrain,
        (x, dy, dw): (View<'_>, View<'_>, View<'_>),
        ws: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        let (p, c) = (&plan.plan, plan.chosen(Pass::BackwardFilter)?);
        p.conv.check(x, dw, dy)?;
        ws.require(c.workspace_bytes, "convolution workspace")?;
        let Algo::Filter(algo) = c.algo else {
            return Err(wrong_pass(Pass::BackwardFilter));
        };
        let (alpha, beta) = (1f32, if accumulate { 1f32 } else { 0f32 });
        // SAFETY: as conv_train_forward; dw has the filter's descriptor.
        ok("cudnnConvolutionBackwardFilter", unsafe {
            dn::cudnnConvolutionBackwardFilter(
                self.handle(),
                scalar(&alpha),
                p.x,
                x.addr() as *const c_void,
                p.y,
                dy.addr() as *const c_void,
                p.desc,
                algo,
                ws.addr() as *mut c_void,
                c.workspace_bytes,
                scalar(&beta),
                p.w,
                dw.addr() as *mut c_void,
            )
        })
    }
}

fn wrong_pass(pass: Pass) -> Error {
    Error::Invalid(format!(
        "the plan's {} candidate is another pass's algorithm",
        pass.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_cover_every_enum_value() {
        assert_eq!(
            Algo::Data(dn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1).name(),
            "ALGO_1"
        );
        assert_eq!(
            Algo::Filter(
                dn::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING
            )
            .name(),
            "FFT_TILING"
        );
        assert_eq!(
            Algo::Fwd(dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD).name(),
            "WINOGRAD"
        );
        assert_eq!(
            Algo::Data(dn::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT)
                .name(),
            "unknown algorithm"
        );
    }

    #[test]
    fn strict_f32_keeps_only_exact_sums_in_fma_and_default_math() {
        use dn::cudnnMathType_t as M;
        let mut conv = Conv {
            shape: gpukit_types::ConvShape {
                n: 1,
                c: 3,
                h: 8,
                w: 8,
                k: 4,
                r: 3,
                s: 3,
                stride: 1,
                pad: 1,
                groups: 1,
            },
            layout: Layout::Nchw,
            dtype: DType::F32,
        };
        use dn::cudnnConvolutionBwdDataAlgo_t as D;
        use dn::cudnnConvolutionBwdFilterAlgo_t as F;
        use dn::cudnnConvolutionFwdAlgo_t as W;
        let gemm = Algo::Fwd(W::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
        assert!(usable(&conv, gemm, M::CUDNN_FMA_MATH, true));
        assert!(usable(&conv, gemm, M::CUDNN_DEFAULT_MATH, true));
        assert!(!usable(&conv, gemm, M::CUDNN_TENSOR_OP_MATH, true));
        assert!(!usable(
            &conv,
            gemm,
            M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            true
        ));
        assert!(!usable(&conv, gemm, M::CUDNN_FMA_MATH, false));
        // f32: every pass off Winograd and FFT; the plain sums of each pass kept
        for (algo, exact) in [
            (
                Algo::Fwd(W::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED),
                false,
            ),
            (Algo::Fwd(W::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING), false),
            (
                Algo::Data(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD),
                false,
            ),
            (Algo::Data(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT), false),
            (Algo::Data(D::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1), true),
            (
                Algo::Filter(F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED),
                false,
            ),
            (
                Algo::Filter(F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING),
                false,
            ),
            (Algo::Filter(F::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3), true),
        ] {
            assert_eq!(
                usable(&conv, algo, M::CUDNN_FMA_MATH, true),
                exact,
                "{algo:?}"
            );
        }
        // 16-bit types: tensor cores, and the transforms too (cuDNN's rounding is theirs)
        conv.dtype = DType::Bf16;
        assert!(usable(&conv, gemm, M::CUDNN_TENSOR_OP_MATH, true));
        assert!(usable(
            &conv,
            Algo::Fwd(W::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED),
            M::CUDNN_TENSOR_OP_MATH,
            true
        ));
    }
}

//! Batch normalisation in training mode and its backward (cuDNN's `Ex` forms, with the fused
//! ReLU and add + ReLU ops where cuDNN runs them).

use super::*;

/// What batch norm computes after normalising: nothing, ReLU, or adding a second input `z`
/// then ReLU (a residual block's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BnOps {
    Bn,
    BnRelu,
    BnAddRelu,
}

impl BnOps {
    fn cudnn(self) -> dn::cudnnBatchNormOps_t {
        use dn::cudnnBatchNormOps_t as O;
        match self {
            BnOps::Bn => O::CUDNN_BATCHNORM_OPS_BN,
            BnOps::BnRelu => O::CUDNN_BATCHNORM_OPS_BN_ACTIVATION,
            BnOps::BnAddRelu => O::CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
        }
    }
}

/// cuDNN's batch-norm kernels: `Spatial` (statistics over n, h, w; any layout and type) or
/// `SpatialPersistent` (faster, channels-last 16-bit data; may overflow on extreme inputs,
/// cuDNN warns).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BnMode {
    Spatial,
    SpatialPersistent,
}

impl BnMode {
    fn cudnn(self) -> dn::cudnnBatchNormMode_t {
        match self {
            BnMode::Spatial => dn::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
            BnMode::SpatialPersistent => {
                dn::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL_PERSISTENT
            }
        }
    }
}

/// One training-mode batch norm: its descriptors, the op fused after it and the workspace and
/// reserve space cuDNN asked for. The forward's reserve space must reach the backward intact.
pub struct BatchNorm {
    x: TensorDesc,
    param: TensorDesc,
    relu: Option<ReluDesc>,
    pub maps: Maps,
    pub ops: BnOps,
    pub mode: BnMode,
    /// Added to the variance before its square root (PyTorch's 1e-5).
    pub eps: f64,
    /// How far the running statistics move toward the batch's (PyTorch's momentum, 0.1; cuDNN's
    /// exponential average factor). The running variance moves toward the unbiased variance,
    /// as PyTorch's does.
    pub momentum: f64,
    forward_ws: usize,
    backward_ws: usize,
    reserve: usize,
}

impl BatchNorm {
    /// The workspace both passes fit in.
    pub fn workspace_bytes(&self) -> usize {
        self.forward_ws.max(self.backward_ws)
    }

    /// The reserve space the forward fills and the backward reads (0: none).
    pub fn reserve_bytes(&self) -> usize {
        self.reserve
    }

    fn relu_desc(&self) -> dn::cudnnActivationDescriptor_t {
        self.relu.as_ref().map_or(std::ptr::null_mut(), |r| r.0)
    }

    /// The descriptor of `z` (and `dz`): the input's when the op adds, else none.
    fn z_desc(&self) -> dn::cudnnTensorDescriptor_t {
        if self.ops == BnOps::BnAddRelu {
            self.x.0
        } else {
            std::ptr::null_mut()
        }
    }
}

/// The buffers of a training-mode batch-norm forward. `gamma`, `beta`, the running and saved
/// statistics are f32, one a channel; `z` is given exactly when the op is [`BnOps::BnAddRelu`].
#[derive(Clone, Copy, Debug)]
pub struct BnForward<'a> {
    pub x: View<'a>,
    pub z: Option<View<'a>>,
    pub y: View<'a>,
    pub gamma: View<'a>,
    pub beta: View<'a>,
    pub running_mean: View<'a>,
    pub running_var: View<'a>,
    /// Whether the running statistics move toward the batch's (by the norm's momentum). A
    /// recomputation of a forward already made (activation checkpointing) leaves them where
    /// that forward put them: cuDNN is given a factor of 0, so each becomes `r * 1 + 0 * batch`,
    /// the same bits.
    pub move_running: bool,
    /// The batch's mean, written for the backward.
    pub saved_mean: View<'a>,
    /// The batch's 1 / sqrt(biased variance + eps), written for the backward.
    pub saved_invstd: View<'a>,
}

/// The buffers of a batch-norm backward: `y` (the forward's output) is given when a ReLU was
/// fused, `dz` (the gradient of the added input, written) exactly when the op adds.
#[derive(Clone, Copy, Debug)]
pub struct BnBackward<'a> {
    pub x: View<'a>,
    pub y: Option<View<'a>>,
    pub dy: View<'a>,
    pub dz: Option<View<'a>>,
    pub dx: View<'a>,
    pub gamma: View<'a>,
    pub beta: View<'a>,
    pub dgamma: View<'a>,
    pub dbeta: View<'a>,
    pub saved_mean: View<'a>,
    pub saved_invstd: View<'a>,
}

/// An error unless `given` is there exactly when the op needs it, and large enough.
fn optional(
    given: Option<View<'_>>,
    needed: bool,
    bytes: usize,
    what: &str,
    ops: BnOps,
) -> Result<()> {
    match (given, needed) {
        (Some(v), true) => v.require(bytes, what),
        (None, false) => Ok(()),
        (None, true) => Err(Error::Invalid(format!(
            "batch norm with {ops:?} needs {what}"
        ))),
        (Some(_), false) => Err(Error::Invalid(format!(
            "batch norm with {ops:?} takes no {what}"
        ))),
    }
}

/// The size checks of a forward: every map holds `maps`, every statistic one f32 a channel,
/// `z` exactly with the add.
fn check_forward(maps: &Maps, ops: BnOps, a: &BnForward<'_>) -> Result<()> {
    let (bytes, stat) = (maps.bytes(), maps.c.saturating_mul(4));
    a.x.require(bytes, "batch norm input")?;
    a.y.require(bytes, "batch norm output")?;
    optional(
        a.z,
        ops == BnOps::BnAddRelu,
        bytes,
        "z (the added input)",
        ops,
    )?;
    for (v, what) in [
        (a.gamma, "batch norm weight"),
        (a.beta, "batch norm bias"),
        (a.running_mean, "running mean"),
        (a.running_var, "running variance"),
        (a.saved_mean, "saved mean"),
        (a.saved_invstd, "saved inverse std"),
    ] {
        v.require(stat, what)?;
    }
    Ok(())
}

/// The size checks of a backward, as [`check_forward`]'s.
fn check_backward(maps: &Maps, ops: BnOps, a: &BnBackward<'_>) -> Result<()> {
    let (bytes, stat) = (maps.bytes(), maps.c.saturating_mul(4));
    a.x.require(bytes, "batch norm input")?;
    a.dy.require(bytes, "batch norm output gradient")?;
    a.dx.require(bytes, "batch norm input gradient")?;
    optional(
        a.y,
        ops != BnOps::Bn,
        bytes,
        "y (the forward's output)",
        ops,
    )?;
    optional(
        a.dz,
        ops == BnOps::BnAddRelu,
        bytes,
        "dz (the added input's gradient)",
        ops,
    )?;
    for (v, what) in [
        (a.gamma, "batch norm weight"),
        (a.beta, "batch norm bias"),
        (a.dgamma, "batch norm weight gradient"),
        (a.dbeta, "batch norm bias gradient"),
        (a.saved_mean, "saved mean"),
        (a.saved_invstd, "saved inverse std"),
    ] {
        v.require(stat, what)?;
    }
    Ok(())
}

/// The address of an optional view (null when absent).
fn addr_or_null(v: Option<View<'_>>) -> *mut c_void {
    v.map_or(std::ptr::null_mut(), |v| v.addr() as *mut c_void)
}

impl Dnn {
    /// A training-mode batch norm over `maps` with the op `ops` fused after it, in `mode`,
    /// `eps` and `momentum` as PyTorch's. An error naming the configuration when cuDNN does not
    /// run it (the fused ops are not available in every layout, type and mode).
    pub fn batch_norm(
        &self,
        maps: Maps,
        ops: BnOps,
        mode: BnMode,
        (eps, momentum): (f64, f64),
    ) -> Result<BatchNorm> {
        if !(eps > 0.0 && (0.0..=1.0).contains(&momentum)) {
            return Err(Error::Invalid(format!(
                "batch norm eps {eps} (must be positive), momentum {momentum} (0 to 1)"
            )));
        }
        let x = TensorDesc::of(&maps)?;
        let param = TensorDesc::empty()?;
        // SAFETY: both descriptors are live; x is set.
        ok("cudnnDeriveBNTensorDescriptor", unsafe {
            dn::cudnnDeriveBNTensorDescriptor(param.0, x.0, mode.cudnn())
        })?;
        let relu = if ops == BnOps::Bn {
            None
        } else {
            Some(ReluDesc::new()?)
        };
        let mut bn = BatchNorm {
            x,
            param,
            relu,
            maps,
            ops,
            mode,
            eps,
            momentum,
            forward_ws: 0,
            backward_ws: 0,
            reserve: 0,
        };
        let unsupported = |e: Error| {
            Error::NoAlgorithm(format!(
                "cuDNN runs no training batch norm with {ops:?} in {mode:?} mode on {} {:?} maps {}x{}x{}x{}: {e}",
                maps.layout.name(), maps.dtype, maps.n, maps.c, maps.h, maps.w
            ))
        };
        let (h, m, o) = (self.handle(), mode.cudnn(), ops.cudnn());
        let (xd, zd, pd, act) = (bn.x.0, bn.z_desc(), bn.param.0, bn.relu_desc());
        // SAFETY: live handle and descriptors (z and the activation null where the op has
        // none, as cuDNN allows); out-pointers to the plan's own fields.
        unsafe {
            ok(
                "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                dn::cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                    h,
                    m,
                    o,
                    xd,
                    zd,
                    xd,
                    pd,
                    act,
                    &mut bn.forward_ws,
                ),
            )
            .map_err(unsupported)?;
            ok(
                "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
                dn::cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                    h,
                    m,
                    o,
                    xd,
                    // y's shape whatever the op (as PyTorch asks); the call passes y only
                    // with a fused ReLU
                    xd,
                    xd,
                    zd,
                    xd,
                    pd,
                    act,
                    &mut bn.backward_ws,
                ),
            )
            .map_err(unsupported)?;
            ok(
                "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                dn::cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
                    h,
                    m,
                    o,
                    act,
                    xd,
                    &mut bn.reserve,
                ),
            )
            .map_err(unsupported)?;
        }
        Ok(bn)
    }

    /// Training-mode forward: `y = op(gamma (x - mean) invstd + beta [, z])` with the batch's
    /// statistics, which are saved for the backward and move the running ones (unless
    /// [`BnForward::move_running`] is off).
    pub fn bn_forward_training(
        &self,
        bn: &BatchNorm,
        a: &BnForward<'_>,
        ws: View<'_>,
        reserve: Option<View<'_>>,
    ) -> Result<()> {
        check_forward(&bn.maps, bn.ops, a)?;
        ws.require(bn.forward_ws, "batch norm workspace")?;
        let reserve = self.reserve_of(bn, reserve)?;
        let (alpha, beta) = (1f32, 0f32);
        // SAFETY: sizes checked above against the maps and channel count; descriptors live;
        // optional pointers null exactly where the op takes none.
        ok("cudnnBatchNormalizationForwardTrainingEx", unsafe {
            dn::cudnnBatchNormalizationForwardTrainingEx(
                self.handle(),
                bn.mode.cudnn(),
                bn.ops.cudnn(),
                scalar(&alpha),
                scalar(&beta),
                bn.x.0,
                a.x.addr() as *const c_void,
                bn.z_desc(),
                addr_or_null(a.z),
                bn.x.0,
                a.y.addr() as *mut c_void,
                bn.param.0,
                a.gamma.addr() as *const c_void,
                a.beta.addr() as *const c_void,
                if a.move_running { bn.momentum } else { 0.0 },
                a.running_mean.addr() as *mut c_void,
                a.running_var.addr() as *mut c_void,
                bn.eps,
                a.saved_mean.addr() as *mut c_void,
                a.saved_invstd.addr() as *mut c_void,
                bn.relu_desc(),
                ws.addr() as *mut c_void,
                bn.forward_ws,
                addr_or_null(reserve),
                bn.reserve,
            )
        })
    }

    /// Backward from `dy`: `dx`, and `dgamma`, `dbeta` (added to what they hold when
    /// `accumulate_params`), `dz` for the added input; from the forward's saved statistics
    /// and reserve space.
    pub fn bn_backward(
        &self,
        bn: &BatchNorm,
        a: &BnBackward<'_>,
        ws: View<'_>,
        reserve: Option<View<'_>>,
        accumulate_params: bool,
    ) -> Result<()> {
        check_backward(&bn.maps, bn.ops, a)?;
        ws.require(bn.backward_ws, "batch norm workspace")?;
        let reserve = self.reserve_of(bn, reserve)?;
        let (one, zero) = (1f32, 0f32);
        let beta_param = if accumulate_params { one } else { zero };
        let y_desc = if bn.ops == BnOps::Bn {
            std::ptr::null_mut()
        } else {
            bn.x.0
        };
        // SAFETY: as bn_forward_training.
        ok("cudnnBatchNormalizationBackwardEx", unsafe {
            dn::cudnnBatchNormalizationBackwardEx(
                self.handle(),
                bn.mode.cudnn(),
                bn.ops.cudnn(),
                scalar(&one),
                scalar(&zero),
                scalar(&one),
                scalar(&beta_param),
                bn.x.0,
                a.x.addr() as *const c_void,
                y_desc,
                addr_or_null(a.y),
                bn.x.0,
                a.dy.addr() as *const c_void,
                bn.z_desc(),
                addr_or_null(a.dz),
                bn.x.0,
                a.dx.addr() as *mut c_void,
                bn.param.0,
                a.gamma.addr() as *const c_void,
                a.beta.addr() as *const c_void,
                a.dgamma.addr() as *mut c_void,
                a.dbeta.addr() as *mut c_void,
                bn.eps,
                a.saved_mean.addr() as *const c_void,
                a.saved_invstd.addr() as *const c_void,
                bn.relu_desc(),
                ws.addr() as *mut c_void,
                bn.backward_ws,
                addr_or_null(reserve),
                bn.reserve,
            )
        })
    }

    /// The reserve space view to pass: required (and large enough) when cuDNN asked for one.
    fn reserve_of<'a>(
        &self,
        bn: &BatchNorm,
        reserve: Option<View<'a>>,
    ) -> Result<Option<View<'a>>> {
        match reserve {
            Some(r) => {
                r.require(bn.reserve, "batch norm reserve space")?;
                Ok(Some(r))
            }
            None if bn.reserve == 0 => Ok(None),
            None => Err(Error::Invalid(format!(
                "batch norm needs a reserve space of {} bytes",
                bn.reserve
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward_args(
        x: View<'static>,
        z: Option<View<'static>>,
        stat: View<'static>,
    ) -> BnForward<'static> {
        BnForward {
            x,
            z,
            y: x,
            gamma: stat,
            beta: stat,
            running_mean: stat,
            running_var: stat,
            move_running: true,
            saved_mean: stat,
            saved_invstd: stat,
        }
    }

    #[test]
    fn batch_norm_arguments_are_checked_before_cudnn() {
        let maps = Maps::nchw_f32(2, 8, 4, 4);
        let x = View::fake(1 << 20, maps.bytes(), 0);
        let stat = View::fake(1 << 24, 8 * 4, 0);
        let short = View::fake(1 << 24, 7 * 4, 0);
        assert!(check_forward(&maps, BnOps::Bn, &forward_args(x, None, stat)).is_ok());
        assert!(check_forward(&maps, BnOps::BnRelu, &forward_args(x, None, stat)).is_ok());
        let e = check_forward(&maps, BnOps::BnAddRelu, &forward_args(x, None, stat))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs z (the added input)"), "{e}");
        assert!(check_forward(&maps, BnOps::BnAddRelu, &forward_args(x, Some(x), stat)).is_ok());
        let e = check_forward(&maps, BnOps::Bn, &forward_args(x, Some(x), stat))
            .unwrap_err()
            .to_string();
        assert!(e.contains("takes no z"), "{e}");
        let e = check_forward(&maps, BnOps::Bn, &forward_args(x, None, short))
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch norm weight"), "{e}");
        let small = View::fake(1 << 20, maps.bytes() - 1, 0);
        assert!(check_forward(&maps, BnOps::Bn, &forward_args(small, None, stat)).is_err());

        let back = |y: Option<View<'static>>, dz: Option<View<'static>>| BnBackward {
            x,
            y,
            dy: x,
            dz,
            dx: x,
            gamma: stat,
            beta: stat,
            dgamma: stat,
            dbeta: stat,
            saved_mean: stat,
            saved_invstd: stat,
        };
        assert!(check_backward(&maps, BnOps::Bn, &back(None, None)).is_ok());
        assert!(check_backward(&maps, BnOps::BnRelu, &back(None, None)).is_err());
        assert!(check_backward(&maps, BnOps::BnRelu, &back(Some(x), None)).is_ok());
        assert!(check_backward(&maps, BnOps::BnAddRelu, &back(Some(x), None)).is_err());
        assert!(check_backward(&maps, BnOps::BnAddRelu, &back(Some(x), Some(x))).is_ok());
    }
}

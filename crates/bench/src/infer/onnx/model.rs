//! The model part of `infer --onnx`: the file checked for what gpukit can feed it (one f32
//! input, the batch sizes it takes), imported and optimized at a batch size, and described as
//! the report shows it.

use crate::error::{Error, Result};
use gpukit_models::graph::passes::{optimize, PassStats};
use gpukit_models::graph::{last_uses, DType, Data, Graph};
use gpukit_models::onnx::{DeclaredValue, ImportOptions, ModelFile};
use serde::{Deserialize, Serialize};

/// The batch sizes when none are given and the model leaves its batch open.
pub const DEFAULT_BATCH_SIZES: [usize; 4] = [1, 8, 16, 32];

/// One graph input or output: as declared, and its shape at the report's first batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxValue {
    pub name: String,
    /// `float`, `int64`, ...
    pub elem_type: String,
    /// Each axis as the model writes it: a size, a symbolic name (`batch`) or `?`.
    pub declared: Vec<String>,
    /// Resolved at `OnnxModel::batch`.
    pub shape: Vec<usize>,
}

/// What gpukit's passes changed ([`PassStats`], as the report keeps it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Passes {
    pub folded_constants: usize,
    pub folded_batch_norms: usize,
    pub gelus: usize,
    #[serde(default)]
    pub silus: usize,
    pub fused_epilogues: usize,
    pub squeeze_excites: usize,
    pub dead_nodes: usize,
}

impl From<PassStats> for Passes {
    fn from(s: PassStats) -> Passes {
        Passes {
            folded_constants: s.folded_constants,
            folded_batch_norms: s.folded_batch_norms,
            gelus: s.gelus,
            silus: s.silus,
            fused_epilogues: s.fused_epilogues,
            squeeze_excites: s.squeeze_excites,
            dead_nodes: s.dead_nodes,
        }
    }
}

/// The model, as the file declares it and as gpukit imported and optimized it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OnnxModel {
    /// The path as given.
    pub file: String,
    pub file_bytes: u64,
    /// The default domain's opset.
    pub opset: i64,
    /// `pytorch 2.5.1`, as the model says (empty when it does not).
    pub producer: String,
    /// Whether its weights are in external data files (ONNX Runtime then reads the path).
    pub external_data: bool,
    /// Nodes in the file.
    pub nodes_in_file: usize,
    /// Nodes of gpukit's graph as imported, and after the passes.
    pub nodes_imported: usize,
    pub nodes_optimized: usize,
    pub passes: Passes,
    /// Elements of the imported graph's constants (weights, and shape constants).
    pub parameters: usize,
    /// The batch size `inputs` and `outputs` are resolved at.
    pub batch: usize,
    pub inputs: Vec<OnnxValue>,
    pub outputs: Vec<OnnxValue>,
}

/// The batch sizes to run: those given, else the model's fixed batch, else the defaults. A
/// size a fixed batch cannot take is bad input, said before any work.
pub(super) fn batch_sizes(
    file: &ModelFile,
    input: &DeclaredValue,
    given: Option<&[usize]>,
) -> Result<Vec<usize>> {
    let mut sizes = match (given, input.fixed_first) {
        (Some(g), _) => g.to_vec(),
        (None, Some(fixed)) => vec![fixed],
        (None, None) => DEFAULT_BATCH_SIZES.to_vec(),
    };
    sizes.sort_unstable();
    sizes.dedup();
    if let (Some(fixed), Some(other)) = (
        input.fixed_first,
        sizes.iter().find(|&&n| Some(n) != input.fixed_first),
    ) {
        return Err(Error::BadInput(format!(
            "{}: input {} has a fixed batch of {fixed}, --batch-sizes asks for {other}: give \
             --batch-sizes {fixed}, or re-export the model with a dynamic batch axis \
             (torch.onnx.export(..., dynamic_axes={{\"{}\": {{0: \"batch\"}}}}))",
            file.path().display(),
            input.name,
            input.name
        )));
    }
    if sizes.is_empty() {
        return Err(Error::BadInput("--batch-sizes names no batch size".into()));
    }
    Ok(sizes)
}

/// The one input gpukit feeds, checked: one graph input, of f32, and `dims` not naming its
/// batch axis (that is `--batch-sizes`'s).
pub(super) fn the_input(file: &ModelFile, dims: &[(String, usize)]) -> Result<DeclaredValue> {
    let shown = file.path().display();
    let inputs = file.inputs();
    let input = match inputs.as_slice() {
        [one] => one.clone(),
        [] => {
            return Err(Error::BadInput(format!(
                "{shown}: the model has no graph input"
            )))
        }
        many => {
            let names: Vec<&str> = many.iter().map(|v| v.name.as_str()).collect();
            return Err(Error::BadInput(format!(
                "{shown}: the model has {} inputs ({}); infer --onnx feeds one input for now",
                many.len(),
                names.join(", ")
            )));
        }
    };
    if input.elem_type != "float" {
        return Err(Error::BadInput(format!(
            "{shown}: input {} is {}; infer --onnx feeds a random float (f32) input",
            input.name, input.elem_type
        )));
    }
    if let Some((name, _)) =
        named_batch_axis(&input).and_then(|first| dims.iter().find(|(n, _)| n == first))
    {
        return Err(Error::BadInput(format!(
            "--input-dims {name}: {name} is input {}'s batch axis; give it with --batch-sizes",
            input.name
        )));
    }
    for (name, _) in dims {
        if !input.dims.contains(name) {
            return Err(Error::BadInput(format!(
                "--input-dims {name}: input {} has no axis named {name} (its axes: {})",
                input.name,
                input.dims.join(", ")
            )));
        }
    }
    Ok(input)
}

/// The first (batch) axis's name, where the model names it.
fn named_batch_axis(v: &DeclaredValue) -> Option<&str> {
    v.dims
        .first()
        .map(String::as_str)
        .filter(|d| d.parse::<usize>().is_err() && *d != "?")
}

/// The graph at batch `n`: as imported, optimized, and what the passes did.
pub(super) struct Prepared {
    pub imported: Graph,
    pub optimized: Graph,
    pub stats: PassStats,
}

pub(super) fn prepare(file: &ModelFile, n: usize, dims: &[(String, usize)]) -> Result<Prepared> {
    let imported = file.import(&ImportOptions {
        batch: Some(n),
        dims: dims.to_vec(),
    })?;
    let mut optimized = imported.clone();
    let stats = optimize(&mut optimized).map_err(gpukit_models::Error::from)?;
    Ok(Prepared {
        imported,
        optimized,
        stats,
    })
}

fn values(graph: &Graph, ids: &[usize], declared: &[DeclaredValue]) -> Vec<OnnxValue> {
    ids.iter()
        .filter_map(|&id| graph.values.get(id))
        .map(|v| {
            let d = declared.iter().find(|d| d.name == v.name);
            OnnxValue {
                name: v.name.clone(),
                elem_type: d.map_or_else(
                    || match v.dtype {
                        DType::F32 => "float".into(),
                        DType::I64 => "int64".into(),
                    },
                    |d| d.elem_type.clone(),
                ),
                declared: d.map(|d| d.dims.clone()).unwrap_or_default(),
                shape: v.shape.clone(),
            }
        })
        .collect()
}

pub(super) fn model_of(file: &ModelFile, n: usize, p: &Prepared) -> OnnxModel {
    OnnxModel {
        file: file.path().display().to_string(),
        file_bytes: file.bytes().len() as u64,
        opset: file.opset().unwrap_or(0),
        producer: file.producer(),
        external_data: file.has_external_data(),
        nodes_in_file: file.node_count(),
        nodes_imported: p.imported.nodes.len(),
        nodes_optimized: p.optimized.nodes.len(),
        passes: p.stats.into(),
        parameters: p
            .imported
            .values
            .iter()
            .filter_map(|v| v.constant.as_ref())
            .map(Data::len)
            .sum(),
        batch: n,
        inputs: values(&p.imported, &p.imported.inputs, &file.inputs()),
        outputs: values(&p.imported, &p.imported.outputs, &file.outputs()),
    }
}

/// The model part of the report at batch `n`: imported and optimized, nothing run.
pub fn describe(file: &ModelFile, n: usize, dims: &[(String, usize)]) -> Result<OnnxModel> {
    the_input(file, dims)?;
    Ok(model_of(file, n, &prepare(file, n, dims)?))
}

/// Host memory the float64 reference takes beside the f32 runs: the activations' peak and the
/// constants, both widened to 8 bytes an element.
pub(super) fn float64_bytes(graph: &Graph) -> Option<u64> {
    let constants = graph
        .values
        .iter()
        .filter(|v| v.constant.is_some())
        .try_fold(0u64, |acc, v| {
            acc.checked_add(gpukit_types::resources::bytes(&v.shape, 8)?)
        })?;
    peak_activation_bytes(graph)?
        .checked_mul(2)?
        .checked_add(constants)
}

/// The most bytes the interpreter holds at once: the input and the values alive after each
/// node (each freed after its last reader, as `forward_cpu` does); constants not counted (the
/// graph holds them already). None when it cannot be counted.
pub(super) fn peak_activation_bytes(graph: &Graph) -> Option<u64> {
    let size = |id: usize| -> Option<u64> {
        let v = graph.values.get(id)?;
        let elem = match v.dtype {
            DType::F32 => 4,
            DType::I64 => 8,
        };
        gpukit_types::resources::bytes(&v.shape, elem)
    };
    let computed = |id: &&usize| graph.values.get(**id).is_some_and(|v| v.constant.is_none());
    let last = last_uses(graph);
    let mut live = graph
        .inputs
        .iter()
        .try_fold(0u64, |acc, &id| acc.checked_add(size(id)?))?;
    let mut peak = live;
    for (i, node) in graph.nodes.iter().enumerate() {
        for &o in &node.outputs {
            live = live.checked_add(size(o)?)?;
        }
        peak = peak.max(live);
        let mut freed: Vec<usize> = node
            .inputs
            .iter()
            .filter(computed)
            .copied()
            .filter(|&v| last.get(v).copied().flatten() == Some(i))
            .collect();
        freed.sort_unstable();
        freed.dedup();
        for v in freed {
            live = live.saturating_sub(size(v)?);
        }
    }
    Some(peak)
}

/// The most bytes one convolution's f64 copies take when it sums in f64 on the CPU (its
/// inputs, weights included, widened, and its f64 output beside the f32 one the peak counts):
/// what the CPU row's f64 sums add to [`peak_activation_bytes`] at worst. 0 without
/// convolutions; None where a size overflows.
pub(super) fn widest_f64_convolution_bytes(graph: &Graph) -> Option<u64> {
    let elements = |id: usize| -> Option<u64> {
        let v = graph.values.get(id)?;
        gpukit_types::resources::bytes(&v.shape, 1)
    };
    graph
        .nodes
        .iter()
        .filter(|n| matches!(n.op, gpukit_models::graph::Op::Conv(_)))
        .try_fold(0u64, |widest, n| {
            let mut operands = n.inputs.iter().chain(&n.outputs);
            let total = operands.try_fold(0u64, |acc, &v| acc.checked_add(elements(v)?))?;
            Some(widest.max(total.checked_mul(8)?))
        })
}

//! The [`GraphBuilder`] (nodes added one by one, their outputs inferred) and
//! [`Graph::check`], which replays the same inference over a finished graph.

use super::infer::{element_count, evaluate, infer, In};
use super::{DType, Data, Graph, GraphError, Node, Op, Value, ValueId};
use std::collections::HashMap;

fn node_error(name: &str, op: &Op, problem: String) -> GraphError {
    GraphError::Node {
        node: name.to_string(),
        op: op.name().to_string(),
        problem,
    }
}

/// Builds a [`Graph`] node by node, inferring each node's output shapes as it is added.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
    /// Elements known before running (constants, and small i64 values computed from them).
    known: Vec<Option<Data>>,
    by_name: HashMap<String, ValueId>,
    node_names: std::collections::HashSet<String>,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    fn push_value(&mut self, value: Value, known: Option<Data>) -> Result<ValueId, GraphError> {
        if self.by_name.contains_key(&value.name) {
            return Err(GraphError::Structure(format!(
                "value {} is defined twice",
                value.name
            )));
        }
        let id = self.graph.values.len();
        self.by_name.insert(value.name.clone(), id);
        self.graph.values.push(value);
        self.known.push(known);
        Ok(id)
    }

    /// Adds a graph input.
    pub fn input(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Result<ValueId, GraphError> {
        element_count(&shape).map_err(|problem| GraphError::Input {
            input: name.to_string(),
            problem,
        })?;
        let id = self.push_value(
            Value {
                name: name.to_string(),
                dtype,
                shape,
                constant: None,
            },
            None,
        )?;
        self.graph.inputs.push(id);
        Ok(id)
    }

    /// Adds a constant (weights, or shape arithmetic's operands).
    pub fn constant(
        &mut self,
        name: &str,
        shape: Vec<usize>,
        data: Data,
    ) -> Result<ValueId, GraphError> {
        let count = element_count(&shape)
            .map_err(|e| GraphError::Structure(format!("constant {name}: {e}")))?;
        if count != data.len() {
            return Err(GraphError::Structure(format!(
                "constant {name}: {} elements for shape {shape:?}",
                data.len()
            )));
        }
        let value = Value {
            name: name.to_string(),
            dtype: data.dtype(),
            shape,
            constant: Some(data),
        };
        self.push_value(value, None)
    }

    /// Adds a node computing `op` on `inputs` into new values named `outputs`, and returns
    /// their ids. An empty or repeated node name is replaced by a fresh one.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
        outputs: &[&str],
    ) -> Result<Vec<ValueId>, GraphError> {
        let name = if name.is_empty() || self.node_names.contains(name) {
            let base = if name.is_empty() { op.name() } else { name };
            (self.graph.nodes.len()..)
                .map(|i| format!("{base}_{i}"))
                .find(|n| !self.node_names.contains(n))
                .unwrap_or_default()
        } else {
            name.to_string()
        };
        let views = inputs
            .iter()
            .map(|&i| self.view(i))
            .collect::<Option<Vec<In>>>()
            .ok_or_else(|| {
                node_error(&name, &op, "an input id is not a value of the graph".into())
            })?;
        let outs = infer(&op, &views).map_err(|p| node_error(&name, &op, p))?;
        if outs.len() != outputs.len() {
            return Err(node_error(
                &name,
                &op,
                format!(
                    "has {} outputs; the operator gives {}",
                    outputs.len(),
                    outs.len()
                ),
            ));
        }
        let known = evaluate(&op, &views, &outs).map_err(|p| node_error(&name, &op, p))?;
        let mut known = known.map(Vec::into_iter);
        let mut ids = Vec::with_capacity(outs.len());
        for ((dtype, shape), out) in outs.into_iter().zip(outputs) {
            let value = Value {
                name: out.to_string(),
                dtype,
                shape,
                constant: None,
            };
            let k = known.as_mut().and_then(Iterator::next);
            ids.push(
                self.push_value(value, k)
                    .map_err(|e| node_error(&name, &op, e.to_string()))?,
            );
        }
        self.node_names.insert(name.clone());
        self.graph.nodes.push(Node {
            name,
            op,
            inputs: inputs.to_vec(),
            outputs: ids.clone(),
        });
        Ok(ids)
    }

    fn view(&self, id: ValueId) -> Option<In<'_>> {
        let v = self.graph.values.get(id)?;
        Some(In {
            dtype: v.dtype,
            shape: &v.shape,
            known: v.constant.as_ref().or(self.known.get(id)?.as_ref()),
        })
    }

    /// Marks `id` as a graph output.
    pub fn output(&mut self, id: ValueId) {
        self.graph.outputs.push(id);
    }

    /// The value named `name`, if there is one.
    pub fn lookup(&self, name: &str) -> Option<ValueId> {
        self.by_name.get(name).copied()
    }

    /// The value `id`, if there is one.
    pub fn value(&self, id: ValueId) -> Option<&Value> {
        self.graph.values.get(id)
    }

    /// The elements of `id` if they are known before running (a constant, or shape arithmetic
    /// on constants).
    pub fn known(&self, id: ValueId) -> Option<&Data> {
        self.view(id).and_then(|v| v.known)
    }

    /// The graph (checked: at least one output, every output a value).
    pub fn finish(self) -> Result<Graph, GraphError> {
        if self.graph.outputs.is_empty() {
            return Err(GraphError::Structure("the graph has no outputs".into()));
        }
        Ok(self.graph)
    }
}

/// [`Graph::check`].
pub(crate) fn check(g: &Graph) -> Result<(), GraphError> {
    let structure = |m: String| GraphError::Structure(m);
    let n = g.values.len();
    // None: not yet defined; Some(known elements)
    let mut defined: Vec<Option<Option<Data>>> = vec![None; n];
    for (id, v) in g.values.iter().enumerate() {
        if let Some(c) = &v.constant {
            let count = element_count(&v.shape)
                .map_err(|e| structure(format!("constant {}: {e}", v.name)))?;
            if c.len() != count || c.dtype() != v.dtype {
                return Err(structure(format!(
                    "constant {}: {} {:?} elements for {:?} {:?}",
                    v.name,
                    c.len(),
                    c.dtype(),
                    v.dtype,
                    v.shape
                )));
            }
            defined[id] = Some(None);
        }
    }
    for &i in &g.inputs {
        let v = g
            .values
            .get(i)
            .ok_or_else(|| structure(format!("input id {i} out of range")))?;
        if v.constant.is_some() || defined[i].is_some() {
            return Err(structure(format!("input {} is defined twice", v.name)));
        }
        element_count(&v.shape).map_err(|problem| GraphError::Input {
            input: v.name.clone(),
            problem,
        })?;
        defined[i] = Some(None);
    }
    for node in &g.nodes {
        let err = |p: String| node_error(&node.name, &node.op, p);
        let mut views = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            let d = defined
                .get(i)
                .ok_or_else(|| err(format!("input id {i} out of range")))?;
            let known = d.as_ref().ok_or_else(|| {
                err(format!(
                    "input {} is read before it is computed",
                    g.values[i].name
                ))
            })?;
            let v = &g.values[i];
            views.push(In {
                dtype: v.dtype,
                shape: &v.shape,
                known: v.constant.as_ref().or(known.as_ref()),
            });
        }
        let outs = infer(&node.op, &views).map_err(err)?;
        if outs.len() != node.outputs.len() {
            return Err(err(format!(
                "has {} outputs; the operator gives {}",
                node.outputs.len(),
                outs.len()
            )));
        }
        let known = evaluate(&node.op, &views, &outs).map_err(err)?;
        let mut known = known.map(Vec::into_iter);
        for (&o, (dtype, shape)) in node.outputs.iter().zip(&outs) {
            let v = g
                .values
                .get(o)
                .ok_or_else(|| err(format!("output id {o} out of range")))?;
            if defined[o].is_some() {
                return Err(err(format!("output {} is defined twice", v.name)));
            }
            if (v.dtype, &v.shape) != (*dtype, shape) {
                return Err(err(format!(
                    "output {} is recorded as {:?} {:?}; the operator gives {dtype:?} {shape:?}",
                    v.name, v.dtype, v.shape
                )));
            }
            defined[o] = Some(known.as_mut().and_then(Iterator::next));
        }
    }
    for &o in &g.outputs {
        if defined.get(o).is_none_or(Option::is_none) {
            return Err(structure(format!("output id {o} is never computed")));
        }
    }
    if g.outputs.is_empty() {
        return Err(structure("the graph has no outputs".into()));
    }
    for p in &g.patterns {
        let super::Pattern::SqueezeExcite(se) = p;
        if [se.input, se.pooled, se.squeezed, se.gate, se.output]
            .iter()
            .any(|&v| v >= n)
        {
            return Err(structure("a pattern names a value out of range".into()));
        }
    }
    Ok(())
}

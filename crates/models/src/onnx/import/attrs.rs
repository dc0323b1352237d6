//! A node's attributes as an operator's conversion reads them: each read checks the type and
//! marks the attribute used, and [`Attrs::finish`] refuses any the conversion did not read (an
//! attribute gpukit does not implement must not be silently ignored).

use crate::error::NodeProblem;
use crate::onnx::proto::{attribute_type, AttributeProto, NodeProto, TensorProto};
use std::cell::Cell;

/// The attributes of one node.
pub(super) struct Attrs<'a> {
    list: &'a [AttributeProto],
    used: Vec<Cell<bool>>,
}

fn bad(attribute: &str, problem: impl Into<String>) -> NodeProblem {
    NodeProblem::Attribute {
        attribute: attribute.to_string(),
        problem: problem.into(),
    }
}

impl<'a> Attrs<'a> {
    pub fn new(node: &'a NodeProto) -> Self {
        Attrs {
            list: &node.attribute,
            used: node.attribute.iter().map(|_| Cell::new(false)).collect(),
        }
    }

    /// The attribute `name` of type `ty`, if present.
    fn get(&self, name: &str, ty: i32) -> Result<Option<&'a AttributeProto>, NodeProblem> {
        let Some(i) = self.list.iter().position(|a| a.name == name) else {
            return Ok(None);
        };
        self.used[i].set(true);
        let a = &self.list[i];
        // type 0 (UNDEFINED): old writers left it out; the field read decides
        if a.r#type != ty && a.r#type != 0 {
            return Err(bad(
                name,
                format!("has attribute type {}; {ty} expected", a.r#type),
            ));
        }
        Ok(Some(a))
    }

    /// An INT attribute.
    pub fn int(&self, name: &str) -> Result<Option<i64>, NodeProblem> {
        Ok(match self.get(name, attribute_type::INT)? {
            Some(a) => Some(a.i.ok_or_else(|| bad(name, "has no integer value"))?),
            None => None,
        })
    }

    /// An INT attribute that must be 0 or 1.
    pub fn flag(&self, name: &str, default: bool) -> Result<bool, NodeProblem> {
        match self.int(name)? {
            None => Ok(default),
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(v) => Err(bad(name, format!("is {v}; 0 or 1 expected"))),
        }
    }

    /// An INT attribute that must be `only` when present.
    pub fn int_only(&self, name: &str, only: i64, why: &str) -> Result<(), NodeProblem> {
        match self.int(name)? {
            Some(v) if v != only => Err(bad(name, format!("{v} is not supported ({why})"))),
            _ => Ok(()),
        }
    }

    /// A FLOAT attribute, if present.
    pub fn float_opt(&self, name: &str) -> Result<Option<f32>, NodeProblem> {
        Ok(match self.get(name, attribute_type::FLOAT)? {
            Some(a) => Some(a.f.ok_or_else(|| bad(name, "has no float value"))?),
            None => None,
        })
    }

    /// A FLOAT attribute, `default` when absent.
    pub fn float(&self, name: &str, default: f32) -> Result<f32, NodeProblem> {
        Ok(self.float_opt(name)?.unwrap_or(default))
    }

    /// An INTS attribute.
    pub fn ints(&self, name: &str) -> Result<Option<&'a [i64]>, NodeProblem> {
        Ok(self
            .get(name, attribute_type::INTS)?
            .map(|a| a.ints.as_slice()))
    }

    /// A FLOATS attribute.
    pub fn floats(&self, name: &str) -> Result<Option<&'a [f32]>, NodeProblem> {
        Ok(self
            .get(name, attribute_type::FLOATS)?
            .map(|a| a.floats.as_slice()))
    }

    /// A STRING attribute (UTF-8).
    pub fn string(&self, name: &str) -> Result<Option<String>, NodeProblem> {
        match self.get(name, attribute_type::STRING)? {
            Some(a) => {
                let s = a.s.as_deref().unwrap_or_default();
                Ok(Some(
                    String::from_utf8(s.to_vec()).map_err(|_| bad(name, "is not UTF-8"))?,
                ))
            }
            None => Ok(None),
        }
    }

    /// A TENSOR attribute.
    pub fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>, NodeProblem> {
        match self.get(name, attribute_type::TENSOR)? {
            Some(a) => Ok(Some(
                a.t.as_ref().ok_or_else(|| bad(name, "has no tensor"))?,
            )),
            None => Ok(None),
        }
    }

    /// Positive sizes (strides, dilations, kernel_shape), `count` of them.
    pub fn sizes(&self, name: &str, count: usize) -> Result<Option<Vec<usize>>, NodeProblem> {
        let Some(v) = self.ints(name)? else {
            return Ok(None);
        };
        if v.len() != count {
            return Err(bad(
                name,
                format!("has {} values; {count} expected", v.len()),
            ));
        }
        v.iter()
            .map(|&x| {
                usize::try_from(x)
                    .ok()
                    .filter(|&x| x > 0)
                    .ok_or_else(|| bad(name, format!("{x} is not a positive size")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// `pads` (begin, begin, end, end), defaulting to zeros; `auto_pad` must be NOTSET (or
    /// VALID, which is no padding).
    pub fn pads(&self) -> Result<[usize; 4], NodeProblem> {
        match self.string("auto_pad")?.as_deref() {
            None | Some("NOTSET") => {}
            Some("VALID") => {
                if self.ints("pads")?.is_some() {
                    return Err(bad("pads", "cannot be given with auto_pad VALID"));
                }
                return Ok([0; 4]);
            }
            Some(other) => {
                return Err(bad(
                    "auto_pad",
                    format!("{other} is not supported (NOTSET or VALID; write explicit pads)"),
                ))
            }
        }
        let Some(v) = self.ints("pads")? else {
            return Ok([0; 4]);
        };
        let p: Vec<usize> = v
            .iter()
            .map(|&x| usize::try_from(x).map_err(|_| bad("pads", format!("{x} is negative"))))
            .collect::<Result<_, _>>()?;
        <[usize; 4]>::try_from(p)
            .map_err(|_| bad("pads", format!("has {} values; 4 expected (2-D)", v.len())))
    }

    /// Errors on the first attribute no read asked for.
    pub fn finish(self) -> Result<(), NodeProblem> {
        match self.list.iter().zip(&self.used).find(|(_, u)| !u.get()) {
            Some((a, _)) => Err(bad(&a.name, "is not supported by gpukit for this operator")),
            None => Ok(()),
        }
    }
}

/// `axis` (negative counting from the end) as an index into `rank` axes.
pub(super) fn axis(name: &str, a: i64, rank: usize) -> Result<usize, NodeProblem> {
    let r = rank as i64;
    if a < -r || a >= r {
        return Err(bad(name, format!("{a} is out of range for rank {rank}")));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

/// Axes (negative counting from the end) as sorted, distinct indices into `rank` axes.
pub(super) fn axes(name: &str, list: &[i64], rank: usize) -> Result<Vec<usize>, NodeProblem> {
    let mut v = list
        .iter()
        .map(|&a| axis(name, a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    v.sort_unstable();
    let before = v.len();
    v.dedup();
    if v.len() != before {
        return Err(bad(name, format!("{list:?} names an axis twice")));
    }
    Ok(v)
}

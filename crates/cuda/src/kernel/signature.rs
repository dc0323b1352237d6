//! The parameter lists of a CUDA C source's `extern "C" __global__` functions, read from the
//! source itself so that every launch can be checked against what the kernel declares.
//!
//! The sources instantiate their kernels through function-like macros (one instance per element
//! type, the name pasted with `##`), so the reader is a small preprocessor: it joins continued
//! lines, drops comments, records `#define`s, expands macro uses (object-like and function-like,
//! with `##` pasting) and then reads each `extern "C" ... __global__ void name(params)`.
//! Conditional directives (`#if` and the like) are not evaluated: a source that needs them for
//! its kernels' declarations is refused where a kernel's parameters cannot be read.

use std::collections::HashMap;

/// What a kernel parameter is, as far as a launch can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    /// Any pointer (to device memory, or null).
    Ptr,
    /// `int`, `signed`, `signed int`.
    I32,
    /// `unsigned`, `unsigned int`.
    U32,
    /// `long`, `long long` (64 bits: NVRTC follows the host's LP64 data model on Linux).
    I64,
    /// `unsigned long`, `unsigned long long`.
    U64,
    F32,
    F64,
    /// A struct passed by value, by its type's name.
    Struct(String),
}

impl Param {
    /// Bytes the parameter takes, where the source alone says (not for a struct).
    pub fn size(&self) -> Option<usize> {
        match self {
            Param::Ptr | Param::I64 | Param::U64 | Param::F64 => Some(8),
            Param::I32 | Param::U32 | Param::F32 => Some(4),
            Param::Struct(_) => None,
        }
    }

    /// The parameter kind in words, for error messages.
    pub fn describe(&self) -> String {
        match self {
            Param::Ptr => "a pointer".into(),
            Param::I32 => "int (i32)".into(),
            Param::U32 => "unsigned int (u32)".into(),
            Param::I64 => "long long (i64)".into(),
            Param::U64 => "unsigned long long (u64)".into(),
            Param::F32 => "float (f32)".into(),
            Param::F64 => "double (f64)".into(),
            Param::Struct(name) => format!("struct {name}"),
        }
    }
}

/// One declared parameter: its kind and its name in the source ("" when unnamed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub param: Param,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    /// A number, a string or character literal, or punctuation, as written.
    Other(String),
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Token::Ident(s) | Token::Other(s) => s,
        }
    }
}

/// Splits C text into tokens; comments are dropped, literals kept whole.
fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            i += 2;
            while i < c.len() && !(c[i] == '*' && c.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(c[start..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
            out.push(Token::Other(c[start..i].iter().collect()));
        } else if ch == '"' || ch == '\'' {
            let start = i;
            i += 1;
            while i < c.len() && c[i] != ch {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Token::Other(c[start..i.min(c.len())].iter().collect()));
        } else if ch == '#' && c.get(i + 1) == Some(&'#') {
            out.push(Token::Other("##".into()));
            i += 2;
        } else {
            out.push(Token::Other(ch.to_string()));
            i += 1;
        }
    }
    out
}

struct Macro {
    /// None: object-like.
    params: Option<Vec<String>>,
    body: Vec<Token>,
}

/// The source's lines with continuations joined; directives apart from the rest.
fn logical_lines(source: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for line in source.lines() {
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(line);
            lines.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        lines.push(current);
    }
    lines
}

/// Records a `#define` line (its text after `define`).
fn define(rest: &str, macros: &mut HashMap<String, Macro>) {
    let rest = rest.trim_start();
    let name_len = rest
        .find(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
        .unwrap_or(rest.len());
    let (name, after) = rest.split_at(name_len);
    if name.is_empty() {
        return;
    }
    // function-like only when the parenthesis follows the name at once
    let (params, body) = match after.strip_prefix('(') {
        Some(inner) => match inner.split_once(')') {
            Some((list, body)) => (
                Some(
                    list.split(',')
                        .map(|p| p.trim().to_string())
                        .filter(|p| !p.is_empty())
                        .collect(),
                ),
                body,
            ),
            None => return,
        },
        None => (None, after),
    };
    macros.insert(
        name.to_string(),
        Macro {
            params,
            body: tokens(body),
        },
    );
}

/// The arguments of a macro use whose `(` is at `open`, split at top-level commas; also the
/// index after the closing parenthesis.
fn macro_args(toks: &[Token], open: usize) -> Option<(Vec<Vec<Token>>, usize)> {
    let mut depth = 0usize;
    let mut args = vec![Vec::new()];
    for (i, t) in toks.iter().enumerate().skip(open) {
        match t.text() {
            "(" => {
                depth += 1;
                if depth == 1 {
                    continue;
                }
            }
            ")" => {
                depth -= 1;
                if depth == 0 {
                    if args.len() == 1 && args[0].is_empty() {
                        args.clear();
                    }
                    return Some((args, i + 1));
                }
            }
            "," if depth == 1 => {
                args.push(Vec::new());
                continue;
            }
            _ => {}
        }
        args.last_mut()?.push(t.clone());
    }
    None
}

/// Pastes `a ## b` into one token (an empty macro argument between two `##` pastes nothing:
/// `a ## ## b` is `ab`, as C's placemarkers make it).
fn paste(toks: Vec<Token>) -> Vec<Token> {
    let toks: Vec<Token> = toks
        .iter()
        .enumerate()
        .filter(|(i, t)| !(t.text() == "##" && *i > 0 && toks[i - 1].text() == "##"))
        .map(|(_, t)| t.clone())
        .collect();
    let mut out: Vec<Token> = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text() == "##" && !out.is_empty() && i + 1 < toks.len() {
            let left = out.pop().map(|t| t.text().to_string()).unwrap_or_default();
            let joined = format!("{left}{}", toks[i + 1].text());
            let ident = joined.chars().all(|ch| ch.is_alphanumeric() || ch == '_');
            out.push(if ident {
                Token::Ident(joined)
            } else {
                Token::Other(joined)
            });
            i += 2;
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

/// Expands every macro use in `toks`; `active` are the macros being expanded (never again
/// inside themselves, as in C).
fn expand(toks: &[Token], macros: &HashMap<String, Macro>, active: &mut Vec<String>) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        let found = match t {
            Token::Ident(name) if !active.contains(name) => macros.get(name).map(|m| (name, m)),
            _ => None,
        };
        let Some((name, m)) = found else {
            out.push(t.clone());
            i += 1;
            continue;
        };
        let body = match &m.params {
            None => {
                i += 1;
                m.body.clone()
            }
            Some(params) => {
                if toks.get(i + 1).map(Token::text) != Some("(") {
                    out.push(t.clone());
                    i += 1;
                    continue;
                }
                let Some((args, next)) = macro_args(toks, i + 1) else {
                    out.push(t.clone());
                    i += 1;
                    continue;
                };
                i = next;
                let mut body = Vec::new();
                for b in &m.body {
                    match params.iter().position(|p| p == b.text()) {
                        Some(k) => body.extend(args.get(k).cloned().unwrap_or_default()),
                        None => body.push(b.clone()),
                    }
                }
                body
            }
        };
        active.push(name.clone());
        out.extend(expand(&paste(body), macros, active));
        active.pop();
    }
    out
}

/// The source as tokens, its directives applied (`#define`) or dropped (the rest).
fn preprocess(source: &str) -> Vec<Token> {
    let mut macros = HashMap::new();
    let mut text = String::new();
    for line in logical_lines(source) {
        let trimmed = line.trim_start();
        if let Some(directive) = trimmed.strip_prefix('#') {
            if let Some(rest) = directive.trim_start().strip_prefix("define") {
                define(rest, &mut macros);
            }
            continue;
        }
        text.push_str(&line);
        text.push('\n');
    }
    expand(&tokens(&text), &macros, &mut Vec::new())
}

/// Reads one parameter's tokens.
fn param(toks: &[Token]) -> Result<Declared, String> {
    let written = toks.iter().map(Token::text).collect::<Vec<_>>().join(" ");
    if let Some(star) = toks.iter().rposition(|t| t.text() == "*") {
        // the name, when there is one, follows the last `*` (after any qualifier)
        let name = match toks.last() {
            Some(Token::Ident(n)) if toks.len() - 1 > star && !is_qualifier(n) => n.clone(),
            _ => String::new(),
        };
        return Ok(Declared {
            param: Param::Ptr,
            name,
        });
    }
    if toks.iter().any(|t| matches!(t.text(), "&" | "[" | "]")) {
        return Err(format!(
            "`{written}`: references and arrays cannot be kernel arguments here"
        ));
    }
    let mut words: Vec<&str> = toks
        .iter()
        .filter_map(|t| match t {
            Token::Ident(s) if !is_qualifier(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    if words.len() != toks.iter().filter(|t| !is_qualifier(t.text())).count() {
        return Err(format!(
            "`{written}`: not a parameter this reader understands"
        ));
    }
    // the last word names the parameter unless it is part of the type
    let name = match words.last() {
        Some(w) if words.len() > 1 && !is_type_word(w) => words.pop().unwrap_or_default(),
        _ => "",
    };
    let kind = match words.as_slice() {
        ["int"] | ["signed"] | ["signed", "int"] => Param::I32,
        ["unsigned"] | ["unsigned", "int"] => Param::U32,
        ["long"] | ["long", "int"] | ["long", "long"] | ["long", "long", "int"] => Param::I64,
        ["signed", "long"] | ["signed", "long", "long"] => Param::I64,
        ["unsigned", "long"] | ["unsigned", "long", "long"] => Param::U64,
        ["unsigned", "long", "int"] | ["unsigned", "long", "long", "int"] => Param::U64,
        ["float"] => Param::F32,
        ["double"] => Param::F64,
        [one] if !is_type_word(one) => Param::Struct(one.to_string()),
        [struct_kw, one] if *struct_kw == "struct" => Param::Struct(one.to_string()),
        _ => {
            return Err(format!(
                "`{written}`: type not supported by the kernel API (pointers, 32/64-bit \
                 integers, float, double and structs are)"
            ))
        }
    };
    Ok(Declared {
        param: kind,
        name: name.to_string(),
    })
}

fn is_qualifier(w: &str) -> bool {
    matches!(
        w,
        "const" | "volatile" | "__restrict__" | "__restrict" | "restrict"
    )
}

fn is_type_word(w: &str) -> bool {
    matches!(
        w,
        "int" | "signed" | "unsigned" | "long" | "short" | "char" | "float" | "double" | "bool"
    )
}

/// The parameters of every `extern "C"` `__global__` function the source defines, by name.
/// A kernel whose parameters cannot be read is kept as the reason, reported when it is asked
/// for (another kernel of the same source stays usable).
pub fn kernels(source: &str) -> HashMap<String, Result<Vec<Declared>, String>> {
    let toks = preprocess(source);
    let mut found = HashMap::new();
    let mut i = 0;
    while i + 1 < toks.len() {
        if !(toks[i].text() == "extern" && toks[i + 1].text() == "\"C\"") {
            i += 1;
            continue;
        }
        // the declaration runs to its parameter list: `__global__ void name (`, perhaps with
        // `__launch_bounds__(...)` before the name (skipped, with its arguments)
        let mut head = Vec::new();
        let mut open = None;
        let mut j = i + 2;
        while j < toks.len() {
            match toks[j].text() {
                "__launch_bounds__" => match macro_args(&toks, j + 1) {
                    Some((_, next)) => j = next,
                    None => break,
                },
                "(" => {
                    open = Some(j);
                    break;
                }
                _ => {
                    head.push(toks[j].clone());
                    j += 1;
                }
            }
        }
        let Some(open) = open else {
            break;
        };
        let global = head.iter().any(|t| t.text() == "__global__");
        let name = match head.last() {
            Some(Token::Ident(n)) => n.clone(),
            _ => {
                i = open;
                continue;
            }
        };
        let Some((args, next)) = macro_args(&toks, open) else {
            found.insert(name, Err("the parameter list does not close".to_string()));
            break;
        };
        i = next;
        if !global {
            continue;
        }
        let params = if args.len() == 1 && args[0].len() == 1 && args[0][0].text() == "void" {
            Ok(Vec::new())
        } else {
            args.iter().map(|a| param(a)).collect()
        };
        found.insert(name, params);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str, name: &str) -> Vec<Param> {
        kernels(src)[name]
            .clone()
            .unwrap()
            .into_iter()
            .map(|d| d.param)
            .collect()
    }

    #[test]
    fn plain_kernels_are_read() {
        let src = r#"
// a comment with extern "C" __global__ void fake(int x) in it
extern "C" __global__ void add_bias_f32(float* y, const float* b, int rows, int cols) {
    long total = (long)rows * cols;
}
/* extern "C" __global__ void other(double d) */
extern "C" __global__ void stream_barrier() {}
extern "C" __global__ void nothing(void) {}
extern "C" __global__ void count(const unsigned* a, const unsigned* __restrict__ b, long bytes,
                                 unsigned long long* count) {}
extern "C" __global__ void widths(unsigned u, unsigned long long s, long long n, double d,
                                  float f, signed int i, unsigned int w) {}
extern "C" __device__ int helper(int x) { return x; }
extern "C" __global__ void __launch_bounds__(256, 2) bounded(const float* x, int n) {}
"#;
        let all = kernels(src);
        assert_eq!(kinds(src, "bounded"), [Param::Ptr, Param::I32]);
        assert_eq!(
            kinds(src, "add_bias_f32"),
            [Param::Ptr, Param::Ptr, Param::I32, Param::I32]
        );
        assert_eq!(kinds(src, "stream_barrier"), []);
        assert_eq!(kinds(src, "nothing"), []);
        assert_eq!(
            kinds(src, "count"),
            [Param::Ptr, Param::Ptr, Param::I64, Param::Ptr]
        );
        assert_eq!(
            kinds(src, "widths"),
            [
                Param::U32,
                Param::U64,
                Param::I64,
                Param::F64,
                Param::F32,
                Param::I32,
                Param::U32
            ]
        );
        assert!(!all.contains_key("fake") && !all.contains_key("other"));
        assert!(!all.contains_key("helper"), "not a __global__ function");
        let names: Vec<String> = all["add_bias_f32"]
            .clone()
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["y", "b", "rows", "cols"]);
    }

    #[test]
    fn macro_instances_are_expanded_and_pasted() {
        let src = r#"
#define LOOP(i, n) for (long i = 0; i < (n); ++i)
#define INSTANCES(T, TAG)                                                      \
extern "C" __global__ void cast_##TAG(const float* s, T* d, long n) { LOOP(o, n) d[o] = s[o]; } \
extern "C" __global__ void bias_act_##TAG(T* y, const float* b, int m, int n, int relu)        \
    { }
INSTANCES(float, f32)
INSTANCES(H, f16)
struct Dims { int rank; long long shape[6]; };
#define TYPED(T, tag) \
extern "C" __global__ void copy_##tag(const T* a, T* y, Dims d, long long n) {}
TYPED(double, f64)
#define WINDOWED(T, TAG, WIN, K) \
extern "C" __global__ void pool##WIN##_##TAG(const T* x, int k) {}
#define ALL(T, TAG) WINDOWED(T, TAG, , 0) WINDOWED(T, TAG, _k3, 3)
ALL(float, f32)
"#;
        let all = kernels(src);
        for name in ["cast_f32", "cast_f16"] {
            assert_eq!(
                kinds(src, name),
                [Param::Ptr, Param::Ptr, Param::I64],
                "{name}"
            );
        }
        assert_eq!(
            kinds(src, "bias_act_f16"),
            [Param::Ptr, Param::Ptr, Param::I32, Param::I32, Param::I32]
        );
        assert_eq!(
            kinds(src, "copy_f64"),
            [
                Param::Ptr,
                Param::Ptr,
                Param::Struct("Dims".into()),
                Param::I64
            ]
        );
        assert!(!all.contains_key("cast_TAG") && !all.contains_key("cast_"));
        // an empty argument pasted between two ##, through a macro of macros
        for name in ["pool_f32", "pool_k3_f32"] {
            assert_eq!(kinds(src, name), [Param::Ptr, Param::I32], "{name}");
        }
    }

    #[test]
    fn unreadable_parameters_are_reasons_not_guesses() {
        let src = r#"
extern "C" __global__ void by_ref(const Dims& d, int n) {}
extern "C" __global__ void small(short s) {}
extern "C" __global__ void fine(int n) {}
"#;
        let all = kernels(src);
        assert!(all["by_ref"].is_err());
        assert!(all["small"].as_ref().unwrap_err().contains("not supported"));
        assert_eq!(kinds(src, "fine"), [Param::I32]);
    }

    #[test]
    fn unnamed_parameters_are_read() {
        let src = r#"extern "C" __global__ void k(int, float*, unsigned long long) {}"#;
        assert_eq!(kinds(src, "k"), [Param::I32, Param::Ptr, Param::U64]);
    }
}

//! Slurm's compressed host lists (`node[01-04,07]`, `gpu-a[1-2],gpu-b3`) and tasks-per-node
//! lists (`2(x3),1`), as Slurm writes them into SLURM_JOB_NODELIST, SLURM_STEP_NODELIST and
//! SLURM_TASKS_PER_NODE.
//!
//! To use: [`expand`] for every host, [`first_host`] for rank 0's host without expanding a
//! 10,000-node list, [`tasks_on_node`] for one node's task count.

/// The most hosts [`expand`] writes out; a longer list is refused rather than filling memory.
const MAX_HOSTS: usize = 1 << 16;

/// One bracketed number range: `low-high`, written `width` digits wide (Slurm keeps the zero
/// padding of the low bound: `[01-10]` is 01, 02, ..., 10; `[1-10]` is 1, 2, ..., 10).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    low: u64,
    high: u64,
    width: usize,
}

/// A piece of one host pattern: literal text or a bracketed list of ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Spans(Vec<Span>),
}

/// One comma-separated pattern of the list, e.g. `rack1-n[001-003]`. Several bracket groups
/// (`r[1-2]n[1-2]`) expand to every combination, first group outermost, as Slurm does.
type Pattern = Vec<Piece>;

/// Every host of `list`, in Slurm's order.
pub fn expand(list: &str) -> Result<Vec<String>, String> {
    let patterns = parse(list)?;
    let mut hosts = Vec::new();
    for pattern in &patterns {
        expand_pattern(pattern, &mut hosts)?;
    }
    Ok(hosts)
}

/// The first host of `list` (where srun starts rank 0), checking the whole list's syntax.
pub fn first_host(list: &str) -> Result<String, String> {
    let patterns = parse(list)?;
    let first = patterns
        .first()
        .ok_or_else(|| "the host list is empty".to_string())?;
    Ok(first
        .iter()
        .map(|piece| match piece {
            Piece::Text(text) => text.clone(),
            Piece::Spans(spans) => spans.first().map(number_text).unwrap_or_default(),
        })
        .collect())
}

/// How many tasks node `node` (counting from 0) runs, from a list like `2(x3),1` (three nodes of
/// two tasks, then one of one). None when the node is past the list's end.
pub fn tasks_on_node(list: &str, node: usize) -> Result<Option<usize>, String> {
    let mut remaining = node;
    for group in list.trim().split(',') {
        let (count, repeats) = parse_task_group(group)?;
        if remaining < repeats {
            return Ok(Some(count));
        }
        remaining -= repeats;
    }
    Ok(None)
}

/// `2(x3)` is (2, 3); `4` is (4, 1).
fn parse_task_group(group: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{group:?} is not a task count like 4 or 2(x3)");
    let (count, repeats) = match group.split_once('(') {
        None => (group, "1"),
        Some((count, rest)) => {
            let repeats = rest.strip_prefix('x').and_then(|r| r.strip_suffix(')'));
            (count, repeats.ok_or_else(bad)?)
        }
    };
    let count = parse_digits(count).ok_or_else(bad)?;
    let repeats = parse_digits(repeats).ok_or_else(bad)?;
    let to_usize = |n: u64| usize::try_from(n).map_err(|_| bad());
    Ok((to_usize(count)?, to_usize(repeats)?))
}

fn parse_digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Splits the list at its top-level commas and parses each pattern.
fn parse(list: &str) -> Result<Vec<Pattern>, String> {
    let list = list.trim();
    if list.is_empty() {
        return Err("the host list is empty".into());
    }
    let mut patterns = Vec::new();
    let mut start = 0;
    let mut depth = 0usize;
    for (at, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err(format!("{list:?} has a '[' inside brackets")),
            '[' => depth = 1,
            ']' if depth == 0 => return Err(format!("{list:?} has a ']' without its '['")),
            ']' => depth = 0,
            ',' if depth == 0 => {
                patterns.push(parse_pattern(&list[start..at], list)?);
                start = at + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(format!("{list:?} has a '[' that is never closed"));
    }
    patterns.push(parse_pattern(&list[start..], list)?);
    Ok(patterns)
}

/// One pattern without top-level commas, brackets already known to balance.
fn parse_pattern(text: &str, list: &str) -> Result<Pattern, String> {
    if text.is_empty() {
        return Err(format!(
            "{list:?} has an empty host name (two commas, or one at an end)"
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{list:?} has the character {c:?} in a host name"));
    }
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_string()));
        }
        let close = rest[open..]
            .find(']')
            .map(|at| open + at)
            .ok_or_else(|| format!("{list:?} has a '[' that is never closed"))?;
        pieces.push(Piece::Spans(parse_spans(&rest[open + 1..close], list)?));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

/// The inside of one bracket: `01-04,07`.
fn parse_spans(inside: &str, list: &str) -> Result<Vec<Span>, String> {
    if inside.is_empty() {
        return Err(format!("{list:?} has empty brackets"));
    }
    inside
        .split(',')
        .map(|range| {
            let bad =
                || format!("{list:?}: {range:?} is not a number or a range of numbers like 01-04");
            let (low_text, high_text) = range.split_once('-').unwrap_or((range, range));
            let low = parse_digits(low_text).ok_or_else(bad)?;
            let high = parse_digits(high_text).ok_or_else(bad)?;
            if low > high {
                return Err(format!("{list:?}: the range {range:?} runs backwards"));
            }
            Ok(Span {
                low,
                high,
                width: low_text.len(),
            })
        })
        .collect()
}

fn number_text(span: &Span) -> String {
    format!("{:0width$}", span.low, width = span.width)
}

/// Appends every host of one pattern, refusing to pass [`MAX_HOSTS`].
fn expand_pattern(pattern: &Pattern, hosts: &mut Vec<String>) -> Result<(), String> {
    let mut partial = vec![String::new()];
    for piece in pattern {
        match piece {
            Piece::Text(text) => partial.iter_mut().for_each(|host| host.push_str(text)),
            Piece::Spans(spans) => {
                let mut next = Vec::new();
                for host in &partial {
                    for span in spans {
                        for number in span.low..=span.high {
                            if hosts.len() + next.len() >= MAX_HOSTS {
                                return Err(format!(
                                    "the host list names more than {MAX_HOSTS} hosts"
                                ));
                            }
                            next.push(format!("{host}{number:0width$}", width = span.width));
                        }
                    }
                }
                partial = next;
            }
        }
    }
    hosts.extend(partial);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn single_hosts_and_plain_lists() {
        assert_eq!(hosts("node01"), ["node01"]);
        assert_eq!(hosts("a,b,c"), ["a", "b", "c"]);
        assert_eq!(hosts(" node01 "), ["node01"]);
        assert_eq!(hosts("n1.cluster.example"), ["n1.cluster.example"]);
    }

    #[test]
    fn bracketed_ranges_keep_zero_padding() {
        assert_eq!(
            hosts("node[01-04,07]"),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(
            hosts("rack1-n[001-003]"),
            ["rack1-n001", "rack1-n002", "rack1-n003"]
        );
        assert_eq!(hosts("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(hosts("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(hosts("n[5]"), ["n5"]);
    }

    #[test]
    fn several_patterns_and_suffixes() {
        assert_eq!(hosts("gpu-a[1-2],gpu-b3"), ["gpu-a1", "gpu-a2", "gpu-b3"]);
        assert_eq!(hosts("x[1-2]-ib"), ["x1-ib", "x2-ib"]);
        assert_eq!(
            hosts("r[1-2]n[1-2]"),
            ["r1n1", "r1n2", "r2n1", "r2n2"],
            "several bracket groups: every combination, first group outermost"
        );
        assert_eq!(hosts("[1-2]"), ["1", "2"]);
        assert_eq!(hosts("a[1,3],b[2-3],c"), ["a1", "a3", "b2", "b3", "c"]);
    }

    #[test]
    fn first_host_does_not_expand() {
        assert_eq!(first_host("node[01-04,07]").as_deref(), Ok("node01"));
        assert_eq!(first_host("gpu-a[1-2],gpu-b3").as_deref(), Ok("gpu-a1"));
        assert_eq!(first_host("rack1-n[001-003]").as_deref(), Ok("rack1-n001"));
        assert_eq!(first_host("solo").as_deref(), Ok("solo"));
        assert_eq!(first_host("big[00000-99999]x").as_deref(), Ok("big00000x"));
        assert!(first_host("bad[1-").is_err(), "the whole list is checked");
    }

    #[test]
    fn malformed_lists_are_errors() {
        for list in [
            "",
            "  ",
            "node[",
            "node[1-2",
            "node]1",
            "node[1-2]]",
            "node[[1-2]]",
            "node[]",
            "node[a-b]",
            "node[1-]",
            "node[-3]",
            "node[3-1]",
            "node[1--2]",
            "node[1,,2]",
            "a,,b",
            ",a",
            "a,",
            "node 1",
            "node[1-2 ]",
            "n[99999999999999999999999-1]",
        ] {
            let error = expand(list).expect_err(list);
            assert!(!error.is_empty(), "{list}");
        }
        let error = expand("node[3-1]").unwrap_err();
        assert!(error.contains("backwards"), "{error}");
    }

    #[test]
    fn huge_lists_are_refused() {
        let error = expand("n[0-999999]").unwrap_err();
        assert!(error.contains("more than"), "{error}");
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(tasks_on_node("4", 0), Ok(Some(4)));
        assert_eq!(tasks_on_node("4", 1), Ok(None));
        assert_eq!(tasks_on_node("2(x3),1", 0), Ok(Some(2)));
        assert_eq!(tasks_on_node("2(x3),1", 2), Ok(Some(2)));
        assert_eq!(tasks_on_node("2(x3),1", 3), Ok(Some(1)));
        assert_eq!(tasks_on_node("2(x3),1", 4), Ok(None));
        for bad in ["", "x", "2(3)", "2(x3", "2x3", "-1"] {
            assert!(tasks_on_node(bad, 0).is_err(), "{bad}");
        }
    }
}

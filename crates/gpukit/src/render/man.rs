//! `gpukit man`: one roff page that documents every command, so that `gpukit man | man -l -`
//! is the whole manual.
//!
//! clap_mangen draws one page per command and lists the subcommands as pages of their own
//! (`gpukit-check(1)`), which gpukit does not install. Here the top page is drawn without that
//! list, and a COMMANDS section follows with each command, nested ones included, under its own
//! heading (`gpukit bench matmul`): its synopsis, description and options.
//!
//! To use: `man_page(<Cli as clap::CommandFactory>::command())`, and print the bytes.

use std::io::Write;

/// The whole page: the top command's sections, every command under COMMANDS, the version.
pub fn man_page(cli: clap::Command) -> std::io::Result<Vec<u8>> {
    // `gpukit help` only prints what this page already holds
    let mut cli = cli.disable_help_subcommand(true);
    cli.build();
    let top = clap_mangen::Man::new(cli.clone());
    let mut page = Vec::new();
    top.render_title(&mut page)?;
    top.render_name_section(&mut page)?;
    top.render_synopsis_section(&mut page)?;
    top.render_description_section(&mut page)?;
    top.render_options_section(&mut page)?;
    writeln!(page, ".SH COMMANDS")?;
    // the global flags and --help are documented once, in OPTIONS above
    let documented_above: Vec<String> = cli
        .get_arguments()
        .filter(|a| a.is_global_set() || a.get_id() == "help")
        .map(|a| a.get_id().to_string())
        .collect();
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_entry(&mut page, sub, &documented_above)?;
    }
    top.render_version_section(&mut page)?;
    Ok(strip_repeated_preambles(&page))
}

/// One command under its own `.SS` heading, then the commands nested in it.
fn command_entry(
    page: &mut Vec<u8>,
    cmd: &clap::Command,
    documented_above: &[String],
) -> std::io::Result<()> {
    let heading = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    writeln!(page, ".SS \"{}\"", heading.replace(['"', '\\'], ""))?;
    let own = cmd.clone().mut_args(|a| {
        if documented_above.iter().any(|id| a.get_id() == id.as_str()) {
            a.hide(true)
        } else {
            a
        }
    });
    let man = clap_mangen::Man::new(own.clone());
    let mut entry = Vec::new();
    man.render_synopsis_section(&mut entry)?;
    man.render_description_section(&mut entry)?;
    if own
        .get_arguments()
        .any(|a| !a.is_hide_set() && !a.is_positional())
    {
        man.render_options_section(&mut entry)?;
    }
    page.extend_from_slice(&demote_headings(&entry));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_entry(page, sub, documented_above)?;
    }
    Ok(())
}

/// A command's sections as parts of its `.SS` entry: SYNOPSIS and DESCRIPTION become plain
/// paragraphs, any other section heading (OPTIONS) a bold line.
fn demote_headings(roff: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(roff);
    let mut out = String::new();
    for line in text.lines() {
        match line.strip_prefix(".SH ") {
            Some(name) => {
                let name = name.trim_matches('"');
                out.push_str(".PP\n");
                if name != "SYNOPSIS" && name != "DESCRIPTION" {
                    let mut title = name.to_lowercase();
                    if let Some(first) = title.get(..1) {
                        title.replace_range(..1, &first.to_uppercase());
                    }
                    out.push_str(&format!(".B \"{title}\"\n"));
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.into_bytes()
}

/// Each rendered piece opens with roff's definition of the apostrophe string; the page needs it
/// once, at its top.
fn strip_repeated_preambles(page: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(page);
    let is_preamble = |l: &str| l.starts_with(".ie \\n(.g .ds Aq") || l.starts_with(".el .ds Aq");
    let mut out = String::new();
    let mut seen_body = false;
    for line in text.lines() {
        if is_preamble(line) && seen_body {
            continue;
        }
        seen_body |= !is_preamble(line);
        out.push_str(line);
        out.push('\n');
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    fn page() -> String {
        String::from_utf8(man_page(Cli::command()).expect("the page renders")).expect("UTF-8")
    }

    /// Every command's name as the page heads it: `gpukit bench matmul`.
    fn command_names(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let name = format!("{prefix} {}", sub.get_name());
            out.push(name.clone());
            command_names(sub, &name, out);
        }
    }

    #[test]
    fn the_page_names_no_other_page() {
        let page = page();
        // a reference to another page reads `name(1)`; roff writes a hyphen as `\-`
        let plain = page.replace("\\-", "-");
        for (i, _) in plain.match_indices("(1)") {
            let before = &plain[..i];
            let word = before
                .rsplit(|c: char| c.is_whitespace())
                .next()
                .unwrap_or_default();
            assert!(
                !word.starts_with("gpukit-"),
                "the page refers to {word}(1), a page that does not exist"
            );
        }
        assert!(!plain.contains("SUBCOMMANDS"), "no list of sub-pages");
    }

    #[test]
    fn the_page_documents_every_command_and_its_options() {
        let page = page();
        assert!(page.starts_with(".ie \\n(.g .ds Aq"), "{}", &page[..200]);
        assert_eq!(page.matches(".ds Aq").count(), 2, "one apostrophe preamble");
        assert_eq!(page.matches(".TH ").count(), 1, "one page");
        let mut names = Vec::new();
        command_names(&Cli::command(), "gpukit", &mut names);
        assert!(names.len() > 20, "{names:?}");
        for name in &names {
            assert!(
                page.contains(&format!(".SS \"{name}\"\n")),
                "{name} has no heading"
            );
        }
        assert!(!page.contains(".SS \"gpukit help\""));
        // a subcommand's own flag, and the global ones once, at the top
        assert!(page.contains("\\-\\-quick"), "all --quick");
        assert_eq!(page.matches("Print one JSON document").count(), 1);
        for section in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "OPTIONS",
            "COMMANDS",
            "VERSION",
        ] {
            assert!(page.contains(&format!(".SH {section}\n")), "{section}");
        }
    }
}

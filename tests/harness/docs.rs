//! The documentation as the docs tests read it (`tests/e2e/docs/`): the Markdown files
//! a reader is pointed at, their fenced blocks, inline code and tables, the section of
//! a file between two marker comments, and what the code says in return — the config
//! keys the binaries take (asked of the binaries themselves), their verbs and `--help`
//! entries, and every other file of the repository, for the paths it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository")
        .to_path_buf()
}

/// The documents a reader is pointed at, relative to the root: the README, every
/// page of `docs/`, the sim driver's page and the TypeScript clients' pages.
pub fn files() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("README.md"),
        PathBuf::from("driver/README.md"),
        PathBuf::from("clients/typescript/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| {
            p.strip_prefix(root())
                .expect("under the root")
                .to_path_buf()
        })
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// A document's text, by its path relative to the root.
pub fn read(path: impl AsRef<Path>) -> String {
    let path = root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// A fenced block: its info string (`sh`, `toml`, or empty), its lines, and the line
/// (from 1) of the document its first line is on.
#[derive(Debug, Clone)]
pub struct Block {
    pub lang: String,
    pub body: String,
    pub line: usize,
}

/// Every fenced block of `text` (```` ``` ````, indented or not).
pub fn blocks(text: &str) -> Vec<Block> {
    let mut blocks = vec![];
    let mut open: Option<(String, Vec<&str>, usize, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let indent = line.len() - trimmed.len();
                    open = Some((info.trim().to_string(), vec![], i + 2, indent));
                }
            }
            Some((lang, lines, first, indent)) => {
                if trimmed.starts_with("```") {
                    blocks.push(Block {
                        lang: std::mem::take(lang),
                        body: lines.join("\n"),
                        line: *first,
                    });
                    open = None;
                } else {
                    let cut = line.len() - line.trim_start().len();
                    lines.push(&line[cut.min(*indent)..]);
                }
            }
        }
    }
    blocks
}

/// `text` without its fenced blocks (each line of one left empty, so line numbers
/// stay): the prose, its inline code and its tables.
pub fn prose(text: &str) -> String {
    let mut inside = false;
    let mut out = vec![];
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        if fence {
            inside = !inside;
        }
        out.push(if fence || inside { "" } else { line });
    }
    out.join("\n")
}

/// Every inline code span of the prose of `text` (`` `…` ``), with its line (from 1).
pub fn inline_code(text: &str) -> Vec<(usize, String)> {
    let mut spans = vec![];
    for (i, line) in prose(text).lines().enumerate() {
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            spans.push((i + 1, code.to_string()));
        }
    }
    spans
}

/// The section of `text` between `<!-- NAME:begin -->` and `<!-- NAME:end -->`.
pub fn marked<'a>(text: &'a str, name: &str) -> &'a str {
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let start = text
        .find(&begin)
        .unwrap_or_else(|| panic!("no {begin} in the text"))
        + begin.len();
    let stop = text[start..]
        .find(&end)
        .unwrap_or_else(|| panic!("no {end} after {begin}"));
    &text[start..start + stop]
}

/// A Markdown table: the header's cells, then each row's, without the `|`s.
#[derive(Debug, Clone)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<(usize, Vec<String>)>,
}

/// Every table of the prose of `text`.
pub fn tables(text: &str) -> Vec<Table> {
    let cells = |line: &str| -> Vec<String> {
        let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
        // A `\|` inside a cell is a pipe, not a border.
        inner
            .replace("\\|", "\u{0}")
            .split('|')
            .map(|c| c.replace('\u{0}', "|").trim().to_string())
            .collect()
    };
    let prose = prose(text);
    let lines: Vec<&str> = prose.lines().collect();
    let mut tables = vec![];
    let mut i = 0;
    while i + 1 < lines.len() {
        let is_rule = |l: &str| {
            let l = l.trim();
            l.starts_with('|') && l.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
        };
        if lines[i].trim_start().starts_with('|') && is_rule(lines[i + 1]) {
            let header = cells(lines[i]);
            let mut rows = vec![];
            let mut j = i + 2;
            while j < lines.len() && lines[j].trim_start().starts_with('|') {
                rows.push((j + 1, cells(lines[j])));
                j += 1;
            }
            tables.push(Table { header, rows });
            i = j;
        } else {
            i += 1;
        }
    }
    tables
}

/// Every file of the repository that is not documentation (`.md`) nor built or
/// fetched (`target/`, `node_modules/`, `dist/`, `.git/`), with its text: what the
/// docs' paths must be found in.
pub fn code_files() -> BTreeMap<PathBuf, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                if ![
                    "target",
                    "node_modules",
                    "dist",
                    ".git",
                    "build",
                    "generated",
                    "corpus",
                ]
                .contains(&name.as_str())
                {
                    walk(&path, out);
                }
            } else if !name.ends_with(".md") {
                if let Ok(text) = std::fs::read_to_string(&path) {
                    out.insert(path, text);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&root(), &mut out);
    out
}

/// A binary's `--help` for `args` (e.g. `["log", "--help"]`): its verbs and its
/// options and arguments, each with its description (empty when it has none).
#[derive(Debug, Clone, Default)]
pub struct Help {
    pub verbs: BTreeMap<String, String>,
    /// `--long` (or the argument's `<NAME>`) → (takes a value, description).
    pub entries: BTreeMap<String, (bool, String)>,
}

/// Runs `binary` (a workspace binary, built) with `args` and reads its help.
pub fn help(binary: &str, args: &[&str]) -> Help {
    let out = std::process::Command::new(crate::binary(binary))
        .args(args)
        .arg("--help")
        .env("COLUMNS", "1000")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    assert!(out.status.success(), "{binary} {args:?} --help: {out:?}");
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

/// [`help`]'s reading of clap's output (one line per entry, or clap's long form: the
/// entry on one line and its description indented on the next).
pub fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut section = "";
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with(' ') && line.ends_with(':') {
            section = line.trim_end_matches(':');
            continue;
        }
        let entry = line.trim_start();
        if entry.is_empty() || line.len() - entry.len() > 6 {
            continue;
        }
        // The entry's name: its words up to two spaces; the rest is the description,
        // or the next line's when that is indented further.
        let (name, mut description) = match entry.split_once("  ") {
            Some((name, rest)) => (name.trim(), rest.trim().to_string()),
            None => (entry.trim(), String::new()),
        };
        if description.is_empty() {
            if let Some(next) = lines.get(i + 1) {
                let indent = next.len() - next.trim_start().len();
                if indent > line.len() - entry.len() + 2 {
                    description = next.trim().to_string();
                }
            }
        }
        // clap's annotations (`[default: …]`, `[env: …]`, `[possible values: …]`)
        // are no description.
        let description = strip_annotations(&description);
        match section {
            "Commands" => {
                help.verbs.insert(name.to_string(), description);
            }
            "Options" | "Arguments" => {
                let long = name
                    .split([',', ' '])
                    .find(|w| w.starts_with("--"))
                    .unwrap_or(name.split(' ').next().unwrap_or(name));
                let takes_value = section == "Options" && name.contains('<');
                help.entries
                    .insert(long.to_string(), (takes_value, description));
            }
            _ => {}
        }
    }
    help
}

/// `description` without clap's bracketed annotations.
fn strip_annotations(description: &str) -> String {
    let mut out = description.to_string();
    for tag in ["[default: ", "[env: ", "[possible values: ", "[aliases: "] {
        while let Some(start) = out.find(tag) {
            let end = out[start..].find(']').map_or(out.len(), |e| start + e + 1);
            out.replace_range(start..end, "");
        }
    }
    out.trim().to_string()
}

/// A config's keys, as its binary takes them: section (`""` for the top level,
/// `"log.retention"`, `"hooks"` for `[[hooks]]`) → keys.
pub type Keys = BTreeMap<String, BTreeSet<String>>;

/// Every key of the agent's config (`capstan-agent`) or the coordinator's
/// (`capstan-coordinator run`), found by asking the binary: a config with an unknown
/// key in a section is refused with the list of the keys that section takes (serde's
/// "unknown field `…`, expected one of …"), and each of those that is a table is
/// asked the same in turn.
pub fn config_keys(coordinator: bool) -> Keys {
    let mut keys = Keys::new();
    // The sections that are arrays of tables (`[[hooks]]`), whose children need their
    // parent's element first.
    let mut arrays = BTreeSet::new();
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut todo = vec![String::new()];
    while let Some(section) = todo.pop() {
        let Some(found) = probe(coordinator, dir.path(), &section, &arrays) else {
            continue;
        };
        for key in &found {
            let child = if section.is_empty() {
                key.clone()
            } else {
                format!("{section}.{key}")
            };
            if probe(coordinator, dir.path(), &child, &arrays).is_some() {
                todo.push(child);
                continue;
            }
            arrays.insert(child.clone());
            if probe(coordinator, dir.path(), &child, &arrays).is_some() {
                todo.push(child);
            } else {
                arrays.remove(&child);
            }
        }
        keys.insert(section, found);
    }
    keys
}

/// The keys `section` takes, when it is a table (or an array of tables: in
/// `arrays`); `None` when it is not one.
fn probe(
    coordinator: bool,
    dir: &Path,
    section: &str,
    arrays: &BTreeSet<String>,
) -> Option<BTreeSet<String>> {
    let mut config = String::new();
    if coordinator {
        config.push_str("signing_key_file = \"/nonexistent\"\n");
    }
    // Each array of tables on the way gets an element, then the section its header.
    let mut path = String::new();
    for part in section.split('.').filter(|p| !p.is_empty()) {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part);
        if path == section {
            if arrays.contains(&path) {
                config.push_str(&format!("[[{path}]]\n"));
            } else {
                config.push_str(&format!("[{path}]\n"));
            }
        } else if arrays.contains(&path) {
            config.push_str(&format!("[[{path}]]\n"));
        }
    }
    config.push_str("capstan_docs_probe = 1\n");
    let file = dir.join("probe.toml");
    std::fs::write(&file, config).expect("write the probe config");
    let mut command = if coordinator {
        let mut c = std::process::Command::new(crate::binary("capstan-coordinator"));
        c.args(["run", "--config"]).arg(&file);
        c
    } else {
        let mut c = std::process::Command::new(crate::binary("capstan-agent"));
        c.arg("--config")
            .arg(&file)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--host", "probe", "intent"]);
        c
    };
    let out = command.output().expect("run the binary");
    assert!(
        !out.status.success(),
        "a config with an unknown key was taken: {out:?}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let list = stderr
        .lines()
        .find_map(|l| l.strip_prefix("unknown field `capstan_docs_probe`, expected "))?;
    let keys = list
        .trim_start_matches("one of ")
        .split(['`', ',', ' '])
        .filter(|w| !w.is_empty() && *w != "or")
        .map(str::to_string)
        .collect();
    Some(keys)
}

//! The names the docs use exist in the code, and the code's are in the docs:
//!
//! - every path under `/etc/capstan`, `/var/lib/capstan`, `/run/capstan`,
//!   `/usr/lib/capstan`, `/usr/bin`, `/usr/share/doc` (and CI's caches) that a
//!   document names is in a file of the repository that is not a document (the
//!   packaging, the units, the code, the CI scripts), or is one of the few paths the
//!   docs give as an operator's example ([`EXAMPLES`]);
//! - every config key a document names — in a TOML block (with its section), as
//!   `[section] key`, in a `| key |` table — is a key of the agent's or the
//!   coordinator's config, and every key they take is documented;
//! - every verb of `capstan`, `capstan-agent` and `capstan-coordinator` a document
//!   runs is one of the binary's, and every verb is in `docs/cli.md`;
//! - every error code a document gives as an answer (after an HTTP status, in a
//!   `| code |` column, as `"code":"…"`) is one the code has, and every code is in
//!   `docs/protocol.md` (the protocol's and the agent's) or `docs/api.md` (the API's).
//!
//! What the code has is asked of the code: the binaries' `--help` and their config
//! parsers (`capstan_tests::docs`), `ErrorCode::ALL`, `AgentCode::ALL`, and the served
//! OpenAPI description (`ApiError`'s codes, kept equal to the coordinator's by its unit
//! tests). Each check is a pure function of the docs' text, tested below on a planted
//! wrong name as well as run on the docs.

use capstan_common::answers::AgentCode;
use capstan_common::ErrorCode;
use capstan_tests::docs::{self, Help, Keys};
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

/// Paths the docs give as an operator's choice, not one capstan or its packages make
/// or read by default (a TLS file, a credentials file named in an example config).
/// Each must still be named by a document ([`every_path_the_docs_name_exists`]).
const EXAMPLES: &[&str] = &[
    "/etc/capstan/api.key",
    "/etc/capstan/api.pem",
    "/etc/capstan/bus-ca.pem",
    "/etc/capstan/ca.pem",
    "/etc/capstan/cluster.kubeconfig",
    "/etc/capstan/h1.creds",
    "/etc/capstan/h1.key",
    "/etc/capstan/h1.pem",
    "/etc/capstan/vault-hook.password",
    "/etc/capstan/nats.password",
    "/usr/lib/capstan/hooks/iam",
    "/usr/lib/capstan/hooks/net",
    "/var/lib/capstan/export",
    "/var/lib/capstan/export/h1/capstan-log",
];

/// A document: its path (relative to the root) and text.
struct Doc {
    path: String,
    text: String,
}

fn all_docs() -> Vec<Doc> {
    docs::files()
        .into_iter()
        .map(|p| Doc {
            text: docs::read(&p),
            path: p.display().to_string(),
        })
        .collect()
}

fn doc(path: &str, text: &str) -> Doc {
    Doc {
        path: path.to_string(),
        text: text.to_string(),
    }
}

/// Fails listing `problems`, if there are any.
#[track_caller]
fn none(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// ---------------------------------------------------------------- paths

/// The paths capstan's packages install or its programs use: its directories under
/// `/etc`, `/var/lib`, `/run` and `/usr/lib`, its binaries and its packages' docs (not
/// CI's caches, `/var/cache/capstan-ci`, nor the tests' `/var/lib/capstan-tests`).
static PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"/(?:(?:etc|var/lib|run|usr/lib)/capstan(?:/[A-Za-z0-9_.<>{}*/-]*)?|usr/bin/capstan[a-z-]*|usr/share/doc/capstan-[a-z]+[A-Za-z0-9_.<>{}*/-]*)",
    )
    .expect("the path pattern")
});

/// Every path `doc` names, as checked: cut at its first placeholder (`<host>`, `{x}`,
/// `*`) and without a trailing `.`, `,`, `-` or `/`.
fn paths_named(doc: &Doc) -> Vec<(usize, String)> {
    let mut found = vec![];
    for (i, line) in doc.text.lines().enumerate() {
        for m in PATH.find_iter(line) {
            // `/var/lib/capstan-tests`: another directory, not one of capstan's.
            if line[m.end()..].starts_with(|c: char| c == '-' || c.is_ascii_alphanumeric()) {
                continue;
            }
            let path = m.as_str();
            let cut = path.find(['<', '{', '*']).unwrap_or(path.len());
            let path = path[..cut].trim_end_matches(['.', ',', '-', '/']);
            found.push((i + 1, path.to_string()));
        }
    }
    found
}

/// The paths of `docs` found in none of `code` (file texts) nor [`EXAMPLES`].
fn missing_paths(docs: &[Doc], code: &[&str]) -> Vec<String> {
    let mut missing = vec![];
    for doc in docs {
        for (line, path) in paths_named(doc) {
            if !EXAMPLES.contains(&path.as_str()) && !code.iter().any(|c| c.contains(&path)) {
                missing.push(format!("{}:{line}: {path}", doc.path));
            }
        }
    }
    missing
}

#[test]
fn every_path_the_docs_name_exists() {
    let docs = all_docs();
    let code = docs::code_files();
    let code: Vec<&str> = code.values().map(String::as_str).collect();
    none(
        "paths the docs name that no file of the code has (fix the doc, or the code)",
        missing_paths(&docs, &code),
    );
    let named: BTreeSet<String> = docs.iter().flat_map(paths_named).map(|(_, p)| p).collect();
    none(
        "examples no document names any more (remove them from EXAMPLES)",
        EXAMPLES
            .iter()
            .filter(|e| !named.contains(**e))
            .map(|e| e.to_string())
            .collect(),
    );
}

#[test]
fn a_path_no_code_has_is_found() {
    let code = ["const TOKENS: &str = \"/etc/capstan/tokens\";"];
    let good = doc(
        "good.md",
        "Tokens: `/etc/capstan/tokens`, `/etc/capstan/ca.pem`.",
    );
    assert_eq!(missing_paths(&[good], &code), Vec::<String>::new());
    let planted = doc("bad.md", "x\nTokens: `/etc/capstan/api-tokens`.");
    assert_eq!(
        missing_paths(&[planted], &code),
        ["bad.md:2: /etc/capstan/api-tokens"]
    );
}

// ---------------------------------------------------------------- config keys

/// A key a document names: its line, its section when the document says it (`""` the
/// top level), and the key (`[x]` for a section named alone).
#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyNamed {
    line: usize,
    section: Option<String>,
    key: String,
}

static TOML_KEY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*(?:#\s*)?([a-z_][a-z0-9_]*)\s*=").expect("the key pattern"));
static TOML_SECTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(?:#\s*)?\[\[?([a-z_][a-z0-9_.]*)\]\]?\s*(?:#.*)?$")
        .expect("the section pattern")
});
static SECTION_KEY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\[\[?([a-z_][a-z0-9_.]*)\]\]? ([a-z_][a-z0-9_]*)$").expect("the pattern")
});
static SECTION_ALONE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\[?([a-z_][a-z0-9_.]*)\]\]?$").expect("the pattern"));
static KEY_EQUALS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^([a-z_][a-z0-9_]*) = (?:"|\[|[0-9]|true|false)"#)
        .expect("the key = value pattern")
});

/// Whether a TOML block is a capstan config: not one whose first line names another
/// file (`# /etc/containers/containers.conf`).
fn is_capstan_toml(body: &str) -> bool {
    match body
        .lines()
        .next()
        .and_then(|l| l.trim().strip_prefix("# /"))
    {
        Some(file) => file.starts_with("etc/capstan/"),
        None => true,
    }
}

/// Every config key `doc` names: in TOML blocks (also commented-out ones, `# key =`),
/// as `` `[section] key` ``, as `` `key = value` ``, in the first column of a table
/// whose first header is `key`.
fn keys_named(doc: &Doc) -> Vec<KeyNamed> {
    let mut found = vec![];
    for block in docs::blocks(&doc.text) {
        if block.lang != "toml" || !is_capstan_toml(&block.body) {
            continue;
        }
        let mut section = String::new();
        for (i, line) in block.body.lines().enumerate() {
            let line_no = block.line + i;
            if let Some(c) = TOML_SECTION.captures(line) {
                section = c[1].to_string();
                found.push(KeyNamed {
                    line: line_no,
                    section: None,
                    key: format!("[{section}]"),
                });
            } else if let Some(c) = TOML_KEY.captures(line) {
                found.push(KeyNamed {
                    line: line_no,
                    section: Some(section.clone()),
                    key: c[1].to_string(),
                });
            }
        }
    }
    for (line, code) in docs::inline_code(&doc.text) {
        if let Some(c) = SECTION_KEY.captures(&code) {
            found.push(KeyNamed {
                line,
                section: Some(c[1].to_string()),
                key: c[2].to_string(),
            });
        } else if let Some(c) = KEY_EQUALS.captures(&code) {
            found.push(KeyNamed {
                line,
                section: None,
                key: c[1].to_string(),
            });
        }
    }
    for table in docs::tables(&doc.text) {
        if table.header.first().map(String::as_str) != Some("key") {
            continue;
        }
        for (line, row) in &table.rows {
            let first = row.first().map(String::as_str).unwrap_or("");
            for code in first.split('`').skip(1).step_by(2) {
                let key = match SECTION_ALONE.captures(code) {
                    Some(c) => format!("[{}]", &c[1]),
                    None => code.to_string(),
                };
                found.push(KeyNamed {
                    line: *line,
                    section: None,
                    key,
                });
            }
        }
    }
    found
}

/// Whether `keys` (a config's) has `named`.
fn has(keys: &Keys, named: &KeyNamed) -> bool {
    if let Some(section) = named
        .key
        .strip_prefix('[')
        .and_then(|k| k.strip_suffix(']'))
    {
        return keys.contains_key(section);
    }
    match &named.section {
        Some(section) => keys.get(section).is_some_and(|k| k.contains(&named.key)),
        None => keys.values().any(|k| k.contains(&named.key)),
    }
}

/// The keys of `docs` neither config has.
fn unknown_keys(docs: &[Doc], configs: &[&Keys]) -> Vec<String> {
    let mut unknown = vec![];
    for doc in docs {
        for named in keys_named(doc) {
            if !configs.iter().any(|keys| has(keys, &named)) {
                let at = match &named.section {
                    Some(s) if !s.is_empty() => format!("[{s}] "),
                    _ => String::new(),
                };
                unknown.push(format!("{}:{}: {at}{}", doc.path, named.line, named.key));
            }
        }
    }
    unknown
}

/// The keys (and sections) of `keys` that no document names: a section as `[x]` or
/// `[[x]]` (or one of its own sections: `[log.retention]` names `[log]`), a key in its
/// section's TOML, as `[section] key`, or alone (`` `key` ``, a `| key |` row); a key
/// that is a section, as that section.
fn undocumented_keys(docs: &[Doc], keys: &Keys) -> Vec<String> {
    let mut named: BTreeSet<(Option<String>, String)> = BTreeSet::new();
    let mut spans: BTreeSet<String> = BTreeSet::new();
    let mut sections: BTreeSet<String> = BTreeSet::new();
    for doc in docs {
        for k in keys_named(doc) {
            if let Some(section) = k.key.strip_prefix('[').and_then(|k| k.strip_suffix(']')) {
                sections.insert(section.to_string());
            }
            named.insert((k.section.clone(), k.key.clone()));
            named.insert((None, k.key));
        }
        for (_, code) in docs::inline_code(&doc.text) {
            if let Some(c) = SECTION_ALONE.captures(&code) {
                sections.insert(c[1].to_string());
            }
            spans.insert(code);
        }
    }
    let section_named = |section: &str| {
        sections
            .iter()
            .any(|s| s == section || s.starts_with(&format!("{section}.")))
    };
    let mut missing = vec![];
    for (section, section_keys) in keys {
        if !section.is_empty() && !section_named(section) {
            missing.push(format!("[{section}]"));
        }
        for key in section_keys {
            let child = if section.is_empty() {
                key.clone()
            } else {
                format!("{section}.{key}")
            };
            let documented = if keys.contains_key(&child) {
                section_named(&child)
            } else {
                named.contains(&(Some(section.clone()), key.clone()))
                    || named.contains(&(None, key.clone()))
                    || spans.contains(key)
            };
            if !documented {
                let at = if section.is_empty() {
                    String::new()
                } else {
                    format!("[{section}] ")
                };
                missing.push(format!("{at}{key}"));
            }
        }
    }
    missing
}

#[test]
fn every_config_key_the_docs_name_exists_and_every_key_is_documented() {
    let agent = docs::config_keys(false);
    let coordinator = docs::config_keys(true);
    // The probe reached into the sections (a probe that found nothing would pass).
    for (keys, section, key) in [
        (&agent, "", "data_dir"),
        (&agent, "nats", "nkey_seed_file"),
        (&agent, "log.retention", "export_dir"),
        (&agent, "hooks", "phases"),
        (&coordinator, "", "max_beats_per_sec"),
        (&coordinator, "nats", "hosts_nkey_seed_file"),
    ] {
        assert!(
            keys.get(section).is_some_and(|k| k.contains(key)),
            "the probe did not find [{section}] {key}: {keys:?}"
        );
    }
    let docs = all_docs();
    none(
        "config keys the docs name that neither config takes",
        unknown_keys(&docs, &[&agent, &coordinator]),
    );
    none(
        "agent config keys no document names",
        undocumented_keys(&docs, &agent),
    );
    none(
        "coordinator config keys no document names",
        undocumented_keys(&docs, &coordinator),
    );
}

#[test]
fn a_config_key_no_config_takes_is_found() {
    let keys: Keys = [
        (
            String::new(),
            ["listen".to_string(), "tokens_file".into()].into(),
        ),
        ("nats".to_string(), ["url".to_string()].into()),
    ]
    .into();
    let good = doc(
        "good.md",
        "```toml\nlisten = \"x\"\n[nats]\nurl = \"y\"\n```\n`[nats] url`, `tokens_file = \"/t\"`\n",
    );
    assert_eq!(unknown_keys(&[good], &[&keys]), Vec::<String>::new());
    let planted = doc(
        "bad.md",
        "```toml\n[nats]\nlisten = \"x\"\n# tokens_fil = \"/t\"\n```\n\n| key | meaning |\n|---|---|\n| `max_beat_per_sec` | x |\n\n`[nats] urls`\n",
    );
    assert_eq!(
        unknown_keys(&[planted], &[&keys]),
        [
            "bad.md:3: [nats] listen",
            "bad.md:4: [nats] tokens_fil",
            "bad.md:11: [nats] urls",
            "bad.md:9: max_beat_per_sec",
        ]
    );
    let partial = doc("partial.md", "`listen`, `[nats]`");
    assert_eq!(
        undocumented_keys(&[partial], &keys),
        ["tokens_file", "[nats] url"]
    );
}

// ---------------------------------------------------------------- verbs

/// A program's command line as its `--help` gives it: the options that take a value,
/// and its verbs, each with its own.
#[derive(Debug, Clone, Default)]
struct Cli {
    valued: BTreeSet<String>,
    verbs: BTreeMap<String, Cli>,
}

const PROGRAMS: [&str; 3] = ["capstan", "capstan-agent", "capstan-coordinator"];

/// The program's [`Cli`], asked of the built binary (verbs of verbs too).
fn cli(binary: &str, args: &[&str]) -> Cli {
    let help: Help = docs::help(binary, args);
    let mut cli = Cli {
        valued: help
            .entries
            .iter()
            .filter(|(_, (valued, _))| *valued)
            .map(|(name, _)| name.clone())
            .collect(),
        verbs: BTreeMap::new(),
    };
    for verb in help.verbs.keys().filter(|v| *v != "help") {
        let mut sub = args.to_vec();
        sub.push(verb);
        let child = if args.is_empty() {
            cli_of_verb(binary, &sub)
        } else {
            Cli::default()
        };
        cli.verbs.insert(verb.clone(), child);
    }
    cli
}

fn cli_of_verb(binary: &str, args: &[&str]) -> Cli {
    let mut child = cli(binary, args);
    // A verb's options include the program's global ones; keep its own verbs.
    child.verbs.retain(|v, _| v != "help");
    child
}

static WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-z][a-z0-9-]*$").expect("the verb pattern"));

/// Where a program's name starts a command: at the start, after a shell operator, a
/// `(`, `$(`, an environment assignment or `sudo`/`env`/`exec`, or as a path's last
/// part (`/usr/bin/capstan-agent`).
fn invocation(tokens: &[&str], i: usize) -> Option<&'static str> {
    let token = tokens[i].trim_start_matches(['"', '\'', '(', '$']);
    let name = token.rsplit('/').next().unwrap_or(token);
    let program = PROGRAMS.iter().find(|p| **p == name)?;
    let starts = match i.checked_sub(1).map(|p| tokens[p]) {
        None => true,
        Some(prev) => {
            ["(", "$(", "\"$("].iter().any(|p| tokens[i].starts_with(p))
                || [
                    "|", "||", "&&", ";", "(", "$(", "sudo", "env", "exec", "then", "do", "!", "#",
                ]
                .contains(&prev)
                || (prev.contains('=') && prev.starts_with(|c: char| c.is_ascii_uppercase()))
        }
    };
    starts.then_some(*program)
}

/// The verbs (a verb, and a verb of that verb when it has any) each command line of
/// `doc` runs: in its shell blocks and inline code.
fn verbs_named(doc: &Doc, clis: &BTreeMap<&str, Cli>) -> Vec<(usize, String)> {
    let mut lines: Vec<(usize, String)> = vec![];
    for block in docs::blocks(&doc.text) {
        if ["sh", "bash", "shell", "console", ""].contains(&block.lang.as_str()) {
            for (i, l) in block.body.lines().enumerate() {
                lines.push((block.line + i, l.to_string()));
            }
        }
    }
    lines.extend(docs::inline_code(&doc.text));
    let mut found = vec![];
    for (line, text) in lines {
        let tokens: Vec<&str> = text.split_whitespace().collect();
        for i in 0..tokens.len() {
            let Some(program) = invocation(&tokens, i) else {
                continue;
            };
            let mut cli = &clis[program];
            let mut words = vec![program.to_string()];
            let mut rest = tokens[i + 1..].iter();
            while let Some(token) = rest.next() {
                let token = token.trim_matches(['[', ']']);
                if token.starts_with('-') {
                    let option = token.split('=').next().unwrap_or(token);
                    if cli.valued.contains(option) && !token.contains('=') {
                        rest.next();
                    }
                    continue;
                }
                let word = token.trim_end_matches([')', '"', '\'', ';', ',', '.', ':']);
                if !WORD.is_match(word) || (words.len() > 1 && cli.verbs.is_empty()) {
                    break;
                }
                words.push(word.to_string());
                match cli.verbs.get(word) {
                    Some(child) => cli = child,
                    None => break,
                }
            }
            if words.len() > 1 {
                found.push((line, words.join(" ")));
            }
        }
    }
    found
}

/// Whether `words` (`program verb …`) are verbs of `clis`.
fn is_verb(clis: &BTreeMap<&str, Cli>, words: &str) -> bool {
    let mut parts = words.split(' ');
    let Some(mut cli) = parts.next().and_then(|p| clis.get(p)) else {
        return false;
    };
    for word in parts {
        match cli.verbs.get(word) {
            Some(child) => cli = child,
            None => return false,
        }
    }
    true
}

/// The verbs `docs` run that the programs do not have.
fn unknown_verbs(docs: &[Doc], clis: &BTreeMap<&str, Cli>) -> Vec<String> {
    let mut unknown = vec![];
    for doc in docs {
        for (line, words) in verbs_named(doc, clis) {
            if !is_verb(clis, &words) {
                unknown.push(format!("{}:{line}: {words}", doc.path));
            }
        }
    }
    unknown
}

/// The programs' verbs (and verbs of verbs) that `reference` never runs.
fn unlisted_verbs(reference: &Doc, clis: &BTreeMap<&str, Cli>) -> Vec<String> {
    let named: BTreeSet<String> = verbs_named(reference, clis)
        .into_iter()
        .map(|(_, w)| w)
        .collect();
    let mut all = vec![];
    for (program, cli) in clis {
        for (verb, child) in &cli.verbs {
            all.push(format!("{program} {verb}"));
            for sub in child.verbs.keys() {
                all.push(format!("{program} {verb} {sub}"));
            }
        }
    }
    all.into_iter().filter(|v| !named.contains(v)).collect()
}

fn clis() -> BTreeMap<&'static str, Cli> {
    PROGRAMS.iter().map(|p| (*p, cli(p, &[]))).collect()
}

#[test]
fn every_verb_the_docs_run_exists_and_docs_cli_lists_every_verb() {
    let clis = clis();
    // The help was read (a reading that found nothing would pass).
    assert!(is_verb(&clis, "capstan-agent log verify"), "{clis:?}");
    assert!(
        is_verb(&clis, "capstan-coordinator nats-config"),
        "{clis:?}"
    );
    assert!(is_verb(&clis, "capstan cancel"), "{clis:?}");
    let docs = all_docs();
    none(
        "verbs the docs run that the programs do not have",
        unknown_verbs(&docs, &clis),
    );
    let reference = docs
        .iter()
        .find(|d| d.path == "docs/cli.md")
        .expect("docs/cli.md");
    none(
        "verbs docs/cli.md does not list",
        unlisted_verbs(reference, &clis),
    );
}

#[test]
fn a_verb_no_program_has_is_found() {
    let leaf = Cli::default();
    let clis: BTreeMap<&str, Cli> = [
        (
            "capstan",
            Cli {
                valued: ["--coordinator".to_string()].into(),
                verbs: [
                    ("hosts".to_string(), leaf.clone()),
                    ("log".into(), leaf.clone()),
                ]
                .into(),
            },
        ),
        (
            "capstan-agent",
            Cli {
                valued: ["--config".to_string()].into(),
                verbs: [(
                    "log".to_string(),
                    Cli {
                        valued: BTreeSet::new(),
                        verbs: [("verify".to_string(), leaf.clone())].into(),
                    },
                )]
                .into(),
            },
        ),
        ("capstan-coordinator", leaf.clone()),
    ]
    .into();
    let good = doc(
        "good.md",
        "```sh\ncapstan --coordinator URL hosts\nCAPSTAN_TOKEN=x capstan log h1 | head\n\
         cargo build -p capstan-agent -p capstan-coordinator\n```\n\
         `/usr/bin/capstan-agent --config /etc/capstan/agent.toml log verify`, `capstan-agent log --json`\n",
    );
    assert_eq!(unknown_verbs(&[good], &clis), Vec::<String>::new());
    let planted = doc(
        "bad.md",
        "```sh\ncapstan [--coordinator URL] host\n```\n`capstan-agent log verfy`\n",
    );
    assert_eq!(
        unknown_verbs(&[planted], &clis),
        [
            "bad.md:2: capstan host",
            "bad.md:4: capstan-agent log verfy"
        ]
    );
    let reference = doc(
        "cli.md",
        "```sh\ncapstan hosts\ncapstan-agent log verify\n```\n",
    );
    assert_eq!(
        unlisted_verbs(&reference, &clis),
        ["capstan log", "capstan-agent log"]
    );
}

// ---------------------------------------------------------------- error codes

static STATUS_CODES: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b[45]\d\d( `[a-z][a-z_]*`(?:(?:,? (?:or |and )?|/)`[a-z][a-z_]*`)*)")
        .expect("the pattern")
});
static CODE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"`([a-z][a-z_]*)`").expect("the code pattern"));
static JSON_CODE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#""code"\s*:\s*"([a-z][a-z_]*)""#).expect("the JSON code pattern")
});

/// Every error code `doc` gives as an answer: after an HTTP status (`503
/// `busy``, a code right after the status, then others after `,`, `or`, `and`, `/`),
/// in a table column headed `code`, as `"code":"…"`.
fn codes_named(doc: &Doc) -> Vec<(usize, String)> {
    let mut found = vec![];
    let prose = docs::prose(&doc.text);
    for (i, line) in prose.lines().enumerate() {
        for m in STATUS_CODES.captures_iter(line) {
            for c in CODE.captures_iter(&m[1]) {
                found.push((i + 1, c[1].to_string()));
            }
        }
    }
    for (i, line) in doc.text.lines().enumerate() {
        for c in JSON_CODE.captures_iter(line) {
            found.push((i + 1, c[1].to_string()));
        }
    }
    for table in docs::tables(&doc.text) {
        let Some(column) = table.header.iter().position(|h| h == "code") else {
            continue;
        };
        for (line, row) in &table.rows {
            for c in CODE.captures_iter(row.get(column).map(String::as_str).unwrap_or("")) {
                found.push((*line, c[1].to_string()));
            }
        }
    }
    found
}

/// The codes `docs` give that are not in `known`.
fn unknown_codes(docs: &[Doc], known: &BTreeSet<String>) -> Vec<String> {
    let mut unknown = vec![];
    for doc in docs {
        for (line, code) in codes_named(doc) {
            if !known.contains(&code) {
                unknown.push(format!("{}:{line}: {code}", doc.path));
            }
        }
    }
    unknown
}

/// The codes of the served OpenAPI description's `ApiError`: every code the
/// coordinator's API answers.
pub(super) fn api_codes() -> BTreeSet<String> {
    let description: serde_json::Value =
        serde_json::from_str(&docs::read("coordinator/src/openapi.json")).expect("openapi.json");
    description["components"]["schemas"]["ApiError"]["properties"]["error"]["properties"]["code"]
        ["enum"]
        .as_array()
        .expect("ApiError's code enum")
        .iter()
        .map(|c| c.as_str().expect("a code").to_string())
        .collect()
}

pub(super) fn protocol_codes() -> BTreeSet<String> {
    ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect()
}

fn agent_codes() -> BTreeSet<String> {
    AgentCode::ALL
        .iter()
        .map(|c| c.as_str().to_string())
        .collect()
}

#[test]
fn every_error_code_the_docs_give_exists_and_every_code_is_documented() {
    let known: BTreeSet<String> = api_codes()
        .into_iter()
        .chain(protocol_codes())
        .chain(agent_codes())
        .collect();
    let docs = all_docs();
    none(
        "error codes the docs give that the code does not have",
        unknown_codes(&docs, &known),
    );
    let protocol = docs::read("docs/protocol.md");
    none(
        "protocol and agent codes docs/protocol.md does not name",
        protocol_codes()
            .into_iter()
            .chain(agent_codes())
            .filter(|c| !protocol.contains(&format!("`{c}`")))
            .collect(),
    );
}

#[test]
fn an_error_code_no_answer_has_is_found() {
    let known: BTreeSet<String> = ["busy", "nats_error", "host_not_found"]
        .iter()
        .map(|c| c.to_string())
        .collect();
    let good = doc(
        "good.md",
        "503 `busy`, `nats_error`; 404 `host_not_found` (per-host).\n\
         | status | code |\n|---|---|\n| 503 | `busy` |\n",
    );
    assert_eq!(unknown_codes(&[good], &known), Vec::<String>::new());
    let planted = doc(
        "bad.md",
        "503 `busy` or `nats_eror`\n\n| code | when |\n|---|---|\n| `host_not_fund` | x |\n\
         \n```json\n{\"error\":{\"code\":\"bussy\"}}\n```\n",
    );
    assert_eq!(
        unknown_codes(&[planted], &known),
        [
            "bad.md:1: nats_eror",
            "bad.md:8: bussy",
            "bad.md:5: host_not_fund"
        ]
    );
}

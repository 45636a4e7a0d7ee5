//! Every entry of every `--help` of the binaries an operator runs — each verb, option
//! and argument, at every level — says what it is.

use capstan_tests::docs::{self, Help};

/// The binaries an operator or a developer runs.
const BINARIES: [&str; 5] = [
    "capstan",
    "capstan-agent",
    "capstan-coordinator",
    "capstan-sim-driver",
    "capstan-bench",
];

/// The entries of `help` without a description, as `ARGS… ENTRY`.
fn bare(args: &[&str], help: &Help) -> Vec<String> {
    help.verbs
        .iter()
        .chain(help.entries.iter().map(|(name, (_, d))| (name, d)))
        .filter(|(_, description)| description.is_empty())
        .map(|(name, _)| format!("{} {name}", args.join(" ")))
        .collect()
}

#[test]
fn every_help_entry_has_a_description() {
    let mut missing = vec![];
    let mut asked = 0;
    for binary in BINARIES {
        let mut todo = vec![vec![binary.to_string()]];
        while let Some(args) = todo.pop() {
            let rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
            let help = docs::help(binary, &rest);
            asked += 1;
            let names: Vec<&str> = args.iter().map(String::as_str).collect();
            missing.extend(bare(&names, &help));
            for verb in help.verbs.keys().filter(|v| *v != "help") {
                let mut sub = args.clone();
                sub.push(verb.clone());
                todo.push(sub);
            }
        }
    }
    assert!(asked > 20, "only {asked} helps read");
    assert!(
        missing.is_empty(),
        "--help entries without a description:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn an_entry_without_a_description_is_found() {
    let help = docs::parse_help(
        "Usage: capstan wait [OPTIONS] <ID>\n\nArguments:\n  <ID>  \n\nOptions:\n      \
         --coordinator <URL>  The coordinator's base URL\n      --timeout <TIMEOUT>  [default: 30s]\n  \
         -h, --help  Print help\n",
    );
    assert_eq!(
        bare(&["capstan", "wait"], &help),
        ["capstan wait --timeout", "capstan wait <ID>"]
    );
}

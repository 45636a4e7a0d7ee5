//! The documentation against the code: the README's quickstart run as written
//! (`quickstart`), and the names the docs use — paths, config keys, verbs, error
//! codes, API routes, `--help` entries — checked both ways against what the binaries
//! and the code say (`names`, `api`, `help`). Harness: `capstan_tests::docs`.

mod api;
mod help;
mod names;
mod quickstart;

//! Harness for capstan's end-to-end tests: find the built binaries, give each test its
//! own data dir, run the agent CLI and read what it says.

pub mod agent;
pub mod docker;
pub mod hooks;
pub mod nats;

use std::path::PathBuf;

/// The directory holding the workspace's built binaries (`target/<profile>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(|p| p.parent())
        .expect("target dir")
        .to_path_buf()
}

/// The path of workspace binary `name`, which must have been built
/// (`cargo build --workspace --bins`; `.ci/run` does it).
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (the README's test command does)",
        path.display()
    );
    path
}

/// A small deterministic PRNG (xorshift64*), seeded per test and printed so that a
/// failing run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn from_env_or_time(name: &str) -> Rng {
        let seed = std::env::var("CAPSTAN_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos() as u64
            });
        eprintln!("{name}: seed {seed} (set CAPSTAN_TEST_SEED={seed} to repeat)");
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

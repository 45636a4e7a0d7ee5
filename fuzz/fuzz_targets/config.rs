//! The agent's config file (`AgentConfig::from_toml`: TOML, unknown keys refused, hook
//! owners and limits checked): whatever the file holds, a config or an error naming
//! the problem, never a panic.
#![no_main]

use capstan_agent::config::AgentConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = AgentConfig::from_toml(text, "fuzz.toml".into());
});

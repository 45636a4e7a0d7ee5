//! What the measurements that boot hosts need from this machine.

/// Why a measurement needing root (`why_root` says what for) and `tools` on `PATH`
/// cannot run here, if it cannot.
pub fn root_and_tools(why_root: &str, tools: &[&str]) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1));
    if euid != Some("0") {
        return Some(format!("needs root ({why_root})"));
    }
    self::tools(tools)
}

/// Why `tools` cannot run here (the first one not on `PATH`), if they cannot.
pub fn tools(tools: &[&str]) -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    tools
        .iter()
        .find(|tool| !std::env::split_paths(&path).any(|dir| dir.join(tool).exists()))
        .map(|tool| format!("`{tool}` is not on PATH"))
}

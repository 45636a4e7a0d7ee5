//! The shipped capstan-agent package (`packaging/deb/build.sh`, from this build's
//! binaries) on a fleet host: `dpkg -i` over SSH enables its unit, and with an
//! agent.toml written the way an operator would, `systemctl start capstan-agent`
//! returns once the agent said it was ready (`Type=notify`).

use super::ssh_ok;
use capstan_tests::build_packages;
use capstan_tests::fleet::Fleet;

#[test]
fn the_agent_package_installs_and_its_unit_becomes_ready_on_a_fleet_host() {
    let debs = tempfile::tempdir().expect("a temp dir");
    let deb = build_packages(debs.path()).remove(0);
    assert!(
        deb.to_string_lossy().contains("capstan-agent_"),
        "{}",
        deb.display()
    );
    let fleet = Fleet::create();
    let host = fleet.boot("agent-1");
    std::fs::copy(&deb, host.path("/root/capstan-agent.deb")).expect("copy the package in");

    ssh_ok(&host, &["dpkg", "-i", "/root/capstan-agent.deb"]);
    assert_eq!(
        host.property("capstan-agent.service", "UnitFileState"),
        "enabled"
    );
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "inactive"
    );
    // The operator's config: the sim driver, no NATS, this host's name.
    let config = format!("host = \"{}\"\ndriver = \"sim\"\n", host.name());
    std::fs::write(host.path("/etc/capstan/agent.toml"), config).expect("write agent.toml");

    ssh_ok(&host, &["systemctl", "start", "capstan-agent"]);
    assert_eq!(
        host.property("capstan-agent.service", "ActiveState"),
        "active"
    );
    assert_eq!(host.property("capstan-agent.service", "Type"), "notify");
    let status = host.property("capstan-agent.service", "StatusText");
    assert!(
        status.starts_with(&format!("ready: host {}", host.name())),
        "{status}"
    );
    ssh_ok(&host, &["systemctl", "stop", "capstan-agent"]);
    assert_eq!(host.property("capstan-agent.service", "Result"), "success");
    let journal = host.journal(&["--unit", "capstan-agent.service", "--output", "cat"]);
    assert!(journal.contains("capstan-agent ready"), "{journal}");
    host.kill();
}

//! The docker driver, called directly, keeps the driver contract
//! (`capstan_driver::testkit`) on each engine, the launch environment included: the
//! kit reads each container's `Config.Env` (what the engine gives the process).

use capstan_docker::{naming, DockerConfig, DockerDriver};
use capstan_driver::testkit::{EnvProbe, Kit};
use capstan_driver::RevisionRef;
use capstan_tests::docker::{remove_host, serve, Engine};
use std::collections::BTreeMap;

capstan_tests::each_engine!(the_driver_keeps_the_contract);

/// The env of a revision's container on `engine`, found by the driver's labels for
/// `host` (as the driver finds it: the name may be hash-shortened).
struct ContainerEnv {
    engine: Engine,
    host: String,
}

#[async_trait::async_trait]
impl EnvProbe for ContainerEnv {
    async fn env(&self, rev: RevisionRef<'_>) -> Result<BTreeMap<String, String>, String> {
        let labels = [
            (naming::HOST, &*self.host),
            (naming::NAMESPACE, rev.namespace),
            (naming::WORKLOAD, rev.workload),
            (naming::REVISION, rev.revision),
        ];
        let mut ps = vec!["ps".to_string(), "-aq".into(), "--no-trunc".into()];
        for (k, v) in labels {
            ps.extend(["--filter".into(), format!("label={k}={v}")]);
        }
        let ps: Vec<&str> = ps.iter().map(String::as_str).collect();
        let ids = self.engine.docker(&ps);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        let [id] = ids[..] else {
            return Err(format!("containers of {rev}: {ids:?}, expected one"));
        };
        let c = self.engine.inspect(id);
        // The engine filtered; checked again here (the driver does too).
        for (k, v) in labels {
            if c["Config"]["Labels"][k].as_str() != Some(v) {
                return Err(format!("container {id} is not {rev}'s: label {k}"));
            }
        }
        let env = c["Config"]["Env"]
            .as_array()
            .ok_or_else(|| format!("container {id} has no Config.Env: {}", c["Config"]))?;
        env.iter()
            .map(|e| {
                let e = e.as_str().ok_or_else(|| format!("an env entry {e}"))?;
                let (k, v) = e
                    .split_once('=')
                    .ok_or_else(|| format!("an env entry without '=': {e:?}"))?;
                Ok((k.to_string(), v.to_string()))
            })
            .collect()
    }
}

/// Removes what the kit may have left on the engine when the test fails.
struct Cleanup(Engine, String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        remove_host(self.0, &self.1);
    }
}

fn the_driver_keeps_the_contract(engine: Engine) {
    // The host name is the kit's namespace too: tests sharing the engine never meet.
    let host = capstan_tests::unique(&format!("kit-{}", engine.name()));
    let _cleanup = Cleanup(engine, host.clone());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let config = DockerConfig {
        socket: engine.socket(),
        ..Default::default()
    };
    let driver = rt
        .block_on(DockerDriver::connect(&host, config))
        .unwrap_or_else(|e| panic!("connect to {}: {}", engine.name(), e.report()));
    // A busybox that runs until stopped, with env `REV` (a name the launch env shares).
    let spec = serde_json::from_value(serve("r1").into()).expect("the harness's spec");
    let probe = ContainerEnv {
        engine,
        host: host.clone(),
    };
    rt.block_on(Kit::new(&driver, &host, spec).with_env_probe(&probe).run())
        .unwrap_or_else(|e| {
            panic!(
                "{} on {host}: {}",
                engine.name(),
                capstan_common::report(&e)
            )
        });
    let left = engine.docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label={}={host}", naming::HOST),
    ]);
    assert_eq!(left.trim(), "", "the kit leaves no container");
}

//! A real Kubernetes control plane per test ([`KubeCluster`]): etcd, kube-apiserver
//! (RBAC on, TLS, its own certificates) and kube-controller-manager, the binaries of
//! `.ci/kube.sh` in `$CAPSTAN_KUBE_BIN_DIR`, each on free loopback ports with its data in
//! the test's temp dir; and a node stand-in ([`node`]) that plays the kubelet for the
//! pods the controllers create. An admin kubeconfig, and kubeconfigs for a
//! ServiceAccount bound to a given ClusterRole ([`KubeCluster::kubeconfig_for`]).

pub mod node;

use crate::process::{Exit, Process};
use crate::{wait_until, READY};
use capstan_testsupport::free_port;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The dir holding `etcd`, `kube-apiserver` and `kube-controller-manager`:
/// `$CAPSTAN_KUBE_BIN_DIR` (`scripts/test.sh` sets it from `.ci/kube.sh`).
pub fn bin_dir() -> PathBuf {
    let dir = std::env::var_os("CAPSTAN_KUBE_BIN_DIR").unwrap_or_else(|| {
        panic!(
            "CAPSTAN_KUBE_BIN_DIR is not set: run `eval \"$(.ci/kube.sh)\"` first \
             (it builds etcd, kube-apiserver and kube-controller-manager once and caches them)"
        )
    });
    PathBuf::from(dir)
}

/// The field manager the harness writes with (never `capstan`, the driver's).
pub const MANAGER: &str = "capstan-test";

/// etcd, kube-apiserver and kube-controller-manager, started for one test, and the
/// node stand-in. Every process is stopped by its pid: [`KubeCluster::stop`] asserts
/// how each ended; dropping the cluster SIGKILLs what still runs.
pub struct KubeCluster {
    dir: tempfile::TempDir,
    /// The apiserver's secure port (`https://127.0.0.1:<port>`).
    pub port: u16,
    etcd_port: u16,
    etcd_peer_port: u16,
    token: String,
    etcd: Option<Process>,
    apiserver: Option<Process>,
    controllers: Option<Process>,
    runs: u32,
    rt: tokio::runtime::Runtime,
    node: Option<tokio::task::JoinHandle<()>>,
    /// How long the last apiserver start took, from spawn to `/readyz` answering ok.
    pub apiserver_ready_in: Duration,
}

impl KubeCluster {
    /// Certificates, etcd, the apiserver (waited on until `/readyz` is ok), the
    /// controller-manager (waited on until it has made the `default` ServiceAccount)
    /// and the node stand-in.
    pub fn start() -> KubeCluster {
        crate::watchdog::watch();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut cluster = KubeCluster {
            dir: tempfile::tempdir().expect("kube dir"),
            port: free_port(),
            etcd_port: free_port(),
            etcd_peer_port: free_port(),
            token: token(),
            etcd: None,
            apiserver: None,
            controllers: None,
            runs: 0,
            rt,
            node: None,
            apiserver_ready_in: Duration::ZERO,
        };
        cluster.certificates();
        cluster.write_kubeconfig(&cluster.admin_kubeconfig(), &cluster.token.clone());
        cluster.start_etcd();
        cluster.start_apiserver();
        cluster.start_controllers();
        let client = cluster.client();
        cluster.node = Some(cluster.rt.spawn(node::run(client)));
        cluster
    }

    /// The apiserver's URL.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA certificate the apiserver's serving certificate is signed by.
    pub fn ca_cert(&self) -> PathBuf {
        self.pki().join("ca.crt")
    }

    /// A kubeconfig for `admin` (group `system:masters`: cluster-admin under RBAC).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// The cluster's own runtime (the node stand-in runs on it): for tests to call the
    /// API on with [`KubeCluster::block_on`] and clients made by [`KubeCluster::client`].
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Runs `f` on the cluster's runtime in the background (e.g. a command that must
    /// be in flight while the test restarts the apiserver).
    pub fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.rt.spawn(f)
    }

    /// An admin client, bound to the cluster's runtime.
    pub fn client(&self) -> Client {
        self.client_for(&self.admin_kubeconfig())
    }

    /// A client from `kubeconfig`, bound to the cluster's runtime.
    pub fn client_for(&self, kubeconfig: &Path) -> Client {
        let config = self.rt.block_on(config_from(kubeconfig));
        let _entered = self.rt.enter();
        Client::try_from(config).expect("a kube client")
    }

    /// A kubeconfig for ServiceAccount `name` (in namespace `capstan-test-auth`) bound
    /// to ClusterRole `cluster_role` by a ClusterRoleBinding `name` (made or replaced),
    /// with a token from the TokenRequest API (one hour).
    pub fn kubeconfig_for(&self, name: &str, cluster_role: &str) -> PathBuf {
        const NS: &str = "capstan-test-auth";
        let client = self.client();
        let token = self.block_on(async {
            let pp = PatchParams::apply(MANAGER).force();
            let ns: Api<Namespace> = Api::all(client.clone());
            ns.patch(NS, &pp, &Patch::Apply(named::<Namespace>(NS, None)))
                .await
                .expect("apply the auth namespace");
            let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
            sas.patch(
                name,
                &pp,
                &Patch::Apply(named::<ServiceAccount>(name, Some(NS))),
            )
            .await
            .expect("apply the service account");
            let binding = ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: cluster_role.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.into(),
                    namespace: Some(NS.into()),
                    ..Default::default()
                }]),
            };
            let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
            let mut binding = serde_json::to_value(&binding).expect("binding JSON");
            binding["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
            binding["kind"] = "ClusterRoleBinding".into();
            bindings
                .patch(name, &pp, &Patch::Apply(binding))
                .await
                .expect("apply the cluster role binding");
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![],
                    expiration_seconds: Some(3600),
                    ..Default::default()
                },
                ..Default::default()
            };
            sas.create_token_request(name, &PostParams::default(), &request)
                .await
                .expect("a service account token")
                .status
                .expect("a token request's status")
                .token
        });
        let path = self.dir.path().join(format!("{name}.kubeconfig"));
        self.write_kubeconfig(&path, &token);
        path
    }

    /// The agent's ClusterRole as shipped (`packaging/kube/clusterrole.yaml`), applied
    /// as `role` with `without` (resource, verb) pairs taken out of its rules; returns a
    /// kubeconfig for a ServiceAccount `role` bound to it (see `kubeconfig_for`).
    pub fn agent_kubeconfig(&self, role: &str, without: &[(&str, &str)]) -> PathBuf {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kube/clusterrole.yaml");
        let text = std::fs::read_to_string(&path).expect("read the shipped ClusterRole");
        let mut cluster_role: serde_json::Value =
            serde_saphyr::from_str(&text).expect("the shipped ClusterRole is YAML");
        cluster_role["metadata"]["name"] = role.into();
        for rule in cluster_role["rules"].as_array_mut().expect("rules") {
            let names = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            };
            let resources = names("resources");
            let verbs: Vec<String> = names("verbs")
                .into_iter()
                .filter(|verb| {
                    !without
                        .iter()
                        .any(|(r, v)| v == verb && resources.iter().any(|x| x == r))
                })
                .collect();
            rule["verbs"] = verbs.into();
        }
        let client = self.client();
        self.block_on(async {
            let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client);
            roles
                .patch(
                    role,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&cluster_role),
                )
                .await
                .expect("apply the agent's ClusterRole");
        });
        self.kubeconfig_for(role, role)
    }

    /// Stops the apiserver (SIGTERM, asserting exit 0), keeping etcd and its data.
    #[track_caller]
    pub fn stop_apiserver(&mut self) {
        let apiserver = self.apiserver.take().expect("the apiserver runs");
        apiserver.stop();
    }

    /// Starts the apiserver again on the same port and etcd; waits for `/readyz`.
    pub fn restart_apiserver(&mut self) {
        assert!(self.apiserver.is_none(), "stop_apiserver() first");
        self.start_apiserver();
    }

    /// Stops everything, each by its pid with SIGTERM, asserting how each ended: the
    /// node stand-in, the controller-manager, the apiserver, then etcd.
    #[track_caller]
    pub fn stop(mut self) {
        if let Some(node) = self.node.take() {
            node.abort();
        }
        // kube-controller-manager does not handle SIGTERM (Go's default: the signal
        // ends it); etcd cleans up and then re-raises it, so it ends by it too; the
        // apiserver shuts down gracefully and exits 0.
        let sigterm = Exit::Signal(libc::SIGTERM);
        for (process, want) in [
            (self.controllers.take(), sigterm),
            (self.apiserver.take(), Exit::OK),
            (self.etcd.take(), sigterm),
        ] {
            if let Some(process) = process {
                process.stop_expecting(want);
            }
        }
    }

    fn pki(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    /// A CA, the apiserver's serving certificate (127.0.0.1, localhost) and the
    /// ServiceAccount signing key, made with openssl for this cluster only.
    fn certificates(&self) {
        let pki = self.pki();
        std::fs::create_dir_all(&pki).expect("pki dir");
        std::fs::write(
            pki.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .expect("san.ext");
        for args in [
            "genrsa -out sa.key 2048",
            "rsa -in sa.key -pubout -out sa.pub",
            "req -x509 -newkey rsa:2048 -nodes -days 2 -keyout ca.key -out ca.crt -subj /CN=capstan-test-ca",
            "req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=kube-apiserver",
            "x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out tls.crt",
        ] {
            let out = Command::new("openssl")
                .args(args.split(' '))
                .current_dir(&pki)
                .stdin(Stdio::null())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(
            pki.join("tokens.csv"),
            format!("{},admin,admin,system:masters\n", self.token),
        )
        .expect("tokens.csv");
    }

    fn write_kubeconfig(&self, path: &Path, token: &str) {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url(),
                "certificate-authority": self.ca_cert(),
            }}],
            "users": [{"name": "test", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        });
        // JSON is YAML: kubectl and kube-rs read it as a kubeconfig.
        std::fs::write(path, config.to_string()).expect("write a kubeconfig");
    }

    fn start_etcd(&mut self) {
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let mut c = Command::new(bin_dir().join("etcd"));
        c.arg("--name=default")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("etcd").display()
            ))
            .arg(format!("--listen-client-urls={}", url(self.etcd_port)))
            .arg(format!("--advertise-client-urls={}", url(self.etcd_port)))
            .arg(format!("--listen-peer-urls={}", url(self.etcd_peer_port)))
            .arg(format!(
                "--initial-advertise-peer-urls={}",
                url(self.etcd_peer_port)
            ))
            .arg(format!(
                "--initial-cluster=default={}",
                url(self.etcd_peer_port)
            ))
            // Throwaway data: no fsync, so a loaded disk does not slow the tests down.
            .arg("--unsafe-no-fsync")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let process = Process::spawn(
            format!("etcd (port {})", self.etcd_port),
            c,
            &self.dir.path().join("etcd.log"),
        );
        process.wait_for_text("ready to serve client requests");
        self.etcd = Some(process);
    }

    fn start_apiserver(&mut self) {
        self.runs += 1;
        let pki = self.pki();
        let file = |name: &str| pki.join(name).display().to_string();
        let mut c = Command::new(bin_dir().join("kube-apiserver"));
        c.arg(format!(
            "--etcd-servers=http://127.0.0.1:{}",
            self.etcd_port
        ))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={}", self.port))
        // The loopback endpoint of the `kubernetes` Service would be refused.
        .arg("--endpoint-reconciler-type=none")
        .arg(format!("--tls-cert-file={}", file("tls.crt")))
        .arg(format!("--tls-private-key-file={}", file("tls.key")))
        .arg(format!("--cert-dir={}", file("generated")))
        .arg(format!("--client-ca-file={}", file("ca.crt")))
        .arg(format!("--token-auth-file={}", file("tokens.csv")))
        .arg("--authorization-mode=RBAC")
        .arg(format!("--service-account-key-file={}", file("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            file("sa.key")
        ))
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg("--service-cluster-ip-range=10.96.0.0/16")
        // Also its shutdown timeout: a SIGTERM waits up to this long for the
        // controllers' and the stand-in's connections (60 s by default).
        .arg("--request-timeout=10s")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        let t0 = Instant::now();
        let process = Process::spawn(
            format!("kube-apiserver (port {}, run {})", self.port, self.runs),
            c,
            &self.dir.path().join(format!("apiserver-{}.log", self.runs)),
        );
        let client = self.client();
        let readyz = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("request");
        wait_until(
            format_args!("kube-apiserver on port {} to be ready", self.port),
            READY,
            || {
                if let Some(exit) = process.exited() {
                    panic!(
                        "kube-apiserver ended ({exit}) before it was ready; its stderr:\n{}",
                        process.stderr()
                    );
                }
                self.rt.block_on(async {
                    tokio::time::timeout(
                        Duration::from_secs(2),
                        client.request_text(readyz.clone()),
                    )
                    .await
                    .is_ok_and(|r| r.is_ok_and(|body| body.trim() == "ok"))
                })
            },
        );
        self.apiserver_ready_in = t0.elapsed();
        eprintln!(
            "kube-apiserver (port {}, run {}) ready in {} ms",
            self.port,
            self.runs,
            self.apiserver_ready_in.as_millis()
        );
        self.apiserver = Some(process);
    }

    fn start_controllers(&mut self) {
        let pki = self.pki();
        let mut c = Command::new(bin_dir().join("kube-controller-manager"));
        c.arg(format!(
            "--kubeconfig={}",
            self.admin_kubeconfig().display()
        ))
        .args([
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port=0",
        ])
        .arg(format!(
            "--service-account-private-key-file={}",
            pki.join("sa.key").display()
        ))
        .arg(format!("--root-ca-file={}", pki.join("ca.crt").display()))
        .arg("--use-service-account-credentials=false")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        let process = Process::spawn(
            format!("kube-controller-manager (apiserver port {})", self.port),
            c,
            &self.dir.path().join("controller-manager.log"),
        );
        // Running controllers: the ServiceAccount controller has made `default`.
        let client = self.client();
        let sas: Api<ServiceAccount> = Api::namespaced(client, "default");
        wait_until(
            "kube-controller-manager to make the default ServiceAccount",
            READY,
            || {
                if let Some(exit) = process.exited() {
                    panic!(
                        "kube-controller-manager ended ({exit}); its stderr:\n{}",
                        process.stderr()
                    );
                }
                self.rt
                    .block_on(sas.get_opt("default"))
                    .is_ok_and(|sa| sa.is_some())
            },
        );
        self.controllers = Some(process);
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            node.abort();
        }
        // The processes' own drops SIGKILL them: controllers first, etcd last.
        drop(self.controllers.take());
        drop(self.apiserver.take());
        drop(self.etcd.take());
    }
}

/// A kube-rs config read from `kubeconfig`.
pub async fn config_from(kubeconfig: &Path) -> Config {
    let file = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .expect("a config from the kubeconfig")
}

/// A bare object named `name` for server-side apply.
fn named<K: kube::Resource<DynamicType = ()>>(
    name: &str,
    namespace: Option<&str>,
) -> serde_json::Value {
    let mut object = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name},
    });
    if let Some(namespace) = namespace {
        object["metadata"]["namespace"] = namespace.into();
    }
    object
}

/// A bearer token for the admin user, unique per cluster.
fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    format!("capstan-{:x}-{nanos:x}", std::process::id())
}

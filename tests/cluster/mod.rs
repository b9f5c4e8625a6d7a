//! A real single-node Kubernetes cluster for end-to-end tests, started on demand as children of
//! the test binary: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (its
//! own root, state and socket), a kubelet registered as node `cfp-node`, and kube-proxy.
//!
//! Networking stays on this machine: a bridge (`cfp-e2e0`, 10.213.0.1/24) that the pods' network
//! namespaces attach to through the CNI bridge plugin; the API server, and whatever the tests serve
//! to pods (the emulator, handler receivers), listen on the bridge address. Packets from pods to
//! any address outside 10.213.0.0/16 (pods and service IPs) are dropped.
//!
//! Needs root and the Debian packages of `tools/k8s/node-packages.sh`. Images come from OCI
//! archives (the pause image of `tools/k8s/pause-image.sh`, the `cfp` image of
//! `tools/image/build.sh`, the handler sidecar image of `tools/k8s/handler-image.sh`) imported into
//! containerd; no registry is reached. [`Cluster::stop`] (also on drop) kills everything and
//! removes what the cluster left (mounts, cgroups, the bridge, iptables rules); a start first
//! removes what a killed earlier run left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::free_port;
use crate::control_plane::{ControlPlane, apiserver_args_with, binaries, kubeconfig, pki, spawn, start_etcd};

/// The bridge the pods attach to.
pub const BRIDGE: &str = "cfp-e2e0";
/// The host's address on the bridge: the API server and the test's servers listen here.
pub const HOST_IP: &str = "10.213.0.1";
/// The pods' subnet.
pub const POD_SUBNET: &str = "10.213.0.0/24";
/// Service cluster IPs.
pub const SERVICE_SUBNET: &str = "10.213.128.0/24";
/// What pods may reach: pods and service IPs.
const ALLOWED: &str = "10.213.0.0/16";
/// The node's name.
pub const NODE: &str = "cfp-node";
/// The cgroup parent of every pod.
const CGROUP_ROOT: &str = "cfp-e2e";
/// The cfp image as the cluster knows it.
pub const CFP_IMAGE: &str = "cfp.local/cfp:0.1.0";
const PAUSE_IMAGE: &str = "cfp.local/pause:3.10";
/// A naive HTTP handler for sidecars (`tools/k8s/handler.c`): on `PORT` (8080) it records each
/// POSTed body as a file in `RECORD_DIR` (`/records`), answers 200 only `DELAY_MS` (1500) later,
/// and exits at once on SIGTERM.
pub const HANDLER_IMAGE: &str = "cfp.local/handler:1";

/// A running cluster.
pub struct Cluster {
    /// kubectl/helm access (admin).
    pub plane: ControlPlane,
    /// The cluster's directory (logs, state).
    pub dir: PathBuf,
    children: Vec<Child>,
    stopped: bool,
}

fn dir() -> PathBuf {
    std::env::temp_dir().join("cfp-e2e-cluster")
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Why this machine cannot run the cluster, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the end-to-end cluster needs root (network namespaces, cgroups, mounts)".into());
    }
    for tool in ["containerd", "runc", "iptables", "conntrack", "umoci", "gcc", "ctr"] {
        if run("sh", &["-c", &format!("command -v {tool}")]).is_err() {
            return Some(format!("{tool} is missing: run tools/k8s/node-packages.sh"));
        }
    }
    if !Path::new("/usr/lib/cni/bridge").exists() {
        return Some("the CNI plugins are missing: run tools/k8s/node-packages.sh".into());
    }
    None
}

impl Cluster {
    /// Starts the cluster with the `cfp` binary `cfp` as image [`CFP_IMAGE`]; returns when the node
    /// is Ready.
    pub fn start(cfp: &Path) -> Result<Cluster, String> {
        let started = Instant::now();
        clean_up(&dir());
        let bin = binaries()?;
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let pause = run("bash", &[&root.join("tools/k8s/pause-image.sh").display().to_string()])?;
        let handler = run(
            "bash",
            &[&root.join("tools/k8s/handler-image.sh").display().to_string()],
        )?;
        let dir = dir();
        std::fs::create_dir_all(dir.join("cni/net.d")).map_err(|e| e.to_string())?;
        let cfp_image = dir.join("cfp.oci.tar");
        run(
            "bash",
            &[
                &root.join("tools/image/build.sh").display().to_string(),
                "--binary",
                &cfp.display().to_string(),
                "--out",
                &cfp_image.display().to_string(),
            ],
        )?;
        network_up()?;

        let pki = pki(&[
            "localhost",
            "127.0.0.1",
            HOST_IP,
            "10.213.128.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ])
        .map_err(|e| e.to_string())?;
        let write = |name: &str, text: &str| -> Result<String, String> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            Ok(path.display().to_string())
        };
        let files = pki.write_to(&dir)?;
        let (ca, sa_key) = (files.ca.clone(), files.service_account_key.clone());
        let log = |name: &str| dir.join(format!("{name}.log"));
        let mut children = Vec::new();

        let (etcd, etcd_url) = start_etcd(bin, &dir)?;
        children.push(etcd);
        let api_port = free_port();
        let mut args = apiserver_args_with(&files, &etcd_url, HOST_IP, api_port, &dir, SERVICE_SUBNET);
        args.extend([
            format!("--kubelet-client-certificate={}", files.client_cert),
            format!("--kubelet-client-key={}", files.client_key),
            "--kubelet-preferred-address-types=InternalIP".into(),
        ]);
        let mut apiserver = spawn(&bin.join("kube-apiserver"), &args, &log("kube-apiserver"))?;
        let server = format!("https://{HOST_IP}:{api_port}");
        let kubeconfig_path = PathBuf::from(write("kubeconfig", &kubeconfig(&server, &pki))?);
        let plane = ControlPlane {
            kubeconfig: kubeconfig_path.clone(),
            bin: bin.to_path_buf(),
            server,
            startup: Duration::ZERO,
        };
        let ready = plane.wait_ready(&mut apiserver, &log("kube-apiserver"));
        children.push(apiserver);
        let mut cluster = Cluster {
            plane,
            dir: dir.clone(),
            children,
            stopped: false,
        };
        ready?;
        let kubeconfig_arg = format!("--kubeconfig={}", kubeconfig_path.display());

        cluster.children.push(spawn(
            &bin.join("kube-controller-manager"),
            &[
                kubeconfig_arg.clone(),
                format!("--service-account-private-key-file={sa_key}"),
                format!("--root-ca-file={ca}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                "--secure-port=0".into(),
                "--controllers=*".into(),
            ],
            &log("kube-controller-manager"),
        )?);
        cluster.children.push(spawn(
            &bin.join("kube-scheduler"),
            &[
                kubeconfig_arg.clone(),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                "--secure-port=0".into(),
            ],
            &log("kube-scheduler"),
        )?);

        let socket = dir.join("containerd.sock");
        write("containerd.toml", &containerd_config(&dir))?;
        write("cni/net.d/10-cfp-e2e.conflist", &cni_config(&dir))?;
        cluster.children.push(spawn(
            Path::new("containerd"),
            &[format!("--config={}", dir.join("containerd.toml").display())],
            &log("containerd"),
        )?);
        wait_for("containerd's socket", Duration::from_secs(30), || socket.exists())?;
        let address = socket.display().to_string();
        for (archive, name) in [
            (pause.trim(), "cfp.local/pause"),
            (cfp_image.to_str().unwrap_or_default(), "cfp.local/cfp"),
            (handler.trim(), "cfp.local/handler"),
        ] {
            run(
                "ctr",
                &[
                    "-a",
                    &address,
                    "-n",
                    "k8s.io",
                    "images",
                    "import",
                    "--base-name",
                    name,
                    archive,
                ],
            )?;
        }

        for controller in [
            "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
        ] {
            let _ = std::fs::create_dir_all(Path::new("/sys/fs/cgroup").join(controller).join(CGROUP_ROOT));
        }
        write("kubelet.yaml", &kubelet_config(&dir, &ca, &address))?;
        cluster.children.push(spawn(
            &bin.join("kubelet"),
            &[
                kubeconfig_arg.clone(),
                format!("--config={}", dir.join("kubelet.yaml").display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--cert-dir={}", dir.join("kubelet-pki").display()),
                format!("--hostname-override={NODE}"),
                format!("--node-ip={HOST_IP}"),
            ],
            &log("kubelet"),
        )?);
        cluster.children.push(spawn(
            &bin.join("kube-proxy"),
            &[
                kubeconfig_arg,
                format!("--hostname-override={NODE}"),
                format!("--cluster-cidr={POD_SUBNET}"),
                "--proxy-mode=iptables".into(),
                "--conntrack-max-per-core=0".into(),
                format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
                format!("--healthz-bind-address=127.0.0.1:{}", free_port()),
                format!("--nodeport-addresses={HOST_IP}/32"),
            ],
            &log("kube-proxy"),
        )?);
        wait_for("node cfp-node Ready", Duration::from_secs(120), || {
            let (ok, out, _) = cluster.plane.kubectl_run(
                &[
                    "get",
                    "node",
                    NODE,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
                None,
            );
            ok && out.trim() == "True"
        })
        .map_err(|e| format!("{e}; kubelet log tail:\n{}", tail(&log("kubelet"), 20)))?;
        // The default service account exists before pods are admitted.
        wait_for("the default service account", Duration::from_secs(60), || {
            cluster
                .plane
                .kubectl_run(&["get", "serviceaccount", "default", "-n", "default"], None)
                .0
        })?;
        cluster.plane.startup = started.elapsed();
        eprintln!(
            "cluster ready at {} in {:.1?} (node {NODE}, pods on {POD_SUBNET})",
            cluster.plane.server, cluster.plane.startup
        );
        Ok(cluster)
    }

    /// Kills every process of the cluster and its pods, and removes what they left.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // The kubelet first, so that it restarts nothing; then the rest.
        for child in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            // Keep the components' and pods' logs of a failed run.
            let kept = std::env::temp_dir().join("cfp-e2e-cluster-logs");
            let _ = std::fs::remove_dir_all(&kept);
            let _ = run(
                "cp",
                &[
                    "-r",
                    &self.dir.join("pod-logs").display().to_string(),
                    &kept.display().to_string(),
                ],
            );
            if let Ok(entries) = std::fs::read_dir(&self.dir) {
                for entry in entries
                    .flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                {
                    let _ = std::fs::copy(entry.path(), kept.join(entry.file_name()));
                }
            }
            eprintln!("cluster logs kept in {}", kept.display());
        }
        clean_up(&self.dir);
    }

    /// The last `lines` lines of a component's log (for failure messages).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        tail(&self.dir.join(format!("{component}.log")), lines)
    }

    /// The host PIDs of the containers named `container` (from containerd's task list).
    pub fn container_pids(&self, container: &str) -> Vec<u32> {
        let address = self.dir.join("containerd.sock").display().to_string();
        let Ok(containers) = run("ctr", &["-a", &address, "-n", "k8s.io", "containers", "ls", "--quiet"]) else {
            return Vec::new();
        };
        // Running tasks: id → pid, listed once.
        let running: std::collections::HashMap<String, u32> =
            run("ctr", &["-a", &address, "-n", "k8s.io", "tasks", "ls"])
                .unwrap_or_default()
                .lines()
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    (fields.get(2) == Some(&"RUNNING")).then_some(())?;
                    Some((fields.first()?.to_string(), fields.get(1)?.parse().ok()?))
                })
                .collect();
        let mut pids = Vec::new();
        for id in containers.lines() {
            let Some(pid) = running.get(id) else { continue };
            let Ok(info) = run("ctr", &["-a", &address, "-n", "k8s.io", "containers", "info", id]) else {
                continue;
            };
            if info.contains(&format!("\"io.kubernetes.container.name\": \"{container}\"")) {
                pids.push(*pid);
            }
        }
        pids
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let last: Vec<&str> = text.lines().rev().take(lines).collect();
    last.into_iter().rev().collect::<Vec<_>>().join("\n")
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

/// The bridge with the host's address, and the rule that keeps pod traffic on this machine.
/// Where the host's `ip_forward` setting is kept while a cluster runs (the CNI bridge plugin turns
/// forwarding on; the cleanup puts it back).
fn saved_forwarding() -> PathBuf {
    std::env::temp_dir().join("cfp-e2e-cluster.ip_forward")
}

fn network_up() -> Result<(), String> {
    let forwarding = "/proc/sys/net/ipv4/ip_forward";
    if !saved_forwarding().exists() {
        let current = std::fs::read_to_string(forwarding).map_err(|e| e.to_string())?;
        std::fs::write(saved_forwarding(), current).map_err(|e| e.to_string())?;
    }
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run("ip", &["addr", "add", &format!("{HOST_IP}/24"), "dev", BRIDGE])?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    run("iptables", &confine_rule("-I"))?;
    Ok(())
}

/// Drops packets from the pods to anything but pods and service IPs (before kube-proxy's NAT).
fn confine_rule(action: &str) -> Vec<&str> {
    vec![
        "-t",
        "mangle",
        action,
        "PREROUTING",
        "-i",
        BRIDGE,
        "!",
        "-d",
        ALLOWED,
        "-m",
        "comment",
        "--comment",
        "cfp-e2e: pods reach only this machine",
        "-j",
        "DROP",
    ]
}

fn containerd_config(dir: &Path) -> String {
    let d = dir.display();
    // restrict_oom_score_adj: this VM withholds CAP_SYS_RESOURCE, so a container may not lower
    // its OOM score below the runtime's own (runc fails with "can't get final child's PID").
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/net.d"
"#
    )
}

fn cni_config(dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "cfp-e2e",
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": HOST_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": dir.join("cni/ipam").display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "loopback"},
        ],
    })
    .to_string()
}

fn kubelet_config(dir: &Path, ca: &str, containerd: &str) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP_ROOT}
failSwapOn: false
address: {HOST_IP}
port: {port}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
containerRuntimeEndpoint: unix://{containerd}
podLogsDir: {logs}
resolvConf: /etc/resolv.conf
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 10s
"#,
        port = free_port(),
        logs = dir.join("pod-logs").display(),
    )
}

/// Removes everything a cluster in `dir` may have left: its processes and its pods' processes,
/// mounts, cgroups, the bridge, iptables rules (kube-proxy's and ours), and the directory.
pub fn clean_up(dir: &Path) {
    let marker = dir.display().to_string();
    // Processes of the cluster (their command lines name its directory) and of its pods (in its
    // cgroups).
    let mut pids: Vec<i32> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&marker) || cgroup.contains(&format!(":/{CGROUP_ROOT}/")) {
                pids.push(pid);
            }
        }
    }
    for pid in pids {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    // Mounts under the directory, deepest first.
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_owned))
        .filter(|point| point.starts_with(&marker))
        .collect();
    mounts.sort_by_key(|point| std::cmp::Reverse(point.len()));
    for point in mounts {
        let _ = run("umount", &["-l", &point]);
    }
    // Pod cgroups, children first.
    for controller in [
        "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd",
    ] {
        let root = Path::new("/sys/fs/cgroup").join(controller).join(CGROUP_ROOT);
        remove_cgroup_tree(&root);
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
    while run("iptables", &confine_rule("-D")).is_ok() {}
    if let Ok(bin) = run(
        "bash",
        &[concat!(env!("CARGO_MANIFEST_DIR"), "/tools/k8s/build.sh"), "--print"],
    ) {
        let _ = run(&format!("{}/kube-proxy", bin.trim()), &["--cleanup"]);
    }
    if let Ok(saved) = std::fs::read_to_string(saved_forwarding()) {
        let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", saved.trim());
        let _ = std::fs::remove_file(saved_forwarding());
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn remove_cgroup_tree(path: &Path) {
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(path);
}

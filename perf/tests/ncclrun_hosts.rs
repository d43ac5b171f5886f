//! `ncclrun` across hosts: two network namespaces, `ncrun0` and `ncrun1`,
//! joined by a veth pair (10.79.0.1/24 and 10.79.0.2/24), stand in for two
//! hosts, and `--rsh "ip netns exec"` for ssh. Checked: each rank's
//! variables by `--map-by slot` and `node`, its namespace, directory and
//! CPU, a real 4-rank all-reduce with its data checked, and a rank that
//! exits 3 on one "host" taking the job down with status 3.
//!
//! Needs root (to make namespaces); otherwise each namespace test says why
//! and passes. (The last test, of ssh's quoting through a stand-in `ssh`,
//! needs neither.) The namespaces are made afresh for each test, one test at a
//! time, and always removed (a guard's `Drop`, also on a panic). Every
//! child runs under `timeout`.

use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One test at a time owns the namespaces.
static NETNS: Mutex<()> = Mutex::new(());

const NS: [&str; 2] = ["ncrun0", "ncrun1"];
const VETH: [&str; 2] = ["ncrunv0", "ncrunv1"];
const ADDR: [&str; 2] = ["10.79.0.1/24", "10.79.0.2/24"];
/// `MASTER_ADDR`: rank 0's end of the veth pair.
const MASTER: &str = "10.79.0.1";
/// ncclrun's grace (its `--help` says 5 s).
const GRACE: Duration = Duration::from_secs(5);
/// Slack for a busy machine on every time limit.
const SLACK: Duration = Duration::from_secs(30);

/// `cmd` under `timeout`: SIGTERM after `secs`, SIGKILL 5 s later.
fn timed(secs: u32, cmd: &str) -> Command {
    let mut c = Command::new("timeout");
    c.args(["-k", "5", &secs.to_string(), cmd]);
    c
}

/// Runs `ip args...`; its output.
fn ip(args: &[&str]) -> Output {
    timed(30, "ip").args(args).output().expect("running ip")
}

/// Runs `ip args...` and fails the test if it fails.
fn must(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes the namespaces and the veth pair (gone with its namespace, or
/// left in this one by a setup that stopped half way), ignoring what is
/// not there.
fn teardown() {
    for ns in NS {
        let _ = ip(&["netns", "del", ns]);
    }
    let _ = ip(&["link", "del", VETH[0]]);
}

/// The two namespaces, up while this lives.
struct Netns {
    _lock: MutexGuard<'static, ()>,
}

impl Netns {
    /// Makes the namespaces; `None` (having said why) where this process
    /// cannot.
    fn up() -> Option<Netns> {
        // SAFETY: geteuid only reads this process's credentials.
        if unsafe { libc::geteuid() } != 0 {
            println!("skipped: not root, cannot make network namespaces");
            return None;
        }
        let lock = NETNS.lock().unwrap_or_else(|e| e.into_inner());
        // Left by a run that was killed.
        teardown();
        let first = ip(&["netns", "add", NS[0]]);
        if !first.status.success() {
            println!(
                "skipped: cannot make a network namespace: {}",
                String::from_utf8_lossy(&first.stderr)
            );
            return None;
        }
        // From here on the guard removes whatever was made.
        let net = Netns { _lock: lock };
        must(&["netns", "add", NS[1]]);
        must(&[
            "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1],
        ]);
        for i in 0..2 {
            must(&["link", "set", VETH[i], "netns", NS[i]]);
            must(&["-n", NS[i], "addr", "add", ADDR[i], "dev", VETH[i]]);
            must(&["-n", NS[i], "link", "set", "lo", "up"]);
            must(&["-n", NS[i], "link", "set", VETH[i], "up"]);
        }
        Some(net)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        teardown();
    }
}

/// `ncclrun -H ncrun0:2,ncrun1:2 --rsh "ip netns exec" --master-addr
/// 10.79.0.1 args...` under `timeout`, with no `NCCL_*` variable of this
/// process's environment; its output and how long it took.
fn ncclrun(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let mut c = timed(120, env!("CARGO_BIN_EXE_ncclrun"));
    c.args(["-H", "ncrun0:2,ncrun1:2", "--rsh", "ip netns exec"])
        .args(["--master-addr", MASTER])
        .args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("NCCL_") {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    let t = Instant::now();
    let out = c.output().expect("starting ncclrun");
    (out, t.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A successful run's stdout lines, sorted (ranks print in any order).
fn sorted_lines(out: &Output) -> Vec<String> {
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{:?}\n{o}{e}", out.status);
    assert_eq!(e, "", "stderr");
    let mut lines: Vec<String> = o.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

const ECHO: &str = "echo $RANK $LOCAL_RANK $NODE_RANK $NCCL_HOSTID";

/// (a) `--map-by slot`, the default: ranks 0, 1 on ncrun0, 2, 3 on ncrun1.
#[test]
fn map_by_slot_variables() {
    let Some(_net) = Netns::up() else { return };
    let (out, _) = ncclrun(&["--tag-output", "--", "sh", "-c", ECHO], &[]);
    assert_eq!(
        sorted_lines(&out),
        [
            "[1,0]<stdout>:0 0 0 ncrun0",
            "[1,1]<stdout>:1 1 0 ncrun0",
            "[1,2]<stdout>:2 0 1 ncrun1",
            "[1,3]<stdout>:3 1 1 ncrun1",
        ]
    );
}

/// (b) `--map-by node`: ranks dealt round-robin, 0, 2 on ncrun0, 1, 3 on
/// ncrun1.
#[test]
fn map_by_node_variables() {
    let Some(_net) = Netns::up() else { return };
    let (out, _) = ncclrun(
        &["--map-by", "node", "--tag-output", "--", "sh", "-c", ECHO],
        &[],
    );
    assert_eq!(
        sorted_lines(&out),
        [
            "[1,0]<stdout>:0 0 0 ncrun0",
            "[1,1]<stdout>:1 0 1 ncrun1",
            "[1,2]<stdout>:2 1 0 ncrun0",
            "[1,3]<stdout>:3 1 1 ncrun1",
        ]
    );
}

/// Each rank runs in its host's namespace, in ncclrun's directory, with
/// the rest of its environment (`-x` words with spaces and quotes reach it
/// as they are; an `NCCL_HOSTID` of ncclrun's environment wins), bound by
/// LOCAL_RANK; its stderr is tagged onto ncclrun's stderr.
#[test]
fn ranks_run_in_their_namespace_and_directory() {
    let Some(_net) = Netns::up() else { return };
    let dir = std::env::current_dir().unwrap();
    let script = "echo $RANK $(ip netns identify) $WORLD_SIZE $LOCAL_WORLD_SIZE \
                  $MASTER_ADDR:$MASTER_PORT ${#NCCL_RS_JOB_SECRET} $NCCL_HOSTID $NCCL_DEBUG \"$X\" \
                  $(grep Cpus_allowed_list /proc/self/status | cut -f2) \"$PWD\"; \
                  echo to stderr >&2";
    let (out, _) = ncclrun(
        &[
            "--master-port",
            "29411",
            "--tag-output",
            "-x",
            "X=it's a \"test\" $HOME",
            "--",
            "sh",
            "-c",
            script,
        ],
        &[("NCCL_HOSTID", "rack7"), ("NCCL_DEBUG", "WARN")],
    );
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{o}{e}");
    let mut err: Vec<&str> = e.lines().collect();
    err.sort_unstable();
    assert_eq!(
        err,
        (0..4)
            .map(|r| format!("[1,{r}]<stderr>:to stderr"))
            .collect::<Vec<_>>()
    );
    let mut cpu_of_local = [None, None];
    let mut lines: Vec<&str> = o.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines.len(), 4, "{o}");
    for (rank, line) in lines.iter().enumerate() {
        let rest = line
            .strip_prefix(&format!("[1,{rank}]<stdout>:"))
            .unwrap_or_else(|| panic!("{line}"));
        let ns = NS[rank / 2];
        let head = format!("{rank} {ns} 4 2 {MASTER}:29411 32 rack7 WARN it's a \"test\" $HOME ");
        let cpus = rest
            .strip_prefix(&head)
            .unwrap_or_else(|| panic!("{rest:?} does not start with {head:?}"));
        let (cpu, pwd) = cpus.split_once(' ').unwrap();
        assert_eq!(pwd, dir.to_str().unwrap(), "{line}");
        assert!(cpu.parse::<usize>().is_ok(), "bound to {cpu:?}: {line}");
        // LOCAL_RANK is rank % 2: ranks 0 and 2 on one CPU, 1 and 3 on one.
        match cpu_of_local[rank % 2] {
            None => cpu_of_local[rank % 2] = Some(cpu.to_string()),
            Some(ref c) => assert_eq!(c, cpu, "rank {rank}"),
        }
    }
}

/// (c) A real 4-rank job across the namespaces, its data checked (`-c 1`):
/// ncclrun exits 0 and the table has no wrong element. Twice: as the
/// library sees the ranks (one kernel: until it honours NCCL_HOSTID, all
/// one host), and with shared memory off, so that the ranks of different
/// namespaces talk over the veth pair as they do between hosts.
#[test]
fn all_reduce_across_namespaces() {
    let Some(_net) = Netns::up() else { return };
    let ifname = format!("NCCL_SOCKET_IFNAME={},{}", VETH[0], VETH[1]);
    for extra in [&[][..], &["-x", "NCCL_SHM_DISABLE=1"]] {
        let mut args = vec!["--timeout", "100", "-x", &ifname];
        args.extend_from_slice(extra);
        args.push(env!("CARGO_BIN_EXE_all_reduce_perf"));
        args.extend(["-b", "8", "-e", "1M", "-f", "4", "-c", "1"]);
        let (out, took) = ncclrun(&args, &[("NCCL_RS_TIMEOUT", "60")]);
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{extra:?}: {:?}\n{o}{e}", out.status);
        assert!(
            o.contains("# Out of bounds values : 0 OK"),
            "{extra:?}:\n{o}{e}"
        );
        // Rows: size count type redop root, then time algbw busbw #wrong
        // out of place and in place.
        let rows: Vec<Vec<&str>> = o
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 9, "8 B to 512 KiB by 4:\n{o}");
        for r in &rows {
            assert_eq!(r.len(), 13, "{r:?}\n{o}");
            assert_eq!((r[8], r[12]), ("0", "0"), "wrong elements: {r:?}");
        }
        println!("{extra:?}: 4 ranks in {took:?}");
    }
}

/// (d) A rank that exits 3 on ncrun1 fails the job with status 3: the
/// other ranks (sleeping) are killed after the grace, through the agent,
/// and none is left in either namespace.
#[test]
fn remote_rank_failure_takes_the_job_down() {
    let Some(_net) = Netns::up() else { return };
    let script = "if [ $RANK = 3 ]; then exit 3; fi; exec sleep 100";
    let (out, took) = ncclrun(&["--", "sh", "-c", script], &[]);
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{e}");
    let verdict = e.lines().rev().find(|l| l.starts_with("ncclrun: job"));
    assert_eq!(
        verdict,
        Some("ncclrun: job failed: rank 3 exited with status 3; ranks 0, 1, 2 did not exit (killed by ncclrun)"),
        "{e}"
    );
    assert!(took < GRACE + SLACK, "took {took:?}");
    for ns in NS {
        let pids = ip(&["netns", "pids", ns]);
        assert_eq!(text(&pids.stdout), "", "processes left in {ns}");
    }
    // Without sleepers the failure ends the job at once (the time limit
    // only keeps a busy machine from failing the test).
    let (out, took) = ncclrun(
        &[
            "--map-by",
            "node",
            "--",
            "sh",
            "-c",
            "exit $((RANK == 3 ? 3 : 0))",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(took < SLACK, "took {took:?}");
}

/// An agent named `ssh` gets one shell command line, every word quoted:
/// a stand-in `ssh` (no root needed) joins its words after the host with
/// spaces and hands them to `sh -c`, as sshd hands them to the login
/// shell, and the rank still sees each word and value as given.
#[test]
fn ssh_agent_words_are_shell_quoted() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ncclrun-fake-ssh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ssh = dir.join("ssh");
    std::fs::write(
        &ssh,
        "#!/bin/sh\n# ssh HOST words...: like sshd, a shell runs the words joined by spaces\n\
         shift\nexec sh -c \"$*\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let weird = "a b'c \"d\" $HOME `x` ; *";
    let x = format!("Y={weird}");
    let mut c = timed(60, env!("CARGO_BIN_EXE_ncclrun"));
    c.args(["-H", "far1,far2", "--rsh"])
        .arg(&ssh)
        .args(["--tag-output", "--bind", "none", "-x", &x, "--"])
        .args([
            "sh",
            "-c",
            "printf '%s|' \"$Y\" \"$1\" $NCCL_HOSTID $RANK $MASTER_ADDR; pwd",
        ])
        .args(["sh", weird])
        .env_remove("NCCL_HOSTID");
    let out = c.output().unwrap();
    let (o, e) = (text(&out.stdout), text(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{o}{e}");
    let cwd = std::env::current_dir().unwrap();
    let cwd = cwd.to_str().unwrap();
    let mut lines: Vec<&str> = o.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            format!("[1,0]<stdout>:{weird}|{weird}|far1|0|far1|{cwd}"),
            format!("[1,1]<stdout>:{weird}|{weird}|far2|1|far1|{cwd}"),
        ],
        "{e}"
    );
}

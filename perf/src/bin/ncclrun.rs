//! `ncclrun -n N [--timeout SECS] [--] cmd args...`: starts N processes of
//! `cmd` on this machine as the ranks of one job, torchrun style.
//!
//! Each child gets `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR=127.0.0.1` and `MASTER_PORT` (a port that was free a moment
//! ago), and inherits stdout and stderr. Rank variables of other launchers
//! (Open MPI, PMI, Slurm) are removed so that they cannot win over ours.
//!
//! Exit status: 0 when every rank exits 0. When a rank fails (non-zero
//! exit or a signal), the others get 5 seconds to finish, are then killed,
//! and ncclrun exits with that rank's status (128 + signal for a signal).
//! `--timeout SECS` (0 = none, the default) kills all ranks and exits 124.
//! Ranks are killed too if ncclrun itself dies (`PR_SET_PDEATHSIG`).
//!
//! `--bind core` (the default) binds each rank to one of ncclrun's CPUs, or
//! neighbouring ranks to one CPU when there are more ranks than CPUs
//! (`nccl_perf::bind`); `--bind none` leaves them unbound.

use nccl_perf::bind::{self, Bind};
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

/// How long the other ranks may run on after one failed.
const GRACE: Duration = Duration::from_secs(5);
/// How often children are polled.
const POLL: Duration = Duration::from_millis(20);

/// Variables of other launchers that would make a child see another rank.
const FOREIGN: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NPROCS",
    "GROUP_RANK",
    "ROLE_RANK",
];

struct Opts {
    n: usize,
    timeout: Option<Duration>,
    bind: Bind,
    cmd: Vec<String>,
}

const USAGE: &str = "usage: ncclrun -n N [--timeout SECS] [--bind core|none] [--] cmd [args...]\n";

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Opts, String> {
    let mut n = None;
    let mut timeout = None;
    let mut bind = Bind::Core;
    let mut cmd = Vec::new();
    while let Some(a) = argv.next() {
        let mut value = |name: &str| argv.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "-n" | "-np" | "--nproc" | "--nproc-per-node" | "--nproc_per_node" => {
                let v = value(&a)?;
                n = Some(
                    v.parse::<usize>()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| format!("bad process count '{v}'"))?,
                );
            }
            "--timeout" => {
                let v = value(&a)?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| format!("bad timeout '{v}'"))?;
                timeout = (secs > 0.0).then(|| Duration::from_secs_f64(secs));
            }
            "--bind" => bind = Bind::parse(&value(&a)?)?,
            "-h" | "--help" => return Err(String::new()),
            "--" => {
                cmd.extend(argv);
                break;
            }
            s if s.starts_with('-') && cmd.is_empty() => {
                return Err(format!("unknown option '{s}'"))
            }
            _ => {
                cmd.push(a);
                cmd.extend(argv);
                break;
            }
        }
    }
    let n = n.ok_or("missing -n N")?;
    if cmd.is_empty() {
        return Err("missing command".into());
    }
    Ok(Opts {
        n,
        timeout,
        bind,
        cmd,
    })
}

/// A port that was free when we looked (the OS picks it for port 0).
fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The status as text and the exit code that ncclrun passes on.
fn describe(st: ExitStatus) -> (String, u8) {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = st.code() {
        (
            format!("exit status {code}"),
            u8::try_from(code).unwrap_or(1).max(1),
        )
    } else if let Some(sig) = st.signal() {
        (
            format!("killed by signal {sig}"),
            (128 + sig).clamp(1, 255) as u8,
        )
    } else {
        (format!("{st}"), 1)
    }
}

/// Makes the child get SIGKILL when ncclrun dies, even by SIGKILL, so that
/// no rank outlives its launcher.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, _exit); it allocates
    // nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Binds the child to `cpu` before it runs the command.
fn bind_to(cmd: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    let set = bind::single_cpu_set(cpu);
    // SAFETY: the closure runs in the forked child before exec and makes one
    // async-signal-safe system call on a set built before the fork; it
    // allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn kill_all(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill(); // SIGKILL; an already-exited child is not an error here
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}

fn main() -> ExitCode {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(msg) if msg.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprint!("ncclrun: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let port = match free_port() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ncclrun: cannot find a free port: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cpus = bind::allowed_cpus();
    let start = Instant::now();
    let mut running: Vec<(usize, Child)> = Vec::with_capacity(opts.n);
    for rank in 0..opts.n {
        let mut cmd = Command::new(&opts.cmd[0]);
        cmd.args(&opts.cmd[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", opts.n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", opts.n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        for v in FOREIGN {
            cmd.env_remove(v);
        }
        die_with_parent(&mut cmd);
        if let Some(cpu) = bind::cpu_for(opts.bind, rank, opts.n, &cpus) {
            bind_to(&mut cmd, cpu);
        }
        match cmd.spawn() {
            Ok(c) => running.push((rank, c)),
            Err(e) => {
                eprintln!("ncclrun: cannot start rank {rank} ({}): {e}", opts.cmd[0]);
                kill_all(&mut running);
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                return ExitCode::from(code);
            }
        }
    }

    // The first failure: (rank, description, exit code, when).
    let mut failed: Option<(usize, String, u8, Instant)> = None;
    loop {
        let mut i = 0;
        while i < running.len() {
            match running[i].1.try_wait() {
                Ok(Some(st)) => {
                    let (rank, _) = running.swap_remove(i);
                    if !st.success() && failed.is_none() {
                        let (what, code) = describe(st);
                        eprintln!("ncclrun: rank {rank} failed ({what}); stopping the other ranks");
                        failed = Some((rank, what, code, Instant::now()));
                    }
                }
                Ok(None) => i += 1,
                Err(e) => {
                    eprintln!("ncclrun: waiting for rank {}: {e}", running[i].0);
                    i += 1;
                }
            }
        }
        if running.is_empty() {
            break;
        }
        if let Some((_, _, _, at)) = &failed {
            if at.elapsed() >= GRACE {
                let left: Vec<String> = running.iter().map(|(r, _)| r.to_string()).collect();
                eprintln!(
                    "ncclrun: killing rank(s) {} after a {GRACE:?} grace",
                    left.join(", ")
                );
                kill_all(&mut running);
                break;
            }
        }
        if let Some(t) = opts.timeout {
            if start.elapsed() >= t {
                let left: Vec<String> = running.iter().map(|(r, _)| r.to_string()).collect();
                eprintln!(
                    "ncclrun: timeout after {t:?}; killing rank(s) {}",
                    left.join(", ")
                );
                kill_all(&mut running);
                return ExitCode::from(124);
            }
        }
        std::thread::sleep(POLL);
    }
    match failed {
        Some((rank, what, code, _)) => {
            eprintln!("ncclrun: job failed: rank {rank} {what}");
            ExitCode::from(code)
        }
        None => ExitCode::SUCCESS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Result<Opts, String> {
        parse(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn command_lines() {
        let o = p(&["-n", "4", "prog", "-b", "8"]).unwrap();
        assert_eq!(
            (o.n, o.timeout, o.cmd.join(" ")),
            (4, None, "prog -b 8".to_string())
        );
        let o = p(&["--timeout", "2.5", "-n", "2", "--", "-weird", "x"]).unwrap();
        assert_eq!(o.timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.cmd, vec!["-weird", "x"]);
        assert_eq!(
            p(&["-n", "2", "--timeout", "0", "a"]).unwrap().timeout,
            None
        );
        assert!(p(&["prog"]).is_err());
        assert!(p(&["-n", "0", "prog"]).is_err());
        assert!(p(&["-n", "2"]).is_err());
        assert!(p(&["-n", "2", "--bogus", "prog"]).is_err());
        assert_eq!(p(&["-n", "2", "a"]).unwrap().bind, Bind::Core);
        assert_eq!(
            p(&["--bind", "none", "-n", "2", "a"]).unwrap().bind,
            Bind::None
        );
        assert!(p(&["--bind", "numa", "-n", "2", "a"]).is_err());
        assert_eq!(p(&["-h"]).err(), Some(String::new()));
    }

    #[test]
    fn statuses() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(describe(ExitStatus::from_raw(3 << 8)).1, 3);
        assert_eq!(describe(ExitStatus::from_raw(9)).1, 137);
        assert!(free_port().unwrap() > 0);
    }
}

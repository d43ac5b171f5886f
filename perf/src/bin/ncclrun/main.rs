//! `ncclrun -n N [--timeout SECS] [--bind core|none] [--] cmd args...`:
//! starts N processes of `cmd` on this host as the ranks of one job,
//! torchrun style. `ncclrun --help` ([`help`]) says what each rank's
//! environment holds, how ranks are bound to CPUs, how a failed job is
//! stopped and blamed (module [`verdict`]), and the exit statuses.

mod verdict;

use nccl_perf::bind::{self, Bind};
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};
use verdict::{End, State};

/// How long the other ranks may run on after one failed.
const GRACE: Duration = Duration::from_secs(5);
/// How often children are polled.
const POLL: Duration = Duration::from_millis(20);
/// How long ncclrun waits for killed ranks to be reaped: SIGKILL ends even
/// a stopped process at once, but one in an uninterruptible sleep (a dead
/// network file system) lingers, and ncclrun must not hang on it.
const REAP: Duration = Duration::from_secs(10);
/// The address every rank is given as `MASTER_ADDR`.
const MASTER_ADDR: &str = "127.0.0.1";

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

/// The `--help` text: what ncclrun does to each rank and to the job. The
/// lists and numbers come from the constants the code uses, so they agree.
fn help() -> String {
    // The variables, wrapped at 78 columns and indented by 2.
    let mut foreign = String::from(" ");
    let mut line = 1;
    for v in FOREIGN {
        if line + 1 + v.len() > 78 {
            foreign.push_str("\n ");
            line = 1;
        }
        foreign.push(' ');
        foreign.push_str(v);
        line += 1 + v.len();
    }
    let grace = GRACE.as_secs();
    let reap = REAP.as_secs();
    let killed = 128 + libc::SIGKILL;
    format!(
        "ncclrun: runs N processes of a command on this machine as the ranks of one job\n\
         (torchrun style: the ranks find each other through MASTER_ADDR:MASTER_PORT).\n\
         \n\
         {USAGE}\
         \n\
         options:\n\
         \x20 -n, -np, --nproc, --nproc-per-node N\n\
         \x20                    the number of ranks (processes), at least 1\n\
         \x20 --timeout SECS     kill every rank and exit 124 after SECS seconds\n\
         \x20                    (fractions allowed; 0, the default: no limit)\n\
         \x20 --bind core|none   core (the default): bind each rank to one CPU of those\n\
         \x20                    ncclrun may run on (rank r of N gets CPU number r*C/N of\n\
         \x20                    the C allowed, so with more ranks than CPUs neighbouring\n\
         \x20                    ranks share one); none: leave the ranks unbound\n\
         \x20 -h, --help         this text\n\
         \n\
         each rank's environment: ncclrun's own, plus\n\
         \x20 RANK=r              the rank, 0 to N-1\n\
         \x20 WORLD_SIZE=N        the number of ranks\n\
         \x20 LOCAL_RANK=r        the same as RANK (every rank is on this machine)\n\
         \x20 LOCAL_WORLD_SIZE=N  the same as WORLD_SIZE\n\
         \x20 MASTER_ADDR={MASTER_ADDR}\n\
         \x20 MASTER_PORT=P       a port that was free when ncclrun started, the same for all\n\
         \x20 NCCL_RS_JOB_SECRET  32 random hex digits, the same for all (unless ncclrun's\n\
         \x20                    environment has one): only ranks that present it may join\n\
         and without these variables of other launchers (Open MPI, PMI, Slurm,\n\
         torchrun), so that they cannot win over RANK and WORLD_SIZE:\n\
         {foreign}\n\
         The ranks share ncclrun's stdin, stdout and stderr, and get SIGKILL if\n\
         ncclrun dies.\n\
         \n\
         when a rank fails (exits non-zero or is killed by a signal), the other\n\
         ranks get a grace of {grace} s to exit; then ncclrun kills (SIGKILL) those\n\
         still there, stopped ones too, and waits at most {reap} s for them to go.\n\
         The last line, \"ncclrun: job failed: rank R ...; ...\", names the culprit\n\
         and says how every other rank ended. The culprit is found by the first of\n\
         these rules that fits a rank (the rank that ended first, if several do):\n\
         \x20 1. a rank killed by a signal ncclrun did not send (a crash, the OOM killer);\n\
         \x20 2. a rank that was stopped (SIGSTOP, SIGTSTP, a debugger; state T or t in\n\
         \x20    /proc/PID/stat) when ncclrun killed it: its peers' timeouts are its doing;\n\
         \x20 3. the first rank to exit non-zero.\n\
         A rank that was still running when ncclrun killed it is not blamed: it is\n\
         usually waiting for the rank that failed.\n\
         \n\
         exit status:\n\
         \x20 0        every rank exited 0\n\
         \x20 1-255    the culprit's exit status, when it exited non-zero\n\
         \x20 128+S    the culprit was killed by signal S; {killed} (SIGKILL) for a rank\n\
         \x20          ncclrun killed (a stopped one)\n\
         \x20 124      --timeout ran out (the ranks left are killed, the culprit named)\n\
         \x20 2        a usage error (bad or missing option, no command)\n\
         \x20 126, 127 the command could not be started (127: not found)\n\
         \x20 1        ncclrun itself failed (no free port)\n"
    )
}

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

/// Kills the ranks still running and waits for them (at most [`REAP`]),
/// adding how each ended to `ends`. Each rank's state is read before the
/// SIGKILL, which ends a stopped process too (SIGTERM would wait for a
/// SIGCONT). Returns what it did, for the log line.
fn kill_all(running: &mut Vec<(usize, Child)>, ends: &mut Vec<(usize, End)>) -> String {
    let mut states = Vec::with_capacity(running.len());
    for (rank, c) in running.iter_mut() {
        let state = verdict::state_of(c.id());
        let _ = c.kill(); // an already-exited child is not an error here
        states.push((*rank, state));
    }
    let what: Vec<String> = states
        .iter()
        .map(|(rank, st)| match st {
            State::Running => format!("{rank}"),
            State::Stopped(Some(sig)) => {
                format!(
                    "{rank} (stopped by {})",
                    verdict::signal_name(*sig).unwrap_or("a signal")
                )
            }
            State::Stopped(None) => format!("{rank} (stopped)"),
        })
        .collect();
    let deadline = Instant::now() + REAP;
    while !running.is_empty() {
        let mut i = 0;
        while i < running.len() {
            let state = states
                .iter()
                .find(|(r, _)| *r == running[i].0)
                .map_or(State::Running, |(_, s)| *s);
            match running[i].1.try_wait() {
                Ok(Some(st)) => {
                    let (rank, _) = running.swap_remove(i);
                    ends.push((rank, End::after_kill(st, state)));
                }
                Ok(None) => i += 1,
                Err(e) => {
                    let (rank, _) = running.swap_remove(i);
                    ends.push((rank, End::Lost(e.to_string())));
                }
            }
        }
        if running.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            // Ended all the same: ncclrun exits, and init reaps them.
            for (rank, c) in running.drain(..) {
                eprintln!(
                    "ncclrun: rank {rank} (pid {}) still there {REAP:?} after SIGKILL",
                    c.id()
                );
                let state = states.iter().find(|(r, _)| *r == rank).map(|(_, s)| *s);
                ends.push((
                    rank,
                    match state {
                        Some(State::Stopped(sig)) => End::KilledStopped(sig),
                        _ => End::KilledRunning,
                    },
                ));
            }
            break;
        }
        std::thread::sleep(POLL);
    }
    what.join(", ")
}

fn main() -> ExitCode {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(msg) if msg.is_empty() => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprint!("ncclrun: {msg}\n{USAGE}(ncclrun --help says more)\n");
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
    // One secret per job keeps strangers out of the rendezvous; a secret
    // already in the environment is the caller's choice and is inherited.
    let secret = match std::env::var_os("NCCL_RS_JOB_SECRET") {
        Some(_) => None,
        None => match job_secret() {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("ncclrun: cannot make a job secret: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let cpus = bind::allowed_cpus();
    let start = Instant::now();
    let mut running: Vec<(usize, Child)> = Vec::with_capacity(opts.n);
    // How each rank ended, in the order ncclrun saw it.
    let mut ends: Vec<(usize, End)> = Vec::with_capacity(opts.n);
    for rank in 0..opts.n {
        let mut cmd = Command::new(&opts.cmd[0]);
        cmd.args(&opts.cmd[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", opts.n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", opts.n.to_string())
            .env("MASTER_ADDR", MASTER_ADDR)
            .env("MASTER_PORT", port.to_string());
        if let Some(secret) = &secret {
            cmd.env("NCCL_RS_JOB_SECRET", secret);
        }
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
                kill_all(&mut running, &mut ends);
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                return ExitCode::from(code);
            }
        }
    }

    // When the first rank failed: the grace runs from then.
    let mut failed_at: Option<Instant> = None;
    let mut timed_out = None;
    loop {
        let mut i = 0;
        while i < running.len() {
            let end = match running[i].1.try_wait() {
                Ok(Some(st)) => End::of(st),
                Ok(None) => {
                    i += 1;
                    continue;
                }
                // The child cannot be waited for: count it as ended, so
                // that this loop cannot spin on it until the grace ends.
                Err(e) => End::Lost(e.to_string()),
            };
            let (rank, _) = running.swap_remove(i);
            if end.failed() && failed_at.is_none() {
                eprintln!(
                    "ncclrun: rank {rank} {}; the other ranks get {GRACE:?} to exit",
                    end.describe()
                );
                failed_at = Some(Instant::now());
            }
            ends.push((rank, end));
        }
        if running.is_empty() {
            break;
        }
        if failed_at.is_some_and(|at| at.elapsed() >= GRACE) {
            let what = kill_all(&mut running, &mut ends);
            eprintln!("ncclrun: killed rank(s) {what} after the {GRACE:?} grace");
            break;
        }
        if let Some(t) = opts.timeout.filter(|t| start.elapsed() >= *t) {
            let what = kill_all(&mut running, &mut ends);
            eprintln!("ncclrun: timeout after {t:?}; killed rank(s) {what}");
            timed_out = Some(t);
            break;
        }
        std::thread::sleep(POLL);
    }
    if let Some(t) = timed_out {
        eprintln!(
            "ncclrun: job timed out after {t:?}: {}",
            verdict::summary(&ends)
        );
        return ExitCode::from(124);
    }
    match verdict::culprit(&ends) {
        Some(i) => {
            eprintln!("ncclrun: job failed: {}", verdict::summary(&ends));
            ExitCode::from(ends[i].1.exit_code())
        }
        // Only ranks ncclrun killed while running: cannot follow a failure,
        // but a failed job must never exit 0.
        None if ends.iter().any(|(_, e)| e.failed()) => {
            eprintln!("ncclrun: job failed: {}", verdict::summary(&ends));
            ExitCode::FAILURE
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
    fn port_and_help() {
        assert!(free_port().unwrap() > 0);
        let h = help();
        for v in FOREIGN {
            assert!(h.contains(v), "--help does not name {v}");
        }
        assert!(h.contains(&format!("{} s", GRACE.as_secs())));
    }
}

/// 16 bytes from the kernel's random source, as 32 hex digits.
fn job_secret() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

//! `ncclrun [-n N] [-H host[:slots],... | --hostfile FILE] ... [--] cmd
//! args...`: starts the ranks of one job, torchrun style, on this host or
//! on the hosts given (Open MPI's conventions: module [`hosts`] reads the
//! hosts and maps the ranks onto them, module [`remote`] builds each rank's
//! environment and the agent's command line, module [`tag`] tags output).
//! `ncclrun --help` ([`help`]) says what each rank's environment holds,
//! how ranks are bound to CPUs, how a failed job is stopped and blamed
//! (module [`verdict`]), and the exit statuses.

mod hosts;
mod remote;
mod tag;
mod verdict;

use hosts::{Host, MapBy, Place};
use nccl_perf::bind::{self, Bind};
use remote::{Agent, Export};
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
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
/// With `--tag-output`, how long ncclrun waits, once every rank is reaped,
/// for the rest of their output.
const DRAIN: Duration = Duration::from_secs(2);
/// `MASTER_ADDR` when every rank is on this host.
const MASTER_ADDR: &str = "127.0.0.1";
/// The default `--rsh`.
const RSH: &str = "ssh";

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

#[derive(Debug)]
struct Opts {
    /// `-n`; `None`: every slot of the hosts.
    n: Option<usize>,
    /// From `-H` (all of them, in order).
    hosts: Vec<Host>,
    hostfile: Option<String>,
    map_by: MapBy,
    rsh: Agent,
    master_addr: Option<String>,
    master_port: Option<u16>,
    tag_output: bool,
    exports: Vec<Export>,
    timeout: Option<Duration>,
    bind: Bind,
    cmd: Vec<String>,
}

const USAGE: &str = "usage: ncclrun [-n N] [-H host[:slots],... | --hostfile FILE]\n\
\x20              [--map-by slot|node] [--rsh AGENT] [--master-addr ADDR]\n\
\x20              [--master-port PORT] [-x VAR[=value]]... [--tag-output]\n\
\x20              [--timeout SECS] [--bind core|none] [--] cmd [args...]\n";

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
    let drain = DRAIN.as_secs();
    let killed = 128 + libc::SIGKILL;
    format!(
        "ncclrun: runs N processes of a command as the ranks of one job, on this\n\
         machine or on the hosts given (torchrun style: the ranks find each other\n\
         through MASTER_ADDR:MASTER_PORT; hosts, mapping, -x and --tag-output as in\n\
         Open MPI's mpirun).\n\
         \n\
         {USAGE}\
         \n\
         options:\n\
         \x20 -n, -np, --nproc, --nproc-per-node N\n\
         \x20                    the number of ranks (processes), at least 1; needed\n\
         \x20                    without hosts; with hosts at most their slots (more is\n\
         \x20                    an error: no oversubscribing), fewer take the first\n\
         \x20                    slots in map order, and the default is every slot\n\
         \x20 -H, --host host[:slots],...\n\
         \x20                    the hosts and their slots (1 by default; [addr]:slots\n\
         \x20                    for an IPv6 address); repeatable; a host named again\n\
         \x20                    gets more slots\n\
         \x20 --hostfile FILE    the hosts, in Open MPI's hostfile format: \"host slots=N\"\n\
         \x20                    a line (a bare host has 1 slot; max_slots=N is ignored),\n\
         \x20                    # comments, blank lines; a host named again gets more\n\
         \x20                    slots (not with -H)\n\
         \x20 --map-by slot|node slot (the default): fill each host's slots in turn;\n\
         \x20                    node: deal the ranks round-robin over the hosts,\n\
         \x20                    skipping the full ones\n\
         \x20 --rsh AGENT        what starts a rank on another host ({RSH} by default, as\n\
         \x20                    Open MPI's plm_rsh_agent), split on white space; a host\n\
         \x20                    named localhost or 127.0.0.1 runs its ranks directly\n\
         \x20 --master-addr ADDR MASTER_ADDR (default: {MASTER_ADDR} when every rank is on\n\
         \x20                    this machine, else the first host's name as given)\n\
         \x20 --master-port PORT MASTER_PORT (default: a port free here when ncclrun starts)\n\
         \x20 -x VAR, -x VAR=value\n\
         \x20                    set VAR in every rank's environment: to value, or to\n\
         \x20                    ncclrun's (for ranks here a bare VAR is inherited\n\
         \x20                    anyway; through the agent it is skipped when unset);\n\
         \x20                    repeatable\n\
         \x20 --tag-output       write each line of a rank's stdout (stderr) to ncclrun's\n\
         \x20                    stdout (stderr) as \"[1,RANK]<stdout>:line\"\n\
         \x20                    (\"[1,RANK]<stderr>:line\"), lines whole\n\
         \x20 --timeout SECS     kill every rank and exit 124 after SECS seconds\n\
         \x20                    (fractions allowed; 0, the default: no limit)\n\
         \x20 --bind core|none   core (the default): bind each rank to one CPU of those\n\
         \x20                    ncclrun may run on (local rank l of the L ranks on a\n\
         \x20                    host gets CPU number l*C/L of the C allowed, so with\n\
         \x20                    more ranks than CPUs neighbouring ranks share one);\n\
         \x20                    none: leave the ranks unbound. Through the agent this\n\
         \x20                    binds the process ncclrun starts: with ip netns exec\n\
         \x20                    the rank (exec keeps the binding), with ssh only the\n\
         \x20                    local ssh client, not the remote rank\n\
         \x20 -h, --help         this text\n\
         \n\
         each rank's environment: ncclrun's own (through an agent: what the agent\n\
         gives), plus\n\
         \x20 RANK=r              the rank, 0 to N-1\n\
         \x20 WORLD_SIZE=N        the number of ranks\n\
         \x20 LOCAL_RANK=l        the rank's index among the ranks on its host (without\n\
         \x20                    hosts: the same as RANK)\n\
         \x20 LOCAL_WORLD_SIZE=L  the number of ranks on its host (without hosts: N)\n\
         \x20 NODE_RANK=h         its host's index in -H/hostfile order (without hosts: 0)\n\
         \x20 MASTER_ADDR={MASTER_ADDR} (or as --master-addr and the hosts say)\n\
         \x20 MASTER_PORT=P       the same for all\n\
         \x20 NCCL_RS_JOB_SECRET  32 random hex digits, the same for all (unless ncclrun's\n\
         \x20                    environment has one): only ranks that present it may join\n\
         \x20 the -x variables    (the variables above win over them)\n\
         and without these variables of other launchers (Open MPI, PMI, Slurm,\n\
         torchrun), so that they cannot win over RANK and WORLD_SIZE:\n\
         {foreign}\n\
         A rank started through the agent also gets every NCCL_* variable of\n\
         ncclrun's environment, and NCCL_HOSTID=<its host as named> unless\n\
         ncclrun's environment has NCCL_HOSTID (ncclrun knows which ranks share a\n\
         host; network namespaces on one kernel would otherwise look like one\n\
         host).\n\
         Ranks here share ncclrun's stdin; ranks through the agent get /dev/null.\n\
         All share ncclrun's stdout and stderr (or write through it, with\n\
         --tag-output: once every rank has ended ncclrun waits at most {drain} s for\n\
         the rest of their output), and what ncclrun started gets SIGKILL if\n\
         ncclrun dies.\n\
         \n\
         ranks on other hosts: a rank runs as\n\
         \x20 AGENT... HOST env -C DIR VAR=value... cmd args...\n\
         with DIR ncclrun's current directory (GNU env, coreutils 8.28 or later, on\n\
         the host). An agent whose program is ssh or rsh hands the host one shell\n\
         command line: each word after HOST is shell-quoted (a POSIX login shell is\n\
         assumed); any other agent (--rsh \"ip netns exec\") gets them as they are.\n\
         The agent's exit status is the rank's (ssh: 255 when it cannot connect).\n\
         The variables travel on the agent's command line, which other users of\n\
         this machine can read (ps) while it runs. Killing a rank kills what\n\
         ncclrun started: ip netns exec has become the rank; a killed ssh client\n\
         does not always end the remote command.\n\
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
         \x20 2        a usage error (bad or missing option, no command, a bad hostfile,\n\
         \x20          more ranks than slots), told in one line\n\
         \x20 126, 127 the command (or the agent) could not be started (127: not found)\n\
         \x20 1        ncclrun itself failed (no free port, no current directory)\n"
    )
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Opts, String> {
    let mut n = None;
    let mut hosts = Vec::new();
    let mut hostfile = None;
    let mut map_by = MapBy::Slot;
    let mut rsh = Agent::parse(RSH)?;
    let mut master_addr = None;
    let mut master_port = None;
    let mut tag_output = false;
    let mut exports = Vec::new();
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
            "-H" | "-host" | "--host" => hosts::parse_h(&value(&a)?, &mut hosts)?,
            "--hostfile" | "-hostfile" | "--machinefile" | "-machinefile" => {
                if hostfile.is_some() {
                    return Err(format!("{a} given twice"));
                }
                hostfile = Some(value(&a)?);
            }
            "--map-by" | "-map-by" => map_by = MapBy::parse(&value(&a)?)?,
            "--rsh" => rsh = Agent::parse(&value(&a)?)?,
            "--master-addr" | "--master_addr" => {
                let v = value(&a)?;
                if v.is_empty() || v.contains(char::is_whitespace) {
                    return Err(format!("bad {a} '{v}'"));
                }
                master_addr = Some(v);
            }
            "--master-port" | "--master_port" => {
                let v = value(&a)?;
                master_port = Some(
                    v.parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| format!("bad {a} '{v}'"))?,
                );
            }
            "--tag-output" | "-tag-output" => tag_output = true,
            "-x" => exports.push(Export::parse(&value(&a)?)?),
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
    if hostfile.is_some() && !hosts.is_empty() {
        return Err("give -H or --hostfile, not both".into());
    }
    if n.is_none() && hostfile.is_none() && hosts.is_empty() {
        return Err("missing -n N (or -H/--hostfile)".into());
    }
    if cmd.is_empty() {
        return Err("missing command".into());
    }
    Ok(Opts {
        n,
        hosts,
        hostfile,
        map_by,
        rsh,
        master_addr,
        master_port,
        tag_output,
        exports,
        timeout,
        bind,
        cmd,
    })
}

/// Where the ranks run: the hosts, each rank's place, and `MASTER_ADDR`.
struct Plan {
    hosts: Vec<Host>,
    places: Vec<Place>,
    master_addr: String,
}

impl Plan {
    /// Whether rank `rank` runs on this machine without the agent.
    fn local(&self, rank: usize) -> bool {
        hosts::is_local(&self.hosts[self.places[rank].host].name)
    }
}

/// The plan of `opts`, reading the hostfile through `read`. Without hosts,
/// every rank is on `localhost`. Errors are usage errors.
fn plan(opts: &Opts, read: impl Fn(&str) -> std::io::Result<String>) -> Result<Plan, String> {
    let hosts = match (&opts.hostfile, opts.n) {
        (Some(path), _) => {
            let text = read(path).map_err(|e| format!("cannot read hostfile {path}: {e}"))?;
            hosts::parse_hostfile(&text).map_err(|e| format!("hostfile {path}: {e}"))?
        }
        (None, _) if !opts.hosts.is_empty() => opts.hosts.clone(),
        (None, Some(n)) => vec![Host {
            name: "localhost".into(),
            slots: n,
        }],
        (None, None) => return Err("missing -n N (or -H/--hostfile)".into()),
    };
    let places = hosts::map(&hosts, opts.n, opts.map_by)?;
    let master_addr = match &opts.master_addr {
        Some(a) => a.clone(),
        None if places.iter().all(|p| hosts::is_local(&hosts[p.host].name)) => {
            MASTER_ADDR.to_string()
        }
        None if hosts::is_local(&hosts[0].name) => {
            return Err(format!(
            "the first host is {}, which the ranks on other hosts cannot reach: give --master-addr",
            hosts[0].name
        ))
        }
        None => hosts[0].name.clone(),
    };
    Ok(Plan {
        hosts,
        places,
        master_addr,
    })
}

/// A port that was free when we looked, below the kernel's ephemeral range
/// (`ip_local_port_range`): a port in that range may meanwhile become the
/// source port of some connection on the master's host (even a connect
/// to itself while the root is not up yet), and the root's bind then fails.
fn free_port() -> std::io::Result<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (lo, hi) = (low.saturating_sub(12288).max(1024), low);
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    if hi > lo {
        for i in 0..64u64 {
            let x = seed.wrapping_add(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33;
            let port = lo + (x % u64::from(hi - lo)) as u16;
            if TcpListener::bind(("0.0.0.0", port)).is_ok() {
                return Ok(port);
            }
        }
    }
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
    let usage_error = |msg: String| {
        eprintln!("ncclrun: {msg}; see ncclrun --help");
        ExitCode::from(2)
    };
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(msg) if msg.is_empty() => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        Err(msg) => return usage_error(msg),
    };
    let plan = match plan(&opts, |p| std::fs::read_to_string(p)) {
        Ok(p) => p,
        Err(msg) => return usage_error(msg),
    };
    run(&opts, &plan)
}

/// Starts the ranks of `plan`, waits for them, and says how the job ended.
fn run(opts: &Opts, plan: &Plan) -> ExitCode {
    let n = plan.places.len();
    let port = match opts.master_port.map_or_else(free_port, Ok) {
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
    // ncclrun's environment, for what goes to ranks through the agent.
    let parent: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    // The directory remote ranks start in.
    let dir = if (0..n).all(|r| plan.local(r)) {
        String::new()
    } else {
        match std::env::current_dir().map(|d| d.into_os_string().into_string()) {
            Ok(Ok(d)) => d,
            Ok(Err(d)) => {
                eprintln!("ncclrun: the current directory {d:?} is not UTF-8");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("ncclrun: no current directory: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let cpus = bind::allowed_cpus();
    let mut tagger = opts.tag_output.then(tag::Tagger::new);
    let start = Instant::now();
    let mut running: Vec<(usize, Child)> = Vec::with_capacity(n);
    // How each rank ended, in the order ncclrun saw it.
    let mut ends: Vec<(usize, End)> = Vec::with_capacity(n);
    for (rank, place) in plan.places.iter().enumerate() {
        let vars = remote::rank_vars(rank, n, *place, &plan.master_addr, port);
        let host = &plan.hosts[place.host].name;
        let mut cmd = if plan.local(rank) {
            let mut cmd = Command::new(&opts.cmd[0]);
            cmd.args(&opts.cmd[1..]).envs(remote::rank_env(
                &parent,
                None,
                secret.as_deref(),
                &opts.exports,
                &vars,
            ));
            cmd
        } else {
            let env =
                remote::rank_env(&parent, Some(host), secret.as_deref(), &opts.exports, &vars);
            let argv = opts.rsh.argv(host, &dir, &env, &opts.cmd);
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]).stdin(Stdio::null());
            cmd
        };
        for v in FOREIGN {
            cmd.env_remove(v);
        }
        die_with_parent(&mut cmd);
        if let Some(cpu) = bind::cpu_for(opts.bind, place.local_rank, place.local_size, &cpus) {
            bind_to(&mut cmd, cpu);
        }
        if tagger.is_some() {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        match cmd.spawn() {
            Ok(mut c) => {
                if let Some(t) = &mut tagger {
                    t.attach(rank, &mut c);
                }
                running.push((rank, c));
            }
            Err(e) => {
                let prog = cmd.get_program().to_string_lossy().into_owned();
                eprintln!("ncclrun: cannot start rank {rank} ({prog}): {e}");
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
    // The ranks' last lines before the verdict.
    if let Some(t) = &mut tagger {
        t.drain(DRAIN);
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

/// 16 bytes from the kernel's random source, as 32 hex digits.
fn job_secret() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
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
            (Some(4), None, "prog -b 8".to_string())
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
    fn host_options() {
        let o = p(&[
            "-H",
            "a:2,b",
            "-H",
            "c",
            "--map-by",
            "node",
            "--rsh",
            "ip netns exec",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "29500",
            "--tag-output",
            "-x",
            "A=1",
            "-x",
            "B",
            "prog",
            "-x",
            "y",
        ])
        .unwrap();
        assert_eq!(o.n, None);
        let names: Vec<_> = o.hosts.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(names, [("a", 2), ("b", 1), ("c", 1)]);
        assert_eq!(o.map_by, MapBy::Node);
        assert_eq!(o.rsh, Agent::parse("ip netns exec").unwrap());
        assert_eq!(o.master_addr.as_deref(), Some("10.0.0.1"));
        assert_eq!(o.master_port, Some(29500));
        assert!(o.tag_output);
        assert_eq!(
            o.exports,
            [Export::parse("A=1").unwrap(), Export::parse("B").unwrap()]
        );
        assert_eq!(o.cmd, ["prog", "-x", "y"]);
        let o = p(&["--hostfile", "hf", "a"]).unwrap();
        assert_eq!(
            (o.hostfile.as_deref(), o.rsh),
            (Some("hf"), Agent::parse("ssh").unwrap())
        );
        let bad: &[&[&str]] = &[
            &["-H", "a", "--hostfile", "f", "x"],
            &["-H", "a:0", "x"],
            &["-H", "a"],
            &["-H"],
            &["--map-by", "core", "-H", "a", "x"],
            &["--rsh", "", "-H", "a", "x"],
            &["--master-port", "0", "-H", "a", "x"],
            &["--master-port", "65536", "-H", "a", "x"],
            &["--master-addr", "", "-H", "a", "x"],
            &["-x", "1=2", "-H", "a", "x"],
            &["--hostfile", "f", "--hostfile", "g", "x"],
        ];
        for args in bad {
            let e = p(args).expect_err(&format!("{args:?}"));
            assert!(!e.is_empty() && !e.contains('\n'), "{args:?}: {e:?}");
        }
    }

    /// (host name, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK) of each rank
    /// and MASTER_ADDR, or the usage error.
    fn planned(args: &[&str], file: &str) -> Result<(Vec<String>, String), String> {
        let o = p(args).unwrap();
        let text = file.to_string();
        let plan = plan(&o, |_| Ok(text.clone()))?;
        let ranks = plan
            .places
            .iter()
            .map(|pl| {
                let h = &plan.hosts[pl.host].name;
                format!("{h} {} {} {}", pl.local_rank, pl.local_size, pl.host)
            })
            .collect();
        Ok((ranks, plan.master_addr))
    }

    #[test]
    fn plans() {
        let ok = |args: &[&str], file: &str, ranks: &[&str], addr: &str| {
            let got = planned(args, file);
            assert_eq!(
                got,
                Ok((
                    ranks.iter().map(|r| r.to_string()).collect(),
                    addr.to_string()
                )),
                "{args:?}"
            );
        };
        // The local case: as before, LOCAL_RANK = RANK.
        ok(
            &["-n", "3", "x"],
            "",
            &["localhost 0 3 0", "localhost 1 3 0", "localhost 2 3 0"],
            "127.0.0.1",
        );
        ok(
            &["-H", "localhost:2,127.0.0.1", "x"],
            "",
            &["localhost 0 2 0", "localhost 1 2 0", "127.0.0.1 0 1 1"],
            "127.0.0.1",
        );
        ok(
            &["-H", "n0:2,n1:2", "--map-by", "node", "-n", "3", "x"],
            "",
            &["n0 0 2 0", "n1 0 1 1", "n0 1 2 0"],
            "n0",
        );
        ok(
            &["-H", "n0:2,n1:2", "--master-addr", "10.79.0.1", "x"],
            "",
            &["n0 0 2 0", "n0 1 2 0", "n1 0 2 1", "n1 1 2 1"],
            "10.79.0.1",
        );
        // Only the ranks that run count: every rank here, so 127.0.0.1.
        ok(
            &["-H", "localhost,far", "-n", "1", "x"],
            "",
            &["localhost 0 1 0"],
            "127.0.0.1",
        );
        ok(
            &["--hostfile", "hf", "x"],
            "# two hosts\na slots=2\nb\n",
            &["a 0 2 0", "a 1 2 0", "b 0 1 1"],
            "a",
        );
        let err = |args: &[&str], file: &str, want: &str| {
            let e = planned(args, file).expect_err(&format!("{args:?}"));
            assert!(e.contains(want), "{args:?}: {e}");
        };
        err(
            &["-H", "a:2,b", "-n", "4", "x"],
            "",
            "-n 4 is more than the 3 slot(s)",
        );
        err(
            &["--hostfile", "hf", "-n", "9", "x"],
            "a slots=8",
            "-n 9 is more than the 8 slot(s)",
        );
        err(
            &["--hostfile", "hf", "x"],
            "a\nb slots=x\n",
            "hostfile hf: line 2: bad slot count 'x'",
        );
        err(&["-H", "localhost,far", "x"], "", "give --master-addr");
        let o = p(&["--hostfile", "/nonexistent", "x"]).unwrap();
        let e = plan(&o, |p| std::fs::read_to_string(p)).err().unwrap();
        assert!(e.starts_with("cannot read hostfile /nonexistent"), "{e}");
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

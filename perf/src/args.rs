//! Command-line flags, as nccl-tests spells them (`-b 8 -e 128M -f 2 ...`).
//!
//! Short flags take their value either as the next argument (`-b 8`) or
//! glued on (`-b8`); long flags as `--minbytes 8` or `--minbytes=8`.

use std::time::Duration;

use nccl_rs::{Config, DataType, RedOp};

/// How the per-rank times of one measurement are combined (nccl-tests `-a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// Rank 0's time (`-a 0`).
    Rank0,
    /// The mean over ranks (`-a 1`).
    Mean,
    /// The minimum over ranks (`-a 2`).
    Min,
    /// The maximum over ranks (`-a 3`, our default).
    Max,
}

/// Which of the two measurements of each size run (`-P`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Places {
    /// Out of place, then in place (nccl-tests' table; the default).
    Both,
    /// Out of place only (`-P out`).
    OutOfPlace,
    /// In place only (`-P in`).
    InPlace,
}

impl Places {
    /// Whether the measurement with `in_place` runs.
    pub fn runs(self, in_place: bool) -> bool {
        match self {
            Places::Both => true,
            Places::OutOfPlace => !in_place,
            Places::InPlace => in_place,
        }
    }
}

/// The parsed options of one perf tool.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// `-b`: smallest size in bytes.
    pub min_bytes: u64,
    /// `-e`: largest size in bytes.
    pub max_bytes: u64,
    /// `-f`: multiply the size by this each step (when > 1).
    pub step_factor: u64,
    /// `-i`: add this to the size each step (when the factor is 1).
    pub step_bytes: u64,
    /// `-n`: timed iterations per size.
    pub iters: usize,
    /// `-w`: warm-up iterations.
    pub warmup_iters: usize,
    /// `-m`: operations per timed iteration.
    pub agg_iters: usize,
    /// `-c`: check the results (0 = no).
    pub check: u32,
    /// `-d`: the datatypes to run, in order.
    pub dtypes: Vec<DataType>,
    /// `-o`: the reduction operations to run, in order.
    pub ops: Vec<RedOp>,
    /// `-r`: root rank of broadcast and reduce.
    pub root: usize,
    /// `-t`: run this many ranks as threads of this process.
    pub nthreads: Option<usize>,
    /// `-a`: how times are combined over ranks.
    pub average: Average,
    /// `-D` / `--device 1`: buffers in GPU memory (the `cuda` feature).
    pub device: bool,
    /// `-R` / `--local_register 1` (nccl-tests: register the buffers): host
    /// buffers in shared memory ([`nccl_rs::ShmBuffer`], `ncclMemAlloc`),
    /// which co-located ranks copy between directly.
    pub register: bool,
    /// `-P` / `--places` (ours): which of out-of-place and in-place run.
    pub places: Places,
    /// `-H` / `--huge_pages 1` (ours): heap buffers registered onto
    /// transparent huge pages (`nccl_rs::hostmem::prefer_huge_pages`, as
    /// `ncclCommRegister` does for host memory).
    pub huge_pages: bool,
    /// `-T` / `--timeout` (nccl-tests' timeout, in seconds): the
    /// communicator's deadline for one operation, in place of
    /// `NCCL_RS_TIMEOUT`; `None` (also `-T 0`) keeps `NCCL_RS_TIMEOUT` or its default.
    pub timeout: Option<Duration>,
}

impl Args {
    /// Applies the options that are communicator settings to `cfg` (read
    /// from the environment first): the command line wins, as in nccl-tests.
    pub fn apply_to(&self, cfg: &mut Config) {
        if let Some(t) = self.timeout {
            cfg.timeout = t;
        }
    }
}

impl Default for Args {
    fn default() -> Self {
        Args {
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 2,
            step_bytes: 1 << 20,
            iters: 20,
            warmup_iters: 5,
            agg_iters: 1,
            check: 1,
            dtypes: vec![DataType::Float32],
            ops: vec![RedOp::Sum],
            root: 0,
            nthreads: None,
            average: Average::Max,
            device: false,
            register: false,
            places: Places::Both,
            huge_pages: false,
            timeout: None,
        }
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Parsed {
    /// Run with these options.
    Run(Args),
    /// `-h`: print the usage and exit successfully.
    Help,
}

/// The usage text, for `prog`.
pub fn usage(prog: &str) -> String {
    format!(
        "USAGE: {prog}\n\
         \t[-t,--nthreads <N>]          run N ranks as threads of this process (default: one rank,\n\
         \t                             or the ranks of a launcher: ncclrun, torchrun, mpirun, srun)\n\
         \t[-b,--minbytes <min size in bytes, K/M/G suffixes>]  (default 32M)\n\
         \t[-e,--maxbytes <max size in bytes, K/M/G suffixes>]  (default 32M)\n\
         \t[-i,--stepbytes <increment size>]  (used when the step factor is 1)\n\
         \t[-f,--stepfactor <increment factor>]  (default 2)\n\
         \t[-n,--iters <iteration count>]  (default 20)\n\
         \t[-m,--agg_iters <operations per iteration>]  (default 1)\n\
         \t[-w,--warmup_iters <warmup iteration count>]  (default 5)\n\
         \t[-c,--check <0/1>]  (default 1)\n\
         \t[-o,--op <sum/prod/min/max/avg/all>]  (default sum)\n\
         \t[-d,--datatype <nccltype/all>]  (default float)\n\
         \t[-r,--root <root>]  (default 0)\n\
         \t[-a,--average <0/1/2/3> report the time of rank 0/the mean/min/max over ranks]  (default 3)\n\
         \t[-g,--ngpus 1] accepted for compatibility; only 1\n\
         \t[-D,--device <0/1>]  buffers in GPU memory, staged by nccl-rs (default 0; needs the cuda feature)\n\
         \t[-R,--local_register <0/1>]  host buffers in shared memory (ncclMemAlloc): co-located ranks copy between them directly (default 0)\n\
         \t[-H,--huge_pages <0/1>]  heap buffers registered onto transparent huge pages, as ncclCommRegister does (default 0)\n\
         \t[-P,--places <both/out/in>]  which measurements run: out of place, in place or both; the other's columns read N/A (default both)\n\
         \t[-T,--timeout <seconds>]  the communicator's timeout for one operation, in place of NCCL_RS_TIMEOUT; 0 keeps NCCL_RS_TIMEOUT (default 0)\n\
         \t[-p -z -y -G -C -F -u -I -x -N -J -S -M <value>] accepted and ignored\n\
         \t[-h,--help]\n"
    )
}

/// The sizes a floor tool (`copy_floor`, `tcp_floor`) runs: `-b` to `-e`
/// by factors of `-f`, `-n` repetitions each (0: the tool picks).
#[derive(Clone, Copy, Debug)]
pub struct Sweep {
    /// `-b`: the first size.
    pub min: usize,
    /// `-e`: the last size at most.
    pub max: usize,
    /// `-f`: each size this many times the one before.
    pub factor: usize,
    /// `-n`: repetitions per size.
    pub reps: usize,
}

impl Sweep {
    /// Takes `flag` if it is one of the sweep's (`-b -e -f -n`), its value
    /// from `value`; whether it was.
    pub fn take(
        &mut self,
        flag: &str,
        value: &mut dyn FnMut() -> Result<String, String>,
    ) -> Result<bool, String> {
        let field = match flag {
            "-b" => &mut self.min,
            "-e" => &mut self.max,
            "-f" => &mut self.factor,
            "-n" => &mut self.reps,
            _ => return Ok(false),
        };
        *field = size_arg(&value()?)?;
        Ok(true)
    }

    /// Refuses a sweep that runs nothing or never ends.
    pub fn check(&self) -> Result<(), String> {
        if self.min == 0 || self.min > self.max || self.factor < 2 {
            return Err("need 0 < min <= max and factor >= 2".into());
        }
        Ok(())
    }

    /// The sizes: `min`, `min * factor`, ... up to `max`.
    pub fn sizes(&self) -> impl Iterator<Item = usize> {
        let (max, factor) = (self.max, self.factor);
        std::iter::successors(Some(self.min), move |s| s.checked_mul(factor))
            .take_while(move |&s| s <= max)
    }
}

/// [`parse_size`] as a `usize`, or a message naming what was given (the
/// floor tools' flags).
pub fn size_arg(s: &str) -> Result<usize, String> {
    parse_size(s)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("not a size: {s:?}"))
}

/// Parses a size like nccl-tests' `parsesize`: a number, optionally
/// fractional, with an optional `K`, `M` or `G` suffix (binary units,
/// case-insensitive). Returns `None` for anything else.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let unit: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return None,
            };
            (s[..i].trim_end(), unit)
        }
        _ => (s, 1),
    };
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() || v < 0.0 {
        return None;
    }
    let bytes = v * unit as f64;
    (bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Parses an integer like `strtol(s, NULL, 0)`: decimal, or `0x` hex.
fn parse_int(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let v = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => body.parse().ok()?,
    };
    Some(if neg { -v } else { v })
}

/// Parses `-T`: seconds, fractional allowed, at least 0 and below 10^9
/// (the range `NCCL_RS_TIMEOUT` takes); `Some(None)` for 0 (no override),
/// `None` for anything else, so a typo is refused rather than ignored.
fn parse_timeout(s: &str) -> Option<Option<Duration>> {
    let v: f64 = s.trim().parse().ok()?;
    if !v.is_finite() || !(0.0..1e9).contains(&v) {
        return None;
    }
    Some((v > 0.0).then(|| Duration::from_secs_f64(v)))
}

/// The sizes of the sweep, as nccl-tests loops over them: from `min` while
/// `<= max`, multiplying by `factor` when it is above 1, otherwise adding
/// `step`. A zero size is followed by 1 when multiplying. Errors if the
/// sweep would not advance.
pub fn sweep(min: u64, max: u64, factor: u64, step: u64) -> Result<Vec<u64>, String> {
    if min > max {
        return Err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {min} > {max}"
        ));
    }
    if factor <= 1 && step == 0 && min < max {
        return Err("stepbytes must be positive when the step factor is 1".into());
    }
    let mut sizes = Vec::new();
    let mut size = min;
    loop {
        sizes.push(size);
        let next = if factor > 1 {
            if size == 0 {
                Some(1)
            } else {
                size.checked_mul(factor)
            }
        } else {
            size.checked_add(step)
        };
        match next {
            Some(n) if n <= max && n > size => size = n,
            _ => break,
        }
    }
    Ok(sizes)
}

/// Flags that nccl-tests takes with a value and that we accept and ignore
/// (blocking, stream null, CUDA graphs, CPU time, output file,
/// unaligned buffers, ...).
const IGNORED: &[(char, &str)] = &[
    ('p', "parallel_init"),
    ('z', "blocking"),
    ('y', "stream_null"),
    ('G', "cudagraph"),
    ('C', "report_cputime"),
    ('F', "output_file"),
    ('u', "unalign"),
    ('I', "per_iter_timing"),
    ('x', "cta_policy"),
    ('N', "run_cycles"),
    ('J', "output_json"),
    ('S', "report_timestamps"),
    ('M', "memory_report"),
];

/// The short letter of a long option.
fn long_to_short(name: &str) -> Option<char> {
    let known = [
        ('t', "nthreads"),
        ('g', "ngpus"),
        ('b', "minbytes"),
        ('e', "maxbytes"),
        ('i', "stepbytes"),
        ('f', "stepfactor"),
        ('n', "iters"),
        ('m', "agg_iters"),
        ('w', "warmup_iters"),
        ('c', "check"),
        ('o', "op"),
        ('d', "datatype"),
        ('r', "root"),
        ('a', "average"),
        ('D', "device"),
        ('R', "local_register"),
        ('P', "places"),
        ('H', "huge_pages"),
        ('T', "timeout"),
        ('h', "help"),
    ];
    known
        .iter()
        .chain(IGNORED.iter())
        .find(|(_, l)| *l == name)
        .map(|(s, _)| *s)
}

/// Parses the arguments after the program name.
pub fn parse_args<I, S>(argv: I) -> Result<Parsed, String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut args = Args::default();
    let mut factor_given = false;
    let mut step_given = false;
    let mut it = argv.into_iter().map(Into::into);
    while let Some(arg) = it.next() {
        let (flag, glued): (char, Option<String>) = if let Some(long) = arg.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let c = long_to_short(name).ok_or_else(|| format!("invalid option '--{name}'"))?;
            (c, val)
        } else if let Some(short) = arg.strip_prefix('-') {
            let mut chars = short.chars();
            let c = chars
                .next()
                .ok_or_else(|| "invalid option '-'".to_string())?;
            let rest = chars.as_str();
            (c, (!rest.is_empty()).then(|| rest.to_string()))
        } else {
            return Err(format!("unexpected argument '{arg}'"));
        };
        if flag == 'h' {
            return Ok(Parsed::Help);
        }
        let known = "tgbeifnmwcodraDRPHT".contains(flag) || IGNORED.iter().any(|(s, _)| *s == flag);
        if !known {
            return Err(format!("invalid option '{arg}'"));
        }
        let val = match glued {
            Some(v) => v,
            None => it
                .next()
                .ok_or_else(|| format!("option '-{flag}' needs a value"))?,
        };
        let bad = |what: &str| format!("invalid value '{val}' for {what} (-{flag})");
        let int = |what: &str, min: i64| -> Result<i64, String> {
            parse_int(&val)
                .filter(|v| *v >= min)
                .ok_or_else(|| bad(what))
        };
        match flag {
            't' => args.nthreads = Some(int("nthreads", 1)? as usize),
            'g' if int("ngpus", 1)? != 1 => {
                return Err("only -g 1 is supported (use -t N for more ranks)".into());
            }
            'b' => args.min_bytes = parse_size(&val).ok_or_else(|| bad("minbytes"))?,
            'e' => args.max_bytes = parse_size(&val).ok_or_else(|| bad("maxbytes"))?,
            'i' => {
                args.step_bytes = parse_size(&val).ok_or_else(|| bad("stepbytes"))?;
                step_given = true;
            }
            'f' => {
                args.step_factor = int("stepfactor", 1)? as u64;
                factor_given = true;
            }
            'n' => args.iters = int("iters", 1)? as usize,
            'm' => args.agg_iters = int("agg_iters", 1)? as usize,
            'w' => args.warmup_iters = int("warmup_iters", 0)? as usize,
            'c' => args.check = int("check", 0)? as u32,
            'r' => args.root = int("root", 0)? as usize,
            'R' => args.register = int("local_register", 0)? > 0,
            'H' => args.huge_pages = int("huge_pages", 0)? > 0,
            'T' => args.timeout = parse_timeout(&val).ok_or_else(|| bad("timeout"))?,
            'P' => {
                args.places = match val.as_str() {
                    "both" => Places::Both,
                    "out" => Places::OutOfPlace,
                    "in" => Places::InPlace,
                    _ => return Err(bad("places")),
                }
            }
            'D' => {
                args.device = match int("device", 0)? {
                    0 => false,
                    1 => true,
                    _ => return Err(bad("device")),
                }
            }
            'a' => {
                args.average = match int("average", 0)? {
                    0 => Average::Rank0,
                    1 => Average::Mean,
                    2 => Average::Min,
                    3 => Average::Max,
                    _ => return Err(bad("average")),
                }
            }
            'd' => {
                args.dtypes = if val == "all" {
                    DataType::ALL.to_vec()
                } else {
                    vec![DataType::parse(&val).ok_or_else(|| bad("datatype"))?]
                }
            }
            'o' => {
                args.ops = if val == "all" {
                    RedOp::ALL.to_vec()
                } else {
                    vec![RedOp::parse(&val).ok_or_else(|| bad("op"))?]
                }
            }
            _ => {} // accepted and ignored
        }
    }
    // `-i` alone selects stepping by bytes; with an explicit `-f` above 1
    // the factor wins, as in nccl-tests.
    if step_given && !factor_given {
        args.step_factor = 1;
    }
    sweep(
        args.min_bytes,
        args.max_bytes,
        args.step_factor,
        args.step_bytes,
    )?;
    Ok(Parsed::Run(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(v: &[&str]) -> Args {
        match parse_args(v.iter().copied()).unwrap() {
            Parsed::Run(a) => a,
            Parsed::Help => panic!("help"),
        }
    }

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("1K"), Some(1024));
        assert_eq!(parse_size("1k"), Some(1024));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("M"), None);
    }

    #[test]
    fn sweep_by_factor_and_bytes() {
        assert_eq!(sweep(8, 64, 2, 0).unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(sweep(8, 100, 4, 0).unwrap(), vec![8, 32]);
        assert_eq!(sweep(0, 4, 2, 0).unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(sweep(10, 40, 1, 10).unwrap(), vec![10, 20, 30, 40]);
        assert_eq!(sweep(10, 45, 1, 10).unwrap(), vec![10, 20, 30, 40]);
        assert_eq!(sweep(32, 32, 2, 0).unwrap(), vec![32]);
        assert_eq!(sweep(32, 32, 1, 0).unwrap(), vec![32]);
        assert!(sweep(64, 32, 2, 0).is_err());
        assert!(sweep(1, 32, 1, 0).is_err());
        // No overflow near the top of the range.
        assert_eq!(sweep(u64::MAX / 2 + 1, u64::MAX, 2, 0).unwrap().len(), 1);
    }

    #[test]
    fn flags() {
        let a = run(&[
            "-b", "8", "-e64M", "-f", "4", "-n", "3", "-w", "1", "-c", "0",
        ]);
        assert_eq!((a.min_bytes, a.max_bytes, a.step_factor), (8, 64 << 20, 4));
        assert_eq!((a.iters, a.warmup_iters, a.check), (3, 1, 0));
        let a = run(&[
            "--minbytes=1K",
            "--maxbytes",
            "4K",
            "-i",
            "1K",
            "-d",
            "half",
            "-o",
            "all",
        ]);
        assert_eq!(
            (a.min_bytes, a.max_bytes, a.step_factor, a.step_bytes),
            (1024, 4096, 1, 1024)
        );
        assert_eq!(a.dtypes, vec![DataType::Float16]);
        assert_eq!(a.ops.len(), 5);
        let a = run(&[
            "-d", "all", "-t", "3", "-r", "2", "-z", "1", "-G", "0", "-a", "1",
        ]);
        assert_eq!(a.dtypes.len(), 12);
        assert_eq!((a.nthreads, a.root, a.average), (Some(3), 2, Average::Mean));
        assert_eq!(run(&[]), Args::default());
        assert!(!Args::default().device);
        assert!(run(&["--device", "1"]).device);
        assert!(!run(&["--device=1", "-D0"]).device);
        assert!(run(&["-D", "1"]).device);
        assert!(!Args::default().register);
        assert!(run(&["-R", "1"]).register);
        assert!(run(&["--local_register=2"]).register);
        assert!(!run(&["-R", "0"]).register);
        assert_eq!(Args::default().places, Places::Both);
        assert!(!Args::default().huge_pages);
        assert!(run(&["-H", "1"]).huge_pages && run(&["--huge_pages=1"]).huge_pages);
        assert!(!run(&["-H0"]).huge_pages);
        assert_eq!(run(&["-P", "out"]).places, Places::OutOfPlace);
        assert_eq!(run(&["--places=in"]).places, Places::InPlace);
        assert!(parse_args(["-P", "1"]).is_err());
        assert!(Places::Both.runs(false) && Places::Both.runs(true));
        assert!(Places::OutOfPlace.runs(false) && !Places::OutOfPlace.runs(true));
        assert!(!Places::InPlace.runs(false) && Places::InPlace.runs(true));
        assert!(parse_args(["--device", "2"]).is_err());
        assert_eq!(parse_args(["-h"]).unwrap(), Parsed::Help);
        assert!(parse_args(["-q", "1"]).is_err());
        assert!(parse_args(["--bogus"]).is_err());
        assert!(parse_args(["-b"]).is_err());
        assert!(parse_args(["-d", "float17"]).is_err());
        assert!(parse_args(["-n", "0"]).is_err());
        assert!(parse_args(["-b", "1M", "-e", "1K"]).is_err());
        assert!(parse_args(["stray"]).is_err());
    }

    #[test]
    fn timeout_reaches_the_config() {
        assert_eq!(Args::default().timeout, None);
        let a = run(&["-T", "3"]);
        assert_eq!(a.timeout, Some(Duration::from_secs(3)));
        let mut cfg = Config::default();
        let before = cfg.timeout;
        a.apply_to(&mut cfg);
        assert_eq!(cfg.timeout, Duration::from_secs(3));
        assert_ne!(before, cfg.timeout);
        assert_eq!(
            run(&["--timeout=1.5"]).timeout,
            Some(Duration::from_millis(1500))
        );
        assert_eq!(run(&["-T2"]).timeout, Some(Duration::from_secs(2)));
        // 0 keeps what the environment gave.
        let mut cfg = Config::default();
        run(&["-T", "0"]).apply_to(&mut cfg);
        assert_eq!(cfg.timeout, before);
        for bad in ["x", "3s", "-1", "", "nan", "inf", "1e10"] {
            assert!(parse_args(["-T", bad]).is_err(), "-T {bad:?} accepted");
        }
        assert!(parse_args(["-T"]).is_err());
    }
}

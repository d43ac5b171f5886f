//! `ncclras`: asks a running job's RAS service for its status, as NCCL's
//! client of the same name (`docs/ras.md`).

use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
Usage: ncclras [OPTION]...
Query the state of a running nccl-rs (or NCCL) job through its RAS port.

Options:
  -a, --addr=HOST:PORT  the RAS port (NCCL_RAS_ADDR, else localhost:28028)
  -h, --host=HOST       host of the RAS port (localhost by default)
  -p, --port=PORT       TCP port of the RAS port (28028 by default)
  -f, --format=FMT      output format: text or json (text by default)
  -t, --timeout=SECS    give up after SECS seconds (5 by default; 0: 1 hour)
  -v, --verbose         every rank's row, not only the problems
      --help            print this help and exit
      --version         print the version and exit

Exit status: 0 answered, 1 no answer, 2 bad usage.
";

struct Opts {
    host: Option<String>,
    port: Option<String>,
    addr: Option<String>,
    json: bool,
    verbose: bool,
    timeout: Duration,
}

fn parse(args: &[String]) -> Result<Option<Opts>, String> {
    let mut o = Opts {
        host: None,
        port: None,
        addr: None,
        json: false,
        verbose: false,
        timeout: Duration::from_secs(5),
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a, None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            if let Some(v) = &inline {
                return Ok(v.clone());
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag {
            "--help" => return Ok(None),
            "--version" => {
                println!("ncclras (nccl-rs) {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "-v" | "--verbose" => o.verbose = true,
            "-a" | "--addr" => o.addr = Some(value(flag)?),
            "-h" | "--host" => o.host = Some(value(flag)?),
            "-p" | "--port" => o.port = Some(value(flag)?),
            "-f" | "--format" => {
                let v = value(flag)?;
                o.json = match v.to_ascii_lowercase().as_str() {
                    "json" => true,
                    "text" => false,
                    _ => return Err(format!("invalid format {v:?} (must be text or json)")),
                };
            }
            "-t" | "--timeout" => {
                let v = value(flag)?;
                let s: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s <= 1e6)
                    .ok_or_else(|| format!("invalid timeout {v:?}"))?;
                o.timeout = match s {
                    0.0 => Duration::from_secs(3600),
                    s => Duration::from_secs_f64(s),
                };
            }
            _ => return Err(format!("unknown option {a:?}")),
        }
        i += 1;
    }
    Ok(Some(o))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ncclras: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let addr = match (&o.addr, &o.host, &o.port) {
        (Some(a), None, None) => a.clone(),
        (Some(_), _, _) => {
            eprintln!("ncclras: --addr excludes --host and --port");
            return ExitCode::from(2);
        }
        (None, h, p) => {
            let default = nccl_rs::Config::from_env()
                .map(|c| c.ras_addr)
                .unwrap_or_else(|_| format!("localhost:{}", nccl_rs::ras::DEFAULT_PORT));
            let (dh, dp) = default
                .rsplit_once(':')
                .map(|(h, p)| (h.to_string(), p.to_string()))
                .unwrap_or((default.clone(), nccl_rs::ras::DEFAULT_PORT.to_string()));
            let host = h.clone().unwrap_or(dh);
            let host = match host.contains(':') && !host.starts_with('[') {
                true => format!("[{host}]"),
                false => host,
            };
            format!("{host}:{}", p.clone().unwrap_or(dp))
        }
    };
    match nccl_rs::ras::client::query(&addr, o.verbose, o.json, o.timeout) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ncclras: {e}");
            ExitCode::from(1)
        }
    }
}

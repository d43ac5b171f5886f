//! Command-line flags (hand-parsed: no argument-parser dependency).

/// Training options.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// `--dataset wine|iris`.
    pub dataset: String,
    /// `--epochs N`.
    pub epochs: usize,
    /// `--batch B`: the *global* batch, split as `B / world` per rank.
    pub batch: usize,
    /// `--lr X`: SGD learning rate.
    pub lr: f32,
    /// `--momentum X`: SGD momentum (0 for plain SGD).
    pub momentum: f32,
    /// `--seed N`: parameter init, data split and per-epoch shuffles.
    pub seed: u64,
    /// `--bucket-bytes N`: gradient bucket cap (DDP's `bucket_cap_mb`).
    pub bucket_bytes: usize,
    /// `--hidden 64,64`: hidden layer widths.
    pub hidden: Vec<usize>,
    /// `--test-fraction X`: held-out share of the dataset.
    pub test_fraction: f64,
    /// `--dump-params PATH`: final parameters as raw little-endian `f32`;
    /// `{rank}` in PATH is replaced by the rank, else only rank 0 writes.
    pub dump_params: Option<String>,
    /// `--log-json PATH`: one JSON object per epoch (rank 0).
    pub log_json: Option<String>,
    /// `--progress auto|always|never`: the in-place progress bar on stderr.
    pub progress: Progress,
}

/// When rank 0 draws the progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// When stderr is a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            dataset: "wine".into(),
            epochs: 30,
            batch: 64,
            lr: 0.01,
            momentum: 0.9,
            seed: 1,
            bucket_bytes: 25 << 20,
            hidden: vec![64, 64],
            test_fraction: 0.2,
            dump_params: None,
            log_json: None,
            progress: Progress::Auto,
        }
    }
}

/// The help text.
pub const USAGE: &str = "\
ddp_train: data-parallel MLP training over nccl-rs (PyTorch DDP style)

usage: ncclrun -n 4 ddp_train [flags]     (or torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT;
       ddp_train [flags]                   without them it runs as a single process)

  --dataset wine|iris     embedded UCI dataset (default wine: red wine quality, 6 classes)
  --epochs N              default 30
  --batch B               global batch, must divide by the number of ranks (default 64)
  --lr X                  SGD learning rate (default 0.01)
  --momentum X            SGD momentum (default 0.9)
  --seed N                init, split and shuffle seed (default 1)
  --bucket-bytes N        gradient bucket cap in bytes (default 26214400 = 25 MiB)
  --hidden A,B,...        hidden layer widths (default 64,64)
  --test-fraction X       held-out share (default 0.2)
  --dump-params PATH      write final parameters as raw f32 LE; {rank} in PATH -> rank
  --log-json PATH         per-epoch JSON lines (rank 0)
  --progress auto|always|never   progress bar on stderr (default auto: when a terminal)
";

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: bad value '{v}'"))
}

impl Args {
    /// Parses flags (`--flag value` or `--flag=value`). `Err("")` asks for help.
    pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
        let mut a = Args::default();
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            if flag == "-h" || flag == "--help" {
                return Err(String::new());
            }
            let v = match inline {
                Some(v) => v,
                None => it
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value (or unknown flag)"))?,
            };
            match flag.as_str() {
                "--dataset" => a.dataset = v,
                "--epochs" => a.epochs = num(&flag, &v)?,
                "--batch" => a.batch = num(&flag, &v)?,
                "--lr" => a.lr = num(&flag, &v)?,
                "--momentum" => a.momentum = num(&flag, &v)?,
                "--seed" => a.seed = num(&flag, &v)?,
                "--bucket-bytes" => a.bucket_bytes = num(&flag, &v)?,
                "--hidden" => {
                    a.hidden = v
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(|s| num(&flag, s))
                        .collect::<Result<_, _>>()?
                }
                "--test-fraction" => a.test_fraction = num(&flag, &v)?,
                "--dump-params" => a.dump_params = Some(v),
                "--log-json" => a.log_json = Some(v),
                "--progress" => {
                    a.progress = match v.as_str() {
                        "auto" => Progress::Auto,
                        "always" => Progress::Always,
                        "never" => Progress::Never,
                        _ => return Err(format!("--progress: bad value '{v}'")),
                    }
                }
                _ => return Err(format!("unknown flag '{flag}'")),
            }
        }
        if a.batch == 0 || a.hidden.contains(&0) || !(0.0..1.0).contains(&a.test_fraction) {
            return Err(
                "--batch and --hidden widths must be positive, --test-fraction in [0, 1)".into(),
            );
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, String> {
        Args::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn flags() {
        assert_eq!(p("").unwrap(), Args::default());
        let a = p("--epochs 3 --batch=32 --lr 0.1 --bucket-bytes 64 --hidden 8,4 --dataset iris --progress never").unwrap();
        assert_eq!(
            (a.epochs, a.batch, a.lr, a.bucket_bytes, a.hidden, a.dataset),
            (3, 32, 0.1, 64, vec![8, 4], "iris".into())
        );
        assert_eq!(a.progress, Progress::Never);
        assert_eq!(p("--help"), Err(String::new()));
        assert!(p("--epochs").is_err());
        assert!(p("--bogus 1").is_err());
        assert!(p("--batch 0").is_err());
    }
}

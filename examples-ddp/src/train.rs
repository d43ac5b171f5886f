//! The training loop: shard, forward, backward with overlapped bucket
//! all-reduces, SGD step; identical on every rank but for the shard.

use crate::args::{Args, Progress};
use crate::data::{self, Table};
use crate::ddp::{CommStats, Reducer};
use crate::mlp::Mlp;
use crate::report::{Bar, EpochStats};
use crate::rng::Rng;
use nccl_rs::launch::LaunchEnv;
use nccl_rs::{Communicator, Config, RedOp, UniqueId};
use std::io::Write;
use std::time::Instant;

/// Any error of a training run.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a run produced (on every rank).
#[derive(Clone, Debug)]
pub struct Outcome {
    /// This process's rank and the world size.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// Per-epoch results (the test metrics are computed on rank 0 only;
    /// other ranks report NaN there).
    pub epochs: Vec<EpochStats>,
    /// The final parameters (bit-identical on every rank).
    pub params: Vec<f32>,
}

/// Joins the job a launcher (`ncclrun`, torchrun-style variables, mpirun,
/// srun) described; without one, a single-process communicator.
pub fn connect() -> nccl_rs::Result<Communicator> {
    let mut cfg = Config::from_env()?;
    if LaunchEnv::detect().is_some() {
        return Communicator::init_from_env(&cfg);
    }
    if cfg.socket_ifname.is_none() && cfg.comm_id.is_none() {
        cfg.socket_ifname = Some("lo".into()); // one process: stay on loopback
    }
    let id = UniqueId::new(&cfg).map_err(|source| nccl_rs::Error::Bootstrap { rank: 0, source })?;
    Communicator::init(&id, 1, 0, &cfg)
}

/// This rank's share of global batch `k` of the epoch's permutation:
/// samples `k*B + rank`, `k*B + rank + world`, ... (`B / world` of them).
pub fn shard(perm: &[usize], k: usize, batch: usize, rank: usize, world: usize) -> Vec<usize> {
    perm[k * batch..(k + 1) * batch]
        .iter()
        .skip(rank)
        .step_by(world)
        .copied()
        .collect()
}

fn gather(t: &Table, idx: &[usize]) -> (Vec<f32>, Vec<usize>) {
    (
        idx.iter().flat_map(|&i| t.row(i).iter().copied()).collect(),
        idx.iter().map(|&i| t.y[i]).collect(),
    )
}

fn evaluate(mlp: &Mlp, params: &[f32], t: &Table) -> (f64, f64) {
    if t.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let (loss, correct, _) = mlp.loss(&mlp.forward(params, &t.x, t.len()), &t.y);
    (loss / t.len() as f64, correct as f64 / t.len() as f64)
}

/// SGD with momentum (PyTorch's form: `v = mu*v + g; p -= lr*v`), reading
/// the averaged gradients from the reducer's buckets.
fn sgd(mlp: &Mlp, reducer: &Reducer, params: &mut [f32], velocity: &mut [f32], args: &Args) {
    for (t, &(off, len)) in mlp.tensors().iter().enumerate() {
        let (p, v) = (&mut params[off..off + len], &mut velocity[off..off + len]);
        for ((p, v), g) in p.iter_mut().zip(v).zip(reducer.grad(t)) {
            *v = args.momentum * *v + g;
            *p -= args.lr * *v;
        }
    }
}

/// Trains on `comm` as `args` says. Rank 0 prints progress and writes the
/// JSON log; ranks write `--dump-params` files.
pub fn train(comm: &mut Communicator, args: &Args) -> Result<Outcome, BoxError> {
    let (rank, world) = (comm.rank(), comm.size());
    if args.batch % world != 0 {
        return Err(format!(
            "--batch {} does not split evenly over {world} ranks",
            args.batch
        )
        .into());
    }
    let split = data::load(&args.dataset, args.test_fraction, args.seed)?;
    let steps = split.train.len() / args.batch; // drop_last, as DistributedSampler + DataLoader(drop_last)
    if steps == 0 {
        return Err(format!(
            "--batch {} exceeds the {} training samples",
            args.batch,
            split.train.len()
        )
        .into());
    }
    let sizes: Vec<usize> = std::iter::once(split.train.features)
        .chain(args.hidden.iter().copied())
        .chain([split.train.classes])
        .collect();
    let mlp = Mlp::new(&sizes);
    let mut params = mlp.init(args.seed);
    comm.broadcast_in_place(&mut params, 0)?; // as DDP's constructor does
    let mut velocity = vec![0.0f32; params.len()];
    let lens: Vec<usize> = mlp.tensors().iter().map(|&(_, l)| l).collect();
    let mut reducer = Reducer::new(&lens, args.bucket_bytes);
    let lead = rank == 0;
    if lead {
        println!(
            "ddp_train: {world} rank(s), dataset {} ({} train / {} test, {} features, {} classes, majority {:.3}), MLP {sizes:?} = {} params",
            args.dataset,
            split.train.len(),
            split.test.len(),
            split.train.features,
            split.train.classes,
            split.test.majority_fraction(),
            mlp.num_params(),
        );
        println!("global batch {} = {} x {world}, {steps} steps/epoch, lr {}, momentum {}, {} gradient bucket(s) of <= {} bytes", args.batch, args.batch / world, args.lr, args.momentum, reducer.num_buckets(), args.bucket_bytes);
    }
    let mut log = match (&args.log_json, lead) {
        (Some(p), true) => {
            Some(std::fs::File::create(p).map_err(|e| format!("--log-json {p}: {e}"))?)
        }
        _ => None,
    };
    let mut bar = Bar::new(match args.progress {
        _ if !lead => Some(false),
        Progress::Auto => None,
        Progress::Always => Some(true),
        Progress::Never => Some(false),
    });
    let mut epochs = Vec::with_capacity(args.epochs);
    for epoch in 1..=args.epochs {
        let t0 = Instant::now();
        let mut perm: Vec<usize> = (0..split.train.len()).collect();
        Rng::new(args.seed, epoch as u64).shuffle(&mut perm);
        let (mut loss_sum, mut correct) = (0.0f64, 0usize);
        let mut comm_stats = CommStats::default();
        for k in 0..steps {
            let (x, y) = gather(&split.train, &shard(&perm, k, args.batch, rank, world));
            let acts = mlp.forward(&params, &x, y.len());
            let (loss, ok, delta) = mlp.loss(&acts, &y);
            loss_sum += loss;
            correct += ok;
            let mut step = reducer.step(comm);
            mlp.backward(&params, &acts, delta, &mut step)?;
            let s = step.finish()?;
            comm_stats.add(s);
            sgd(&mlp, &reducer, &mut params, &mut velocity, args);
            bar.draw(
                epoch,
                args.epochs,
                k + 1,
                steps,
                loss_sum / ((k + 1) * y.len()) as f64,
            );
        }
        let mut global = [loss_sum, correct as f64];
        comm.all_reduce_in_place(&mut global, RedOp::Sum)?;
        let secs = t0.elapsed().as_secs_f64();
        let seen = (steps * args.batch) as f64;
        let (test_loss, test_acc) = if lead {
            evaluate(&mlp, &params, &split.test)
        } else {
            (f64::NAN, f64::NAN)
        };
        let stats = EpochStats {
            epoch,
            train_loss: global[0] / seen,
            train_acc: global[1] / seen,
            test_loss,
            test_acc,
            secs,
            samples_per_s: seen / secs,
            buckets: (comm_stats.buckets, comm_stats.overlapped),
            wait_secs: comm_stats.wait.as_secs_f64(),
        };
        if lead {
            bar.clear();
            println!("{}", stats.line(args.epochs));
            if let Some(f) = &mut log {
                writeln!(f, "{}", stats.to_json(world))?;
                f.flush()?;
            }
        }
        epochs.push(stats);
    }
    if let Some(p) = &args.dump_params {
        dump_params(p, rank, lead, &params)?;
    }
    Ok(Outcome {
        rank,
        world,
        epochs,
        params,
    })
}

/// Writes `params` as little-endian f32 to `pattern`, `{rank}` replaced by
/// the rank; a pattern without `{rank}` is written by the lead rank only.
pub fn dump_params(pattern: &str, rank: usize, lead: bool, params: &[f32]) -> Result<(), BoxError> {
    if pattern.contains("{rank}") || lead {
        let path = pattern.replace("{rank}", &rank.to_string());
        let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&path, bytes).map_err(|e| format!("--dump-params {path}: {e}"))?;
    }
    Ok(())
}

/// The whole program: parse `argv` (without the program name), connect,
/// train. Returns the process exit code.
pub fn main_with_args(argv: impl IntoIterator<Item = String>) -> std::process::ExitCode {
    run_main("ddp_train", crate::args::USAGE, Args::parse(argv), train)
}

/// A training program's `main` around `parsed` (its options, or an error;
/// an empty error asks for `usage`): connects, runs `train`, and maps the
/// outcome to an exit code (2 for bad options), errors on stderr after
/// `name`.
pub fn run_main<O, R>(
    name: &str,
    usage: &str,
    parsed: Result<O, String>,
    train: impl FnOnce(&mut Communicator, &O) -> Result<R, BoxError>,
) -> std::process::ExitCode {
    let opts = match parsed {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            print!("{usage}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("{name}: {e}\n\n{usage}");
            return std::process::ExitCode::from(2);
        }
    };
    nccl_rs::init_logging();
    let result = connect()
        .map_err(BoxError::from)
        .and_then(|mut comm| train(&mut comm, &opts));
    match result {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shard;

    #[test]
    fn shards_partition_each_global_batch() {
        let perm: Vec<usize> = (100..112).collect();
        let parts: Vec<Vec<usize>> = (0..4).map(|r| shard(&perm, 1, 6, r, 4)).collect();
        assert_eq!(parts[0], vec![106, 110]);
        assert_eq!(parts[3], vec![109]);
        let parts: Vec<Vec<usize>> = (0..3).map(|r| shard(&perm, 1, 6, r, 3)).collect();
        assert_eq!(parts.concat().len(), 6);
        assert!(parts.iter().all(|p| p.len() == 2));
    }
}

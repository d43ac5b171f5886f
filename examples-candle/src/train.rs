//! Flags and the training loop: shard, candle forward and backward, bucketed
//! async all-reduce of the `GradStore`, optimizer step; identical on every
//! rank but for the shard.

use crate::model::{hash_params, Mlp};
use crate::optim::{Optim, OptimKind};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::VarMap;
use nccl_ddp::args::{Args, Progress};
use nccl_ddp::data::{self, Table};
use nccl_ddp::ddp::{CommStats, Reducer};
use nccl_ddp::mlp::GradSink;
use nccl_ddp::report::{Bar, EpochStats};
use nccl_ddp::rng::Rng;
use nccl_ddp::train::{shard, BoxError, Outcome};
use nccl_rs::{Communicator, RedOp};
use std::io::Write;
use std::time::Instant;

/// The program's options: `ddp_train`'s flags plus the optimizer's.
#[derive(Clone, Debug, PartialEq)]
pub struct Opts {
    /// The flags shared with `ddp_train` (dataset, epochs, global batch, lr,
    /// momentum, seed, bucket cap, hidden widths, outputs).
    pub base: Args,
    /// `--optim adamw|sgd`.
    pub optim: OptimKind,
    /// `--weight-decay X` (AdamW's decoupled weight decay).
    pub weight_decay: f64,
}

/// The help text.
pub const USAGE: &str = "\
candle_ddp: data-parallel training of a candle-nn MLP over nccl-rs (PyTorch DDP style)

usage: ncclrun -n 4 candle_ddp [flags]    (or torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT;
       candle_ddp [flags]                  without them it runs as a single process)

  --optim adamw|sgd       candle-nn's AdamW (default) or SGD with momentum
  --weight-decay X        AdamW weight decay (default 0.01)
and every flag of ddp_train:
";

impl Opts {
    /// Parses flags (`--flag value` or `--flag=value`). `Err("")` asks for help.
    pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Opts, String> {
        let (mut optim, mut weight_decay) = (OptimKind::AdamW, 0.01f64);
        let mut rest = Vec::new();
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            if flag != "--optim" && flag != "--weight-decay" {
                rest.push(arg);
                continue;
            }
            let v = match inline {
                Some(v) => v,
                None => it.next().ok_or_else(|| format!("{flag} needs a value"))?,
            };
            if flag == "--optim" {
                optim = v.parse()?;
            } else {
                weight_decay = v
                    .parse()
                    .ok()
                    .filter(|w: &f64| w.is_finite() && *w >= 0.0)
                    .ok_or_else(|| format!("--weight-decay: bad value '{v}'"))?;
            }
        }
        Ok(Opts {
            base: Args::parse(rest)?,
            optim,
            weight_decay,
        })
    }
}

fn tensors(t: &Table, idx: &[usize], dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let x: Vec<f32> = idx.iter().flat_map(|&i| t.row(i).iter().copied()).collect();
    let y: Vec<u32> = idx.iter().map(|&i| t.y[i] as u32).collect();
    Ok((
        Tensor::from_vec(x, (idx.len(), t.features), dev)?,
        Tensor::from_vec(y, idx.len(), dev)?,
    ))
}

/// Mean cross-entropy and the number of correct argmax predictions.
fn loss_and_correct(logits: &Tensor, y: &Tensor) -> candle_core::Result<(Tensor, usize)> {
    let loss = candle_nn::loss::cross_entropy(logits, y)?;
    let correct = logits
        .argmax(1)?
        .eq(y)?
        .to_dtype(DType::U32)?
        .sum_all()?
        .to_scalar::<u32>()?;
    Ok((loss, correct as usize))
}

fn evaluate(mlp: &Mlp, t: &Table, dev: &Device) -> Result<(f64, f64), BoxError> {
    if t.is_empty() {
        return Ok((f64::NAN, f64::NAN));
    }
    let all: Vec<usize> = (0..t.len()).collect();
    let (x, y) = tensors(t, &all, dev)?;
    let (loss, correct) = loss_and_correct(&mlp.forward(&x)?, &y)?;
    Ok((
        f64::from(loss.to_scalar::<f32>()?),
        correct as f64 / t.len() as f64,
    ))
}

/// One training step's communication: the gradients of `grads` are copied
/// into the reducer's buckets in reverse parameter order, each bucket's
/// `all_reduce_async(.., Avg)` starting as soon as its last gradient is in
/// (so it runs while the next buckets are filled); then every bucket is
/// waited for and the averaged gradients replace the local ones in `grads`.
pub fn all_reduce_grads(
    mlp: &Mlp,
    grads: &mut candle_core::backprop::GradStore,
    reducer: &mut Reducer,
    comm: &mut Communicator,
) -> Result<CommStats, BoxError> {
    let params = mlp.params();
    let mut step = reducer.step(comm);
    for (t, (name, var)) in params.iter().enumerate().rev() {
        let g = grads
            .get(var.as_tensor())
            .ok_or_else(|| format!("backward gave no gradient for {name}"))?;
        step.grad_mut(t)
            .copy_from_slice(&g.flatten_all()?.to_vec1::<f32>()?);
        step.ready(t)?;
    }
    let stats = step.finish()?;
    for (t, (_, var)) in params.iter().enumerate() {
        let avg = Tensor::from_slice(reducer.grad(t), var.shape(), var.device())?;
        let _local = grads.insert(var.as_tensor(), avg);
    }
    Ok(stats)
}

/// Trains on `comm` as `opts` says. Rank 0 prints progress and writes the
/// JSON log; ranks write `--dump-params` files. Fails if the ranks' final
/// parameters are not bit-identical.
pub fn train(comm: &mut Communicator, opts: &Opts) -> Result<Outcome, BoxError> {
    let args = &opts.base;
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
    let dev = Device::Cpu;
    let sizes: Vec<usize> = std::iter::once(split.train.features)
        .chain(args.hidden.iter().copied())
        .chain([split.train.classes])
        .collect();
    let varmap = VarMap::new();
    let mlp = Mlp::new(&sizes, args.seed, &varmap, &dev)?;
    // As DDP's constructor does: rank 0's parameters win.
    let mut flat = mlp.flatten()?;
    comm.broadcast_in_place(&mut flat, 0)?;
    mlp.load_flat(&flat)?;
    let vars: Vec<_> = mlp.params().iter().map(|(_, v)| v.clone()).collect();
    let mut opt = Optim::new(
        opts.optim,
        vars,
        f64::from(args.lr),
        f64::from(args.momentum),
        opts.weight_decay,
    )?;
    let lens: Vec<usize> = mlp.params().iter().map(|(_, v)| v.elem_count()).collect();
    let mut reducer = Reducer::new(&lens, args.bucket_bytes);
    let lead = rank == 0;
    if lead {
        let optim = match opts.optim {
            OptimKind::AdamW => format!(
                "candle-nn AdamW (lr {}, weight decay {})",
                args.lr, opts.weight_decay
            ),
            OptimKind::Sgd => format!("SGD (lr {}, momentum {})", args.lr, args.momentum),
        };
        println!(
            "candle_ddp: {world} rank(s), dataset {} ({} train / {} test, {} features, {} classes, majority {:.3}), candle-nn MLP {sizes:?} = {} params",
            args.dataset,
            split.train.len(),
            split.test.len(),
            split.train.features,
            split.train.classes,
            split.test.majority_fraction(),
            mlp.num_params(),
        );
        println!(
            "global batch {} = {} x {world}, {steps} steps/epoch, {optim}, {} gradient bucket(s) of <= {} bytes",
            args.batch,
            args.batch / world,
            reducer.num_buckets(),
            args.bucket_bytes
        );
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
            let idx = shard(&perm, k, args.batch, rank, world);
            let (x, y) = tensors(&split.train, &idx, &dev)?;
            let (loss, ok) = loss_and_correct(&mlp.forward(&x)?, &y)?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?) * idx.len() as f64;
            correct += ok;
            let mut grads = loss.backward()?;
            comm_stats.add(all_reduce_grads(&mlp, &mut grads, &mut reducer, comm)?);
            opt.step(&grads)?;
            bar.draw(
                epoch,
                args.epochs,
                k + 1,
                steps,
                loss_sum / ((k + 1) * idx.len()) as f64,
            );
        }
        let mut global = [loss_sum, correct as f64];
        comm.all_reduce_in_place(&mut global, RedOp::Sum)?;
        let secs = t0.elapsed().as_secs_f64();
        let seen = (steps * args.batch) as f64;
        let (test_loss, test_acc) = if lead {
            evaluate(&mlp, &split.test, &dev)?
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
    let params = mlp.flatten()?;
    let hash = hash_params(&params);
    let mut hashes = vec![0u64; world];
    comm.all_gather(&[hash], &mut hashes)?;
    if hashes.iter().any(|&h| h != hash) {
        return Err(format!("final parameters differ across ranks: hashes {hashes:016x?}").into());
    }
    if lead {
        println!("final parameters: hash {hash:016x}, identical on all {world} rank(s)");
    }
    if let Some(p) = &args.dump_params {
        nccl_ddp::train::dump_params(p, rank, lead, &params)?;
    }
    Ok(Outcome {
        rank,
        world,
        epochs,
        params,
    })
}

/// The whole program: parse `argv` (without the program name), connect,
/// train. Returns the process exit code.
pub fn main_with_args(argv: impl IntoIterator<Item = String>) -> std::process::ExitCode {
    let usage = format!("{USAGE}{}", nccl_ddp::args::USAGE);
    nccl_ddp::train::run_main("candle_ddp", &usage, Opts::parse(argv), train)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Opts, String> {
        Opts::parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn flags() {
        let d = p("").unwrap();
        assert_eq!(
            (d.optim, d.weight_decay, d.base),
            (OptimKind::AdamW, 0.01, Args::default())
        );
        let o = p("--epochs 3 --optim sgd --weight-decay=0 --batch=32").unwrap();
        assert_eq!(
            (o.optim, o.weight_decay, o.base.epochs, o.base.batch),
            (OptimKind::Sgd, 0.0, 3, 32)
        );
        assert_eq!(p("--help"), Err(String::new()));
        assert!(p("--optim").is_err());
        assert!(p("--optim adam").is_err());
        assert!(p("--weight-decay -1").is_err());
        assert!(p("--bogus 1").is_err());
    }
}

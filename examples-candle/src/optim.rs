//! The optimizers: candle-nn's `AdamW` as it ships, and SGD with momentum
//! (candle-nn's `SGD` has none) in PyTorch's form, both behind
//! [`candle_nn::Optimizer`], so the training loop hands either the
//! all-reduced [`GradStore`].

use candle_core::backprop::GradStore;
use candle_core::{Result, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};

/// SGD with momentum as `torch.optim.SGD` computes it (dampening 0, no
/// Nesterov, no weight decay): `v = momentum * v + g; p = p - lr * v`.
#[derive(Debug)]
pub struct SgdMomentum {
    vars: Vec<(Var, Var)>,
    cfg: SgdConfig,
}

/// [`SgdMomentum`]'s settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// The learning rate.
    pub lr: f64,
    /// The momentum (0: plain SGD).
    pub momentum: f64,
}

impl Optimizer for SgdMomentum {
    type Config = SgdConfig;

    fn new(vars: Vec<Var>, cfg: SgdConfig) -> Result<Self> {
        let vars = vars
            .into_iter()
            .filter(|v| v.dtype().is_float())
            .map(|v| {
                let velocity = Var::zeros(v.shape(), v.dtype(), v.device())?;
                Ok((v, velocity))
            })
            .collect::<Result<_>>()?;
        Ok(SgdMomentum { vars, cfg })
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        for (var, velocity) in &self.vars {
            if let Some(g) = grads.get(var) {
                let v = ((velocity.as_tensor() * self.cfg.momentum)? + g)?;
                var.set(&(var.as_tensor() - (&v * self.cfg.lr)?)?)?;
                velocity.set(&v)?;
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.cfg.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }
}

/// Which optimizer `--optim` picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimKind {
    /// candle-nn's `AdamW`.
    AdamW,
    /// [`SgdMomentum`].
    Sgd,
}

impl std::str::FromStr for OptimKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "adamw" => Ok(OptimKind::AdamW),
            "sgd" => Ok(OptimKind::Sgd),
            _ => Err(format!("--optim: bad value '{s}' (adamw or sgd)")),
        }
    }
}

/// Either optimizer.
#[derive(Debug)]
pub enum Optim {
    /// candle-nn's `AdamW`.
    AdamW(AdamW),
    /// SGD with momentum.
    Sgd(SgdMomentum),
}

impl Optim {
    /// `kind` over `vars` with learning rate `lr`; `momentum` for SGD,
    /// `weight_decay` for AdamW (its other settings are candle-nn's
    /// defaults, which are PyTorch's).
    pub fn new(
        kind: OptimKind,
        vars: Vec<Var>,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    ) -> Result<Optim> {
        Ok(match kind {
            OptimKind::AdamW => Optim::AdamW(AdamW::new(
                vars,
                ParamsAdamW {
                    lr,
                    weight_decay,
                    ..ParamsAdamW::default()
                },
            )?),
            OptimKind::Sgd => Optim::Sgd(SgdMomentum::new(vars, SgdConfig { lr, momentum })?),
        })
    }

    /// One update from `grads`.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            Optim::AdamW(o) => o.step(grads),
            Optim::Sgd(o) => o.step(grads),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn sgd_momentum_matches_the_pytorch_recurrence() {
        let dev = Device::Cpu;
        let p = Var::new(&[1.0f32, -2.0], &dev).unwrap();
        let mut opt = SgdMomentum::new(
            vec![p.clone()],
            SgdConfig {
                lr: 0.5,
                momentum: 0.5,
            },
        )
        .unwrap();
        // loss = sum(p^2) / 2: g = p. Exact in binary floating point:
        // step 1: v = [1, -2], p = [0.5, -1]
        // step 2: v = [0.5, -1] + [0.5, -1] = [1, -2], p = [0, 0]
        for want in [[0.5f32, -1.0], [0.0, 0.0]] {
            let loss = (p.as_tensor().sqr().unwrap().sum_all().unwrap() * 0.5).unwrap();
            opt.backward_step(&loss).unwrap();
            assert_eq!(p.as_tensor().to_vec1::<f32>().unwrap(), want);
        }
        // A store without a gradient for p (only for another variable).
        let other = Var::new(&[3.0f32], &dev).unwrap();
        let unrelated = other.as_tensor().sum_all().unwrap().backward().unwrap();
        opt.step(&unrelated).unwrap();
        assert_eq!(
            p.as_tensor().to_vec1::<f32>().unwrap(),
            [0.0, 0.0],
            "no gradient, no update"
        );
        assert_eq!("adamw".parse(), Ok(OptimKind::AdamW));
        assert!("adam".parse::<OptimKind>().is_err());
    }
}

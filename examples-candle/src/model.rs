//! The model: an MLP of `candle_nn::Linear` layers with ReLU between them,
//! its parameters in a [`VarMap`], listed in forward order.
//!
//! A `VarMap` is a hash map, so its own order is not the same on every rank;
//! everything that flattens parameters (the broadcast, the gradient buckets,
//! the final hash) goes through [`Mlp::params`], whose order is the layers'.

use candle_core::{DType, Device, Module, Result, Tensor, Var};
use candle_nn::{Linear, VarBuilder, VarMap};
use nccl_ddp::rng::Rng;

/// The network and its named parameters.
pub struct Mlp {
    layers: Vec<Linear>,
    params: Vec<(String, Var)>,
    sizes: Vec<usize>,
}

impl Mlp {
    /// Layers `sizes[0] -> sizes[1] -> ... -> sizes[last]` (`l{i}.weight`,
    /// `l{i}.bias` in `varmap`), initialised from `seed` as PyTorch's
    /// `nn.Linear` is: weights and biases uniform in `±1/sqrt(fan_in)`.
    ///
    /// candle's own initialisers draw from an unseeded CPU generator
    /// (`Device::Cpu.set_seed` is an error), so the values are drawn here
    /// from a seeded one: a single process and every rank of a job start
    /// from the same parameters.
    pub fn new(sizes: &[usize], seed: u64, varmap: &VarMap, dev: &Device) -> Result<Mlp> {
        if sizes.len() < 2 {
            candle_core::bail!("an MLP needs at least an input and an output size");
        }
        let vb = VarBuilder::from_varmap(varmap, DType::F32, dev);
        let mut layers = Vec::new();
        for (i, w) in sizes.windows(2).enumerate() {
            layers.push(candle_nn::linear(w[0], w[1], vb.pp(format!("l{i}")))?);
        }
        let params = {
            let map = varmap
                .data()
                .lock()
                .map_err(|_| candle_core::Error::Msg("VarMap lock poisoned".into()))?;
            let mut params = Vec::new();
            for i in 0..layers.len() {
                for kind in ["weight", "bias"] {
                    let name = format!("l{i}.{kind}");
                    let var = map.get(&name).ok_or_else(|| {
                        candle_core::Error::Msg(format!("no {name} in the VarMap"))
                    })?;
                    params.push((name, var.clone()));
                }
            }
            params
        };
        let mlp = Mlp {
            layers,
            params,
            sizes: sizes.to_vec(),
        };
        mlp.init(seed)?;
        Ok(mlp)
    }

    fn init(&self, seed: u64) -> Result<()> {
        let mut rng = Rng::new(seed, 0x1417);
        for (i, pair) in self.params.chunks(2).enumerate() {
            let bound = 1.0 / (self.sizes[i] as f64).sqrt();
            for (_, var) in pair {
                let n = var.elem_count();
                let v: Vec<f32> = (0..n)
                    .map(|_| ((2.0 * rng.uniform() - 1.0) * bound) as f32)
                    .collect();
                var.set(&Tensor::from_vec(v, var.shape(), var.device())?)?;
            }
        }
        Ok(())
    }

    /// The parameters in forward order: `l0.weight`, `l0.bias`, `l1.weight`, ...
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The layer sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// All parameters, concatenated in [`params`](Mlp::params) order.
    pub fn flatten(&self) -> Result<Vec<f32>> {
        let mut flat = Vec::with_capacity(self.num_params());
        for (_, var) in &self.params {
            flat.extend(var.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(flat)
    }

    /// Sets every parameter from a vector laid out as [`flatten`](Mlp::flatten)'s.
    pub fn load_flat(&self, flat: &[f32]) -> Result<()> {
        if flat.len() != self.num_params() {
            candle_core::bail!("{} values for {} parameters", flat.len(), self.num_params());
        }
        let mut at = 0;
        for (_, var) in &self.params {
            let n = var.elem_count();
            var.set(&Tensor::from_slice(
                &flat[at..at + n],
                var.shape(),
                var.device(),
            )?)?;
            at += n;
        }
        Ok(())
    }
}

impl Module for Mlp {
    /// Logits for a `batch × sizes[0]` input.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

/// FNV-1a (64-bit) over the parameters' bit patterns: equal hashes on two
/// ranks mean bit-identical parameters (barring a collision).
pub fn hash_params(flat: &[f32]) -> u64 {
    flat.iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_in_forward_order_and_seeded() {
        let dev = Device::Cpu;
        let (a, b) = (VarMap::new(), VarMap::new());
        let m = Mlp::new(&[4, 8, 3], 7, &a, &dev).unwrap();
        let names: Vec<&str> = m.params().iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["l0.weight", "l0.bias", "l1.weight", "l1.bias"]);
        assert_eq!(m.num_params(), 4 * 8 + 8 + 8 * 3 + 3);
        let flat = m.flatten().unwrap();
        let same = Mlp::new(&[4, 8, 3], 7, &b, &dev).unwrap();
        assert_eq!(same.flatten().unwrap(), flat, "same seed, same parameters");
        assert!(flat.iter().take(32).all(|v| v.abs() <= 0.5), "±1/sqrt(4)");
        let other = Mlp::new(&[4, 8, 3], 8, &VarMap::new(), &dev).unwrap();
        assert_ne!(other.flatten().unwrap(), flat);
        // load_flat writes through to the VarMap's variables.
        let ramp: Vec<f32> = (0..flat.len()).map(|i| i as f32).collect();
        m.load_flat(&ramp).unwrap();
        assert_eq!(m.flatten().unwrap(), ramp);
        let w1 = a.data().lock().unwrap()["l1.weight"].as_tensor().clone();
        assert_eq!(w1.dims(), [3, 8]);
        assert_eq!(w1.flatten_all().unwrap().to_vec1::<f32>().unwrap()[0], 40.0);
        assert!(m.load_flat(&ramp[1..]).is_err());
    }

    #[test]
    fn forward_is_linear_relu_linear() {
        let m = Mlp::new(&[2, 2, 1], 1, &VarMap::new(), &Device::Cpu).unwrap();
        // W0 = [[1, -1], [2, 0]], b0 = [0, -1], W1 = [[1, 1]], b1 = [0.5]
        m.load_flat(&[1.0, -1.0, 2.0, 0.0, 0.0, -1.0, 1.0, 1.0, 0.5])
            .unwrap();
        let x = Tensor::new(&[[1.0f32, 3.0], [2.0, 1.0]], &Device::Cpu).unwrap();
        let y = m.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        // row 0: h = relu([-2, 1]) = [0, 1] -> 1.5; row 1: relu([1, 3]) -> 4.5
        assert_eq!(y, vec![vec![1.5], vec![4.5]]);
    }

    #[test]
    fn hash_sees_every_bit() {
        let a = [1.0f32, 2.0, 3.0];
        let mut b = a;
        b[2] = f32::from_bits(b[2].to_bits() ^ 1);
        assert_ne!(hash_params(&a), hash_params(&b));
        assert_ne!(hash_params(&[0.0]), hash_params(&[-0.0]));
        assert_eq!(hash_params(&a), hash_params(&[1.0, 2.0, 3.0]));
    }
}

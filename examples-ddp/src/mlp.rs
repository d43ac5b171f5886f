//! A multilayer perceptron with ReLU hidden layers, a softmax cross-entropy
//! loss and hand-written backpropagation over plain `f32` slices.
//!
//! Backward runs layer by layer from the last, and hands each parameter
//! tensor's gradient to a [`GradSink`] the moment it is final. That hook is
//! what lets the data-parallel reducer start a bucket's all-reduce while the
//! earlier layers are still being differentiated, as PyTorch DDP's autograd
//! hooks do.
//!
//! Parameters live in one flat `Vec<f32>`, tensor after tensor: layer `l`
//! owns tensor `2l` (its weights, `out × in`, row-major) and `2l + 1` (its
//! biases, `out`).

use crate::rng::Rng;

/// Receives gradients during [`Mlp::backward`].
pub trait GradSink {
    /// Where the gradient of `tensor` is to be written (overwritten, not
    /// accumulated); its length is the tensor's.
    fn grad_mut(&mut self, tensor: usize) -> &mut [f32];
    /// The gradient of `tensor` is final.
    fn ready(&mut self, tensor: usize) -> nccl_rs::Result<()>;
}

/// Layer sizes and the parameter layout.
#[derive(Clone, Debug)]
pub struct Mlp {
    sizes: Vec<usize>,
    /// `(offset, len)` of each tensor in the flat parameter vector.
    tensors: Vec<(usize, usize)>,
}

/// Activations of one forward pass: `acts[0]` is the input, `acts[l + 1]`
/// the output of layer `l` (after ReLU for hidden layers; logits last).
#[derive(Debug)]
pub struct Acts {
    acts: Vec<Vec<f32>>,
    n: usize,
}

impl Acts {
    /// The logits, `n × classes`.
    pub fn logits(&self) -> &[f32] {
        self.acts.last().expect("at least the input")
    }
}

impl Mlp {
    /// `sizes = [inputs, hidden..., classes]` (at least two entries).
    pub fn new(sizes: &[usize]) -> Mlp {
        assert!(
            sizes.len() >= 2 && sizes.iter().all(|&s| s > 0),
            "bad layer sizes {sizes:?}"
        );
        let mut tensors = Vec::new();
        let mut off = 0;
        for w in sizes.windows(2) {
            for len in [w[0] * w[1], w[1]] {
                tensors.push((off, len));
                off += len;
            }
        }
        Mlp {
            sizes: sizes.to_vec(),
            tensors,
        }
    }

    /// `(offset, len)` of every parameter tensor, in forward order.
    pub fn tensors(&self) -> &[(usize, usize)] {
        &self.tensors
    }

    /// Total number of parameters.
    pub fn num_params(&self) -> usize {
        self.tensors.last().map_or(0, |&(o, l)| o + l)
    }

    /// Number of layers (weight matrices).
    pub fn layers(&self) -> usize {
        self.sizes.len() - 1
    }

    /// He-normal weights (std `sqrt(2 / fan_in)`), zero biases.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed, 0x1417);
        let mut p = vec![0.0f32; self.num_params()];
        for l in 0..self.layers() {
            let (off, len) = self.tensors[2 * l];
            let sd = (2.0 / self.sizes[l] as f64).sqrt();
            p[off..off + len]
                .iter_mut()
                .for_each(|w| *w = (rng.normal() * sd) as f32);
        }
        p
    }

    fn wb<'p>(&self, params: &'p [f32], l: usize) -> (&'p [f32], &'p [f32]) {
        let ((wo, wl), (bo, bl)) = (self.tensors[2 * l], self.tensors[2 * l + 1]);
        (&params[wo..wo + wl], &params[bo..bo + bl])
    }

    /// Forward pass over `n` samples (`x` is `n × inputs`).
    pub fn forward(&self, params: &[f32], x: &[f32], n: usize) -> Acts {
        assert_eq!(x.len(), n * self.sizes[0]);
        let mut acts = vec![x.to_vec()];
        for l in 0..self.layers() {
            let (inp, out) = (self.sizes[l], self.sizes[l + 1]);
            let (w, b) = self.wb(params, l);
            let a = &acts[l];
            let hidden = l + 1 < self.layers();
            let mut z = vec![0.0f32; n * out];
            for s in 0..n {
                let row = &a[s * inp..(s + 1) * inp];
                for o in 0..out {
                    let dot: f32 = row
                        .iter()
                        .zip(&w[o * inp..(o + 1) * inp])
                        .map(|(x, w)| x * w)
                        .sum();
                    let v = dot + b[o];
                    z[s * out + o] = if hidden { v.max(0.0) } else { v };
                }
            }
            acts.push(z);
        }
        Acts { acts, n }
    }

    /// Softmax cross-entropy of the logits against `labels`: returns the
    /// summed loss, the number of correct argmax predictions, and the
    /// gradient of the *mean* loss with respect to the logits.
    pub fn loss(&self, acts: &Acts, labels: &[usize]) -> (f64, usize, Vec<f32>) {
        let c = *self.sizes.last().expect("sizes");
        let (n, logits) = (acts.n, acts.logits());
        assert_eq!(labels.len(), n);
        let mut delta = vec![0.0f32; n * c];
        let (mut loss, mut correct) = (0.0f64, 0usize);
        for (s, &y) in labels.iter().enumerate() {
            let z = &logits[s * c..(s + 1) * c];
            let (arg, max) =
                z.iter().enumerate().fold(
                    (0, f32::NEG_INFINITY),
                    |m, (i, &v)| if v > m.1 { (i, v) } else { m },
                );
            let sum: f32 = z.iter().map(|&v| (v - max).exp()).sum();
            loss += f64::from(sum.ln() + max - z[y]);
            correct += usize::from(arg == y);
            for (k, d) in delta[s * c..(s + 1) * c].iter_mut().enumerate() {
                let p = (z[k] - max).exp() / sum;
                *d = (p - f32::from(u8::from(k == y))) / n as f32;
            }
        }
        (loss, correct, delta)
    }

    /// Backpropagates `delta` (from [`Mlp::loss`]) through the layers, last
    /// first; each tensor's gradient goes to `sink` and is announced ready
    /// (biases, then weights, per layer) before the next layer is started.
    pub fn backward(
        &self,
        params: &[f32],
        acts: &Acts,
        mut delta: Vec<f32>,
        sink: &mut impl GradSink,
    ) -> nccl_rs::Result<()> {
        let n = acts.n;
        for l in (0..self.layers()).rev() {
            let (inp, out) = (self.sizes[l], self.sizes[l + 1]);
            let a = &acts.acts[l];
            let db = sink.grad_mut(2 * l + 1);
            db.fill(0.0);
            for s in 0..n {
                db.iter_mut()
                    .zip(&delta[s * out..(s + 1) * out])
                    .for_each(|(g, d)| *g += d);
            }
            sink.ready(2 * l + 1)?;
            let dw = sink.grad_mut(2 * l);
            dw.fill(0.0);
            for s in 0..n {
                let row = &a[s * inp..(s + 1) * inp];
                for o in 0..out {
                    let d = delta[s * out + o];
                    dw[o * inp..(o + 1) * inp]
                        .iter_mut()
                        .zip(row)
                        .for_each(|(g, x)| *g += d * x);
                }
            }
            sink.ready(2 * l)?;
            if l > 0 {
                // This is the work a launched bucket's all-reduce overlaps.
                let (w, _) = self.wb(params, l);
                let mut prev = vec![0.0f32; n * inp];
                for s in 0..n {
                    let p = &mut prev[s * inp..(s + 1) * inp];
                    for o in 0..out {
                        let d = delta[s * out + o];
                        p.iter_mut()
                            .zip(&w[o * inp..(o + 1) * inp])
                            .for_each(|(g, w)| *g += d * w);
                    }
                    p.iter_mut()
                        .zip(&a[s * inp..(s + 1) * inp])
                        .for_each(|(g, &x)| {
                            if x <= 0.0 {
                                *g = 0.0
                            }
                        });
                }
                delta = prev;
            }
        }
        Ok(())
    }
}

/// A plain sink: one gradient vector per tensor, no communication.
#[derive(Clone, Debug)]
pub struct Grads(pub Vec<Vec<f32>>);

impl Grads {
    /// Zeroed gradients shaped like `mlp`'s tensors.
    pub fn for_model(mlp: &Mlp) -> Grads {
        Grads(
            mlp.tensors()
                .iter()
                .map(|&(_, len)| vec![0.0; len])
                .collect(),
        )
    }
}

impl GradSink for Grads {
    fn grad_mut(&mut self, tensor: usize) -> &mut [f32] {
        &mut self.0[tensor]
    }
    fn ready(&mut self, _tensor: usize) -> nccl_rs::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_loss(m: &Mlp, p: &[f32], x: &[f32], y: &[usize]) -> f64 {
        m.loss(&m.forward(p, x, y.len()), y).0 / y.len() as f64
    }

    #[test]
    fn gradients_match_finite_differences() {
        let m = Mlp::new(&[3, 5, 4, 3]);
        let p = m.init(3);
        let mut rng = Rng::new(9, 9);
        let x: Vec<f32> = (0..6 * 3).map(|_| rng.normal() as f32).collect();
        let y = [0, 1, 2, 2, 1, 0];
        let acts = m.forward(&p, &x, 6);
        let (_, _, delta) = m.loss(&acts, &y);
        let mut g = Grads::for_model(&m);
        m.backward(&p, &acts, delta, &mut g).unwrap();
        let flat: Vec<f32> = g.0.concat();
        for i in (0..m.num_params()).step_by(3) {
            let (mut hi, mut lo) = (p.clone(), p.clone());
            hi[i] += 1e-2;
            lo[i] -= 1e-2;
            let num = (mean_loss(&m, &hi, &x, &y) - mean_loss(&m, &lo, &x, &y)) / 2e-2;
            assert!(
                (num - f64::from(flat[i])).abs() < 2e-3,
                "param {i}: numeric {num} vs {}",
                flat[i]
            );
        }
    }

    #[test]
    fn layout() {
        let m = Mlp::new(&[4, 8, 3]);
        assert_eq!(m.tensors(), &[(0, 32), (32, 8), (40, 24), (64, 3)]);
        assert_eq!(m.num_params(), 67);
    }
}

//! The datasets: two classic UCI tables that `linfa-datasets` embeds in its
//! crate (gzipped CSV through `include_bytes!`), so nothing is downloaded at
//! run time.
//!
//! - `wine`: red wine quality (Cortez et al. 2009), 1599 samples,
//!   11 physico-chemical features, quality 3..=8 as 6 classes. The majority
//!   class (quality 5) is 681/1599 = 42.6%.
//! - `iris`: Fisher's iris, 150 samples, 4 features, 3 classes (1/3 each).

use crate::rng::Rng;

/// Features (row-major, standardised) and class labels.
#[derive(Clone, Debug)]
pub struct Table {
    /// `n × features` values.
    pub x: Vec<f32>,
    /// `n` labels in `0..classes`.
    pub y: Vec<usize>,
    /// Columns of `x`.
    pub features: usize,
    /// Number of classes.
    pub classes: usize,
}

impl Table {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.x[i * self.features..(i + 1) * self.features]
    }

    fn select(&self, idx: &[usize]) -> Table {
        let x = idx
            .iter()
            .flat_map(|&i| self.row(i).iter().copied())
            .collect();
        let y = idx.iter().map(|&i| self.y[i]).collect();
        Table {
            x,
            y,
            features: self.features,
            classes: self.classes,
        }
    }

    /// The fraction of the most frequent class (the accuracy of always
    /// guessing it).
    pub fn majority_fraction(&self) -> f64 {
        let mut count = vec![0usize; self.classes];
        self.y.iter().for_each(|&c| count[c] += 1);
        *count.iter().max().unwrap_or(&0) as f64 / self.len().max(1) as f64
    }
}

/// A train/test split, standardised with the training split's statistics.
#[derive(Clone, Debug)]
pub struct Split {
    /// Training samples (sharded over the ranks).
    pub train: Table,
    /// Held-out samples (evaluated by rank 0).
    pub test: Table,
}

/// The dataset names [`load`] knows.
pub const DATASETS: [&str; 2] = ["wine", "iris"];

/// Loads `name` (`"wine"` or `"iris"`), holds out `test_fraction` of it (a
/// shuffle seeded by `seed`), and standardises every feature to zero mean and
/// unit variance over the training split. Deterministic: every rank gets the
/// same split.
pub fn load(name: &str, test_fraction: f64, seed: u64) -> Result<Split, String> {
    let ds = match name {
        "wine" => linfa_datasets::winequality(),
        "iris" => linfa_datasets::iris(),
        _ => {
            return Err(format!(
                "unknown dataset '{name}' (known: {})",
                DATASETS.join(", ")
            ))
        }
    };
    let (n, features) = (ds.records.nrows(), ds.records.ncols());
    let x: Vec<f32> = ds.records.iter().map(|&v| v as f32).collect();
    let raw: Vec<usize> = ds.targets.iter().copied().collect();
    let lo = raw.iter().copied().min().unwrap_or(0);
    let y: Vec<usize> = raw.iter().map(|&c| c - lo).collect();
    let classes = y.iter().copied().max().unwrap_or(0) + 1;
    let all = Table {
        x,
        y,
        features,
        classes,
    };

    let mut idx: Vec<usize> = (0..n).collect();
    Rng::new(seed, 0x5EED_DA7A).shuffle(&mut idx);
    let n_test = ((n as f64) * test_fraction).round() as usize;
    let (mut train, mut test) = (all.select(&idx[n_test..]), all.select(&idx[..n_test]));
    standardise(&mut train, &mut test);
    Ok(Split { train, test })
}

fn standardise(train: &mut Table, test: &mut Table) {
    let f = train.features;
    for j in 0..f {
        let col = || train.x.iter().skip(j).step_by(f).map(|&v| v as f64);
        let mean = col().sum::<f64>() / train.len() as f64;
        let var = col().map(|v| (v - mean) * (v - mean)).sum::<f64>() / train.len() as f64;
        let sd = var.sqrt().max(1e-12);
        for t in [&mut *train, &mut *test] {
            t.x.iter_mut()
                .skip(j)
                .step_by(f)
                .for_each(|v| *v = ((*v as f64 - mean) / sd) as f32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_datasets_load_and_split() {
        let w = load("wine", 0.2, 1).unwrap();
        assert_eq!(
            (
                w.train.len() + w.test.len(),
                w.train.features,
                w.train.classes
            ),
            (1599, 11, 6)
        );
        assert_eq!(w.test.len(), 320);
        let i = load("iris", 0.2, 1).unwrap();
        assert_eq!(
            (
                i.train.len(),
                i.test.len(),
                i.train.features,
                i.train.classes
            ),
            (120, 30, 4, 3)
        );
        let mean0 =
            w.train.x.iter().step_by(11).map(|&v| v as f64).sum::<f64>() / w.train.len() as f64;
        assert!(mean0.abs() < 1e-5);
        assert!(load("mnist", 0.2, 1).is_err());
        assert_eq!(
            load("wine", 0.2, 1).unwrap().train.x,
            w.train.x,
            "deterministic"
        );
    }
}

//! Max-min fair sharing of link capacity among flows (progressive
//! filling), and the completion time of a set of flows that start together.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A flow: bytes to move over a path (indices of links).
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    /// Bytes.
    pub bytes: f64,
    /// The links it crosses.
    pub path: Vec<usize>,
}

/// A heap entry: a link's fair share at the time it was pushed.
#[derive(PartialEq)]
struct Share(f64, usize);

impl Eq for Share {}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Share {
    // Smallest share first (BinaryHeap is a max-heap).
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

/// Max-min fair rates (bytes/s) of the flows whose `paths` are given over
/// links of `capacity`: progressive filling. Every flow's rate is limited
/// by some saturated link on which no other flow gets more. A flow with an
/// empty path gets `f64::INFINITY`.
pub fn rates(capacity: &[f64], paths: &[&[usize]]) -> Vec<f64> {
    let mut rate = vec![f64::INFINITY; paths.len()];
    // Per used link: remaining capacity, unfrozen flows, its flows.
    let mut links: std::collections::HashMap<usize, (f64, usize, Vec<usize>)> =
        std::collections::HashMap::new();
    for (f, p) in paths.iter().enumerate() {
        for &l in p.iter() {
            let e = links.entry(l).or_insert((capacity[l], 0, Vec::new()));
            e.1 += 1;
            e.2.push(f);
        }
    }
    let mut heap: BinaryHeap<Share> = links
        .iter()
        .map(|(&l, &(c, n, _))| Share(c / n as f64, l))
        .collect();
    let mut frozen = vec![false; paths.len()];
    while let Some(Share(share, l)) = heap.pop() {
        let (c, n) = {
            let e = &links[&l];
            (e.0, e.1)
        };
        if n == 0 {
            continue;
        }
        let now = c / n as f64;
        if now != share {
            // Stale: the link's share changed since it was pushed.
            heap.push(Share(now, l));
            continue;
        }
        let flows = std::mem::take(&mut links.get_mut(&l).expect("a used link").2);
        for &f in &flows {
            if frozen[f] {
                continue;
            }
            frozen[f] = true;
            rate[f] = share;
            for &m in paths[f].iter() {
                let e = links.get_mut(&m).expect("a used link");
                e.0 = (e.0 - share).max(0.0);
                e.1 -= 1;
                if m != l && e.1 > 0 {
                    heap.push(Share(e.0 / e.1 as f64, m));
                }
            }
        }
    }
    rate
}

/// When each of `flows`, all started at time 0, has moved its bytes:
/// rates are max-min fair among the flows still running and are worked out
/// again each time one finishes. Seconds, per flow.
pub fn completion(capacity: &[f64], flows: &[Flow]) -> Vec<f64> {
    let mut done = vec![0.0; flows.len()];
    let mut left: Vec<f64> = flows.iter().map(|f| f.bytes).collect();
    let mut running: Vec<usize> = (0..flows.len()).filter(|&f| left[f] > 0.0).collect();
    let mut now = 0.0;
    while !running.is_empty() {
        let paths: Vec<&[usize]> = running.iter().map(|&f| &flows[f].path[..]).collect();
        let r = rates(capacity, &paths);
        let dt = running
            .iter()
            .zip(&r)
            .map(|(&f, &r)| left[f] / r)
            .fold(f64::INFINITY, f64::min);
        now += dt;
        let mut still = Vec::with_capacity(running.len());
        for (&f, &r) in running.iter().zip(&r) {
            left[f] -= r * dt;
            // Relative slack: flows due within a rounding error end now.
            if left[f] <= flows[f].bytes * 1e-9 || !left[f].is_finite() {
                done[f] = now;
            } else {
                still.push(f);
            }
        }
        running = still;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_flows_on_one_link_get_half_each() {
        let r = rates(&[10.0], &[&[0], &[0]]);
        assert_eq!(r, vec![5.0, 5.0]);
    }

    #[test]
    fn the_classic_max_min_example() {
        // Links 0 (cap 10) and 1 (cap 4): flow a on 0, b on 0 and 1, c on 1.
        // Link 1 saturates first: b = c = 2; then a takes the rest of 0: 8.
        let r = rates(&[10.0, 4.0], &[&[0], &[0, 1], &[1]]);
        assert_eq!(r, vec![8.0, 2.0, 2.0]);
    }

    #[test]
    fn a_flow_finishing_frees_capacity() {
        // 10 B/s shared by 10 B and 30 B: both at 5 until 2 s, then the
        // second alone at 10 for its remaining 20 B: done at 4 s.
        let f = |b| Flow {
            bytes: b,
            path: vec![0],
        };
        assert_eq!(completion(&[10.0], &[f(10.0), f(30.0)]), vec![2.0, 4.0]);
    }

    #[test]
    fn disjoint_flows_run_at_their_own_links_rates() {
        let r = rates(&[3.0, 7.0], &[&[0], &[1]]);
        assert_eq!(r, vec![3.0, 7.0]);
    }
}

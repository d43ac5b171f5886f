//! The simulator against answers known in closed form, and its shortcuts
//! against the full expansion.
//!
//! Times are sums of floating-point level durations, so results are
//! compared to the formulas within a relative 1e-9 (a few roundings of a
//! 2^-52 ulp each), never with a looser slack.

use fabric_sim::gen::{gbps, LeafSpine, Rails};
use fabric_sim::net::Ecmp;
use fabric_sim::sim::{collective, simulate, Costs, Job, Outcome, Placement, RailUse, Setup};

const RATE_GBPS: f64 = 100.0;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs()
}

/// Costs without latency or overhead: time is bytes over rates.
fn ideal() -> Costs {
    Costs {
        alpha: 0.0,
        goodput: 1.0,
        intra_rate: gbps(10_000.0),
        intra_latency: 0.0,
    }
}

fn fabric(hosts: usize, hpl: usize, oversub: f64, spines: usize) -> LeafSpine {
    LeafSpine {
        hosts,
        rails: 1,
        nic_gbps: RATE_GBPS,
        hosts_per_leaf: hpl,
        spines,
        oversub,
        link_latency: 0.0,
        ..LeafSpine::default()
    }
}

fn run(
    ls: LeafSpine,
    local: usize,
    placement: Placement,
    op: &str,
    bytes: usize,
    setup: &Setup,
) -> Outcome {
    let costs = setup.costs;
    let mut job = Job::new(ls.build().unwrap(), ls.hosts, local, placement, &costs).unwrap();
    let n = job.nranks();
    simulate(&mut job, collective(op, bytes, n).unwrap(), setup).unwrap()
}

fn flat_ring() -> Setup {
    Setup {
        algo: Some("ring".into()),
        ring_by_topology: false,
        costs: ideal(),
        ..Setup::default()
    }
}

#[test]
fn ring_busbw_on_a_non_blocking_fabric_is_the_link_rate() {
    // 8 hosts on 2 leaves, 1:1; the ring crosses the spine twice, each
    // leaf's uplinks carry one flow.
    for op in ["allreduce", "allgather", "reducescatter"] {
        let o = run(
            fabric(8, 4, 1.0, 0),
            1,
            Placement::Block,
            op,
            64 << 20,
            &flat_ring(),
        );
        assert_eq!(o.algorithm, "Ring");
        assert!(
            close(o.busbw, gbps(RATE_GBPS)),
            "{op}: {} vs {}",
            o.busbw,
            gbps(RATE_GBPS)
        );
    }
}

#[test]
fn two_to_one_oversubscription_halves_a_spine_crossing_flat_ring() {
    // One host per leaf: every ring edge crosses an uplink of half the
    // NIC's rate.
    let full = run(
        fabric(8, 1, 1.0, 0),
        1,
        Placement::Block,
        "allreduce",
        64 << 20,
        &flat_ring(),
    );
    let half = run(
        fabric(8, 1, 2.0, 0),
        1,
        Placement::Block,
        "allreduce",
        64 << 20,
        &flat_ring(),
    );
    assert!(close(full.busbw, gbps(RATE_GBPS)));
    assert!(close(half.busbw, gbps(RATE_GBPS) / 2.0), "{}", half.busbw);
    assert!(half.hot[0].link.starts_with("leaf") && half.hot[0].link.contains(">spine"));
    assert!(close(half.hot[0].utilisation, 1.0), "{:?}", half.hot[0]);
}

#[test]
fn a_topology_ordered_ring_does_not_feel_the_oversubscription() {
    // 4 hosts per leaf at 2:1: the ring in topology order sends one flow
    // up each leaf, whose uplink (2 NICs' worth) carries it at full rate.
    let setup = Setup {
        algo: Some("ring".into()),
        costs: ideal(),
        ..Setup::default()
    };
    let o = run(
        fabric(8, 4, 2.0, 1),
        1,
        Placement::Block,
        "allreduce",
        64 << 20,
        &setup,
    );
    assert!(close(o.busbw, gbps(RATE_GBPS)), "{}", o.busbw);
}

#[test]
fn pipelined_messages_by_hand() {
    // 2 hosts on one leaf, an all-gather of 8 MiB in 1 MiB chunks: each
    // rank sends its 4 MiB as 4 chunks, each after receiving the previous
    // one (the engine executes steps in order), so 4 levels of 1 MiB each
    // way, one pattern: 4 × (1 MiB / rate + alpha + the two cables'
    // latency). (The last receive starts no level.)
    let mut ls = fabric(2, 2, 1.0, 0);
    ls.link_latency = 1e-6;
    let setup = Setup {
        costs: Costs {
            alpha: 3e-6,
            ..ideal()
        },
        chunk_bytes: Some(1 << 20),
        ..flat_ring()
    };
    let o = run(ls, 1, Placement::Block, "allgather", 8 << 20, &setup);
    let want = 4.0 * ((1 << 20) as f64 / gbps(RATE_GBPS) + 3e-6 + 2e-6);
    assert!(close(o.time, want), "{} vs {want}", o.time);
    assert_eq!(o.levels, 4);
    assert_eq!(o.patterns, 1);
}

#[test]
fn two_flows_share_one_uplink() {
    // 4 hosts, 2 per leaf, 4:1 (each leaf's uplink carries half a NIC);
    // 2 ranks per host placed round-robin, the ring in rank order: hosts
    // 0,1,2,3,0,1,2,3, so two ring edges leave each leaf, sharing its
    // uplink: each gets a quarter of the NIC's rate.
    let o = run(
        fabric(4, 2, 4.0, 1),
        2,
        Placement::Cyclic,
        "allreduce",
        64 << 20,
        &flat_ring(),
    );
    assert!(close(o.busbw, gbps(RATE_GBPS) / 4.0), "{}", o.busbw);
}

#[test]
fn ecmp_collisions_cost_what_an_even_spread_avoids() {
    // 8 hosts each alone on a leaf with 4 spines (uplinks a quarter of the
    // NIC each, 1:1), 4 ranks per host round-robin, the ring in rank order:
    // 4 flows leave each leaf. Spread puts one on each uplink (a quarter
    // of the rate each); hashing collides somewhere and the ring waits for
    // the slowest.
    let spread = Setup {
        ecmp: Ecmp::Spread,
        ..flat_ring()
    };
    let ideal = run(
        fabric(8, 1, 1.0, 4),
        4,
        Placement::Cyclic,
        "allreduce",
        64 << 20,
        &spread,
    );
    assert!(close(ideal.busbw, gbps(RATE_GBPS) / 4.0), "{}", ideal.busbw);
    let mut worse = 0;
    for seed in 1..=4 {
        let hashed = Setup {
            ecmp: Ecmp::Hash { seed },
            ..flat_ring()
        };
        let o = run(
            fabric(8, 1, 1.0, 4),
            4,
            Placement::Cyclic,
            "allreduce",
            64 << 20,
            &hashed,
        );
        assert!(o.busbw <= ideal.busbw * (1.0 + 1e-9));
        worse += (o.busbw < ideal.busbw * 0.99) as usize;
    }
    assert!(
        worse > 0,
        "hashing 32 flows onto 4 uplinks per leaf never collided"
    );
}

/// The symmetric shortcut gives the same answer as expanding every rank.
#[test]
fn symmetric_shortcut_equals_full_expansion() {
    let ls = LeafSpine {
        hosts: 8,
        rails: 2,
        nic_gbps: RATE_GBPS,
        hosts_per_leaf: 2,
        oversub: 2.0,
        rails_layout: Rails::Optimized,
        link_latency: 0.7e-6,
        ..LeafSpine::default()
    };
    let base = Setup {
        costs: Costs {
            alpha: 2e-6,
            intra_rate: gbps(800.0),
            ..ideal()
        },
        ..Setup::default()
    };
    for placement in [Placement::Block, Placement::Cyclic] {
        for algo in ["ring", "hier"] {
            for op in ["allreduce", "allgather", "reducescatter"] {
                for rails in [RailUse::Stripe, RailUse::Affinity] {
                    let s = Setup {
                        algo: Some(algo.into()),
                        rails,
                        ..base.clone()
                    };
                    let sym = run(ls.clone(), 4, placement, op, 3 << 20, &s);
                    let full = run(
                        ls.clone(),
                        4,
                        placement,
                        op,
                        3 << 20,
                        &Setup {
                            symmetric: false,
                            ..s
                        },
                    );
                    let what = format!("{placement:?} {algo} {op} {rails:?}");
                    assert_eq!(sym.mode, "symmetric", "{what}");
                    assert_eq!(full.mode, "full", "{what}");
                    assert_eq!(sym.levels, full.levels, "{what}");
                    assert!(
                        close(sym.time, full.time),
                        "{what}: {} vs {}",
                        sym.time,
                        full.time
                    );
                }
            }
        }
    }
}

#[test]
fn every_algorithm_runs_on_the_full_expansion() {
    for algo in ["tree", "direct", "hd", "ring", "hier"] {
        let s = Setup {
            algo: Some(algo.into()),
            costs: ideal(),
            symmetric: false,
            ..Setup::default()
        };
        let o = run(
            fabric(4, 2, 2.0, 0),
            2,
            Placement::Block,
            "allreduce",
            1 << 20,
            &s,
        );
        assert!(o.time > 0.0 && o.time.is_finite(), "{algo}");
    }
    for op in ["broadcast", "reduce", "alltoall"] {
        let o = run(
            fabric(4, 2, 2.0, 0),
            2,
            Placement::Block,
            op,
            1 << 20,
            &flat_ring(),
        );
        assert!(o.time > 0.0 && o.time.is_finite(), "{op}");
    }
}

#[test]
fn too_many_ranks_without_symmetry_is_an_error_not_a_hang() {
    let ls = fabric(512, 16, 1.0, 0);
    let mut job = Job::new(ls.build().unwrap(), 512, 8, Placement::Block, &ideal()).unwrap();
    let s = Setup {
        algo: Some("tree".into()),
        max_steps: 1000,
        ..Setup::default()
    };
    let e = simulate(
        &mut job,
        collective("allreduce", 1 << 30, 4096).unwrap(),
        &s,
    )
    .unwrap_err();
    assert!(e.contains("too many"), "{e}");
}

#[test]
fn a_fat_tree_is_non_blocking() {
    // k = 4: 16 hosts, every link at the NIC's rate. A rank-order ring
    // spread evenly over the equal-cost paths runs at the link rate.
    let c = fabric_sim::gen::fat_tree(4, RATE_GBPS, 0.0).unwrap();
    assert_eq!(c.hosts.len(), 16);
    let mut job = Job::new(c, 16, 1, Placement::Block, &ideal()).unwrap();
    let s = Setup {
        ecmp: Ecmp::Spread,
        ..flat_ring()
    };
    let o = simulate(&mut job, collective("allreduce", 64 << 20, 16).unwrap(), &s).unwrap();
    assert!(close(o.busbw, gbps(RATE_GBPS)), "{}", o.busbw);
}

#[test]
fn topology_conf_oversubscription_halves_a_spine_crossing_ring() {
    // One host per leaf under one spine, as Slurm writes it; the uplinks
    // carry half a NIC at 2:1.
    let conf = "SwitchName=l0 Nodes=n0\nSwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n2\n\
                SwitchName=l3 Nodes=n3\nSwitchName=top Switches=l[0-3]\n";
    for (over, want) in [(1.0, 1.0), (2.0, 0.5)] {
        let c =
            fabric_sim::gen::from_topology_conf(conf, None, 1, RATE_GBPS, &[over], 0.0).unwrap();
        assert_eq!(c.hosts, ["n0", "n1", "n2", "n3"]);
        let mut job = Job::new(c, 4, 1, Placement::Block, &ideal()).unwrap();
        let o = simulate(
            &mut job,
            collective("allreduce", 64 << 20, 4).unwrap(),
            &flat_ring(),
        )
        .unwrap();
        assert!(
            close(o.busbw, want * gbps(RATE_GBPS)),
            "{over}: {}",
            o.busbw
        );
    }
}

#[test]
fn three_tiers_cost_what_their_pod_uplinks_allow() {
    // 4 hosts, one per leaf, 2 leaves per pod, pods under one core at
    // 4:1: a pod's uplink carries its 2 NICs' worth over 4, half a NIC;
    // the ring's edges between pods (2 of 4, one per pod and direction)
    // get half the rate, and the ring waits for them.
    let ls = LeafSpine {
        leaves_per_pod: 2,
        cores: 1,
        oversub2: 4.0,
        spines: 1,
        ..fabric(4, 1, 1.0, 1)
    };
    let o = run(ls, 1, Placement::Block, "allreduce", 64 << 20, &flat_ring());
    assert!(close(o.busbw, gbps(RATE_GBPS) / 2.0), "{}", o.busbw);
    assert!(o.hot[0].link.contains("core0") && close(o.hot[0].utilisation, 1.0));
}

#[test]
fn bad_fabrics_are_errors() {
    assert!(fabric_sim::gen::fat_tree(3, 100.0, 0.0).is_err());
    assert!(LeafSpine {
        hosts: 0,
        ..LeafSpine::default()
    }
    .build()
    .is_err());
    assert!(LeafSpine {
        oversub: 0.5,
        ..LeafSpine::default()
    }
    .build()
    .is_err());
    assert!(
        fabric_sim::gen::from_topology_conf("SwitchName=x Bogus=1\n", None, 1, 1.0, &[], 0.0)
            .is_err()
    );
    let c = fabric(2, 2, 1.0, 0).build().unwrap();
    assert!(Job::new(c, 3, 1, Placement::Block, &ideal()).is_err());
    assert!(collective("allfoo", 1, 2).is_err());
}

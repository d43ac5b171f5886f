//! The planner's choices: the tuning model, `NCCL_ALGO`, `NCCL_PROTO` and
//! the one-hop paths for small calls.

use super::*;

#[test]
fn model_prefers_direct_small_ring_large() {
    let p = Planner::new("Socket", None, None).unwrap();
    assert_eq!(p.all_reduce_algo(4, 8), Algo::Direct);
    assert_eq!(p.all_reduce_algo(4, 64 << 20), Algo::Ring);
    assert_eq!(p.all_reduce_algo(2, 64 << 20), Algo::Ring);
}

#[test]
fn nccl_algo_overrides() {
    let p = Planner::new("Socket", Some("allreduce:tree;broadcast:ring"), None).unwrap();
    assert_eq!(p.all_reduce_algo(8, 8), Algo::Tree);
    assert_eq!(p.all_reduce_algo(8, 1 << 30), Algo::Tree);
    let p = Planner::new("Socket", Some("ring"), None).unwrap();
    assert_eq!(p.all_reduce_algo(8, 8), Algo::Ring);
    let p = Planner::new("Socket", Some("^ring,direct"), None).unwrap();
    assert_eq!(p.all_reduce_algo(8, 1 << 30), Algo::Tree);
    assert!(Planner::new("Socket", Some("allreduce:bogus"), None).is_err());
    assert!(Planner::new("Socket", Some("NVLS,ring"), None).is_ok());
}

#[test]
fn model_prefers_halving_doubling_at_middle_sizes() {
    for transport in ["Socket", "SHM"] {
        let p = Planner::new(transport, None, None).unwrap();
        assert_eq!(p.all_reduce_algo(8, 8), Algo::Direct, "{transport}");
        assert_eq!(
            p.all_reduce_algo(8, 64 << 10),
            Algo::HalvingDoubling,
            "{transport}"
        );
        assert_eq!(p.all_reduce_algo(8, 64 << 20), Algo::Ring, "{transport}");
    }
    let p = Planner::new("Socket", None, None).unwrap();
    assert_eq!(p.all_reduce_algo(16, 128 << 10), Algo::HalvingDoubling);
    // At 2 ranks it sends what the ring sends; the ring keeps the job.
    for bytes in [8, 64 << 10, 1 << 20, 64 << 20] {
        assert_ne!(p.all_reduce_algo(2, bytes), Algo::HalvingDoubling);
    }
    // The fold of the extra ranks costs a whole buffer more.
    let m = Model::for_transport("Socket");
    let (pow2, folded) = (
        m.predict(Algo::HalvingDoubling, 8, 1 << 20),
        m.predict(Algo::HalvingDoubling, 9, 1 << 20),
    );
    assert!(folded > pow2 + (1 << 20) as f64 / (HD_BW * m.beta) * 0.99);
}

#[test]
fn nccl_algo_names_halving_doubling() {
    for spec in [
        "allreduce:halvingdoubling",
        "HalvingDoubling",
        "hd",
        "allreduce:ring,hd;broadcast:tree",
    ] {
        let p = Planner::new("Socket", Some(spec), None).unwrap();
        assert_eq!(
            p.all_reduce_algo(8, 64 << 10),
            Algo::HalvingDoubling,
            "{spec}"
        );
    }
    let p = Planner::new("Socket", Some("allreduce:hd"), None).unwrap();
    assert_eq!(p.all_reduce_algo(8, 8), Algo::HalvingDoubling);
    assert_eq!(p.all_reduce_algo(3, 1 << 30), Algo::HalvingDoubling);
    for spec in ["^hd", "allreduce:^halvingdoubling"] {
        let p = Planner::new("Socket", Some(spec), None).unwrap();
        for bytes in [8, 128 << 10, 1 << 30] {
            assert_ne!(p.all_reduce_algo(8, bytes), Algo::HalvingDoubling, "{spec}");
        }
    }
    let s = Planner::new("Socket", Some("hd"), None).unwrap().plan(
        Coll::AllReduce { count: 100 },
        3,
        0,
        DataType::Float32,
        16,
    );
    assert_eq!(s, schedule::all_reduce_halving_doubling(3, 0, 100, 16));
}

#[test]
fn small_all_gather_and_reduce_scatter_exchange_directly() {
    let p = Planner::new("SHM", None, None).unwrap();
    let f32 = DataType::Float32;
    let ag = |p: &Planner, n, count| p.plan(Coll::AllGather { send_count: count }, n, 1, f32, 1024);
    let rs =
        |p: &Planner, n, count| p.plan(Coll::ReduceScatter { recv_count: count }, n, 1, f32, 1024);
    // 1 KiB of output at 4 ranks: one exchange; 64 KiB: the ring.
    assert_eq!(ag(&p, 4, 64), schedule::all_gather_direct(4, 1, 64));
    assert_eq!(ag(&p, 4, 4096), schedule::all_gather(4, 1, 4096, 1024));
    assert_eq!(rs(&p, 4, 64), schedule::reduce_scatter_direct(4, 1, 64));
    assert_eq!(rs(&p, 4, 4096), schedule::reduce_scatter(4, 1, 4096, 1024));
    let bc = |p: &Planner, n, count| p.plan(Coll::Broadcast { count, root: 2 }, n, 1, f32, 1024);
    assert_eq!(bc(&p, 4, 2), schedule::broadcast_direct(4, 1, 2, 2));
    assert_eq!(bc(&p, 4, 4096), schedule::broadcast(4, 1, 2, 4096, 1024));
    let ring_bc = Planner::new("SHM", Some("broadcast:ring"), None).unwrap();
    assert_eq!(bc(&ring_bc, 4, 2), schedule::broadcast(4, 1, 2, 2, 1024));
    // At 2 ranks the ring is already one exchange.
    assert_eq!(ag(&p, 2, 64), schedule::all_gather(2, 1, 64, 1024));
    assert_eq!(rs(&p, 2, 64), schedule::reduce_scatter(2, 1, 64, 1024));
    // NCCL_ALGO naming the ring for them, or NCCL_PROTO=Simple, keep it.
    for (algo, proto) in [
        (Some("allgather:ring;reducescatter:ring"), None),
        (Some("ring"), None),
        (None, Some("Simple")),
    ] {
        let q = Planner::new("SHM", algo, proto).unwrap();
        assert_eq!(
            ag(&q, 4, 64),
            schedule::all_gather(4, 1, 64, 1024),
            "{algo:?} {proto:?}"
        );
        assert_eq!(
            rs(&q, 4, 64),
            schedule::reduce_scatter(4, 1, 64, 1024),
            "{algo:?} {proto:?}"
        );
    }
}

#[test]
fn nccl_proto() {
    let simple = Planner::new("Socket", None, Some("Simple")).unwrap();
    assert_ne!(simple.all_reduce_algo(4, 8), Algo::Direct);
    let ll = Planner::new("Socket", None, Some("LL")).unwrap();
    assert_eq!(ll.all_reduce_algo(4, 1 << 20), Algo::Direct);
    let not_ll = Planner::new("Socket", None, Some("^LL")).unwrap();
    assert_ne!(not_ll.all_reduce_algo(4, 8), Algo::Direct);
    // Only LL left by an exclusion forces the direct path too.
    let only_ll = Planner::new("Socket", None, Some("^simple,LL128")).unwrap();
    assert_eq!(only_ll.all_reduce_algo(4, 1 << 20), Algo::Direct);
}

#[test]
fn nccl_proto_ll128_counts_as_simple() {
    let f32 = DataType::Float32;
    let ag = |p: &Planner| p.plan(Coll::AllGather { send_count: 64 }, 4, 1, f32, 1024);
    let default = Planner::new("SHM", None, None).unwrap();
    // Excluding LL128 leaves every path as it was, the direct one included.
    for spec in ["^LL128", "ll,ll128,simple", "LL,Simple", "allreduce:^LL128"] {
        let p = Planner::new("SHM", None, Some(spec)).unwrap();
        assert_eq!(p.all_reduce_algo(4, 8), Algo::Direct, "{spec}");
        assert_eq!(ag(&p), ag(&default), "{spec}");
        assert_eq!(ag(&p), schedule::all_gather_direct(4, 1, 64), "{spec}");
    }
    // LL128 alone or with Simple: as Simple alone, no direct path.
    for spec in ["LL128", "Simple,LL128", "^LL"] {
        let p = Planner::new("SHM", None, Some(spec)).unwrap();
        assert_ne!(p.all_reduce_algo(4, 8), Algo::Direct, "{spec}");
        assert_eq!(ag(&p), schedule::all_gather(4, 1, 64, 1024), "{spec}");
    }
    // LL with LL128 keeps both kinds, as LL with Simple does.
    let p = Planner::new("SHM", None, Some("LL,LL128")).unwrap();
    assert_eq!(p.all_reduce_algo(4, 8), Algo::Direct);
    assert_eq!(p.all_reduce_algo(4, 64 << 20), Algo::Ring);
}

#[test]
fn nccl_proto_per_collective() {
    let f32 = DataType::Float32;
    let p = Planner::new("SHM", None, Some("allgather:Simple;allreduce:LL")).unwrap();
    assert_eq!(
        p.plan(Coll::AllGather { send_count: 64 }, 4, 1, f32, 1024),
        schedule::all_gather(4, 1, 64, 1024)
    );
    assert_eq!(p.all_reduce_algo(4, 1 << 20), Algo::Direct);
    // A collective's own part overrides the global list.
    let p = Planner::new("SHM", None, Some("Simple;allreduce:LL,Simple")).unwrap();
    assert_eq!(p.all_reduce_algo(4, 8), Algo::Direct);
    assert_eq!(
        p.plan(Coll::ReduceScatter { recv_count: 16 }, 4, 1, f32, 1024),
        schedule::reduce_scatter(4, 1, 16, 1024)
    );
}

#[test]
fn bad_algo_and_proto_are_errors_naming_the_variable_and_value() {
    for (algo, proto, var, bad) in [
        (None, Some("bogus"), "NCCL_PROTO", "bogus"),
        (None, Some("LL,bogus"), "NCCL_PROTO", "bogus"),
        (None, Some("LL256"), "NCCL_PROTO", "LL256"),
        (None, Some("LL,"), "NCCL_PROTO", "LL,"),
        (None, Some("^"), "NCCL_PROTO", "^"),
        (
            None,
            Some("^LL,LL128,Simple"),
            "NCCL_PROTO",
            "^LL,LL128,Simple",
        ),
        (None, Some("allreduce:"), "NCCL_PROTO", "allreduce:"),
        (None, Some("allreduc:LL"), "NCCL_PROTO", "allreduc"),
        (None, Some("allreduce:ring"), "NCCL_PROTO", "ring"),
        (Some("allreduce:bogus"), None, "NCCL_ALGO", "bogus"),
        (Some("sendrecv:ring"), None, "NCCL_ALGO", "sendrecv"),
        (
            Some("^ring,tree,direct,hd,hier"),
            None,
            "NCCL_ALGO",
            "^ring",
        ),
        (Some("ring,,tree"), None, "NCCL_ALGO", "ring,,tree"),
    ] {
        let e = Planner::new("Socket", algo, proto).unwrap_err().to_string();
        assert!(
            e.contains(var) && e.contains(bad),
            "{algo:?} {proto:?}: {e}"
        );
        assert_eq!(
            check(algo, proto).unwrap_err().to_string(),
            e,
            "the config check says the same"
        );
    }
    let e = Planner::new("Socket", None, Some("bogus"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("LL, LL128, Simple"),
        "lists the valid names: {e}"
    );
    for proto in [
        "LL",
        "ll128",
        "SIMPLE",
        " LL , Simple ",
        "^LL128",
        "allgather:^LL;LL",
    ] {
        check(None, Some(proto)).unwrap();
    }
}

#[test]
fn the_direct_path_honours_nccl_algo_and_proto() {
    let ag = Coll::AllGather {
        send_count: 1 << 20,
    };
    assert!(Planner::new("SHM", None, None).unwrap().allows_direct(ag));
    for (algo, proto) in [(Some("allgather:ring"), None), (None, Some("Simple"))] {
        let q = Planner::new("SHM", algo, proto).unwrap();
        assert!(!q.allows_direct(ag), "{algo:?} {proto:?}");
    }
}

#[test]
fn rings_follow_the_planners_order() {
    // Ranks 0 and 2 on one host, 1 and 3 on another (cyclic placement):
    // the ring 0 → 2 → 1 → 3 crosses between the hosts twice, not four times.
    let ring = schedule::RingOrder::new(vec![0, 2, 1, 3]).unwrap();
    let p = Planner::new("Socket", Some("ring"), None)
        .unwrap()
        .with_ring(ring);
    let next = [2, 3, 1, 0];
    let big = 1 << 20;
    for coll in [
        Coll::AllReduce { count: big },
        Coll::ReduceScatter { recv_count: big },
        Coll::AllGather { send_count: big },
        Coll::Broadcast {
            count: big,
            root: 1,
        },
        Coll::Reduce {
            count: big,
            root: 1,
        },
    ] {
        for (r, &after) in next.iter().enumerate() {
            let s = p.plan(coll, 4, r, DataType::Float32, 1 << 14);
            let sends: Vec<_> = s.steps.iter().filter_map(|s| s.send_peer()).collect();
            assert!(
                sends.iter().all(|&to| to == after),
                "{coll:?} rank {r}: {sends:?}"
            );
        }
    }
    // Another world size (a split communicator's planner): rank order.
    let s = p.plan(
        Coll::AllReduce { count: big },
        3,
        0,
        DataType::Float32,
        1 << 14,
    );
    assert!(s
        .steps
        .iter()
        .filter_map(|s| s.send_peer())
        .all(|to| to == 1));
}

/// Four hosts of two ranks (cyclic placement: rank r on host r % 4), with
/// shared memory inside hosts and sockets between them.
fn four_hosts(algo: Option<&str>) -> Planner {
    let ranks = vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]];
    // Two 10 Gbit/s rails per host.
    let net = Model {
        beta: 20e9 / 8.0,
        ..Model::for_transport("Socket")
    };
    let layout = HostLayout::new(
        ranks,
        Model {
            alpha: 0.7e-6,
            beta: 20e9,
        },
        net,
    );
    Planner::new("Socket", algo, None)
        .unwrap()
        .with_hosts(layout)
}

#[test]
fn hosts_choose_hierarchical_schedules() {
    let f32 = DataType::Float32;
    let hosts = [vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]];
    let h = schedule::Hosts { ranks: &hosts };
    let p = four_hosts(None);
    // (collective, the planner's choice, the schedule it must build)
    let big = 1 << 20;
    let want = |coll: Coll, r: usize| match coll {
        Coll::AllReduce { count } => schedule::all_reduce_hier(h, r, count, 4096),
        Coll::ReduceScatter { recv_count } => schedule::reduce_scatter_hier(h, r, recv_count, 4096),
        Coll::AllGather { send_count } => schedule::all_gather_hier(h, r, send_count, 4096),
        Coll::Broadcast { count, root } => schedule::broadcast_hier(h, r, root, count, 4096),
        _ => None,
    };
    for coll in [
        Coll::AllReduce { count: big },
        Coll::ReduceScatter { recv_count: big },
        Coll::AllGather { send_count: big },
        Coll::Broadcast {
            count: big,
            root: 5,
        },
    ] {
        assert_eq!(p.choice(coll, 8, f32).algo, "Hierarchical", "{coll:?}");
        for r in 0..8 {
            assert_eq!(
                Some(p.plan(coll, 8, r, f32, 4096)),
                want(coll, r),
                "{coll:?} rank {r}"
            );
        }
    }
    // NCCL_ALGO=ring keeps the flat ring; tree runs chains inside hosts.
    let ring = four_hosts(Some("ring"));
    assert_eq!(
        ring.choice(Coll::AllReduce { count: big }, 8, f32).algo,
        "Ring"
    );
    assert_eq!(
        ring.choice(Coll::AllGather { send_count: big }, 8, f32)
            .algo,
        "Ring"
    );
    let tree = four_hosts(Some("allreduce:tree"));
    assert_eq!(
        Some(tree.plan(Coll::AllReduce { count: big }, 8, 3, f32, 4096)),
        schedule::all_reduce_tree_hier(h, 3, big, 4096)
    );
    // Another world size (a split communicator): no hosts apply.
    assert_eq!(
        p.choice(Coll::AllGather { send_count: big }, 6, f32).algo,
        "Ring"
    );
}

#[test]
fn host_costs_rank_the_algorithms() {
    let ranks = vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]];
    let intra = Model {
        alpha: 1e-6,
        beta: 10e9,
    };
    let inter = Model {
        alpha: 20e-6,
        beta: 1e9,
    };
    let l = HostLayout::new(ranks, intra, inter);
    let t = |a, b| l.predict(a, b).unwrap();
    // Fewer steps and fewer bytes between hosts than the flat ring.
    for bytes in [8, 1 << 20, 64 << 20] {
        assert!(
            t(Algo::Hierarchical, bytes) < t(Algo::Ring, bytes),
            "{bytes}"
        );
    }
    // The tree moves the whole buffer between hosts each way.
    assert!(t(Algo::Hierarchical, 64 << 20) < t(Algo::Tree, 64 << 20));
    // Its log depth wins over many hosts while latency dominates.
    let many: Vec<Vec<usize>> = (0..16).map(|h| vec![2 * h, 2 * h + 1]).collect();
    let l = HostLayout::new(many, intra, inter);
    let t = |a, b| l.predict(a, b).unwrap();
    assert!(t(Algo::Tree, 8) < t(Algo::Hierarchical, 8));
    assert!(t(Algo::Hierarchical, 64 << 20) < t(Algo::Tree, 64 << 20));
    // Halving-doubling and direct: the flat model over the host links.
    assert_eq!(t(Algo::Direct, 8), inter.predict(Algo::Direct, 32, 8));
}

#[test]
fn host_predictions_count_an_all_to_alls_whole_input() {
    let p = four_hosts(None);
    let s = 16 << 20;
    // Each rank's blocks for the 6 ranks of other hosts cross its host's
    // links, with its host-mate's: L·(n-L)/n of the input per rank, twice.
    let t = p.predict(Coll::AllToAll { count: s / 32 }, 8, s).unwrap();
    let net = Model {
        beta: 20e9 / 8.0,
        ..Model::for_transport("Socket")
    };
    let want = 7.0 * net.alpha + 2.0 * 6.0 / 8.0 * s as f64 / net.beta;
    assert!((t - want).abs() < 1e-9, "{t} {want}");
}

#[test]
fn all_to_all_across_hosts_acknowledges_long_messages() {
    let f32 = DataType::Float32;
    let p = four_hosts(None).across_hosts(8);
    let inter = Model {
        beta: 20e9 / 8.0,
        ..Model::for_transport("Socket")
    };
    // The threshold: a message of ACK_MIN_ALPHAS step latencies on the wire.
    let edge = (ACK_MIN_ALPHAS * inter.alpha * inter.beta / 4.0).ceil() as usize;
    for (count, acked) in [
        (1, false),
        (edge - 1, false),
        (edge, true),
        (16 << 20, true),
    ] {
        let bytes = count * 4;
        assert_eq!(p.acks_pay(8, bytes), acked, "{bytes} B");
        let s = p.plan(Coll::AllToAll { count }, 8, 0, f32, usize::MAX);
        let sends = s
            .steps
            .iter()
            .filter(|st| matches!(st, schedule::Step::Send { .. }))
            .count();
        assert_eq!(sends, if acked { 14 } else { 7 }, "{bytes} B");
    }
    // Within one host, all-to-all posts everything at once, unacknowledged.
    let one = Planner::new("Socket", None, None).unwrap();
    let s = one.plan(Coll::AllToAll { count: 16 << 20 }, 8, 0, f32, usize::MAX);
    assert_eq!(s.scratch, 0);
}

#[test]
fn all_to_all_predictions_count_the_uplinks_across_the_spine() {
    let ranks = || vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]];
    let intra = Model {
        alpha: 0.7e-6,
        beta: 20e9,
    };
    let inter = Model {
        beta: 1e9,
        ..Model::for_transport("Socket")
    };
    let s = 16 << 20;
    let coll = Coll::AllToAll { count: s / 32 };
    let t = |l: HostLayout| l.predict_other(coll, false, s).unwrap();
    let sf = s as f64;
    // (oversubscription, hosts per leaf) -> the busier of a host's link
    // (2·6/8 of the input) and a leaf's uplink (its 4 ranks' blocks for the
    // other leaf's 4 ranks, at 2 host links over the oversubscription).
    for (over, per_leaf, busiest) in [
        (1.0, 2.0, 1.5 * sf),
        (2.0, 2.0, 2.0 * sf),
        (4.0, 2.0, 4.0 * sf),
        (4.0, 4.0, 1.5 * sf),
    ] {
        let l = HostLayout::new(ranks(), intra, inter).with_spine(per_leaf, over);
        let want = 7.0 * inter.alpha + busiest / inter.beta;
        assert!((t(l) - want).abs() < 1e-9, "{over}:1, {per_leaf} per leaf");
    }
    let flat = HostLayout::new(ranks(), intra, inter);
    assert!((t(flat) - (7.0 * inter.alpha + 1.5 * sf / inter.beta)).abs() < 1e-9);
}

#[test]
fn across_hosts_the_tree_and_halving_doubling_run_only_when_named() {
    // 16 hosts of 2: the tree's model beats the hierarchical ring at 8 B,
    // but across hosts the planner takes the one-hop exchange or the rings
    // unless NCCL_ALGO names the tree or halving-doubling.
    let many: Vec<Vec<usize>> = (0..16).map(|h| vec![2 * h, 2 * h + 1]).collect();
    let intra = Model {
        alpha: 0.7e-6,
        beta: 20e9,
    };
    let inter = Model {
        beta: 20e9 / 8.0,
        ..Model::for_transport("Socket")
    };
    let layout = || HostLayout::new(many.clone(), intra, inter);
    assert!(layout().predict(Algo::Tree, 8) < layout().predict(Algo::Hierarchical, 8));
    for (algo, bytes, want) in [
        (None, 8, Algo::Direct),
        (None, 1 << 30, Algo::Ring),
        (Some("tree"), 8, Algo::Tree),
        (Some("^ring,hier,direct"), 1 << 30, Algo::Tree),
        (Some("hd"), 8, Algo::HalvingDoubling),
    ] {
        let p = Planner::new("Socket", algo, None)
            .unwrap()
            .with_hosts(layout());
        assert_eq!(p.all_reduce_algo(32, bytes), want, "{algo:?} {bytes} B");
    }
}

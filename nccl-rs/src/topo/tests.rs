//! The topology as communicators see it at init: ranks as threads of one
//! process, each with its own `NCCL_HOSTID`, so that one machine holds
//! several "hosts".

use crate::transport::mem::MemNet;
use crate::{Communicator, Config, Error, RedOp, UniqueId};
use std::sync::Arc;
use std::time::Duration;

/// Inits one communicator per config (rank = index) over the in-memory
/// transport, and returns each rank's outcome of `f`.
fn init_each<R: Send>(
    configs: &[Config],
    f: impl Fn(usize, crate::Result<Communicator>) -> R + Sync,
) -> Vec<R> {
    let n = configs.len();
    let id = UniqueId::new(&configs[0]).expect("a unique id");
    std::thread::scope(|s| {
        let handles: Vec<_> = configs
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let (id, f) = (&id, &f);
                s.spawn(move || {
                    f(
                        r,
                        Communicator::init_with_net(id, n, r, c, Arc::new(MemNet::new())),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn config(host: &str) -> Config {
    Config {
        host_id: Some(host.into()),
        ..crate::testing::loopback(Duration::from_secs(20))
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("nccl-rs-topo-init-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn hosts_leaves_and_the_dump_come_from_every_ranks_record() {
    let topo = scratch("two-leaves.conf");
    let dump = scratch("dump.xml");
    std::fs::write(
        &topo,
        "SwitchName=l0 Nodes=fab-h0\nSwitchName=l1 Nodes=fab-h1\nSwitchName=top Switches=l[0-1]\n",
    )
    .unwrap();
    // srun's cyclic placement: rank r on host r % 2.
    let configs: Vec<Config> = ["fab-h0", "fab-h1", "fab-h0", "fab-h1"]
        .iter()
        .map(|h| Config {
            topo_file: Some(topo.to_str().unwrap().into()),
            topo_oversub: vec![2.0],
            topo_dump_file: Some(dump.to_str().unwrap().into()),
            ..config(h)
        })
        .collect();
    let seen = init_each(&configs, |r, comm| {
        let mut comm = comm.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let mut out = [0.0f32; 4];
        comm.all_reduce(&[r as f32; 4], &mut out, RedOp::Sum)
            .unwrap();
        let f = comm.fabric();
        let local: Vec<bool> = (0..4).map(|p| f.same_host(r, p)).collect();
        (
            out,
            f.ring_order(),
            local,
            f.local_rank(r),
            f.summary(),
            comm.fabric().clone(),
        )
    });
    for (r, (out, ring, local, lr, summary, _)) in seen.iter().enumerate() {
        assert_eq!(*out, [6.0; 4], "rank {r}");
        assert_eq!(*ring, [0, 2, 1, 3], "rank {r}");
        assert_eq!(
            *local,
            [r % 2 == 0, r % 2 == 1, r % 2 == 0, r % 2 == 1],
            "rank {r}"
        );
        assert_eq!(*lr, r / 2, "rank {r}");
        assert_eq!(
            summary,
            "Topology: 4 ranks on 2 hosts, 2 per host, 1 rail, 2 leaves"
        );
    }
    assert!(
        seen.iter().all(|s| s.5 == seen[0].5),
        "one fabric on every rank"
    );
    let want = "\
<system version=\"1\" ranks=\"4\" hosts=\"2\" rails=\"1\" leaves=\"2\">
  <switch name=\"top\" level=\"1\">
    <switch name=\"l0\" level=\"0\" oversub=\"2\">
      <host name=\"fab-h0\" id=\"fab-h0\" leaf=\"0\">
        <nic name=\"lo\" addr=\"127.0.0.1\" speed=\"0\" rail=\"0\"/>
        <rank rank=\"0\" local=\"0\"/>
        <rank rank=\"2\" local=\"1\"/>
      </host>
    </switch>
    <switch name=\"l1\" level=\"0\" oversub=\"2\">
      <host name=\"fab-h1\" id=\"fab-h1\" leaf=\"1\">
        <nic name=\"lo\" addr=\"127.0.0.1\" speed=\"0\" rail=\"0\"/>
        <rank rank=\"1\" local=\"0\"/>
        <rank rank=\"3\" local=\"1\"/>
      </host>
    </switch>
  </switch>
</system>
";
    assert_eq!(std::fs::read_to_string(&dump).unwrap(), want);
    std::fs::remove_file(&topo).unwrap();
    std::fs::remove_file(&dump).unwrap();
}

#[test]
fn a_bad_topology_file_fails_init_on_every_rank() {
    let bad = scratch("bad.conf");
    std::fs::write(
        &bad,
        "SwitchName=l0 Nodes=fab-h0\nSwitchName=l1 Nodes=fab-h[2-1]\n",
    )
    .unwrap();
    let path = bad.to_str().unwrap().to_string();
    // Only rank 1 has the file set: the others learn of it from rank 1.
    let configs: Vec<Config> = (0..3)
        .map(|r| Config {
            topo_file: (r == 1).then(|| path.clone()),
            ..config("h")
        })
        .collect();
    let errs = init_each(&configs, |_, c| match c {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    });
    let why = format!(
        "topology file {path}: line 2: bad hostlist \"fab-h[2-1]\": range \"2-1\" ends below its start"
    );
    assert_eq!(errs[1], format!("rank 1: NCCL_RS_TOPO_FILE: {why}"));
    for r in [0, 2] {
        assert_eq!(
            errs[r],
            format!("rank {r}: rank 1 failed with NCCL_RS_TOPO_FILE: {why}")
        );
    }
    std::fs::remove_file(&bad).unwrap();
}

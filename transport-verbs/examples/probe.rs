//! What the verbs transport sees on this machine: libibverbs, devices,
//! ports, the port and GID it would choose, or why it would fall back to
//! TCP.
//!
//! `cargo run -p transport-verbs --example probe` (honours `NCCL_IB_*`).

use nccl_net::Net;
use transport_verbs::{list_ports, VerbsNet, VerbsOptions};

fn main() {
    let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    match list_ports() {
        Ok(ports) => {
            for p in ports {
                println!(
                    "{}:{} {} {:?} MTU enum {} LID {} GIDs {} max_msg_sz {:#x} {} Mb/s",
                    p.device,
                    p.port,
                    if p.active { "ACTIVE" } else { "down" },
                    p.link_layer,
                    p.mtu,
                    p.lid,
                    p.gid_tbl_len,
                    p.max_msg_sz,
                    p.speed_mbps
                );
            }
        }
        Err(e) => println!("no ports: {e}"),
    }
    let opts = match VerbsOptions::from_env_lookup(|k| std::env::var(k).ok()) {
        Ok(o) => o,
        Err(e) => {
            println!("{e}");
            std::process::exit(2);
        }
    };
    match VerbsNet::new(opts) {
        Ok(net) => println!(
            "would use {} ({:?}), GID index {}, DMA-BUF {}: {:?}",
            net.device_name(),
            net.link_layer(),
            net.gid_index(),
            net.dmabuf_supported(),
            net.properties()
        ),
        Err(e) => {
            println!("verbs transport unavailable, nccl-rs would use TCP: {e}");
            std::process::exit(1);
        }
    }
}

//! Every decoder of the verbs transport's wire data and settings must return
//! (an error is fine) for any input: the connection handle, the endpoint
//! exchanged over the side socket, clear-to-send entries and completion
//! records written by the peer, `NCCL_IB_HCA`, `NCCL_IB_ADDR_RANGE` and sysfs
//! GID text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport_verbs::wire::{Cts, Endpoint, Record, VerbsHandle, CTS_BYTES, RECORD_BYTES};
use transport_verbs::{Cidr, HcaFilter};

fuzz_target!(|data: &[u8]| {
    let _ = VerbsHandle::decode(data);
    let nqps = data.first().map_or(1, |b| usize::from(*b % 8) + 1);
    let rails = data.get(1).map_or(1, |b| usize::from(*b % 5) + 1);
    let _ = Endpoint::decode(data, nqps, rails);
    let _ = data.get(..transport_verbs::wire::ENDPOINT_FIXED).map(Endpoint::rails_in);
    if let Some(b) = data.get(..CTS_BYTES) {
        let _ = Cts::decode(b.try_into().expect("CTS_BYTES"), data.len() as u64);
    }
    if let Some(b) = data.get(..RECORD_BYTES) {
        let _ = Record::decode(b.try_into().expect("RECORD_BYTES"));
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = HcaFilter::parse(s);
        let _ = Cidr::parse(s);
        let _ = transport_verbs::gid::parse_sysfs_gid(s);
    }
});

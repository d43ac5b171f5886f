//! `TcpHandle::decode` must return (an error is fine) for any input, and a
//! handle it accepts must survive encode/decode unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use transport_tcp::handle::TcpHandle;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = TcpHandle::decode(data) {
        let again = TcpHandle::decode(&h.encode()).expect("an encoded handle decodes");
        assert_eq!(again, h, "encode/decode round trip");
    }
});

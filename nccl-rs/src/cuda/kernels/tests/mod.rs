//! Tests of the kernel source: every kernel name is in it (here), and
//! the kernels compiled for the CPU match the host kernels (`cpu`).

use super::*;

mod cpu;

#[test]
fn every_kernel_is_in_the_source() {
    let names = all_names();
    assert_eq!(names.len(), 60);
    for n in &names {
        // The source builds names with ## from these parts.
        let (ty, op) = match n.strip_prefix("ncclrs_reduce_") {
            Some(rest) => rest.rsplit_once('_').unwrap(),
            None => (n.strip_prefix("ncclrs_scale_").unwrap(), ""),
        };
        assert!(SOURCE.contains(&format!("TYPE({ty},")), "{n}");
        if !op.is_empty() {
            assert!(SOURCE.contains(&format!(", {op}, ")), "{n}");
        }
    }
}

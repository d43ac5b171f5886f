//! The data stream's wire format as `transport_tcp` documents it (its
//! `wire` module), written out independently here so that raw peers check
//! the implementation against the documented layout.
#![allow(dead_code)] // each test crate uses part of it

/// Every write is a whole number of these bytes.
pub(crate) const UNIT: usize = 64;

/// A message header: tag and length (little-endian), the sender's payload
/// alignment, three reserved zero bytes.
pub(crate) fn header(tag: u32, len: u64, align: u8) -> Vec<u8> {
    let mut v = tag.to_le_bytes().to_vec();
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&[align, 0, 0, 0]);
    v
}

/// Zero bytes up to offset `align` of the current unit (none if there is
/// no payload), the payload, zero bytes to the end of the unit.
fn place(mut unit: Vec<u8>, payload: &[u8], align: u8) -> Vec<u8> {
    if !payload.is_empty() {
        while unit.len() % UNIT != usize::from(align) {
            unit.push(0);
        }
    }
    unit.extend_from_slice(payload);
    while unit.len() % UNIT != 0 {
        unit.push(0);
    }
    unit
}

/// A message with its payload inline on socket 0.
pub(crate) fn inline_unit(tag: u32, payload: &[u8], align: u8) -> Vec<u8> {
    place(header(tag, payload.len() as u64, align), payload, align)
}

/// The socket-0 unit of a striped message of `len` bytes (its payload
/// travels in pieces).
pub(crate) fn striped_unit(tag: u32, len: usize, align: u8) -> Vec<u8> {
    place(header(tag, len as u64, align), &[], align)
}

/// One piece of a striped message on a data socket.
pub(crate) fn piece_unit(piece: &[u8], align: u8) -> Vec<u8> {
    place(Vec::new(), piece, align)
}

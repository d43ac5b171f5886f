//! Tests of the FP8 conversions against exhaustive and hand-checked values.

use super::*;

/// Reference decoding, field by field: the `f32` bits of the FP8 value `b`.
const fn decode_bits(f: &Format, b: u8) -> u32 {
    let sign = ((b as u32) & 0x80) << 24;
    let exp = ((b as u32) >> f.man_bits) & ((1 << (7 - f.man_bits)) - 1);
    let man = (b as u32) & ((1 << f.man_bits) - 1);
    let exp_max = (1 << (7 - f.man_bits)) - 1;
    let man_max = (1 << f.man_bits) - 1;
    if f.ieee_specials && exp == exp_max {
        return if man == 0 {
            sign | 0x7F80_0000
        } else {
            sign | 0x7FC0_0000 | (man << (23 - f.man_bits))
        };
    }
    if !f.ieee_specials && exp == exp_max && man == man_max {
        return sign | 0x7FC0_0000;
    }
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // Subnormal: man * 2^(1 - bias - man_bits). Normalise around the
        // leading one at bit position p.
        let mut p = f.man_bits - 1;
        while (man >> p) == 0 {
            p -= 1;
        }
        let e32 = (p as i32 + 1 - f.bias - f.man_bits as i32 + 127) as u32;
        let m32 = (man - (1 << p)) << (23 - p);
        return sign | (e32 << 23) | m32;
    }
    let e32 = (exp as i32 - f.bias + 127) as u32;
    sign | (e32 << 23) | (man << (23 - f.man_bits))
}

/// The 256 reference `f32` bit patterns of one format.
const fn build_table(f: &Format) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_bits(f, i as u8);
        i += 1;
    }
    t
}

static E4M3_TO_F32: [u32; 256] = build_table(&E4M3);
static E5M2_TO_F32: [u32; 256] = build_table(&E5M2);

#[test]
fn decode_matches_reference_table() {
    for b in 0..=255u8 {
        assert_eq!(
            F8E4M3(b).to_f32().to_bits(),
            E4M3_TO_F32[b as usize],
            "e4m3 {b:#04x}"
        );
        assert_eq!(
            F8E5M2(b).to_f32().to_bits(),
            E5M2_TO_F32[b as usize],
            "e5m2 {b:#04x}"
        );
    }
}

/// A straightforward (branchy) rounding, to check `encode` against.
fn encode_reference(f: &Format, x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return if f.ieee_specials {
            // Quiet NaN keeping the top two payload bits, as CUDA does.
            sign | 0x7E | ((abs >> 21) & 0x3) as u8
        } else {
            sign | 0x7F
        };
    }
    if abs == 0x7F80_0000 {
        return sign | f.max_finite;
    }
    let e32 = (abs >> 23) as i32;
    if e32 == 0 {
        // Zero or f32 subnormal (< 2^-126): far below half the smallest FP8
        // subnormal.
        return sign;
    }
    let sig = (abs & 0x7F_FFFF) | 0x80_0000; // 24-bit significand
    let texp = e32 - 127 + f.bias; // biased target exponent
    if texp > (1 << (7 - f.man_bits)) {
        // At least twice the top binade: certainly past max finite.
        return sign | f.max_finite;
    }
    let normal_shift = 23 - f.man_bits as i32;
    let (shift, base) = if texp >= 1 {
        (normal_shift, (texp - 1) as u32) // q carries the implicit one
    } else {
        (normal_shift + 1 - texp, 0)
    };
    if shift > 24 {
        // Below a quarter of the smallest subnormal: rounds to zero.
        return sign;
    }
    let shift = shift as u32;
    let mut q = sig >> shift;
    let rem = sig & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rem > half || (rem == half && (q & 1) == 1) {
        q += 1;
    }
    // For normals: (texp << man) + (q - 2^man), written so that a rounding
    // carry moves into the exponent. For subnormals q is the whole encoding.
    let enc = (base << f.man_bits) + q;
    if enc > f.max_finite as u32 {
        sign | f.max_finite
    } else {
        sign | enc as u8
    }
}

#[test]
fn branch_free_encode_matches_reference() {
    let mut lows = vec![0u32, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
    let mut r = 7u32;
    for _ in 0..4 {
        r = r.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        lows.push(r >> 16);
    }
    for hi in 0..=0xFFFFu32 {
        for &lo in &lows {
            let x = f32::from_bits(hi << 16 | lo);
            assert_eq!(
                F8E4M3::from_f32(x).0,
                encode_reference(&E4M3, x),
                "{x:e} {:#x}",
                x.to_bits()
            );
            assert_eq!(
                F8E5M2::from_f32(x).0,
                encode_reference(&E5M2, x),
                "{x:e} {:#x}",
                x.to_bits()
            );
        }
    }
}

#[test]
fn exhaustive_round_trip() {
    for b in 0..=255u8 {
        let x = F8E4M3(b);
        let y = F8E4M3::from_f32(x.to_f32());
        if x.to_f32().is_nan() {
            assert!(y.is_nan(), "e4m3 {b:#04x}");
            assert_eq!(b & 0x7F, 0x7F);
        } else {
            assert_eq!(y, x, "e4m3 {b:#04x} -> {}", x.to_f32());
        }
        let x = F8E5M2(b);
        let y = F8E5M2::from_f32(x.to_f32());
        if x.to_f32().is_nan() {
            assert!(y.is_nan(), "e5m2 {b:#04x}");
        } else if x.to_f32().is_infinite() {
            assert_eq!(y.0, 0x7B | (b & 0x80));
        } else {
            assert_eq!(y, x, "e5m2 {b:#04x} -> {}", x.to_f32());
        }
    }
}

#[test]
fn monotonic_and_matches_formula() {
    // Decoding agrees with a direct formula, and positive values increase.
    for (bias, man_bits, table) in [(7, 3, &E4M3_TO_F32), (15, 2, &E5M2_TO_F32)] {
        let mut prev = -1.0f64;
        for b in 0..0x7Bu32 {
            let e = (b >> man_bits) as i32;
            let m = (b & ((1 << man_bits) - 1)) as f64;
            let scale = (1u32 << man_bits) as f64;
            let v = if e == 0 {
                m / scale * 2f64.powi(1 - bias)
            } else {
                (1.0 + m / scale) * 2f64.powi(e - bias)
            };
            let got = f32::from_bits(table[b as usize]) as f64;
            assert_eq!(got, v);
            let neg = f32::from_bits(table[(b | 0x80) as usize]) as f64;
            assert_eq!(neg.to_bits(), (-v).to_bits());
            assert!(v > prev);
            prev = v;
        }
    }
}

#[test]
fn known_values() {
    assert_eq!(F8E4M3(0x7E).to_f32(), 448.0);
    assert_eq!(F8E5M2(0x7B).to_f32(), 57344.0);
    assert_eq!(F8E4M3::from_f32(1.0).0, 0x38);
    assert_eq!(F8E5M2::from_f32(1.0).0, 0x3C);
    assert_eq!(F8E4M3::from_f32(-2.0).0, 0xC0);
    assert_eq!(F8E5M2::from_f32(-2.0).0, 0xC0);
    assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
    assert_eq!(F8E5M2(0x3C).to_f32(), 1.0);
    assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9));
    assert_eq!(F8E5M2(0x01).to_f32(), 2f32.powi(-16));
    assert_eq!(F8E4M3(0x08).to_f32(), 2f32.powi(-6));
    assert_eq!(F8E5M2(0x04).to_f32(), 2f32.powi(-14));
    assert!(F8E4M3(0x7F).to_f32().is_nan());
    assert!(F8E4M3(0xFF).to_f32().is_nan());
    assert_eq!(F8E4M3(0x7F - 8).to_f32(), 240.0); // 0x77 = 1.875 * 2^7
    assert_eq!(F8E5M2(0x7C).to_f32(), f32::INFINITY);
    assert_eq!(F8E5M2(0xFC).to_f32(), f32::NEG_INFINITY);
    for b in [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF] {
        assert!(F8E5M2(b).to_f32().is_nan());
    }
    assert_eq!(F8E4M3::from_f32(-0.0).0, 0x80);
    assert_eq!(F8E5M2::from_f32(-0.0).0, 0x80);
    assert_eq!(F8E4M3::MAX.to_f32(), 448.0);
    assert_eq!(F8E5M2::MIN.to_f32(), -57344.0);
}

#[test]
fn ties_to_even() {
    // E4M3 near 1: spacing 1/8. 1 + 1/16 is a tie between 0x38 (even) and 0x39.
    assert_eq!(F8E4M3::from_f32(1.0625).0, 0x38);
    // 1 + 3/16 ties between 0x39 (odd) and 0x3A (even).
    assert_eq!(F8E4M3::from_f32(1.1875).0, 0x3A);
    // Just above / below a tie.
    assert_eq!(F8E4M3::from_f32(1.0625f32.next_up_compat()).0, 0x39);
    assert_eq!(F8E4M3::from_f32(1.1875f32.next_down_compat()).0, 0x39);
    // E5M2 near 1: spacing 1/4.
    assert_eq!(F8E5M2::from_f32(1.125).0, 0x3C);
    assert_eq!(F8E5M2::from_f32(1.375).0, 0x3E);
    // A tie that carries into the next binade: 1.9375 between 1.875 (0x3F,
    // odd) and 2.0 (0x40).
    assert_eq!(F8E4M3::from_f32(1.9375).0, 0x40);
    // Subnormal ties: E4M3 step is 2^-9.
    let s = 2f32.powi(-9);
    assert_eq!(F8E4M3::from_f32(0.5 * s).0, 0x00);
    assert_eq!(F8E4M3::from_f32(1.5 * s).0, 0x02);
    assert_eq!(F8E4M3::from_f32(2.5 * s).0, 0x02);
    assert_eq!(F8E4M3::from_f32(-0.5 * s).0, 0x80);
    assert_eq!(F8E4M3::from_f32((0.5 * s).next_up_compat()).0, 0x01);
    // Tie between the largest subnormal (7 * 2^-9, odd) and the smallest normal.
    assert_eq!(F8E4M3::from_f32(7.5 * s).0, 0x08);
    let s = 2f32.powi(-16);
    assert_eq!(F8E5M2::from_f32(0.5 * s).0, 0x00);
    assert_eq!(F8E5M2::from_f32(1.5 * s).0, 0x02);
    assert_eq!(F8E5M2::from_f32(3.5 * s).0, 0x04);
}

#[test]
fn saturation() {
    // E4M3: 464 is the tie between 448 and (nonexistent) 480; it rounds to
    // even 448, and everything above saturates.
    assert_eq!(F8E4M3::from_f32(464.0).0, 0x7E);
    assert_eq!(F8E4M3::from_f32(465.0).0, 0x7E);
    assert_eq!(F8E4M3::from_f32(1e9).0, 0x7E);
    assert_eq!(F8E4M3::from_f32(-1e9).0, 0xFE);
    assert_eq!(F8E4M3::from_f32(f32::MAX).0, 0x7E);
    assert_eq!(F8E4M3::from_f32(f32::INFINITY).0, 0x7E);
    assert_eq!(F8E4M3::from_f32(f32::NEG_INFINITY).0, 0xFE);
    assert_eq!(F8E5M2::from_f32(61439.0).0, 0x7B);
    assert_eq!(F8E5M2::from_f32(61440.0).0, 0x7B);
    assert_eq!(F8E5M2::from_f32(1e30).0, 0x7B);
    assert_eq!(F8E5M2::from_f32(-1e30).0, 0xFB);
    assert_eq!(F8E5M2::from_f32(f32::INFINITY).0, 0x7B);
    assert_eq!(F8E5M2::from_f32(f32::NEG_INFINITY).0, 0xFB);
}

#[test]
fn nan_and_tiny() {
    assert_eq!(F8E4M3::from_f32(f32::NAN).0 & 0x7F, 0x7F);
    assert_eq!(F8E4M3::from_f32(-f32::NAN).0, 0xFF);
    assert!(F8E5M2::from_f32(f32::NAN).is_nan());
    assert!(F8E5M2::from_f32(-f32::NAN).is_nan());
    assert_eq!(F8E5M2::from_f32(f32::NAN).0, 0x7E);
    assert_eq!(F8E4M3::from_f32(f32::MIN_POSITIVE).0, 0);
    assert_eq!(F8E4M3::from_f32(1e-45).0, 0);
    assert_eq!(F8E5M2::from_f32(-1e-45).0, 0x80);
    assert_eq!(F8E4M3::from_f32(2f32.powi(-11)).0, 0);
    assert_eq!(F8E5M2::from_f32(2f32.powi(-20)).0, 0);
}

#[test]
fn nearest_against_brute_force() {
    // For many f32 inputs, from_f32 picks the nearest finite value (ties to
    // the even encoding), clamped to max finite.
    let finite_e4m3: Vec<(u8, f64)> = (0..=0x7Eu8)
        .map(|b| (b, F8E4M3(b).to_f32() as f64))
        .collect();
    let finite_e5m2: Vec<(u8, f64)> = (0..=0x7Bu8)
        .map(|b| (b, F8E5M2(b).to_f32() as f64))
        .collect();
    let mut x = 1u32;
    for _ in 0..20000 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        // Magnitudes from about 2^-20 to 2^17.
        let v = f32::from_bits((x & 0x7FFFF) | ((107 + (x >> 27)) << 23)) as f64;
        for (table, got) in [
            (&finite_e4m3, F8E4M3::from_f32(v as f32).0),
            (&finite_e5m2, F8E5M2::from_f32(v as f32).0),
        ] {
            let mut best = table[0];
            for &(b, w) in table.iter() {
                let (d, db) = ((w - v).abs(), (best.1 - v).abs());
                if d < db || (d == db && b & 1 == 0) {
                    best = (b, w);
                }
            }
            assert_eq!(got, best.0, "{v}");
        }
    }
}

trait NextCompat {
    fn next_up_compat(self) -> Self;
    fn next_down_compat(self) -> Self;
}
impl NextCompat for f32 {
    // Positive finite inputs only.
    fn next_up_compat(self) -> f32 {
        f32::from_bits(self.to_bits() + 1)
    }
    fn next_down_compat(self) -> f32 {
        f32::from_bits(self.to_bits() - 1)
    }
}

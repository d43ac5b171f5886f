//! The two 8-bit floating-point formats NCCL reduces: `F8E4M3` and `F8E5M2`.
//!
//! Both follow the OCP FP8 specification, bit for bit as CUDA's `__nv_fp8_e4m3`
//! and `__nv_fp8_e5m2`:
//!
//! | format   | sign | exponent | mantissa | bias | infinities | NaN                  | max finite      | min subnormal |
//! |----------|------|----------|----------|------|------------|----------------------|-----------------|---------------|
//! | `F8E4M3` | 1    | 4        | 3        | 7    | none       | `S.1111.111` only    | 448 (`0x7E`)    | 2^-9          |
//! | `F8E5M2` | 1    | 5        | 2        | 15   | `S.11111.00` | `S.11111.{01,10,11}` | 57344 (`0x7B`) | 2^-16       |
//!
//! # Conversions
//!
//! `to_f32` is exact (every FP8 value is an `f32` value). NaNs become quiet
//! `f32` NaNs with the same sign (E5M2 keeps its payload bits).
//!
//! Both directions are branch-free bit manipulation so that slice conversions
//! in the reduction kernels vectorise.
//!
//! `from_f32` behaves like CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ..)`,
//! which is what NCCL's FP8 kernels use:
//!
//! * Finite values round to the nearest representable value, **ties to even**
//!   (the one whose last mantissa bit is 0), with gradual underflow through
//!   the subnormals: anything whose magnitude is at most half the smallest
//!   subnormal becomes a zero of the same sign.
//! * Values whose rounded magnitude would exceed the largest finite value
//!   **saturate** to ±max finite (±448 for E4M3, ±57344 for E5M2). No
//!   conversion ever produces an E5M2 infinity.
//! * **±infinity saturates too**, to ±max finite, in both formats (E4M3 has no
//!   infinity; for E5M2 this is the `__NV_SATFINITE` rule, so a reduction that
//!   overflows in `f32` yields the largest finite value, as on a GPU).
//! * NaN stays NaN: E4M3 gives `S.1111.111`; E5M2 gives a quiet NaN
//!   `S.11111.1x`, keeping the top two bits of the `f32` payload like CUDA.

#![forbid(unsafe_code)]

/// An OCP FP8 E4M3 number (CUDA's `__nv_fp8_e4m3`), stored as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// An OCP FP8 E5M2 number (CUDA's `__nv_fp8_e5m2`), stored as its bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

/// Layout of one FP8 format, for the shared conversion code.
struct Format {
    /// Number of mantissa bits.
    man_bits: u32,
    /// Exponent bias.
    bias: i32,
    /// Whether an all-ones exponent field means infinity/NaN (E5M2) or is an
    /// ordinary binade with only mantissa all-ones as NaN (E4M3).
    ieee_specials: bool,
    /// Bits of the largest finite magnitude.
    max_finite: u8,
}

const E4M3: Format = Format {
    man_bits: 3,
    bias: 7,
    ieee_specials: false,
    max_finite: 0x7E,
};

const E5M2: Format = Format {
    man_bits: 2,
    bias: 15,
    ieee_specials: true,
    max_finite: 0x7B,
};

/// The exact `f32` value of the FP8 encoding `b` in a format with `MAN`
/// mantissa bits and exponent bias `BIAS` (`IEEE`: E5M2-style infinities and
/// NaNs; otherwise E4M3's single NaN `S.1111.111`). NaN gives a quiet NaN.
///
/// Branch-free (selects only), so a loop of conversions vectorises; it never
/// touches `f32` subnormals, so it is exact even with flush-to-zero enabled.
#[inline(always)]
fn decode<const MAN: u32, const BIAS: u32, const IEEE: bool>(b: u8) -> f32 {
    let shift = 23 - MAN;
    let magic_bits = ((127 - BIAS) + shift + 1) << 23;
    let b = u32::from(b);
    let sign = (b & 0x80) << 24;
    let abs = b & 0x7F;
    // Normal: move the fields into place and rebias the exponent.
    let nor = (abs << shift) + ((127 - BIAS) << 23);
    // Subnormal m * 2^(1 - BIAS - MAN): the magic power of two has exactly
    // that ulp, so (magic + m ulps) - magic is exact.
    let sub = (f32::from_bits(magic_bits | abs) - f32::from_bits(magic_bits)).to_bits();
    let r = if abs < (1 << MAN) { sub } else { nor };
    let r = if IEEE {
        let man = abs & ((1 << MAN) - 1);
        let quiet = if man != 0 { 0x40_0000 } else { 0 };
        let special = 0x7F80_0000 | quiet | (man << shift);
        if abs >= 0x7F & !((1 << MAN) - 1) {
            special
        } else {
            r
        }
    } else if abs == 0x7F {
        0x7FC0_0000
    } else {
        r
    };
    f32::from_bits(r | sign)
}

/// Rounds `x` to an FP8 format with `MAN` mantissa bits and exponent bias
/// `BIAS`: nearest, ties to even, saturating to `MAX` (the largest finite
/// encoding), NaN to NaN (`IEEE`: E5M2-style quiet NaN keeping payload bits;
/// otherwise E4M3's single NaN).
///
/// Branch-free (selects only), so a loop of conversions vectorises.
#[inline(always)]
fn encode<const MAN: u32, const BIAS: u32, const MAX: u32, const IEEE: bool>(x: f32) -> u8 {
    let shift = 23 - MAN;
    // Adding this power of two leaves the subnormal mantissa, rounded to
    // nearest even by the f32 addition, in the low bits.
    let magic_bits = ((127 - BIAS) + shift + 1) << 23;
    let min_normal_bits = (127 + 1 - BIAS) << 23;
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7FFF_FFFF;
    // Subnormal or zero result (valid when abs < min normal).
    let sub = (f32::from_bits(abs) + f32::from_bits(magic_bits))
        .to_bits()
        .wrapping_sub(magic_bits);
    // Normal result (valid when abs >= min normal): rebias the exponent, add
    // half an ulp minus one plus the kept lsb (ties to even), truncate. A
    // carry out of the mantissa correctly bumps the exponent.
    let odd = (abs >> shift) & 1;
    let nor = abs
        .wrapping_sub((127 - BIAS) << 23)
        .wrapping_add((1 << (shift - 1)) - 1 + odd)
        >> shift;
    let enc = if abs < min_normal_bits { sub } else { nor };
    // Saturate (this also maps +-infinity to +-max).
    let enc = if enc > MAX { MAX } else { enc };
    let nan = if IEEE {
        0x7E | ((abs >> 21) & 0x3)
    } else {
        0x7F
    };
    let enc = if abs > 0x7F80_0000 { nan } else { enc };
    (enc | sign) as u8
}

macro_rules! fp8_impl {
    ($t:ident, $fmt:ident, $nan:expr, $dec:expr, $enc:expr) => {
        impl $t {
            /// Largest finite value.
            pub const MAX: $t = $t($fmt.max_finite);
            /// Most negative finite value.
            pub const MIN: $t = $t($fmt.max_finite | 0x80);
            /// The canonical (positive, quiet) NaN.
            pub const NAN: $t = $t($nan);
            /// Positive zero.
            pub const ZERO: $t = $t(0);

            /// Builds a value from its bit pattern.
            pub const fn from_bits(bits: u8) -> Self {
                $t(bits)
            }

            /// Returns the bit pattern.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// Converts to `f32`, exactly (NaN gives a quiet NaN of the same sign).
            #[inline]
            pub fn to_f32(self) -> f32 {
                $dec(self.0)
            }

            /// Converts from `f32`: round to nearest, ties to even; finite
            /// overflow and ±infinity saturate to ±max finite; NaN stays NaN.
            #[inline]
            pub fn from_f32(x: f32) -> Self {
                $t($enc(x))
            }

            /// Whether this is a NaN.
            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }
        }

        impl From<$t> for f32 {
            fn from(x: $t) -> f32 {
                x.to_f32()
            }
        }
    };
}

fp8_impl!(
    F8E4M3,
    E4M3,
    0x7F,
    decode::<{ E4M3.man_bits }, { E4M3.bias as u32 }, { E4M3.ieee_specials }>,
    encode::<
        { E4M3.man_bits },
        { E4M3.bias as u32 },
        { E4M3.max_finite as u32 },
        { E4M3.ieee_specials },
    >
);
fp8_impl!(
    F8E5M2,
    E5M2,
    0x7E,
    decode::<{ E5M2.man_bits }, { E5M2.bias as u32 }, { E5M2.ieee_specials }>,
    encode::<
        { E5M2.man_bits },
        { E5M2.bias as u32 },
        { E5M2.max_finite as u32 },
        { E5M2.ieee_specials },
    >
);

#[cfg(test)]
mod tests;

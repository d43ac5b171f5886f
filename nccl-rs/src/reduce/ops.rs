//! Element arithmetic, the operation markers, and the kernels for the types
//! that are reduced in their own arithmetic (integers, `f32`, `f64`).

/// Arithmetic that a reduction computes in (the "compute type").
pub(super) trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)]
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)]
            fn max(self, o: Self) -> Self { if self > o { self } else { o } }
            #[inline(always)]
            fn min(self, o: Self) -> Self { if self < o { self } else { o } }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

// Float max/min follow C's fmax/fmin, which NCCL's kernels call: a NaN
// operand is ignored (the result is NaN only when both are NaN). Signed zeros
// are ordered -0 < +0 so that the result never depends on operand order.
macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self { self + o }
            #[inline(always)]
            fn mul(self, o: Self) -> Self { self * o }
            // Written as selects (no early exits) so that loops vectorise.
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                let m = if o > self { o } else { self }; // self if either is NaN
                let m = if self.is_nan() { o } else { m };
                // Equal: identical bits, or +0 and -0 (AND gives +0).
                let z = <$t>::from_bits(self.to_bits() & o.to_bits());
                if self == o { z } else { m }
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                let m = if o < self { o } else { self };
                let m = if self.is_nan() { o } else { m };
                // Equal: identical bits, or +0 and -0 (OR gives -0).
                let z = <$t>::from_bits(self.to_bits() | o.to_bits());
                if self == o { z } else { m }
            }
        }
    )*};
}
float_arith!(f32, f64);

/// A binary reduction operation, as a type so that kernels are
/// monomorphised (and vectorised) per operation.
pub(super) trait Op {
    fn apply<T: Arith>(a: T, b: T) -> T;
}

pub(super) struct Sum;
pub(super) struct Prod;
pub(super) struct Max;
pub(super) struct Min;

impl Op for Sum {
    #[inline(always)]
    fn apply<T: Arith>(a: T, b: T) -> T {
        a.add(b)
    }
}
impl Op for Prod {
    #[inline(always)]
    fn apply<T: Arith>(a: T, b: T) -> T {
        a.mul(b)
    }
}
impl Op for Max {
    #[inline(always)]
    fn apply<T: Arith>(a: T, b: T) -> T {
        a.max(b)
    }
}
impl Op for Min {
    #[inline(always)]
    fn apply<T: Arith>(a: T, b: T) -> T {
        a.min(b)
    }
}

/// The typed kernels for one storage type. Slices have equal lengths.
pub(super) trait Kernel: bytemuck::Pod {
    /// `dst[i] = O(dst[i], src[i])`.
    fn inplace<O: Op>(dst: &mut [Self], src: &[Self]);
    /// `dst[i] = O(a[i], b[i])`.
    fn copy<O: Op>(dst: &mut [Self], a: &[Self], b: &[Self]);
    /// `buf[i] = buf[i] / n`, with `n >= 1`.
    fn divide(buf: &mut [Self], n: usize);
    /// `buf[i] = buf[i] * s`.
    fn scale(buf: &mut [Self], s: Self);
}

/// The loops shared by every type that computes in itself.
#[inline(always)]
fn native_inplace<T: Arith, O: Op>(dst: &mut [T], src: &[T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = O::apply(*d, s);
    }
}

#[inline(always)]
fn native_copy<T: Arith, O: Op>(dst: &mut [T], a: &[T], b: &[T]) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = O::apply(x, y);
    }
}

macro_rules! int_kernel {
    ($($t:ty => $wide:ty),*) => {$(
        impl Kernel for $t {
            #[inline(always)]
            fn inplace<O: Op>(dst: &mut [Self], src: &[Self]) {
                native_inplace::<$t, O>(dst, src)
            }
            #[inline(always)]
            fn copy<O: Op>(dst: &mut [Self], a: &[Self], b: &[Self]) {
                native_copy::<$t, O>(dst, a, b)
            }
            fn divide(buf: &mut [Self], n: usize) {
                // Truncating division, as C's `/`. When n does not fit the
                // type, divide in a wider type (only i64::MIN / 2^63 and
                // the like are nonzero then).
                match <$t>::try_from(n) {
                    Ok(d) => {
                        for x in buf.iter_mut() {
                            *x = x.wrapping_div(d);
                        }
                    }
                    Err(_) => {
                        let d = n as $wide;
                        for x in buf.iter_mut() {
                            *x = (*x as $wide / d) as $t;
                        }
                    }
                }
            }
            fn scale(buf: &mut [Self], s: Self) {
                for x in buf.iter_mut() {
                    *x = x.wrapping_mul(s);
                }
            }
        }
    )*};
}
int_kernel!(i8 => i128, u8 => u128, i32 => i128, u32 => u128, i64 => i128, u64 => u128);

macro_rules! float_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            #[inline(always)]
            fn inplace<O: Op>(dst: &mut [Self], src: &[Self]) {
                native_inplace::<$t, O>(dst, src)
            }
            #[inline(always)]
            fn copy<O: Op>(dst: &mut [Self], a: &[Self], b: &[Self]) {
                native_copy::<$t, O>(dst, a, b)
            }
            fn divide(buf: &mut [Self], n: usize) {
                let d = n as $t;
                for x in buf.iter_mut() {
                    *x /= d;
                }
            }
            fn scale(buf: &mut [Self], s: Self) {
                for x in buf.iter_mut() {
                    *x *= s;
                }
            }
        }
    )*};
}
float_kernel!(f32, f64);

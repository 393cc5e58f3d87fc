//! The deterministic generator of the randomised unit tests: xorshift64 (Marsaglia, 2003,
//! shifts 13, 7, 17), so that a failing case is the same on every run and machine, with no
//! dependency.

/// xorshift64 state.
pub(crate) struct XorShift(u64);

impl XorShift {
    /// A generator from a non-zero seed (zero is xorshift's one fixed point).
    pub(crate) fn new(seed: u64) -> Self {
        assert_ne!(seed, 0, "xorshift needs a non-zero seed");
        XorShift(seed)
    }

    /// The next 64 bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// The next value below `n`: `next_u64() % n`, slightly biased, which the tests do not
    /// mind.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

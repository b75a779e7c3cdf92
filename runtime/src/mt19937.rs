//! The 32-bit Mersenne Twister as C++'s `std::mt19937` defines it (the engine llama.cpp's
//! samplers draw from, seeded with `-s`), and the `[0, 1)` doubles libstdc++'s
//! `std::uniform_real_distribution<double>` makes from it (`std::generate_canonical<double,
//! 53>`: two 32-bit outputs). With the same seed, the same draws as llama.cpp built by GCC.

/// State size in 32-bit words.
const N: usize = 624;
/// Offset of the twist's middle word.
const M: usize = 397;

/// `std::mt19937`.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl Mt19937 {
    /// The engine seeded as `std::mt19937(seed)` seeds it.
    pub fn new(seed: u32) -> Mt19937 {
        let mut state = [0u32; N];
        state[0] = seed;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    /// The next 32-bit output (`operator()`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % N] & 0x7fff_ffff);
            let mut v = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    /// A float in `[0, 1)` as libstdc++'s `generate_canonical<float, 24>` makes it (what
    /// `std::uniform_real_distribution<float>(0, 1)` returns; llama.cpp's XTC sampler): one
    /// output converted to float (to nearest), divided by 2³², a result of 1 replaced by the
    /// largest float below 1.
    pub fn canonical_f32(&mut self) -> f32 {
        let r = self.next_u32() as f32 / 4_294_967_296.0;
        if r >= 1.0 {
            1.0 - f32::EPSILON / 2.0
        } else {
            r
        }
    }

    /// A double in `[0, 1)` as libstdc++'s `generate_canonical<double, 53>` makes it from
    /// two outputs `a`, `b`: `(a + b · 2³²) / 2⁶⁴` in double arithmetic, values that round to
    /// 1 replaced by the largest double below 1.
    pub fn canonical_f64(&mut self) -> f64 {
        let a = f64::from(self.next_u32());
        let b = f64::from(self.next_u32());
        let r = (a + b * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if r >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_thousandth_output_of_the_default_seed() {
        // The C++ standard ([rand.predef]): the 10000th consecutive invocation of a
        // default-constructed std::mt19937 (seed 5489) produces 4123659995.
        let mut g = Mt19937::new(5489);
        let mut x = 0;
        for _ in 0..10_000 {
            x = g.next_u32();
        }
        assert_eq!(x, 4_123_659_995);
    }

    #[test]
    fn canonical_doubles_are_in_the_unit_interval() {
        let mut g = Mt19937::new(42);
        for _ in 0..1000 {
            let x = g.canonical_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}

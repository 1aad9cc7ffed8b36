//! Exponentially distributed variates by the ziggurat method (Marsaglia and Tsang, 2000): the
//! same distribution as `-ln(1 - u)`, but about 99 % of draws cost one 64-bit draw, a table
//! lookup, a multiplication and a comparison instead of a logarithm.
//!
//! The density `e^-x` is covered by 256 layers of equal area `V`: layer `i` is the rectangle
//! `[0, x[i]) × [f[i], f[i + 1])`, with `x` decreasing from `x[0] = V / f(R)` through `x[1] = R`
//! to `x[256] = 0`, `f[i] = e^-x[i]` for `i ≥ 1`, and `f[0] = 0`: the base layer is
//! `[0, x[0]) × [0, f(R))`, under the curve up to `R`, its part beyond `R` standing for the tail
//! (review22 R7). A draw picks a layer and a point `u · x[i]` in it uniformly: below `x[i + 1]`
//! the point is under the curve (accepted at once); in the wedge beyond it (`i ≥ 1`), it is
//! accepted if a uniform height in `[f[i], f[i + 1])` falls under the curve; in the base layer
//! beyond `R` it stands for the tail, which is `R` plus an exponential variate
//! (memorylessness). Every rejected draw starts again, so the result is exactly exponential (up
//! to `f64` rounding, as `-ln(1 - u)` is).

use rand_core::RngCore;

use super::policy::unit;

/// The right edge of the base layer, for 256 layers of the density `e^-x`.
const R: f64 = 7.697_117_470_131_487;
/// The area of each layer: `R e^-R` plus the tail beyond `R`, `e^-R`.
const V: f64 = 0.003_949_659_822_581_557;

/// The layers' edges and heights, computed once per table.
pub(crate) struct Exponential {
    x: [f64; 257],
    f: [f64; 257],
}

impl Exponential {
    /// The tables for 256 layers (computed with `exp` and `ln`: the same on every run).
    pub(crate) fn new() -> Exponential {
        let mut x = [0.0; 257];
        let mut f = [0.0; 257];
        x[0] = V / (-R).exp();
        x[1] = R;
        for i in 1..256 {
            f[i] = (-x[i]).exp();
            if i < 255 {
                x[i + 1] = -(f[i] + V / x[i]).ln();
            }
        }
        x[256] = 0.0;
        f[256] = 1.0;
        Exponential { x, f }
    }

    /// An exponential variate of mean 1.
    #[inline]
    pub(crate) fn sample(&self, rng: &mut impl RngCore) -> f64 {
        loop {
            let bits = rng.next_u64();
            // The low 8 bits pick the layer, the high 53 the point in it: independent bits.
            let i = (bits & 0xff) as usize;
            let u = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let x = u * self.x[i];
            if x < self.x[i + 1] {
                return x;
            }
            if let Some(v) = self.rare(i, x, rng) {
                return v;
            }
        }
    }

    /// The base layer's tail and the wedges (about 1 % of draws).
    #[cold]
    #[inline(never)]
    fn rare(&self, i: usize, x: f64, rng: &mut impl RngCore) -> Option<f64> {
        if i == 0 {
            return Some(R - (1.0 - unit(rng)).ln());
        }
        let y = self.f[i] + (self.f[i + 1] - self.f[i]) * unit(rng);
        (y < (-x).exp()).then_some(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_core::rng::EngineRng;

    /// The tables close: the top layer ends at 0 with height 1, each layer, the base one
    /// (`f[0] = 0`, review22 R7) included, is the rectangle `[0, x[i]) × [f[i], f[i + 1])` of
    /// area `V`.
    #[test]
    fn the_layers_have_equal_areas_and_reach_the_top() {
        let e = Exponential::new();
        let top = e.f[255] + V / e.x[255];
        assert!((top - 1.0).abs() < 1e-9, "{top}");
        assert_eq!(e.f[0], 0.0, "the base layer starts at height 0");
        for i in 0..256 {
            let area = e.x[i] * (e.f[i + 1] - e.f[i]);
            assert!((area - V).abs() < 1e-12, "layer {i}: {area}");
        }
    }

    /// Review22 R7: the draws fall in each of the 255 intervals `[x[i + 1], x[i])` between the
    /// layers' edges (`i ≥ 1`) and in the tail `[R, ∞)` as often as `e^-x` puts them there
    /// (masses `f[i + 1] - f[i]` and `f[1]`): a chi-square over the 256 cells, 255 degrees of
    /// freedom (mean 255, standard deviation 22.6), below 370, about five standard deviations
    /// (282 with this seed, deterministic). It checks the whole distribution, cell by cell:
    /// the wedges accepted wholesale give 628, the top layer's alone 408, layer 1's (next to
    /// the tail) 392; a middle layer's wedge holds too little mass to show in two million
    /// draws.
    #[test]
    fn review22_r7_each_layers_interval_gets_its_exponential_mass() {
        let e = Exponential::new();
        let mut rng = EngineRng::from_seed_u64(22);
        let n = 2_000_000u32;
        // Cell 0 is the tail; cell i (1..=255) is [x[i + 1], x[i]).
        let mut cells = [0u32; 256];
        for _ in 0..n {
            let v = e.sample(&mut rng);
            // The layers' edges decrease: the first edge at or below `v`, from x[1] = R on.
            let cell = if v >= R {
                0
            } else {
                e.x[1..=256].partition_point(|&edge| edge > v)
            };
            cells[cell] += 1;
        }
        let chi_square: f64 = (0..256)
            .map(|i| {
                let mass = if i == 0 { e.f[1] } else { e.f[i + 1] - e.f[i] };
                let want = mass * f64::from(n);
                let got = f64::from(cells[i]);
                (got - want) * (got - want) / want
            })
            .sum();
        assert!(
            chi_square < 370.0,
            "chi-square {chi_square} over 255 degrees of freedom"
        );
    }

    /// The draws are exponential: the mean, the variance and the distribution function at a
    /// few points match `e^-x` within sampling error (a million draws).
    #[test]
    fn the_draws_are_exponential() {
        let e = Exponential::new();
        let mut rng = EngineRng::from_seed_u64(11);
        let n = 1_000_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        let points = [0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 7.0, 7.697, 9.0];
        let mut below = [0u32; 9];
        for _ in 0..n {
            let v = e.sample(&mut rng);
            assert!(v >= 0.0 && v.is_finite());
            sum += v;
            sq += v * v;
            for (p, b) in points.iter().zip(below.iter_mut()) {
                *b += u32::from(v < *p);
            }
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!((mean - 1.0).abs() < 0.005, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
        for (p, b) in points.iter().zip(below) {
            let want = 1.0 - (-p).exp();
            let got = f64::from(b) / n as f64;
            // Five standard errors of a binomial proportion.
            let tolerance = 5.0 * (want * (1.0 - want) / n as f64).sqrt() + 1e-6;
            assert!(
                (got - want).abs() < tolerance,
                "P(X < {p}) = {got}, want {want}"
            );
        }
    }
}

//! The engine's step grid.

use super::*;
use std::time::Duration;

#[test]
fn steps_end_on_their_replicas_phase_of_the_grid() {
    let ms = Duration::from_millis;
    let t = Instant::now() + ms(10_000);
    let a = on_grid(t, 1000.0, 0.25);
    // A step that overran by a few ms still ends on the next grid point.
    assert_eq!(on_grid(a + ms(1003), 1000.0, 0.25) - a, ms(1000));
    assert_eq!(on_grid(a + ms(997), 1000.0, 0.25) - a, ms(1000));
    // Another phase: half a step apart.
    let b = on_grid(a + ms(1000), 1000.0, 0.75);
    assert!(b - a == ms(500) || b - a == ms(1500), "{:?}", b - a);
}

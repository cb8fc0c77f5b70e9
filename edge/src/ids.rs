//! The one way the Edge makes up an id (run ids, response and tool-call
//! ids, command ids).

/// A random (version 4) UUID drawn from `fastrand`'s per-thread generator,
/// seeded once per thread, rather than from the OS RNG: that cost one
/// `getrandom` syscall per id, two per client request. These ids correlate
/// and name things; they never authorize anything (a run's frames are
/// accepted only from its own node and connection generation), so they must
/// be unique, not unpredictable.
pub fn new_uuid() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid()
}

#[cfg(test)]
mod tests;

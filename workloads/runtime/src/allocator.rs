//! The allocator of every flash-sale process, and of every benchmark or
//! test that runs one inside its own process: mimalloc, not glibc's malloc.
//!
//! In a profile of the reservation path (the gateway's inventory client and
//! the inventory service), glibc's malloc took about a quarter of the CPU,
//! much of it consolidating and unlinking free chunks; see
//! `docs/benchmarks.md`, *The gateway's own client*.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

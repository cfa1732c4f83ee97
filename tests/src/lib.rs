//! tests harness

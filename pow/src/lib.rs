//! sluice-pow

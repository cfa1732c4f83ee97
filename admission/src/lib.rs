//! sluice-admission

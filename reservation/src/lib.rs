//! sluice-reservation

//! The configured waiting rooms and their live settings.

use std::collections::HashMap;

use parking_lot::RwLock;
use serde_json::{Value, json};

use crate::config::{Config, RoomConfig};
use crate::problem::Problem;

/// Live settings of one room.
#[derive(Clone, Debug)]
struct Live {
    rate_per_sec: f64,
    burst: f64,
}

/// The rooms of this gateway.
pub struct Rooms {
    configs: Vec<RoomConfig>,
    live: RwLock<HashMap<String, Live>>,
}

impl Rooms {
    /// Rooms as configured.
    pub fn from_config(config: &Config) -> Rooms {
        let live = config
            .rooms
            .iter()
            .map(|r| {
                (
                    r.id.clone(),
                    Live {
                        rate_per_sec: r.rate_per_sec,
                        burst: r.burst,
                    },
                )
            })
            .collect();
        Rooms {
            configs: config.rooms.clone(),
            live: RwLock::new(live),
        }
    }

    /// The configured rooms.
    pub fn configs(&self) -> &[RoomConfig] {
        &self.configs
    }

    /// The admin view of a room.
    pub fn admin_view(&self, room: &str) -> Result<Value, Problem> {
        let live = self.live.read();
        let l = live.get(room).ok_or_else(Problem::room_not_found)?;
        Ok(json!({
            "room": room,
            "rate_per_sec": l.rate_per_sec,
            "burst": l.burst,
        }))
    }

    /// Applies an admin PATCH.
    pub fn patch(&self, room: &str, patch: &Value) -> Result<Value, Problem> {
        let obj = patch
            .as_object()
            .ok_or_else(|| Problem::invalid_setting("body", "must be a JSON object"))?;
        {
            let mut live = self.live.write();
            let l = live.get_mut(room).ok_or_else(Problem::room_not_found)?;
            let mut next = l.clone();
            for (k, v) in obj {
                match k.as_str() {
                    "rate_per_sec" => next.rate_per_sec = non_negative(k, v)?,
                    "burst" => next.burst = non_negative(k, v)?,
                    other => {
                        return Err(Problem::invalid_setting(other, "unknown setting"));
                    }
                }
            }
            *l = next;
        }
        self.admin_view(room)
    }
}

fn non_negative(field: &str, v: &Value) -> Result<f64, Problem> {
    match v.as_f64() {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(Problem::invalid_setting(field, "must be a number ≥ 0")),
    }
}

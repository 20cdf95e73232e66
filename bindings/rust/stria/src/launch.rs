//! Where this process stands in a job started by a launcher people already use (torchrun,
//! mpirun): the path from the environment to a [`Config`](crate::Config) (`Config::from_env`).

use crate::error::{invalid, Result};

/// This process's place in a launched job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Its rank.
    pub rank: i32,
    /// The number of ranks.
    pub world_size: i32,
    /// Its rank on this host (0 when the launcher does not say): the GPU for
    /// [`Device::Cuda`](crate::Device::Cuda).
    pub local_rank: i32,
}

impl Launch {
    /// From this process's environment: RANK, WORLD_SIZE and LOCAL_RANK (torchrun), else
    /// OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_RANK (mpirun).
    ///
    /// ```
    /// let vars = [("RANK", "2"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "0")];
    /// let launch = stria::Launch::from_vars(|name| {
    ///     vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    /// })
    /// .unwrap();
    /// assert_eq!((launch.rank, launch.world_size, launch.local_rank), (2, 4, 0));
    /// ```
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// The same from any source of variables (`var(name)`: its value, or `None` when unset).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let names = if var("RANK").is_some() && var("WORLD_SIZE").is_some() {
            ["RANK", "WORLD_SIZE", "LOCAL_RANK"]
        } else if var("OMPI_COMM_WORLD_RANK").is_some() && var("OMPI_COMM_WORLD_SIZE").is_some() {
            [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ]
        } else {
            return Err(invalid(
                "no launcher environment found: set RANK and WORLD_SIZE (torchrun does) or \
                 OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (mpirun does)",
            ));
        };
        let int = |name: &str, unset: Option<i32>| -> Result<i32> {
            match var(name) {
                Some(value) => value
                    .trim()
                    .parse::<i32>()
                    .map_err(|_| invalid(format!("{}={:?} is not an integer", name, value))),
                None => unset.ok_or_else(|| invalid(format!("{} is not set", name))),
            }
        };
        Ok(Launch {
            rank: int(names[0], None)?,
            world_size: int(names[1], None)?,
            local_rank: int(names[2], Some(0))?,
        })
    }
}

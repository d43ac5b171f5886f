//! `ncclCommSplit`: ranks with the same color form a new communicator.

use super::Communicator;
use crate::bootstrap::{UniqueId, UNIQUE_ID_BYTES};
use crate::config::Config;
use crate::error::{Error, Result};

impl Communicator {
    /// Splits this communicator: ranks passing the same `color` form a new
    /// communicator, ranked by `(key, old rank)`. `color == None` (NCCL's
    /// `NCCL_SPLIT_NOCOLOR`) takes part in the exchange but gets `None`.
    /// Every rank must call it (it is a collective on this communicator).
    pub fn split(
        &mut self,
        color: Option<u32>,
        key: i32,
        config: &Config,
    ) -> Result<Option<Communicator>> {
        let mine = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * self.nranks];
        self.all_gather(&mine, &mut all)?;
        let mut members: Vec<(i64, usize)> = (0..self.nranks)
            .filter(|&r| color.is_some() && all[2 * r] == mine[0])
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort_unstable();
        let leader = members.first().map(|m| m.1);
        let mut id_bytes = [0u8; UNIQUE_ID_BYTES];
        if leader == Some(self.rank) {
            // A fixed NCCL_COMM_ID names the parent's root; the new
            // communicator gets a root of its own on a fresh port.
            let mut fresh = config.clone();
            fresh.comm_id = None;
            let id = UniqueId::new(&fresh).map_err(|source| Error::Bootstrap {
                rank: self.rank,
                source,
            })?;
            id_bytes = id.to_bytes();
        }
        let mut ids = vec![0u8; UNIQUE_ID_BYTES * self.nranks];
        self.all_gather(&id_bytes, &mut ids)?;
        let Some(leader) = leader else {
            return Ok(None);
        };
        let id =
            UniqueId::from_bytes(&ids[leader * UNIQUE_ID_BYTES..(leader + 1) * UNIQUE_ID_BYTES])
                .map_err(|source| Error::Bootstrap {
                    rank: self.rank,
                    source,
                })?;
        let new_rank = members
            .iter()
            .position(|m| m.1 == self.rank)
            .expect("a colored rank is a member");
        Communicator::init_with_net(&id, members.len(), new_rank, config, self.net.clone())
            .map(Some)
    }

    /// The configuration this communicator was created with.
    pub fn config(&self) -> &Config {
        &self.config
    }
}

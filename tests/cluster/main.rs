//! Exactly once past one database machine, on real clustered engines
//! started on loopback (`docs/scaling.md`): replicas of the real binaries
//! on different nodes, nodes killed under load, and the last writes lost on
//! purpose (a claim deleted on every Galera node; a Patroni standby
//! promoted without the acknowledged commits it was never sent), which the
//! clients' retries restore without a second provider charge.

mod galera;
mod load;
mod patroni;

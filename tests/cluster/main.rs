//! Exactly once past one database machine, on real clustered engines
//! started on loopback (`docs/scaling.md`): replicas of the real binaries
//! on different nodes, nodes killed under load.

mod galera;
mod load;
mod patroni;

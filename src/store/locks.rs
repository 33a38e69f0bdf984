//! The lock keys P2 and this server take, in one place so every user agrees on them (§2.2).

/// Held by the leader's session; its value names the holder.
pub const LEADER_LOCK: &str = "lock/p2-apiserver/leader";

/// Which farm runs an RC.
pub fn rc_ownership(rc_id: &str) -> String {
    format!("lock/replication_controllers/{rc_id}")
}

/// Held by a running roll (or a node transfer): nobody else may change the RC's counts.
pub fn rc_mutation(rc_id: &str) -> String {
    format!("lock/replication_controllers/{rc_id}/update")
}

/// Held while a roll over the RC is being created, so no two rolls are created over it.
pub fn rc_update_creation(rc_id: &str) -> String {
    format!("lock/replication_controllers/{rc_id}/update_creation")
}

/// Which farm runs a roll.
pub fn roll_ownership(roll_id: &str) -> String {
    format!("lock/rolls/{roll_id}")
}

/// Which farm runs a daemon set.
pub fn ds_ownership(ds_id: &str) -> String {
    format!("lock/daemon_sets/{ds_id}")
}

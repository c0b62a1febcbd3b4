//! The reliability suites of `RELIABILITY.md` and the deterministic simulation, in one binary:
//! crash injection (against the `crash_child` binary), ledger outages, storms, hostile input,
//! tenant isolation, fencing, and seeded runs of simulated replicas, clients and faults.
//!
//! Each `reliability_*` module is one suite (its long form under `IDEM_RELIABILITY_LONG=1`);
//! `simulation` takes its seeds from `IDEM_SIM_*`. They share this process, so each names its
//! files, tables' keys and tenants uniquely (`support::unique`) and changes no process-wide
//! state.

mod reliability_crash;
mod reliability_failover;
mod reliability_fencing;
mod reliability_hostile;
mod reliability_isolation;
mod reliability_outage;
mod reliability_storm;
mod sim;
mod simulation;
mod support;

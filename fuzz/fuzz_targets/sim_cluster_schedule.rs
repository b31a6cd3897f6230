#![no_main]

use libfuzzer_sys::fuzz_target;

// The fuzzer's bytes choose the whole schedule of a 3- or 5-node cluster:
// delays, chunking, clocks, workload, partitions, node crashes and
// replacements; every checker of the cluster simulator runs.
fuzz_target!(|data: &[u8]| ticketing_sim::fuzzing::sim_cluster_schedule(data));

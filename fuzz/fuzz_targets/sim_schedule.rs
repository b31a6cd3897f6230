#![no_main]

use libfuzzer_sys::fuzz_target;

// The fuzzer's bytes choose the whole schedule: delays, chunking, clocks,
// workload and faults; every checker of the simulator runs.
fuzz_target!(|data: &[u8]| ticketing_sim::fuzzing::sim_schedule(data));

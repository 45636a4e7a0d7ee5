//! `capstan-envdump OUT_PATH [ARGS...]`: the workload the systemd tests run; see
//! [`capstan_tests::envdump`].

fn main() {
    capstan_tests::envdump::main()
}

"""Stage `bench`: speculative decoding benchmarks (row schema in `specbuild.bench.specdec`)."""
